"""Training: full-batch gradient descent (SGD whose batch is the whole training set) and mini-batch SGD, with momentum
or Adam (optimizers.py), in :func:`train_loop`, the series' one training loop. :func:`train` runs it in one process;
lesson 06 runs it on every rank, with its own way of combining the gradients (the ``sync``)::

    for every epoch:
        for every step of the plan (which rows, and the batch size to divide by):
            data      take this step's rows
            compute   the loss and its gradient (backpropagation)
            sync      combine the gradients and update (here: just the update)
        the epoch's loss and accuracy, summed over the ranks (here: one rank)

Hooks (:class:`Hook`) watch or extend the loop without changing it: progress lines here; the later lessons' hooks
(phase timing, checkpoints, deadlines) live in those lessons' folders."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import Callable

import numpy as np

from nnlib.lesson03_training.optimizers import SGD, Adam, check, problems

LESSON = 3


def add_to_sums(loss_sum, correct_sum, loss, correct, divide_by):
    """(loss_sum + loss * divide_by, correct_sum + correct): a step's share of its epoch's sums (one GPU kernel)."""
    return loss_sum + loss * divide_by, correct_sum + correct


def diverged(loss, where: str, learning_rate) -> FloatingPointError:
    """The error for a NaN or infinite loss: where it happened, and what to try."""
    return FloatingPointError(f"the loss became {loss} {where} (learning rate {learning_rate}); training diverged. "
                              f"Try a smaller learning rate, e.g. {learning_rate / 10:g}.")


@dataclass
class History:
    """Each epoch of a run: loss (mean cost over its batches), train_accuracy (of the samples as the batches went by),
    validation_accuracy (after it; empty without validation), seconds (its training time); and the run's steps."""

    loss: list = field(default_factory=list)
    train_accuracy: list = field(default_factory=list)
    validation_accuracy: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    steps: int = 0

    @property
    def epochs(self) -> int:
        return len(self.loss)


def batch_ranges(num_samples: int, batch_size: int):
    """(start, stop) of each batch within an epoch's order; the last batch may be smaller."""
    return [(start, min(start + batch_size, num_samples)) for start in range(0, num_samples, batch_size)]


def batches(num_samples: int, batch_size: int, rng):
    """Index arrays (host memory) of one epoch's batches: a permutation by ``rng`` cut by :func:`batch_ranges`."""
    order = rng.permutation(num_samples)
    return [order[start:stop] for start, stop in batch_ranges(num_samples, batch_size)]


@dataclass(frozen=True)
class Settings:
    """How to train: the same object for one process, for many ranks and for the batch job.

    learning_rate: a number, or a function of the progress in epochs (0.0, 0.25, ...) giving the rate
                   before every step (a schedule). batch_size: None for full-batch gradient descent, else
                   the (global) batch of mini-batch SGD. momentum: mu in [0, 1). seed: of the shuffling.
    optimizer:     "sgd" (momentum optional), "adam" or "adamw" (with beta1, beta2, eps; AdamW's weight_decay).
    """

    epochs: int
    learning_rate: float | Callable
    batch_size: int | None = None
    momentum: float = 0.0
    seed: int = 0
    optimizer: str = "sgd"
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def problems(self) -> list[str]:
        """Everything wrong with these settings (empty if nothing): the one place they are checked."""
        found = []
        if not is_whole(self.epochs) or self.epochs < 1:
            found.append(f"epochs must be a positive integer; got {self.epochs!r}")
        if self.batch_size is not None and (not is_whole(self.batch_size) or self.batch_size < 1):
            found.append(f"batch_size must be at least 1 (or None: the full batch); got {self.batch_size!r}")
        rate = 1.0 if callable(self.learning_rate) else self.learning_rate  # (a schedule's values: rate_at)
        found += problems(rate, self.momentum, self.beta1, self.beta2, self.eps, self.weight_decay, self.optimizer)
        if not is_whole(self.seed):
            found.append(f"seed must be a whole number; got {self.seed!r}")
        return found

    def rate_at(self, progress: float) -> float:
        """The learning rate at ``progress`` epochs (0.0, 0.25, ...); a schedule's, checked at every step."""
        if not callable(self.learning_rate):
            return self.learning_rate  # (checked once, with the settings or by the optimizer)
        rate = self.learning_rate(progress)
        check(problems(rate))  # (a bad schedule fails at its first bad step)
        return rate

    def optimizer_for(self, learning_rate: float):
        """A function (params, xp, pieces) -> the optimizer named here (optimizers.py), made for ``params`` (n,)."""
        sgd, adam = (self.momentum,), (self.beta1, self.beta2, self.eps, self.weight_decay)
        kind = (SGD, sgd) if self.optimizer == "sgd" else (Adam, adam)
        return lambda params, xp, pieces=(slice(None),): kind[0](params, learning_rate, *kind[1], xp=xp, pieces=pieces)

    @classmethod
    def from_keywords(cls, settings: Settings | None, keywords: dict, others=()) -> Settings:
        """``settings`` itself, or Settings(**keywords): train(..., epochs=3, learning_rate=0.1) works too."""
        known = [field.name for field in fields(cls)] + list(others)
        if set(keywords) - set(known):
            raise TypeError(f"unknown keywords {sorted(set(keywords) - set(known))}; they are {', '.join(known)}")
        if settings is not None and keywords:
            raise TypeError(f"give the settings as one Settings or as keywords, not both (got {sorted(keywords)})")
        return cls(**keywords) if settings is None else settings


def is_whole(value) -> bool:  # an integer, not a bool
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class Batches:
    """Which rows each step of an epoch trains on: ``epoch(e)`` -> [(rows, divide_by)]: all N rows shuffled by
    default_rng(seed), cut into batches of b (the last may be smaller), each divided by its length.
    Full-batch gradient descent (b None, or b >= N): one step, rows None (all of them), divide_by N."""

    name = "exact"  # the sequential run's batches (lesson 10's samplers have other names)

    def __init__(self, num_samples: int, batch_size: int | None, seed: int):
        self.num_samples = int(num_samples)
        self.batch_size = self.num_samples if batch_size is None else min(int(batch_size), self.num_samples)
        self.full_batch = self.batch_size >= self.num_samples
        self.rng = None if self.full_batch else np.random.default_rng(seed)

    def epoch(self, epoch: int) -> list:
        if self.full_batch:
            return [(None, self.num_samples)]
        return [(indices, len(indices)) for indices in batches(self.num_samples, self.batch_size, self.rng)]


class Hook:
    """Watches or extends the training loop: :func:`train_loop` calls each method at its moment (no-ops here)."""

    def begin(self, run) -> None:
        """Before the first step."""

    def begin_epoch(self, run) -> None:
        """Epoch ``run.epoch`` begins; its batches are not drawn yet."""

    def phase(self, run, name) -> None:
        """A phase of the step begins: "data", "compute", "communicate", "update"; None: the step ended."""

    def after_step(self, run) -> None:
        """After step ``run.step`` of epoch ``run.epoch`` (0-based); ``run.total_steps`` counts it."""

    def after_epoch(self, run) -> None:
        """After epoch ``run.epoch``, once its loss and accuracy are in ``run.history``."""


class ProgressLines(Hook):
    """Prints one line per epoch (``show``: on rank 0 only, in parallel): loss, accuracies, seconds."""

    def __init__(self, show: bool = True):
        self.show = show

    def after_epoch(self, run) -> None:
        history = run.history
        extra = f", validation accuracy {history.validation_accuracy[-1]:.4f}" if history.validation_accuracy else ""
        if self.show:
            print(f"epoch {run.epoch + 1}/{run.settings.epochs}: loss {history.loss[-1]:.4f}, training accuracy "
                  f"{history.train_accuracy[-1]:.4f}{extra}, {history.seconds[-1]:.2f} s", flush=True)


class LocalUpdate:
    """How one process combines its gradients (the loop's ``sync``): there is nothing to combine. Every sync (lesson
    06's combine the ranks') has: size (ranks), layer_done (None, or a gradient hook: called as backpropagation
    finishes each layer), optimizer(network, make): ``make(params, xp)`` for the part this rank updates, begin(run),
    step(run): communicate, then ``run.update``, sum_over_ranks(values), score(network, validation),
    raised_on_every_rank(error), and the run's state, whole (lesson 13's checkpoints): state_dict, load_state_dict."""

    size = 1
    layer_done = None  # nothing to start while backpropagation runs
    kept_between_steps = None  # what it keeps between steps beyond the optimizer (lesson 15's residuals): None
    compression = "none"  # of its messages (lesson 15's)

    def optimizer(self, network, make):
        return make(network.params, network.xp)

    def whole(self, part):
        """A vector of the optimizer's state, whole (collective where each rank keeps a part); part(): back."""
        return part

    def part(self, whole):
        return whole  # (this rank's part of a whole vector: here all of it)

    def state_dict(self, run) -> dict:
        """The run's state, whole: the network's and the optimizer's (None on a rank without one), by whole()."""
        return dict(network=run.network.state_dict(), optimizer=run.optimizer and run.optimizer.state_dict(self.whole))

    def load_state_dict(self, run, state: dict) -> None:
        """Take a whole ``state`` (as :meth:`state_dict` gives it); each rank keeps its part()."""
        run.network.load_state_dict(state["network"])
        if run.optimizer:
            run.optimizer.load_state_dict(state["optimizer"], self.part)

    def begin(self, run) -> None:
        pass  # nothing to agree on with other ranks

    def step(self, run) -> None:
        run.phase("update")
        run.update(run.network.params, run.network.grads)

    def sum_over_ranks(self, values: np.ndarray) -> np.ndarray:
        return values

    def score(self, network, validation) -> float:
        return network.accuracy(*validation)

    def raised_on_every_rank(self, error: BaseException) -> BaseException:
        return error


@dataclass
class Run:
    """Where a training run is, shared by :func:`train_loop` and its hooks. plan: :class:`Batches`; sync: how
    gradients are combined (:class:`LocalUpdate`; its step calls :meth:`update`); step: the next of ``epoch`` (a
    resumed run starts later); loss_sum, correct_sum: this epoch's so far."""

    network: object
    settings: Settings
    plan: Batches
    sync: object = field(default_factory=LocalUpdate)
    hooks: list = field(default_factory=list)
    history: History = field(default_factory=History)
    validation: tuple | None = None
    optimizer: object = None
    epoch: int = 0
    step: int = 0
    steps_in_epoch: int = 0
    total_steps: int = 0
    loss_sum: object = 0.0
    correct_sum: object = 0
    rate: float = 0.0
    scaler: object = None  # lesson 17's loss scaler: it may skip a step whose gradient overflowed

    def update(self, params, grads, comm=None) -> None:
        """The optimizer's step on ``params`` from ``grads``: all of them, or this rank's part (``comm``'s ranks hold
        the rest); or the scaler's, which may skip it: ``scaler.step(optimizer, params, grads, comm)``."""
        if self.scaler is None:
            self.optimizer.step(params, grads)
        else:
            self.scaler.step(self.optimizer, params, grads, comm)

    def phase(self, name) -> None:
        """Tell every hook that phase ``name`` begins (None: the step ended)."""
        for hook in self.hooks:
            hook.phase(self, name)


def train_loop(run: Run, inputs, labels) -> History:
    """Train ``run.network`` on this process's rows (inputs (N, n_0), labels (N,)), moved to its device once; return
    the history. The loss is checked after every step on the host in one process; otherwise once per epoch, after
    the sum over ranks, so that every rank stops together."""
    network, sync, settings, xp = run.network, run.sync, run.settings, run.network.xp
    inputs, labels = xp.asarray(inputs), xp.asarray(labels)
    run.optimizer = sync.optimizer(network, settings.optimizer_for(settings.rate_at(0.0)))
    for hook in run.hooks:
        hook.begin(run)
    sync.begin(run)
    while run.epoch < settings.epochs:
        began = time.perf_counter()
        for hook in run.hooks:
            hook.begin_epoch(run)
        steps = epoch_on_device(run.plan.epoch(run.epoch), inputs, labels, xp)
        run.steps_in_epoch = len(steps)
        if run.step == 0:  # (a run restored from a checkpoint may begin part-way, its sums restored)
            run.loss_sum, run.correct_sum = 0.0, 0
        for step in range(run.step, len(steps)):
            run.step, run.rate = step, settings.rate_at(run.epoch + step / len(steps))
            train_step(run, *steps[step])
        end_epoch(run, began)
    return run.history


def train_step(run: Run, inputs, labels, rows, divide_by: int) -> None:
    """One step: data, compute, then the sync's communicate and update; hooks hear of each phase."""
    network, xp = run.network, run.network.xp
    if run.optimizer is not None:
        run.optimizer.learning_rate = run.rate
    run.phase("data")
    if rows is not None:
        inputs, labels = xp.take(inputs, rows, axis=0), xp.take(labels, rows, axis=0)
    run.phase("compute")  # (a rank may hold none of a batch's rows: its share of the gradient is then 0)
    loss = network.loss_and_gradient(inputs, labels, normalizer=divide_by, check=False, on_device=xp is not np,
                                     on_layer_done=run.sync.layer_done)
    if run.sync.size == 1 and xp is np and not math.isfinite(loss):
        raise diverged(loss, f"at epoch {run.epoch + 1}, step {run.step + 1}", run.rate)
    run.loss_sum, run.correct_sum = network.fused(add_to_sums)(run.loss_sum, run.correct_sum, loss,
                                                               network.last_correct, divide_by)
    run.sync.step(run)
    run.phase(None)
    run.total_steps += 1
    run.history.steps += 1
    for hook in run.hooks:
        hook.after_step(run)


def end_epoch(run: Run, began: float) -> None:
    """Sum the epoch's loss and correct answers over the ranks, check the loss, record the epoch (begun ``began``)."""
    history, num_samples = run.history, run.plan.num_samples
    totals = run.sync.sum_over_ranks(np.array([float(run.loss_sum), float(run.correct_sum)]))  # one trip back
    history.seconds.append(time.perf_counter() - began)  # after float(): a GPU has finished the epoch's work
    loss = float(totals[0]) / num_samples
    if not math.isfinite(loss):
        where = f"in epoch {run.epoch + 1}" + ("" if run.network.xp is np else " (checked once per epoch on the GPU)")
        raise run.sync.raised_on_every_rank(diverged(loss, where, run.rate))
    history.loss.append(loss)
    history.train_accuracy.append(float(totals[1]) / num_samples)
    if run.validation is not None:
        history.validation_accuracy.append(run.sync.score(run.network, run.validation))
    for hook in run.hooks:
        hook.after_epoch(run)
    run.epoch, run.step = run.epoch + 1, 0


def epoch_on_device(steps: list, inputs, labels, xp) -> list:
    """Each step's (inputs, labels, rows, divide_by): on NumPy the data and the step's rows to take; on a GPU the
    epoch's rows gathered once, in the steps' order, and each step a slice of them (a view: no kernel, no wait)."""
    if xp is np or all(rows is None for rows, _ in steps):
        return [(inputs, labels, rows, divide_by) for rows, divide_by in steps]
    order = xp.asarray(np.concatenate([rows for rows, _ in steps]))  # one copy to the device, two gathers
    inputs, labels = xp.take(inputs, order, axis=0), xp.take(labels, order, axis=0)
    starts = np.cumsum([0] + [len(rows) for rows, _ in steps]).tolist()
    return [(inputs[a:b, ...], labels[a:b], None, divide_by) for (_, divide_by), a, b in zip(steps, starts, starts[1:])]


def train(network, inputs, labels, settings: Settings | None = None, *, validation=None, progress: bool = True,
          **keywords) -> History:
    """Train ``network`` in place and return its :class:`History`. inputs (N, n_0) floats, labels (N,) integers;
    ``settings`` a :class:`Settings`, or its fields as keywords (``train(network, inputs, labels, epochs=3,
    learning_rate=0.1, batch_size=32)``). ``validation=(inputs, labels)`` is scored after each epoch; ``progress``
    prints a line per epoch. Raises FloatingPointError as soon as the loss is NaN or infinite."""
    settings = Settings.from_keywords(settings, keywords)
    xp = network.xp
    inputs, labels = xp.asarray(inputs), xp.asarray(labels)
    validation = None if validation is None else (xp.asarray(validation[0]), xp.asarray(validation[1]))
    for rows, classes in [(inputs, labels)] + ([validation] if validation else []):
        network.check_inputs(rows)
        network.check_labels(classes, rows.shape[0])
    check(settings.problems())
    run = Run(network, settings, Batches(inputs.shape[0], settings.batch_size, settings.seed),
              hooks=[ProgressLines(progress)], validation=validation)
    return train_loop(run, inputs, labels)
