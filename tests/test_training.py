"""nnlib.lesson03_training.training: it learns, it is deterministic, and it stops clearly when it cannot."""

import numpy as np
import pytest

from nnlib import Network, train
from nnlib.lesson01_mnist.data import scale_pixels


@pytest.fixture(scope="module")
def small_mnist(mnist):
    return (scale_pixels(mnist.train_images[:5000]), mnist.train_labels[:5000].astype(np.int64),
            scale_pixels(mnist.test_images[:2000]), mnist.test_labels[:2000].astype(np.int64))


def test_short_sgd_run_reaches_85_percent(small_mnist):
    inputs, labels, test_inputs, test_labels = small_mnist
    network = Network((784, 30, 10), seed=0)
    history = train(network, inputs, labels, epochs=5, learning_rate=0.5, batch_size=32,
                    momentum=0.5, validation=(test_inputs, test_labels), progress=False)
    assert history.epochs == 5 and len(history.seconds) == 5
    assert history.loss[-1] < history.loss[0]
    assert history.validation_accuracy[-1] >= 0.85  # 0.889 when written
    assert network.accuracy(test_inputs, test_labels) == history.validation_accuracy[-1]


def test_full_batch_gradient_descent_lowers_the_loss_every_step(small_mnist):
    inputs, labels, _, _ = small_mnist
    network = Network((784, 20, 10), dtype="float64", seed=0)
    history = train(network, inputs[:1000], labels[:1000], epochs=20, learning_rate=1.0, progress=False)
    assert all(later < earlier for earlier, later in zip(history.loss, history.loss[1:]))


def test_training_is_deterministic(small_mnist):
    inputs, labels, _, _ = small_mnist
    runs = []
    for _ in range(2):
        network = Network((784, 16, 10), seed=7)
        train(network, inputs[:1000], labels[:1000], epochs=2, learning_rate=0.5, batch_size=50,
              momentum=0.9, seed=11, progress=False)
        runs.append(network.state_dict()["params"])
    np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_divergence_stops_with_a_clear_error():
    """A learning rate of 1e38 overflows float32 weights on the first update: the loss becomes inf."""
    rng = np.random.default_rng(0)
    inputs, labels = rng.random((64, 8)).astype(np.float32), rng.integers(0, 3, 64)
    network = Network((8, 4, 3), seed=0)
    with pytest.raises(FloatingPointError,
                       match=r"loss became inf at epoch 1, step 2 \(learning rate 1e\+38\).*smaller learning rate"):
        train(network, inputs, labels, epochs=3, learning_rate=1e38, batch_size=16, progress=False)


@pytest.mark.parametrize("learning_rate", [0, -0.1, float("nan"), float("inf"), "0.1"])
def test_bad_learning_rate_is_refused(learning_rate):
    network = Network((4, 3), seed=0)
    with pytest.raises(ValueError, match="learning_rate must be a positive finite number"):
        train(network, np.zeros((2, 4)), np.array([0, 1]), epochs=1, learning_rate=learning_rate, progress=False)


def test_bad_batch_and_epochs_are_refused():
    network = Network((4, 3), seed=0)
    inputs, labels = np.zeros((2, 4)), np.array([0, 1])
    with pytest.raises(ValueError, match="batch_size must be at least 1"):
        train(network, inputs, labels, epochs=1, learning_rate=0.1, batch_size=0, progress=False)
    with pytest.raises(ValueError, match="epochs must be a positive integer"):
        train(network, inputs, labels, epochs=0, learning_rate=0.1, progress=False)
    with pytest.raises(ValueError, match="2 samples but 1 labels"):
        train(network, inputs, labels[:1], epochs=1, learning_rate=0.1, progress=False)


def test_a_schedule_that_turns_bad_is_refused_at_that_step():
    network = Network((4, 3), seed=0)
    inputs, labels = np.zeros((8, 4)), np.arange(8) % 3
    schedule = lambda progress: 0.1 if progress < 1.5 else -0.1  # noqa: E731
    with pytest.raises(ValueError, match=r"learning_rate must be a positive finite number; got -0\.1"):
        train(network, inputs, labels, epochs=3, learning_rate=schedule, batch_size=4, progress=False)


def test_an_epoch_is_timed_after_its_totals_came_back():
    """On a GPU the step's work is queued: the epoch has ended only once its loss and accuracy are back."""
    import time

    from nnlib.lesson03_training.training import Batches, LocalUpdate, Run, Settings, train_loop

    class SlowTotals(LocalUpdate):
        def sum_over_ranks(self, values):
            time.sleep(0.05)  # as a GPU finishing the epoch's queued work before float() returns
            return values

    rng = np.random.default_rng(0)
    inputs, labels = rng.random((20, 4)), rng.integers(0, 3, 20)
    settings = Settings(epochs=2, learning_rate=0.1, batch_size=10)
    history = train_loop(Run(Network((4, 3)), settings, Batches(20, 10, 0), SlowTotals()), inputs, labels)
    assert len(history.seconds) == 2 and min(history.seconds) >= 0.05
