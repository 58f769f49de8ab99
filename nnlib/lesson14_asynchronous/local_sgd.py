"""Local SGD and DiLoCo: every rank takes H steps alone, then the ranks average what they changed.

Data parallelism talks at every step; local SGD (Stich 2019; Lin et al. 2020) and DiLoCo (Douillard et al. 2023)
once per *round* of H steps. Every rank starts the round from the same parameters x (n,), the *anchor*, takes H
inner steps on its own batches (the run's optimizer, each rank with its own state: SGD's velocity, Adam's
moments), then one Allreduce of n numbers and the outer step, the same on every rank::

    inner, on rank r alone:   x_r <- x_r - eta P g_r          (H times; momentum as in lesson 03)
    outer gradient:           D = (1 / P) sum_r (x - x_r)     (one Allreduce)
    average (local SGD):      x <- x - eta_out D              (eta_out = 1: the mean of the x_r)
    nesterov (DiLoCo):        v <- mu_out v + D;   x <- x - eta_out (D + mu_out v)
    every rank goes on from x

g_r is rank r's part of the global batch gradient, divided by the global batch B as lesson 06's loop computes it;
P g_r is the gradient of rank r's own batch of B / P samples (exactly, where B divides). With H = 1, ``average``
and eta_out = 1 the outer step is x - eta sum_r g_r: synchronous data parallelism (with momentum too: the ranks'
mean velocity follows the synchronous one) with lesson 10's per-rank sampler (PerRankBatches), each rank drawing
its own batches. The tests check that equality; H > 1 is the experiment.

A round ends after H steps, and at the end of every epoch, so that each epoch ends with one model on
every rank (the one scored and saved). An epoch of S steps then makes ceil(S / H) Allreduces of the n
parameters instead of S. DiLoCo's outer settings: eta_out = 0.7, mu_out = 0.9.
"""

from __future__ import annotations

from functools import partial

from mpi4py import MPI

from nnlib.lesson03_training.training import is_whole
from nnlib.lesson06_data_parallel.data_parallel import DataParallel

LESSON = 14

DEFAULT_OUTER_LEARNING_RATE = {"average": 1.0, "nesterov": 0.7}  # the outer optimizers: plain averaging; DiLoCo
DILOCO_MOMENTUM = 0.9


def check_local_sgd(local_steps, outer: str, outer_learning_rate, outer_momentum,
                    names=("the local steps H", "the outer learning rate")) -> list[str]:
    """What is wrong with these settings (an empty list if nothing), naming H and the outer rate as ``names`` say;
    the same verdict on every rank."""
    problems = []
    if not is_whole(local_steps) or local_steps < 1:
        problems.append(f"{names[0]} must be a whole number, 1 or more; got {local_steps!r}")
    if outer not in DEFAULT_OUTER_LEARNING_RATE:
        problems.append(f"the outer optimizer must be one of {', '.join(DEFAULT_OUTER_LEARNING_RATE)}; got {outer!r}")
    if outer_learning_rate is not None and not (isinstance(outer_learning_rate, (int, float))
                                                and 0 < outer_learning_rate < float("inf")):
        problems.append(f"{names[1]} must be a positive number; got {outer_learning_rate!r}")
    if not 0 <= outer_momentum < 1:
        problems.append(f"the outer momentum must be in [0, 1); got {outer_momentum!r}")
    return problems


def outer_step(anchor, outer_gradient, velocity, learning_rate: float, momentum: float) -> None:
    """In place, the outer optimizer's step on the anchor x (n,) from D (n,) = mean_r (x - x_r).

    velocity None (average): x <- x - eta D. Else (nesterov): v <- mu v + D, x <- x - eta (D + mu v).
    """
    if velocity is None:
        anchor -= learning_rate * outer_gradient
        return
    velocity *= momentum
    velocity += outer_gradient
    anchor -= learning_rate * (outer_gradient + momentum * velocity)


class LocalSGD(DataParallel):
    """Local SGD (``outer="average"``) or DiLoCo (``"nesterov"``) as data parallelism's sync: see the module.

    local_steps: H; outer_learning_rate: eta_out (None: 1 for average, 0.7 for nesterov); outer_momentum: mu_out.
    """

    def __init__(self, comm, network, local_steps: int, outer: str = "average", outer_learning_rate=None,
                 outer_momentum: float = DILOCO_MOMENTUM):
        super().__init__(comm, network)
        problems = check_local_sgd(local_steps, outer, outer_learning_rate, outer_momentum)
        if problems:
            raise ValueError("; ".join(problems))
        self.local_steps, self.outer, self.outer_momentum = int(local_steps), outer, float(outer_momentum)
        self.outer_learning_rate = float(outer_learning_rate or DEFAULT_OUTER_LEARNING_RATE[outer])
        kind = "DiLoCo" if outer == "nesterov" else "local SGD"
        self.name = f"{kind} (H = {self.local_steps}, outer rate {self.outer_learning_rate:g})"
        self.kept_between_steps = "local SGD's anchor, outer momentum and each rank's own optimizer state"
        self.anchor, self.velocity, self.steps_in_round, self.rounds = None, None, 0, 0

    def begin(self, run) -> None:
        super().begin(run)  # every rank from rank 0's weights
        self.anchor = self.network.params.copy()
        self.velocity = self.network.xp.zeros_like(self.anchor) if self.outer == "nesterov" else None

    def step(self, run) -> None:
        """An inner step on this rank's own gradient; the round's end after H of them or at the epoch's end."""
        run.phase("update")
        self.network.grads *= self.size  # P g_r: this rank's own batch's gradient
        run.update(self.network.params, self.network.grads)
        self.steps_in_round += 1
        if self.steps_in_round == self.local_steps or run.step == run.steps_in_epoch - 1:
            self.end_round(run)

    def end_round(self, run) -> None:
        """One Allreduce of the parameter changes, then the outer step; every rank goes on from the new anchor."""
        run.phase("communicate")
        outer_gradient = self.anchor - self.network.params  # x - x_r
        self.comm.Allreduce(MPI.IN_PLACE, outer_gradient, op=MPI.SUM)
        run.phase("update")
        outer_gradient /= self.size
        outer_step(self.anchor, outer_gradient, self.velocity, self.outer_learning_rate, self.outer_momentum)
        self.network.params[...] = self.anchor
        self.steps_in_round, self.rounds = 0, self.rounds + 1


def local_sgd(local_steps: int, outer: str = "average", outer_learning_rate=None, outer_momentum=DILOCO_MOMENTUM):
    """The strategy ``train_parallel`` takes: local SGD (``outer="average"``) or DiLoCo (``"nesterov"``) with
    H = ``local_steps``; a function of (comm, network). Use it with ``batches=PerRankBatches``."""
    return partial(LocalSGD, local_steps=local_steps, outer=outer, outer_learning_rate=outer_learning_rate,
                   outer_momentum=outer_momentum)
