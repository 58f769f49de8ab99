"""nnlib.lesson02_network.network: backpropagation is right, the flat buffer aliases, bad input is refused."""

import numpy as np
import pytest

from nnlib import Network, gradient_check
from nnlib.lesson02_network.gradient_check import numerical_gradient, relative_error
from nnlib.lesson04_collectives.costmodel import flops_per_sample, step_matmul_shapes


def batch(sizes, n=7, seed=1, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return rng.random((n, sizes[0])).astype(dtype), rng.integers(0, sizes[-1], n)


@pytest.mark.parametrize("output", ["sigmoid", "softmax"])
@pytest.mark.parametrize("sizes", [(4, 3), (5, 4, 3), (6, 5, 4, 3), (20, 8, 10)])
def test_gradient_check_float64(sizes, output):
    network = Network(sizes, output=output, dtype="float64", seed=3)
    inputs, labels = batch(sizes)
    assert gradient_check(network, inputs, labels) < 1e-7


def test_gradient_check_catches_a_wrong_backward_pass(monkeypatch):
    """The check must be able to fail: drop the sigmoid derivative and it does."""
    import nnlib.lesson02_network.network as module

    monkeypatch.setattr(module, "sigmoid_backward", lambda activation_gradient, activation: None)
    network = Network((5, 4, 3), dtype="float64", seed=0)
    assert gradient_check(network, *batch((5, 4, 3))) > 1e-3


def test_numerical_gradient_of_a_known_function():
    x = np.array([1.0, -2.0, 3.0])
    gradient = numerical_gradient(lambda: float(np.sum(x ** 3)), x)
    np.testing.assert_allclose(gradient, 3 * np.array([1.0, 4.0, 9.0]), rtol=1e-8)
    np.testing.assert_array_equal(x, [1.0, -2.0, 3.0])  # restored
    assert relative_error([1, 0], [1, 0]) == 0.0 and relative_error([1, 0], [-1, 0]) == 1.0


def test_sigmoid_written_with_tanh_equals_the_plain_formula():
    """nnlib computes sigma(z) as 0.5 + 0.5 tanh(z / 2); it must equal 1 / (1 + exp(-z)), and never overflow."""
    from nnlib.lesson02_network.network import sigmoid

    z = np.linspace(-40, 40, 20001)
    plain = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(sigmoid(z), plain, rtol=1e-14, atol=1e-15)
    wide = np.linspace(-500, 500, 2001, dtype=np.float32)
    with np.errstate(all="raise"):  # exp(-z) would overflow in float32 below z = -89
        fast32 = sigmoid(wide)
    assert fast32.dtype == np.float32
    np.testing.assert_allclose(fast32, 1 / (1 + np.exp(-wide.astype(np.float64))), rtol=0, atol=1e-7)


def test_chunked_batch_gives_the_same_gradient():
    network = Network((6, 5, 3), dtype="float64", seed=0)
    inputs, labels = batch((6, 5, 3), n=23)
    whole_loss = network.loss_and_gradient(inputs, labels)
    whole = network.grads.copy()
    network.chunk_size = 4
    chunked_loss = network.loss_and_gradient(inputs, labels)
    np.testing.assert_allclose(network.grads, whole, rtol=1e-12, atol=1e-15)
    assert chunked_loss == pytest.approx(whole_loss, rel=1e-12)


def test_shard_gradients_with_a_shared_normalizer_add_up_to_the_full_gradient():
    network = Network((6, 5, 3), dtype="float64", seed=0)
    inputs, labels = batch((6, 5, 3), n=10)
    network.loss_and_gradient(inputs, labels)
    full = network.grads.copy()
    total = np.zeros_like(full)
    for shard in (slice(0, 3), slice(3, 10)):
        network.loss_and_gradient(inputs[shard], labels[shard], normalizer=10)
        total += network.grads
    np.testing.assert_allclose(total, full, rtol=1e-12)


def test_layer_views_alias_the_flat_vectors():
    network = Network((4, 3, 2), seed=0)
    assert network.num_params == 4 * 3 + 3 + 3 * 2 + 2
    assert [w.shape for w in network.weights] == [(4, 3), (3, 2)]
    assert [b.shape for b in network.biases] == [(3,), (2,)]
    network.weights[1][2, 1] = 7.0
    assert network.params[4 * 3 + 3 + 2 * 2 + 1] == 7.0
    network.params[4 * 3] = 5.0
    assert network.biases[0][0] == 5.0
    network.grads[-1] = 9.0
    assert network.grad_biases[1][1] == 9.0
    for view in network.weights + network.biases + network.grad_weights + network.grad_biases:
        assert np.shares_memory(view, network.params) or np.shares_memory(view, network.grads)
    network.set_params(np.zeros(network.num_params))
    assert not network.weights[0].any()  # views still valid after set_params


def test_forward_shapes_dtypes_and_probabilities():
    network = Network((6, 5, 4, 3), output="softmax", seed=0)
    inputs, _ = batch((6, 5, 4, 3), n=8, dtype=np.float32)
    activations = network.forward(inputs)
    assert [a.shape for a in activations] == [(8, 6), (8, 5), (8, 4), (8, 3)]
    assert all(a.dtype == np.float32 for a in activations)
    np.testing.assert_allclose(activations[-1].sum(axis=1), 1, rtol=1e-6)
    assert network.predict(inputs).shape == (8,)


def test_initialisation_is_seeded_and_glorot_uniform():
    a, b, c = Network((30, 20, 10), seed=4), Network((30, 20, 10), seed=4), Network((30, 20, 10), seed=5)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)
    limit = np.sqrt(6 / 50)
    assert np.abs(a.weights[0]).max() <= limit and np.abs(a.weights[0]).max() > 0.9 * limit
    assert not a.biases[0].any()
    assert a.params.dtype == np.float32 and Network((3, 2), dtype="float64").params.dtype == np.float64


def test_loss_is_finite_where_outputs_saturate():
    network = Network((2, 2), dtype="float32", seed=0)
    network.weights[0][...] = [[100, -100], [100, -100]]
    inputs, labels = np.ones((3, 2), dtype=np.float32), np.array([1, 1, 0])
    loss = network.loss_and_gradient(inputs, labels)
    # Label 1 costs softplus(200) + softplus(-200) + 200 = 400 per sample; label 0 costs 0.
    assert np.isfinite(loss) and loss == pytest.approx(2 * 400 / 3, rel=1e-4)


@pytest.mark.parametrize("inputs, labels, message", [
    (np.zeros((3, 5)), np.array([0, 1, 2]), "inputs have 5 features but the network expects 4"),
    (np.zeros(4), np.array([0]), "inputs must be a 2-D array"),
    (np.zeros((0, 4)), np.array([], dtype=int), "empty batch"),
    (np.zeros((3, 4)), np.array([0, 1]), "3 samples but 2 labels"),
    (np.zeros((2, 4)), np.array([0, 3]), r"labels must lie in 0\.\.2; got values from 0 to 3"),
    (np.zeros((2, 4)), np.array([-1, 0]), r"labels must lie in 0\.\.2"),
    (np.zeros((2, 4)), np.array([0.0, 1.0]), "labels must be integers"),
])
def test_bad_input_is_refused_clearly(inputs, labels, message):
    network = Network((4, 3, 3), seed=0)
    with pytest.raises(ValueError, match=message):
        network.loss_and_gradient(inputs, labels)


@pytest.mark.parametrize("kwargs, message", [
    ({"layer_sizes": (4,)}, "at least two positive sizes"),
    ({"layer_sizes": (4, 0, 2)}, "at least two positive sizes"),
    ({"output": "relu"}, "output must be"),
    ({"dtype": "int32"}, "float32 or float64"),
    ({"device": "tpu"}, "device must be"),
])
def test_bad_network_configuration_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Network(**{"layer_sizes": (4, 3), **kwargs})


def test_flop_count_by_hand():
    # 784-128-10: forward 2(784*128 + 128*10), weight grads the same, input grads 2(128*10) for layer 2 only.
    assert flops_per_sample((784, 128, 10)) == 2 * (2 * (784 * 128 + 1280) + 1280)
    shapes = step_matmul_shapes((784, 128, 10), 5)
    assert sum(2 * m * k * n for m, k, n in shapes) == 5 * flops_per_sample((784, 128, 10))


def test_the_backward_pass_reports_each_layer_as_soon_as_its_gradient_is_final():
    """nnlib.lesson10_zero_overlap.overlap starts sending a layer's gradient at on_layer_done(layer): it must be final by then,
    also when a large batch is processed in chunks (only the last chunk reports)."""
    rng = np.random.default_rng(0)
    network = Network((6, 5, 4, 3), dtype="float64", seed=1)
    network.chunk_size = 7  # 20 samples: 3 chunks
    inputs, labels = rng.random((20, 6)), rng.integers(0, 3, 20)
    seen = []

    def on_layer_done(layer):
        weights, biases = network.grad_weights[layer].copy(), network.grad_biases[layer].copy()
        seen.append((layer, weights, biases))

    network.loss_and_gradient(inputs, labels, on_layer_done=on_layer_done)
    assert [layer for layer, _, _ in seen] == [2, 1, 0]
    for layer, weights, biases in seen:
        assert np.array_equal(weights, network.grad_weights[layer]) and np.array_equal(biases, network.grad_biases[layer])


@pytest.mark.parametrize("namespace", ["numpy", "array_api_strict"])
def test_product_into_writes_the_plain_product_into_a_view(namespace):
    """product_into(a, b, out) leaves out == a @ b, in place (a view into a flat vector), with matmul's
    out= (NumPy) or without it (array_api_strict has none); the rest of the flat vector is untouched."""
    from nnlib.lesson02_network.arrays import product_into

    xp = np if namespace == "numpy" else pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(0)
    a, b = xp.asarray(rng.random((7, 5))), xp.asarray(rng.random((7, 3)))
    flat = xp.asarray(np.full(20, -1.0))
    out = xp.reshape(flat[2:17], (5, 3))
    product_into(a.T, b, out)
    assert np.array_equal(np.asarray(flat[2:17]).reshape(5, 3), np.asarray(a.T @ b))
    assert np.all(np.asarray(flat[:2]) == -1) and np.all(np.asarray(flat[17:]) == -1)


def test_one_hot_targets_are_rows_of_the_identity():
    from nnlib.lesson02_network.loss import one_hot

    labels = np.array([2, 0, 3, 3])
    expected = np.array([[float(label == k) for k in range(4)] for label in labels], np.float32)
    targets = one_hot(labels[:, None], np.arange(4), np.float32)
    assert targets.dtype == np.float32 and np.array_equal(targets, expected)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_bias_gradient_is_the_sum_of_delta_over_the_samples(dtype):
    """Layer.weight_gradient writes dJ/db as 1^T delta (a product, for speed): it equals sum(delta, axis=0)."""
    network = Network((6, 5, 3), dtype=np.dtype(dtype).name, seed=0)
    layer = network.layers[1]
    rng = np.random.default_rng(2)
    inputs, delta = rng.random((37, 5)).astype(dtype), rng.standard_normal((37, 3)).astype(dtype)
    layer.weight_gradient(inputs, delta)
    tolerance = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(layer.grad_biases, delta.sum(axis=0), rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(layer.grad_weights, inputs.T @ delta, rtol=tolerance, atol=tolerance)
