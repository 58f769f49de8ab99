"""Training: full-batch gradient descent and mini-batch SGD with optional momentum.

One step with learning rate eta and momentum mu, on the flat vectors:

    velocity <- mu * velocity - eta * grads
    params   <- params + velocity           (mu = 0: plain gradient descent)

Full-batch gradient descent is SGD whose batch is the whole training set: one
step per epoch.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .arrays import is_numpy, to_numpy

LESSON = 3



class SGD:
    """Stochastic gradient descent on a network's flat parameter vector, momentum optional."""

    def __init__(self, network, learning_rate: float, momentum: float = 0.0):
        check_learning_rate(learning_rate)
        check_momentum(momentum)
        self.network = network
        self.learning_rate = float(learning_rate)
        self.momentum = float(momentum)
        self.velocity = network.xp.zeros_like(network.params) if momentum else None

    def step(self) -> None:
        """Update ``network.params`` in place from ``network.grads``."""
        sgd_update(self.network.params, self.network.grads, self.velocity, self.learning_rate, self.momentum)

    def full_velocity(self, comm=None):
        """The velocity as a NumPy vector (None without momentum), for a checkpoint."""
        return None if self.velocity is None else to_numpy(self.velocity)

    def load_velocity(self, whole) -> None:
        """Take a velocity vector from a checkpoint."""
        if self.velocity is not None:
            self.velocity[...] = self.network.xp.asarray(whole)


def sgd_update(params, grads, velocity, learning_rate: float, momentum: float) -> None:
    """In place: velocity <- mu velocity - eta grads, params <- params + velocity (params -= eta grads if no velocity)."""
    if velocity is None:
        params -= learning_rate * grads
    else:
        velocity *= momentum
        velocity -= learning_rate * grads
        params += velocity


def check_momentum(momentum) -> None:
    """Raise ValueError unless 0 <= momentum < 1."""
    if not 0.0 <= momentum < 1.0:
        raise ValueError(f"momentum must be in [0, 1); got {momentum}")


def diverged(loss, where: str, learning_rate) -> FloatingPointError:
    """The error for a NaN or infinite loss: where it happened, and what to try."""
    return FloatingPointError(
        f"the loss became {loss} {where} (learning rate {learning_rate}); training diverged. "
        f"Try a smaller learning rate, e.g. {learning_rate / 10:g}."
    )


def as_schedule(learning_rate):
    """A function of training progress in epochs (0.0, 0.25, ...) returning a checked learning rate.

    ``learning_rate`` is a number (the same at every step) or such a function already; every
    value is checked to be a positive finite number, so a bad schedule fails at its first bad step.
    """
    if not callable(learning_rate):
        check_learning_rate(learning_rate)
        return lambda progress: learning_rate

    def checked(progress: float) -> float:
        rate = learning_rate(progress)
        check_learning_rate(rate)
        return rate

    return checked


def check_learning_rate(learning_rate) -> None:
    """Raise ValueError unless the learning rate is a positive finite number."""
    if not isinstance(learning_rate, (int, float)) or not math.isfinite(learning_rate) or learning_rate <= 0:
        raise ValueError(f"learning_rate must be a positive finite number; got {learning_rate!r}")


@dataclass
class History:
    """What happened in each epoch of a training run.

    loss: mean training cost over the epoch's batches; train_accuracy: the fraction
    of training samples classified right as the batches went by; validation_accuracy:
    on the validation set after the epoch (empty if none); seconds: training time of
    each epoch (evaluation excluded).
    """

    loss: list = field(default_factory=list)
    train_accuracy: list = field(default_factory=list)
    validation_accuracy: list = field(default_factory=list)
    seconds: list = field(default_factory=list)

    @property
    def epochs(self) -> int:
        return len(self.loss)

    @property
    def elapsed(self) -> np.ndarray:
        """Cumulative training seconds at the end of each epoch."""
        return np.cumsum(self.seconds)


def epoch_order(num_samples: int, rng) -> np.ndarray:
    """The order in which one epoch visits the samples: shuffled by rng, or 0..N-1 if rng is None."""
    return np.arange(num_samples) if rng is None else rng.permutation(num_samples)


def batch_ranges(num_samples: int, batch_size: int):
    """(start, stop) of each batch within an epoch's order; the last batch may be smaller."""
    return [(start, min(start + batch_size, num_samples)) for start in range(0, num_samples, batch_size)]


def batches(num_samples: int, batch_size: int, rng):
    """Index arrays (host memory) of one epoch's batches: :func:`epoch_order` cut by :func:`batch_ranges`."""
    order = epoch_order(num_samples, rng)
    return [order[start:stop] for start, stop in batch_ranges(num_samples, batch_size)]


def train(network, inputs, labels, *, epochs: int, learning_rate, batch_size=None,
          momentum: float = 0.0, seed: int = 0, validation=None, progress: bool = True) -> History:
    """Train ``network`` in place and return its :class:`History`.

    inputs (N, n_0) floats, labels (N,) integers. ``batch_size=None`` means full-batch
    gradient descent (one step per epoch); otherwise mini-batch SGD, reshuffled each
    epoch with numpy.random.default_rng(seed). ``learning_rate`` is a number, or a
    function of the training progress in epochs (0.0, 0.25, ..., 1.0, ...) evaluated before
    every step (a schedule: step decay, or a gradual warm-up). ``validation=(inputs, labels)`` is
    scored after each epoch. ``progress`` shows a tqdm bar over epochs.
    Raises FloatingPointError as soon as the loss is NaN or infinite.
    """
    from tqdm import tqdm

    xp = network.xp
    # The data moves to the network's device once (no copy for NumPy) and stays there.
    inputs, labels = xp.asarray(inputs), xp.asarray(labels)
    network.check_inputs(inputs)
    network.check_labels(labels, inputs.shape[0])
    if validation is not None:
        validation = (xp.asarray(validation[0]), xp.asarray(validation[1]))
        network.check_inputs(validation[0])
        network.check_labels(validation[1], validation[0].shape[0])
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive integer; got {epochs!r}")
    num_samples = inputs.shape[0]
    batch_size = num_samples if batch_size is None else int(batch_size)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1; got {batch_size}")
    schedule = as_schedule(learning_rate)
    optimizer = SGD(network, schedule(0.0), momentum)
    on_host = is_numpy(xp)  # elsewhere (a GPU) the loss stays on the device until the epoch ends
    full_batch = batch_size >= num_samples
    rng = None if full_batch else np.random.default_rng(seed)
    history = History()

    bar = tqdm(range(epochs), disable=not progress, unit="epoch")
    for epoch in bar:
        start = time.perf_counter()
        total_loss, correct = 0.0, 0
        # The epoch's shuffled order goes to the device in one copy; each batch is a slice of it.
        # (A copy per step would make the CPU wait for the GPU at every step.)
        order = None if full_batch else xp.asarray(epoch_order(num_samples, rng))
        epoch_batches = batch_ranges(num_samples, batch_size)
        for step, (begin, end) in enumerate(epoch_batches):
            optimizer.learning_rate = rate = schedule(epoch + step / len(epoch_batches))
            if full_batch:
                batch_inputs, batch_labels = inputs, labels
            else:
                indices = order[begin:end]
                batch_inputs, batch_labels = xp.take(inputs, indices, axis=0), xp.take(labels, indices, axis=0)
            loss = network.loss_and_gradient(batch_inputs, batch_labels, check=False, on_device=not on_host)
            if on_host and not math.isfinite(loss):
                raise diverged(loss, f"at epoch {epoch + 1}, step {step + 1}", rate)
            optimizer.step()
            total_loss += loss * batch_inputs.shape[0]
            correct += network.last_correct
        total_loss, correct = float(total_loss), int(correct)  # the epoch's one trip back from a GPU
        history.seconds.append(time.perf_counter() - start)
        if not math.isfinite(total_loss):  # only reached on a GPU: the host checked every step
            raise diverged(total_loss, f"in epoch {epoch + 1} (checked once per epoch on the GPU)", rate)
        history.loss.append(total_loss / num_samples)
        history.train_accuracy.append(correct / num_samples)
        if validation is not None:
            history.validation_accuracy.append(network.accuracy(*validation))
        if progress:
            postfix = {"loss": f"{history.loss[-1]:.4f}"}
            if validation is not None:
                postfix["val"] = f"{history.validation_accuracy[-1]:.4f}"
            bar.set_postfix(postfix)
    return history
