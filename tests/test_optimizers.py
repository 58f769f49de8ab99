"""Lesson 03's optimizers (nnlib.lesson03_training.optimizers) against the formulas written out by hand: SGD, momentum,
Adam's bias correction, AdamW's decoupled decay; their state saved and restored; slices stepped alone equal the whole;
Adam chosen through Settings in one process, and bad settings refused. (Adam under mpiexec: tests/mpi.)"""

import re

import numpy as np
import pytest

from nnlib import Network, train
from nnlib.lesson03_training.optimizers import SGD, Adam
from nnlib.lesson03_training.training import Settings
from nnlib.lesson13_faults.checkpoint import CheckpointFolder, Checkpointing

RATE, STEPS = 0.05, 5


def gradients(n=17, scale=1e-3, seed=0):
    """STEPS gradients (n,) of varied sizes and signs (about ``scale``), and starting parameters."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=n), [scale * rng.normal(size=n) * rng.uniform(0.1, 10, size=n) for _ in range(STEPS)]


def stepped(optimizer, params, grads_list):
    params = params.copy()
    for grads in grads_list:
        optimizer.step(params, grads)
    return params


def adam_by_hand(params, grads_list, rate, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0):
    """Adam (AdamW with weight_decay) as the papers write it: bias-corrected moments, decay apart from the gradient."""
    params, m, v = params.copy(), np.zeros_like(params), np.zeros_like(params)
    for t, g in enumerate(grads_list, start=1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g ** 2
        m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
        params = params - rate * weight_decay * params - rate * m_hat / (np.sqrt(v_hat) + eps)
    return params, m, v


def test_sgd_and_momentum_are_the_formulas_bit_for_bit():
    params, grads_list = gradients()
    plain, momentum, velocity = params.copy(), params.copy(), np.zeros_like(params)
    for g in grads_list:
        plain = plain - RATE * g
        velocity = 0.9 * velocity - RATE * g
        momentum = momentum + velocity
    assert np.array_equal(stepped(SGD(params, RATE), params, grads_list), plain)
    optimizer = SGD(params, RATE, 0.9)
    assert np.array_equal(stepped(optimizer, params, grads_list), momentum)
    assert np.array_equal(optimizer.state["velocity"], velocity) and optimizer.steps == STEPS
    assert SGD(params, RATE).state == {} and SGD(params, RATE).state_bytes == 0


@pytest.mark.parametrize("eps", [1e-8, 1e-3])  # 1e-3: as large as sqrt(v_hat), so where eps goes matters
def test_adam_is_the_bias_corrected_formula(eps):
    params, grads_list = gradients()
    optimizer = Adam(params, RATE, eps=eps)
    expected, m, v = adam_by_hand(params, grads_list, RATE, eps=eps)
    np.testing.assert_allclose(stepped(optimizer, params, grads_list), expected, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(optimizer.state["m"], m, rtol=1e-13)
    np.testing.assert_allclose(optimizer.state["v"], v, rtol=1e-13)
    assert optimizer.steps == STEPS and optimizer.state_bytes == 2 * params.nbytes


def test_adams_first_step_moves_every_parameter_by_the_learning_rate():
    """Bias correction at t = 1: m_hat = g, v_hat = g^2, so each parameter moves by eta sign(g) (uncorrected moments
    would move it by eta (1 - b1) / sqrt(1 - b2), about 3.2 eta)."""
    params, grads_list = gradients()
    after = stepped(Adam(params, RATE), params, grads_list[:1])
    np.testing.assert_allclose(after - params, -RATE * np.sign(grads_list[0]), rtol=1e-3)  # (eps: 1e-4 at most)


def test_adamw_decays_the_weights_apart_from_the_gradient():
    params, grads_list = gradients()
    expected, _, _ = adam_by_hand(params, grads_list, RATE, weight_decay=0.1)
    np.testing.assert_allclose(stepped(Adam(params, RATE, weight_decay=0.1), params, grads_list), expected, rtol=1e-13)
    zero = [np.zeros_like(params)] * STEPS  # no gradient: the decay alone, (1 - eta lambda)^t
    np.testing.assert_allclose(stepped(Adam(params, RATE, weight_decay=0.1), params, zero),
                               params * (1 - RATE * 0.1) ** STEPS, rtol=1e-14)


@pytest.mark.parametrize("make", [lambda p: SGD(p, RATE, 0.9), lambda p: Adam(p, RATE, weight_decay=0.01)])
def test_the_state_dict_round_trip_continues_exactly(make):
    params, grads_list = gradients()
    first, middle = make(params), params.copy()
    for g in grads_list[:3]:
        first.step(middle, g)
    saved = {name: np.array(value) for name, value in first.state_dict().items()}  # host copies, as a checkpoint
    second = make(params)
    second.load_state_dict(saved)
    assert set(saved) == set(first.state) | {"steps"} and second.steps == 3
    for name in first.state:
        saved[name][...] = np.nan  # loaded values are copies: the saved arrays may change afterwards
    one, other = middle.copy(), middle.copy()
    for g in grads_list[3:]:
        first.step(one, g)
        second.step(other, g)
    assert np.array_equal(one, other)


@pytest.mark.parametrize("kind, numbers", [(SGD, dict(momentum=0.9)), (Adam, dict(weight_decay=0.01))])
def test_slices_stepped_by_their_own_optimizers_or_piece_by_piece_equal_the_whole(kind, numbers):
    """What ZeRO does (each rank's optimizer on its uneven slice only) and FSDP (one optimizer stepping its layers'
    chunks one after another, ``pieces``) give the whole vector's step."""
    params, grads_list = gradients(n=23)
    whole = stepped(kind(params, RATE, **numbers), params, grads_list)
    cuts = [0, 8, 16, 23]
    parts = [stepped(kind(params[a:b], RATE, **numbers), params[a:b], [g[a:b] for g in grads_list])
             for a, b in zip(cuts, cuts[1:])]
    assert np.array_equal(np.concatenate(parts), whole)
    pieces = [slice(a, b) for a, b in zip(cuts, cuts[1:])]
    assert np.array_equal(stepped(kind(params, RATE, **numbers, pieces=pieces), params, grads_list), whole)


@pytest.mark.parametrize("changes, message", [
    (dict(optimizer="rmsprop"), "optimizer must be 'sgd', 'adam' or 'adamw'"),
    (dict(optimizer="adam", momentum=0.9), "momentum is SGD's"),
    (dict(optimizer="adam", weight_decay=0.1), "weight_decay is AdamW's"),
    (dict(beta2=0.99), "beta1, beta2 and eps are Adam's"),
    (dict(optimizer="adam", beta1=1.0), r"beta1 must be in \[0, 1\); got 1.0"),
    (dict(optimizer="adamw", beta2=-0.1), r"beta2 must be in \[0, 1\); got -0.1"),
    (dict(optimizer="adam", eps=0.0), "eps must be a positive finite number; got 0.0"),
    (dict(optimizer="adamw", weight_decay=float("nan")), "weight_decay must be a finite number, 0 or more; got nan"),
])
def test_bad_optimizer_settings_are_refused(changes, message):
    settings = Settings(epochs=1, learning_rate=0.1, **changes)
    assert any(re.search(message, problem) for problem in settings.problems()), settings.problems()
    with pytest.raises(ValueError, match=message):
        train(Network((4, 3)), np.ones((2, 4)), np.zeros(2, dtype=np.int64), settings, progress=False)


def test_the_optimizers_check_their_own_numbers():
    with pytest.raises(ValueError, match=r"beta1 must be in \[0, 1\).*eps must be a positive"):
        Adam(np.zeros(3), 0.1, beta1=1.5, eps=-1)
    with pytest.raises(ValueError, match="learning_rate must be a positive finite number"):
        Adam(np.zeros(3), 0.0)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\)"):
        SGD(np.zeros(3), 0.1, 1.0)


def test_train_with_adam_is_adam_on_the_full_batch_gradient():
    """The wiring: train(..., optimizer="adamw") equals the hand-written AdamW on the network's own gradients."""
    rng = np.random.default_rng(3)
    inputs, labels = rng.random((30, 6)), rng.integers(0, 3, 30)
    trained, by_hand = Network((6, 5, 3), dtype="float64", seed=1), Network((6, 5, 3), dtype="float64", seed=1)
    train(trained, inputs, labels, epochs=4, learning_rate=0.01, optimizer="adamw", weight_decay=0.5, progress=False)
    m = v = np.zeros(by_hand.num_params)
    for t in range(1, 5):
        by_hand.loss_and_gradient(inputs, labels)
        g = by_hand.grads
        m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g ** 2
        step = 0.01 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
        by_hand.params[...] = by_hand.params * (1 - 0.01 * 0.5) - step
    np.testing.assert_allclose(trained.params, by_hand.params, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("strategy", ["allreduce", "parameter_server", "zero", "fsdp"])
def test_a_run_with_adamw_resumed_from_a_checkpoint_is_bit_identical(tmp_path, strategy):
    """Each strategy's state_dict saves the moments and the step count (t: the bias correction) and takes them back;
    a run stopped mid-epoch and resumed ends where the uninterrupted one does, bit for bit (one rank here; other
    numbers of ranks: tests/mpi/check_parallel.py)."""
    from mpi4py import MPI

    from nnlib.lesson06_data_parallel import train_parallel
    from nnlib.lesson10_zero_overlap.zero import ZeRO
    from nnlib.lesson16_sharding.fsdp import FullySharded, FullyShardedNetwork

    rng = np.random.default_rng(4)
    inputs, labels = rng.random((40, 6)), rng.integers(0, 3, 40)
    settings = dict(epochs=2, learning_rate=0.01, batch_size=16, optimizer="adamw", weight_decay=0.1, seed=1)
    sync = dict(zero=ZeRO, fsdp=FullySharded).get(strategy, strategy)

    def run(folder=None, resume=False, stop_at=None):
        network = (FullyShardedNetwork(MPI.COMM_WORLD, (6, 5, 3), seed=1) if strategy == "fsdp"
                   else Network((6, 5, 3), dtype="float64", seed=1))

        def on_step(epoch, step, total_steps):
            if total_steps == stop_at:
                raise RuntimeError("stopped")

        hooks = [Checkpointing(CheckpointFolder(folder, every=2), resume)] if folder else []
        train_parallel(MPI.COMM_WORLD, network, inputs, labels, num_samples=40, start=0, strategy=sync, hooks=hooks,
                       on_step=on_step, **settings)
        return network

    expected = run()
    with pytest.raises(RuntimeError, match="stopped"):
        run(tmp_path, stop_at=5)  # the checkpoint after step 4: epoch 2, its first step done
    saved = CheckpointFolder(tmp_path).latest()
    assert saved.state["optimizer"]["steps"] == 4 and set(saved.state["optimizer"]) == {"m", "v", "steps"}
    assert saved.settings["optimizer"] == "adamw" and saved.settings["weight_decay"] == 0.1
    assert np.array_equal(run(tmp_path, resume=True).params, expected.params)
    with pytest.raises(ValueError, match="beta2: the checkpoint has 0.999, this run 0.99"):
        settings["beta2"] = 0.99
        run(tmp_path, resume=True)


def test_every_strategy_on_one_process_steps_adam_as_train_does():
    """In one process (mpi4py's singleton COMM_WORLD): each sync makes the optimizer for its part and steps it there;
    lesson 06's, ZeRO's and FSDP's runs equal train's bit for bit (one rank: the same sums)."""
    from mpi4py import MPI

    from nnlib.lesson06_data_parallel import train_parallel
    from nnlib.lesson10_zero_overlap.zero import ZeRO
    from nnlib.lesson16_sharding.fsdp import FullySharded, FullyShardedNetwork

    rng = np.random.default_rng(4)
    inputs, labels = rng.random((40, 6)), rng.integers(0, 3, 40)
    settings = dict(epochs=2, learning_rate=0.01, batch_size=16, optimizer="adamw", weight_decay=0.1, seed=1)
    expected = Network((6, 5, 3), dtype="float64", seed=1)
    train(expected, inputs, labels, progress=False, **settings)
    for strategy in ("allreduce", "parameter_server", ZeRO, FullySharded):
        network = (FullyShardedNetwork(MPI.COMM_WORLD, (6, 5, 3), seed=1) if strategy is FullySharded
                   else Network((6, 5, 3), dtype="float64", seed=1))
        train_parallel(MPI.COMM_WORLD, network, inputs, labels, num_samples=40, start=0, strategy=strategy, **settings)
        assert np.array_equal(network.params, expected.params), strategy
