"""Data-parallel training with MPI: every rank holds a shard of the data and a full copy of the network.

It is lesson 03's training loop (``train_loop``), run on every rank at once. One step: 1. **data**: the samples
of the global batch that this rank holds; 2. **compute**: forward and backward on them, dividing by the *global*
batch size, so the ranks' gradients add up to exactly the sequential batch gradient (whatever the shard sizes);
3. **communicate** and **update**: the way the gradients are combined (the loop's ``sync``, the one thing that
differs from one process): :class:`ParameterServer`, :class:`ReduceBroadcast` or :class:`Allreduce`.

Every rank draws the sequential run's seeded permutation of all N samples, so global batch k holds the same samples
for any number of ranks; each rank computes the part of it in its shard (:class:`ShardBatches`). Later lessons'
syncs and hooks plug in as ``train_parallel(..., strategy=..., hooks=[...])``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from nnlib.lesson03_training.training import (Batches, History, Hook, LocalUpdate, ProgressLines, Run, Settings,
                                              train_loop)
from nnlib.lesson04_collectives import collectives
from nnlib.lesson04_collectives.collectives import fail_together, raised_on_every_rank, require_same_on_every_rank

LESSON = 6

PHASES = ("data", "compute", "communicate", "update")


@dataclass
class ParallelHistory(History):
    """History, and where this rank's time went: phase_seconds {phase: seconds}, the first steps' timeline."""

    phase_seconds: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    timeline: list = field(default_factory=list)


def shard(comm, inputs, labels, root: int = 0):
    """Scatter (inputs, labels) from ``root`` (other ranks pass None) in near-equal blocks of rows: (local_inputs,
    local_labels, start), this rank's rows and where they begin in the whole."""
    message = None
    if comm.rank == root and len(inputs) != len(labels):
        message = f"{len(inputs)} inputs but {len(labels)} labels on rank {root}; they must match"
    elif comm.rank == root and len(inputs) < comm.size:
        message = (f"{comm.size} ranks but only {len(inputs)} samples: every rank needs at least one. "
                   "Use fewer ranks or more data.")
    fail_together(comm, message)
    local_inputs = collectives.scatter_rows(comm, inputs, root)
    local_labels = collectives.scatter_rows(comm, labels, root)
    total = comm.bcast(len(inputs) if comm.rank == root else None, root=root)
    start = collectives.split_evenly(total, comm.size)[1][comm.rank]
    return local_inputs, local_labels, start


class ShardBatches(Batches):
    """The sequential run's batches, each cut to this rank's rows [start, stop): ``epoch(e)`` -> [(rows in the shard,
    possibly none, the whole global batch's size)]."""

    def __init__(self, shard_sizes, rank: int, settings: Settings):
        super().__init__(sum(shard_sizes), settings.batch_size, settings.seed)
        self.start, self.stop = sum(shard_sizes[:rank]), sum(shard_sizes[:rank + 1])

    def epoch(self, epoch: int) -> list:
        if self.full_batch:
            return [(None, self.num_samples)]  # all of this rank's rows
        return [(indices[(indices >= self.start) & (indices < self.stop)] - self.start, divide_by)
                for indices, divide_by in super().epoch(epoch)]


class DataParallel(LocalUpdate):
    """What every way of combining the ranks' gradients (the loop's ``sync``) shares: lesson 03's LocalUpdate (each
    rank's optimizer on its whole copy), but every rank starts from rank 0's weights, sums the epoch's loss over the
    ranks, hears rank 0's validation score. A subclass's :meth:`step` communicates and updates."""

    name = "data parallel"

    def __init__(self, comm, network):
        self.comm, self.network, self.size, self.rank = comm, network, comm.size, comm.rank

    def begin(self, run) -> None:
        self.comm.Bcast(self.network.params, root=0)  # everyone starts from rank 0's weights

    def sum_over_ranks(self, values: np.ndarray) -> np.ndarray:
        return collectives.allreduce_sum(self.comm, values)

    def score(self, network, validation) -> float:
        """Every rank holds the same network: rank 0 scores it for all."""
        return self.comm.bcast(network.accuracy(*validation) if self.rank == 0 else None, root=0)

    def raised_on_every_rank(self, error: BaseException) -> BaseException:
        return raised_on_every_rank(error)


class RootUpdates(DataParallel):
    """Rank 0 alone updates (and keeps the optimizer's state), then broadcasts the parameters. A subclass
    says how the gradients reach rank 0 (:meth:`to_root`) and are summed there (:meth:`sum_on_root`)."""

    def optimizer(self, network, make):
        return make(network.params, network.xp) if self.rank == 0 else None

    def step(self, run) -> None:
        run.phase("communicate")
        self.to_root(self.network.grads)
        run.phase("update")
        if self.rank == 0:
            self.sum_on_root(self.network.grads)
            run.update(self.network.params, self.network.grads)
        run.phase("communicate")
        self.comm.Bcast(self.network.params, root=0)


class ParameterServer(RootUpdates):
    """Rank 0 gathers every rank's gradient g_r and sums them: its links carry P + 1 times the others'."""

    name = "parameter_server"

    def __init__(self, comm, network):
        super().__init__(comm, network)
        shape = (self.size, network.num_params)  # one row per rank, on rank 0
        self.gathered = network.xp.zeros(shape, dtype=network.params.dtype) if self.rank == 0 else None

    def to_root(self, grads) -> None:
        self.comm.Gather(grads, self.gathered, root=0)

    def sum_on_root(self, grads) -> None:
        grads[...] = self.network.xp.sum(self.gathered, axis=0)  # sum_r g_r


class ReduceBroadcast(RootUpdates):
    """MPI's Reduce sums the gradients on the way to rank 0 (in place there)."""

    name = "reduce_broadcast"

    def to_root(self, grads) -> None:
        on_root = self.rank == 0
        self.comm.Reduce(MPI.IN_PLACE if on_root else grads, grads if on_root else None, op=MPI.SUM, root=0)

    def sum_on_root(self, grads) -> None:
        pass  # the Reduce has summed them


class Allreduce(DataParallel):
    """One in-place Allreduce of the flat gradient: every rank gets sum_r g_r and takes the same step."""

    name = "allreduce"

    def step(self, run) -> None:
        run.phase("communicate")
        self.comm.Allreduce(MPI.IN_PLACE, self.network.grads, op=MPI.SUM)
        run.phase("update")
        run.update(self.network.params, self.network.grads)


STRATEGIES = {"parameter_server": ParameterServer, "reduce_broadcast": ReduceBroadcast, "allreduce": Allreduce}


class EveryStep(Hook):
    """Calls ``function(epoch, step, total_steps)`` after every step (``on_step``: to inject faults, for one)."""

    def __init__(self, function):
        self.function = function

    def after_step(self, run) -> None:
        self.function(run.epoch, run.step, run.total_steps)


class PhaseTimer(Hook):
    """Adds up each phase's seconds on this rank (history.phase_seconds) and keeps the timeline
    (step, phase, start, end) of the first ``timeline_steps`` steps, in seconds since the run began."""

    def __init__(self, timeline_steps: int = 0):
        self.timeline_steps, self.open, self.began, self.zero = timeline_steps, None, 0.0, 0.0

    def begin(self, run) -> None:
        self.zero = time.perf_counter()

    def phase(self, run, name) -> None:
        now = time.perf_counter()
        if self.open is not None:
            run.history.phase_seconds[self.open] += now - self.began
            if run.history.steps < self.timeline_steps:
                run.history.timeline.append((run.history.steps, self.open, self.began - self.zero, now - self.zero))
        self.open, self.began = name, now


def make_sync(comm, network, strategy):
    """The sync of ``strategy`` (a name of STRATEGIES, or a function of (comm, network)), or a problem."""
    if isinstance(strategy, str) and strategy not in STRATEGIES:
        return None, f"strategy must be one of {', '.join(STRATEGIES)} or a class; got {strategy!r}"
    strategy = STRATEGIES.get(strategy, strategy) if isinstance(strategy, str) else strategy
    try:
        return strategy(comm, network), None
    except Exception as problem:  # (on some ranks only, maybe: fail_together makes it every rank's verdict)
        return None, f"{type(problem).__name__}: {problem}"


def check_run(comm, network, local_inputs, local_labels, num_samples: int, settings: Settings, validation) -> list:
    """Every check of a data-parallel run's arguments, as a list of problems (this rank's)."""
    problems = settings.problems()
    if num_samples < comm.size:
        problems.append(f"{num_samples} samples on {comm.size} ranks: every rank needs at least one; use fewer ranks")
    if settings.batch_size is not None and settings.batch_size < comm.size:
        problems.append(f"the global batch ({settings.batch_size}) is smaller than the number of ranks ({comm.size}): "
                        "each rank needs samples to work on; use a batch of at least one sample per rank")
    if local_inputs.shape[0] != local_labels.shape[0]:
        problems.append(f"rank {comm.rank} has {local_inputs.shape[0]} inputs but {local_labels.shape[0]} labels")
    try:
        network.check_inputs(local_inputs)
        if validation is not None:
            network.check_inputs(validation[0])
            network.check_labels(validation[1], validation[0].shape[0])
    except ValueError as error:
        problems.append(str(error))
    return problems


def agree_on_the_run(comm, network, settings: Settings, sync, options: dict, num_samples: int, start: int, rows: int):
    """The same verdict on every rank (the same network, settings, strategy; shards that tile N): the shards' sizes."""
    require_same_on_every_rank(comm, "the network (layer sizes, output, dtype)",
                               (network.layer_sizes, network.output, str(network.params.dtype)))
    learning_rate = "a schedule" if callable(settings.learning_rate) else settings.learning_rate
    run = dict(vars(settings), learning_rate=learning_rate, samples=num_samples, strategy=sync.name,
               batches=getattr(options["batches"], "__name__", None), validation=options["validation"] is not None)
    require_same_on_every_rank(comm, "the training settings", run)
    shard_sizes, starts = comm.allgather(rows), comm.allgather(int(start))
    expected_starts = [int(offset) for offset in collectives.offsets(shard_sizes)]
    if sum(shard_sizes) != num_samples or starts != expected_starts:  # the same verdict on every rank
        raise raised_on_every_rank(ValueError(
            f"the shards do not tile the {num_samples} samples: rows per rank {shard_sizes}, "
            f"starts {starts} (expected {expected_starts}); shard the data with nnlib.lesson06_data_parallel.shard"))
    return shard_sizes


#: What train_parallel takes besides the settings, with defaults. strategy: a name of STRATEGIES, or a class making
#: the sync from (comm, network) (lesson 10's ZeRO); batches: a class making the plan from (shard_sizes, rank,
#: settings), None: ShardBatches; validation: (inputs, labels), on every rank; progress: rank 0 prints a line per
#: epoch; timeline_steps: the steps whose phases are kept; on_step: (epoch, step, total_steps) -> None, after every
#: step; hooks: more hooks; scaler: lesson 17's loss scaler (Run.scaler).
OPTIONS = dict(strategy="allreduce", batches=None, validation=None, progress=False, timeline_steps=0, on_step=None,
               hooks=(), scaler=None)


def train_parallel(comm, network, local_inputs, local_labels, *, num_samples: int, start: int,
                   settings: Settings | None = None, **keywords) -> ParallelHistory:
    """Data-parallel training of ``network`` (a full copy on every rank) on this rank's rows [start, start + len) of
    the N = num_samples samples (:func:`shard`). ``settings``: a Settings, or its fields as keywords (as lesson 03's
    train); the others: :data:`OPTIONS`. Every rank returns the history, or raises the same ValueError."""
    options = {name: keywords.pop(name, default) for name, default in OPTIONS.items()}
    settings = Settings.from_keywords(settings, keywords, others=OPTIONS)
    sync, problem = make_sync(comm, network, options["strategy"])
    if options["scaler"] is not None and isinstance(sync, RootUpdates):  # (its verdict would be rank 0's alone)
        problem = f"a loss scaler needs every rank to update (allreduce, ZeRO, FSDP); {sync.name} updates on rank 0"
    validation = None if options["validation"] is None else tuple(map(network.xp.asarray, options["validation"]))
    problems = check_run(comm, network, local_inputs, local_labels, num_samples, settings, validation)
    fail_together(comm, "; ".join(problems + ([problem] if problem else [])) or None)
    shard_sizes = agree_on_the_run(comm, network, settings, sync, options, num_samples, start, local_inputs.shape[0])
    plan = (options["batches"] or ShardBatches)(shard_sizes, comm.rank, settings)
    hooks = [*([EveryStep(options["on_step"])] if options["on_step"] else []), *options["hooks"],
             PhaseTimer(options["timeline_steps"]), ProgressLines(options["progress"] and comm.rank == 0)]
    run = Run(network, settings, plan, sync, hooks, ParallelHistory(), validation, scaler=options["scaler"])
    return train_loop(run, local_inputs, local_labels)

