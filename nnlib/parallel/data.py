"""Data-parallel training with MPI: every rank holds a shard of the data and a full copy of the network.

One step, on every rank at once:

1. **data**: take the samples of the global batch that this rank holds;
2. **compute**: forward and backward on them, dividing by the *global* batch size, so the
   ranks' gradients add up to exactly the sequential batch gradient (whatever the shard sizes);
3. **communicate** and **update**, by one of these strategies:

   ``parameter_server``  Gather every rank's gradient on rank 0, which sums them, updates,
                         and broadcasts the new parameters (what the seed scripts do);
   ``reduce_broadcast``  Reduce (sum) the gradients onto rank 0, which updates and
                         broadcasts the parameters (one seed's variant);
   ``allreduce``         one in-place Allreduce of the flat gradient vector: every rank gets
                         the sum and applies the same update to its own copy (one message);
   ``zero``              ZeRO stages 1-2 (nnlib.parallel.zero): reduce-scatter the gradients, each rank
                         updates only its 1/P slice (and keeps only that slice's momentum),
                         allgather the parameters (the two halves of a ring Allreduce);
   ``overlap``           allreduce, but each bucket of layers is sent (Iallreduce) as soon as
                         backpropagation has produced it (nnlib.parallel.overlap, PyTorch DDP's design).

Same steps as the sequential run: every rank draws the same seeded permutation of all N
samples that :func:`nnlib.training.train` draws, so global batch k holds the same samples
for any number of ranks; each rank computes the part of it that falls in its shard.

The data is sharded with Scatterv (:func:`shard`), correct when N does not divide by the
number of ranks; the initial weights are broadcast from rank 0.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..arrays import is_numpy, to_numpy
from ..backend import cuda_aware_mpi, synchronizer
from ..checkpoint import Checkpoint, CheckpointError, CheckpointFolder, mismatches
from ..compression import Compressor, check_method
from ..training import SGD, History, as_schedule
from ..watchdog import watch
from ..collectives import fail_together, raised_on_every_rank, require_same_on_every_rank
from .overlap import BucketedAllreduce
from .sampling import SAMPLERS, exact_plan, per_rank_plan
from .zero import ShardedSGD

LESSON = 5


STRATEGIES = ("parameter_server", "reduce_broadcast", "allreduce", "zero", "overlap")
# lesson 05's three; lesson 08 adds "zero" (nnlib.parallel.zero) and "overlap" (nnlib.parallel.overlap)
PHASES = ("data", "compute", "communicate", "update")
HISTORY_FIELDS = ("loss", "train_accuracy", "validation_accuracy", "seconds")  # what a checkpoint keeps


@dataclass
class ParallelHistory(History):
    """History of a data-parallel run, plus where each rank's time went.

    phase_seconds: {phase: seconds summed over the run} on this rank, for data, compute,
                   communicate and update (see module docstring).
    timeline:      per step, (phase, start, end) seconds since the run began, for the
                   first ``timeline_steps`` steps (for drawing who waits for whom).
    """

    phase_seconds: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    timeline: list = field(default_factory=list)
    steps: int = 0


class Messenger:
    """Hands the network's buffers to MPI, wherever they live.

    NumPy arrays, or GPU arrays with a CUDA-aware MPI, go to MPI as they are (GPU work is
    synchronised first, so MPI never reads a half-written buffer). Other arrays (GPU arrays
    with an ordinary MPI) are *staged*: copied to host memory, communicated, copied back.
    """

    def __init__(self, xp, cuda_aware=None):
        self.xp = xp
        on_gpu = hasattr(xp, "cuda")
        self.direct = is_numpy(xp) or (on_gpu and (cuda_aware_mpi() if cuda_aware is None else cuda_aware))
        self.synchronise = synchronizer(xp)

    def outgoing(self, array):
        """The buffer to give MPI for ``array``: itself, or a host copy with its values."""
        if self.direct:
            self.synchronise()  # a GPU must finish writing the buffer before MPI reads it
            return array
        return to_numpy(array)

    def incoming(self, buffer, array) -> None:
        """After MPI wrote into ``buffer`` (from :meth:`outgoing`), make ``array`` hold it."""
        if buffer is not array:
            array[...] = self.xp.asarray(buffer)

    def in_place(self, array, collective) -> None:
        """Run ``collective(buffer)`` (e.g. an in-place Allreduce or a Bcast) on ``array``, wherever it lives."""
        buffer = self.outgoing(array)
        collective(buffer)
        self.incoming(buffer, array)


def shard(comm, inputs, labels, root: int = 0):
    """Scatter (inputs, labels) from ``root`` into near-equal blocks of rows, one per rank.

    Other ranks pass None. Returns (local_inputs, local_labels, start): this rank's rows
    and where they begin in the full dataset.
    """
    if comm.rank == root:
        message = None
        if len(inputs) != len(labels):
            message = f"{len(inputs)} inputs but {len(labels)} labels on rank {root}; they must match"
        elif len(inputs) < comm.size:
            message = (f"{comm.size} ranks but only {len(inputs)} samples: every rank needs at least one. "
                       "Use fewer ranks or more data.")
    else:
        message = None
    fail_together(comm, message)
    local_inputs = collectives.scatter_rows(comm, inputs, root)
    local_labels = collectives.scatter_rows(comm, labels, root)
    total = comm.bcast(len(inputs) if comm.rank == root else None, root=root)
    start, _ = collectives.row_range(total, comm.size, comm.rank)
    return local_inputs, local_labels, start


def train_parallel(comm, network, local_inputs, local_labels, *, num_samples: int, start: int,
                   epochs: int, learning_rate, batch_size=None, momentum: float = 0.0, seed: int = 0,
                   strategy: str = "allreduce", validation=None, progress: bool = False,
                   timeline_steps: int = 0, cuda_aware=None, timeout=None, checkpoints=None,
                   resume: bool = False, on_step=None, sampler: str = "exact", compression: str = "none",
                   k: int | None = None) -> ParallelHistory:
    """Data-parallel training of ``network`` (a full copy on every rank) on sharded data.

    local_inputs, local_labels: this rank's rows [start, start + len) of the N = num_samples
    training samples (see :func:`shard`). Other arguments as in nnlib.training.train, plus
    ``strategy`` (one of STRATEGIES). Every rank returns the history; loss and accuracy are
    summed over ranks once per epoch. The loss is checked for NaN/inf once per epoch, on all
    ranks together, so that a diverging run stops everywhere at once.

    Faults (see nnlib.watchdog): every collective runs on the run's own duplicate of ``comm``
    under a deadline of ``timeout`` seconds (None: nnlib.watchdog.default_timeout()). A rank
    that raises tells the others, which stop at once; a rank that never arrives is named in a
    CollectiveTimeout on the others at the deadline.

    Checkpoints (see nnlib.checkpoint): ``checkpoints=CheckpointFolder(folder, every=steps)``
    writes one (from rank 0) every ``every`` steps, or at the end of every epoch; with
    ``resume=True`` the run continues from the newest one there, exactly: with the same number
    of ranks the final parameters are bit-identical to an uninterrupted run. ``on_step(epoch,
    step, total_steps)``, if given, is called after every step (lessons and tests use it to
    inject a fault).

    ``sampler``: "exact" (the sequential run's batches; the default) or "per_rank" (each rank
    draws its share of every batch from its own shard, like PyTorch's DistributedSampler): see
    nnlib.parallel.sampling.

    ``compression`` (strategy "allreduce" only): "float16", "bfloat16" or "topk" (with ``k``, and
    error feedback) gradients, summed through Allgather; "none" (the default) is the plain Allreduce.
    See nnlib.compression.

    With a GPU network the shards move to the GPU once and stay there; gradients and parameters
    go through host memory for MPI unless the MPI is CUDA-aware (``cuda_aware=None``: detect,
    see nnlib.backend.cuda_aware_mpi; True or False: decide).
    """
    comm = watch(comm, timeout)  # the run's own communicator; every collective below has a deadline
    with comm.guard():  # if this rank raises, the others hear of it at once
        return _train(comm, network, local_inputs, local_labels, num_samples=num_samples, start=start,
                      epochs=epochs, learning_rate=learning_rate, batch_size=batch_size, momentum=momentum,
                      seed=seed, strategy=strategy, validation=validation, progress=progress,
                      timeline_steps=timeline_steps, cuda_aware=cuda_aware, checkpoints=checkpoints,
                      resume=resume, on_step=on_step, sampler=sampler, compression=compression, k=k)


def run_settings(network, num_samples, batch_size, momentum, seed, learning_rate) -> dict:
    """What a checkpoint must match to be resumed: the network and the training settings."""
    return dict(layer_sizes=list(network.layer_sizes), output=network.output, dtype=str(network.params.dtype),
                num_samples=int(num_samples), batch_size=None if batch_size is None else int(batch_size),
                momentum=float(momentum), seed=int(seed),
                learning_rate="a schedule" if callable(learning_rate) else float(learning_rate))


def _check(comm, network, local_inputs, local_labels, num_samples, start, epochs, learning_rate, batch_size,
           momentum, seed, strategy, sampler, compression="none", k=None, checkpoints=None):
    """Every check of train_parallel's arguments, with one verdict on every rank.

    Returns the learning-rate schedule and every rank's shard size.
    """
    size, rank = comm.size, comm.rank
    problems = []
    schedule = None
    if strategy not in STRATEGIES:
        problems.append(f"strategy must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    if sampler not in SAMPLERS:
        problems.append(f"sampler must be one of {', '.join(SAMPLERS)}; got {sampler!r}")
    problems += check_method(compression, k, network.num_params)
    if compression != "none" and strategy != "allreduce":
        problems.append(f"compressed gradients go with the allreduce strategy; got strategy {strategy!r}")
    if compression == "topk" and checkpoints is not None:
        problems.append("checkpoints do not keep top-k compression's residuals: run top-k without checkpoints")
    if num_samples < size:
        problems.append(f"{size} ranks but only {num_samples} samples: every rank needs at least one")
    if batch_size is not None and batch_size < size:
        problems.append(f"the global batch ({batch_size}) is smaller than the number of ranks ({size}): "
                        "each rank needs samples to work on; use a batch of at least one sample per rank")
    if local_inputs.shape[0] != local_labels.shape[0]:
        problems.append(f"rank {rank} has {local_inputs.shape[0]} inputs but {local_labels.shape[0]} labels")
    try:
        schedule = as_schedule(learning_rate)
        network.check_inputs(local_inputs)
    except ValueError as error:
        problems.append(str(error))
    fail_together(comm, "; ".join(problems) or None)
    require_same_on_every_rank(comm, "the network (layer sizes, output, dtype)",
          (network.layer_sizes, network.output, str(network.params.dtype)))
    require_same_on_every_rank(comm, "the training settings (samples, epochs, batch, momentum, seed, strategy, sampler, compression, k)",
          (num_samples, epochs, batch_size, momentum, seed, strategy, sampler, compression, k))
    shard_sizes, starts = comm.allgather(local_inputs.shape[0]), comm.allgather(int(start))
    expected_starts = [int(offset) for offset in collectives.offsets(shard_sizes)]
    if sum(shard_sizes) != num_samples or starts != expected_starts:  # the same verdict on every rank
        raise raised_on_every_rank(ValueError(
            f"the shards do not tile the {num_samples} samples: rows per rank {shard_sizes}, "
            f"starts {starts} (expected {expected_starts}); shard the data with nnlib.parallel.shard"
        ))
    return schedule, shard_sizes


def _resume_point(comm, checkpoints, resume, settings, epochs):
    """Rank 0 prepares the checkpoint folder and, to resume, loads the newest checkpoint there.

    One verdict on every rank. Returns the checkpoint on rank 0 (None elsewhere, or when not resuming)
    and its small fields on every rank (or None).
    """
    problem, saved = None, None
    if resume and checkpoints is None:
        problem = "resume=True needs checkpoints=CheckpointFolder(folder) to resume from"
    elif checkpoints is not None and not isinstance(checkpoints, CheckpointFolder):
        problem = f"checkpoints must be a nnlib.checkpoint.CheckpointFolder; got {type(checkpoints).__name__}"
    elif checkpoints is not None and comm.rank == 0:
        try:
            if resume:
                saved = checkpoints.latest()
                differences = mismatches(saved.settings, settings)
                if differences:
                    raise CheckpointError(f"{saved.path} was written by another run; " + "; ".join(differences)
                                          + ". Resume with the same settings, or use another checkpoint folder.")
                if saved.epoch > epochs or (saved.epoch == epochs and saved.step > 0):
                    raise CheckpointError(f"{saved.path} is at epoch {saved.epoch + 1}, beyond this run's {epochs} "
                                          "epochs; ask for more epochs to continue it.")
            checkpoints.prepare()
        except CheckpointError as error:
            problem = str(error)
    fail_together(comm, problem)
    if not resume:
        return None, None
    small = None if saved is None else dict(epoch=saved.epoch, step=saved.step, rng_state=saved.rng_state,
                                            partial=saved.partial, history=saved.history, ranks=saved.ranks,
                                            total_steps=saved.total_steps, velocity=saved.velocity is not None)
    return saved, comm.bcast(small, root=0)


def _train(comm, network, local_inputs, local_labels, *, num_samples, start, epochs, learning_rate, batch_size,
           momentum, seed, strategy, validation, progress, timeline_steps, cuda_aware, checkpoints, resume,
           on_step, sampler, compression="none", k=None) -> ParallelHistory:
    size, rank = comm.size, comm.rank
    comm.at(phase="checking the settings")
    schedule, shard_sizes = _check(comm, network, local_inputs, local_labels, num_samples, start, epochs,
                                   learning_rate, batch_size, momentum, seed, strategy, sampler, compression, k,
                                   checkpoints)
    settings = run_settings(network, num_samples, batch_size, momentum, seed, learning_rate)
    if sampler != "exact":  # (checkpoints of exact runs, the default, keep their earlier settings)
        settings["sampler"] = sampler
    if compression != "none":
        settings["compression"] = compression
    comm.at(phase="loading the checkpoint" if resume else "preparing")
    saved, resumed = _resume_point(comm, checkpoints, resume, settings, epochs)

    xp = network.xp
    local_inputs, local_labels = xp.asarray(local_inputs), xp.asarray(local_labels)  # to the device, once
    if validation is not None and rank == 0:  # only rank 0 scores it
        validation = (xp.asarray(validation[0]), xp.asarray(validation[1]))
    messenger = Messenger(xp, cuda_aware)
    def broadcast_params(buffer):
        comm.Bcast(buffer, root=0)

    if saved is not None:  # rank 0 takes the checkpoint's parameters; the broadcast gives them to everyone
        network.params[...] = xp.asarray(saved.params)
    messenger.in_place(network.params, broadcast_params)  # everyone starts from rank 0's weights
    updates_here = strategy in ("allreduce", "overlap") or rank == 0
    if strategy == "zero":  # every rank updates its own slice and keeps only that slice's velocity
        optimizer = ShardedSGD(network, schedule(0.0), momentum, size, rank)
    else:
        optimizer = SGD(network, schedule(0.0), momentum) if updates_here else None
    overlap = BucketedAllreduce(comm, network) if strategy == "overlap" and messenger.direct else None
    backward_hook = {} if overlap is None else {"on_layer_done": overlap.layer_done}
    host_dtype = to_numpy(network.params[:1]).dtype
    compressor = None if compression == "none" else Compressor(compression, network.num_params, host_dtype, k)
    if resumed is not None and resumed["velocity"] and momentum:  # the optimizer's state, to every updater
        velocity = saved.velocity.astype(host_dtype) if rank == 0 else np.empty(network.num_params, host_dtype)
        comm.Bcast(velocity, root=0)
        if optimizer is not None:
            optimizer.load_velocity(velocity)
    gathered = np.empty((size, network.num_params), dtype=host_dtype) \
        if strategy == "parameter_server" and rank == 0 else None
    total_gradient = np.empty(network.num_params, dtype=host_dtype) \
        if strategy == "reduce_broadcast" and rank == 0 else None

    global_batch = num_samples if batch_size is None else int(batch_size)
    full_batch = global_batch >= num_samples
    rng = None if full_batch else np.random.default_rng(seed)
    stop = start + local_inputs.shape[0]
    history = ParallelHistory()
    first_epoch, first_step, total_steps = 0, 0, 0
    if resumed is not None:
        first_epoch, first_step, total_steps = resumed["epoch"], resumed["step"], resumed["total_steps"]
        if progress and rank == 0:
            print(f"resuming from {saved.path}: {total_steps} steps done (epoch {first_epoch + 1}, step "
                  f"{first_step}), written by {resumed['ranks']} rank{'s' if resumed['ranks'] > 1 else ''}", flush=True)
        if rng is not None:
            rng.bit_generator.state = resumed["rng_state"]
        for name in HISTORY_FIELDS:
            getattr(history, name).extend(resumed["history"][name])
    phases = history.phase_seconds
    clock_zero = time.perf_counter()
    epoch_totals = np.zeros(2)  # [summed loss, correct predictions] of this rank

    wait_for_device = synchronizer(xp)  # GPU work is queued: wait for it, or its time lands in the next phase

    def mark(phase, began):
        wait_for_device()
        now = time.perf_counter()
        phases[phase] += now - began
        if history.steps < timeline_steps:
            history.timeline.append((history.steps, phase, began - clock_zero, now - clock_zero))
        return now

    def write_checkpoint(epoch, steps_done, rng_state, loss_sum, correct_sum):
        """Rank 0 writes where the run is; every rank learns together whether that worked."""
        comm.at(phase="checkpoint")
        partial = np.array([float(loss_sum), float(correct_sum)])
        if steps_done:  # mid-epoch: the totals so far, summed over ranks
            comm.Allreduce(MPI.IN_PLACE, partial, op=MPI.SUM)
        problem = None
        # ZeRO's velocity is gathered from every rank's slice (every rank takes part); else rank 0 has it
        velocity = optimizer.full_velocity(comm) if strategy == "zero" or rank == 0 else None
        if rank == 0:
            record = Checkpoint(
                params=to_numpy(network.params), velocity=velocity, epoch=epoch, step=steps_done,
                rng_state=rng_state, partial=partial.tolist(), ranks=size, total_steps=total_steps, settings=settings,
                history={name: list(getattr(history, name)) for name in HISTORY_FIELDS})
            try:
                checkpoints.write(record)
            except CheckpointError as error:
                problem = str(error)
        fail_together(comm, problem)

    for epoch in range(first_epoch, epochs):
        epoch_start = time.perf_counter()
        resuming_here = epoch == first_epoch and first_step > 0
        loss_sum, correct_sum = 0.0, 0  # stay on the device until the epoch ends
        if resuming_here and rank == 0:  # the steps done before the checkpoint, summed over ranks
            loss_sum, correct_sum = resumed["partial"][0], int(resumed["partial"][1])
        rng_at_epoch_start = None if rng is None else rng.bit_generator.state
        if sampler == "exact" or full_batch:
            plan = exact_plan(num_samples, global_batch, start, stop, rng)
        else:
            plan = per_rank_plan(shard_sizes, global_batch, rank, seed, epoch)
        for step, (mine, normalizer) in enumerate(plan):
            if resuming_here and step < first_step:
                continue  # done before the checkpoint
            rate = schedule(epoch + step / len(plan))  # the same schedule as nnlib.train
            if optimizer is not None:
                optimizer.learning_rate = rate
            comm.at(epoch=epoch + 1, step=step + 1, phase="data")
            began = time.perf_counter()
            if full_batch:
                batch_inputs, batch_labels = local_inputs, local_labels
            else:
                mine = xp.asarray(mine)
                batch_inputs = xp.take(local_inputs, mine, axis=0)
                batch_labels = xp.take(local_labels, mine, axis=0)
            began = mark("data", began)

            comm.at(phase="compute")
            if batch_inputs.shape[0]:
                loss = network.loss_and_gradient(batch_inputs, batch_labels, normalizer=normalizer,
                                                 check=False, on_device=True, **backward_hook)
                loss_sum += loss * normalizer
                correct_sum += network.last_correct
            else:  # none of this batch's samples are on this rank
                network.grads[...] = 0
                if overlap is not None:
                    for layer in range(network.num_layers - 1, -1, -1):
                        overlap.layer_done(layer)
            began = mark("compute", began)

            comm.at(phase="communicate")
            if strategy == "zero":
                optimizer.reduce_scatter(comm, messenger)
                began = mark("communicate", began)
                comm.at(phase="update")
                optimizer.step()  # this rank's slice only
                began = mark("update", began)
                comm.at(phase="communicate")
                optimizer.allgather(comm, messenger)
                mark("communicate", began)
            elif strategy in ("allreduce", "overlap"):
                if overlap is not None:
                    overlap.finish()  # what the backward pass has not already sent
                elif compressor is not None:
                    messenger.in_place(network.grads, lambda buffer: compressor.allreduce(comm, buffer))
                else:
                    messenger.in_place(network.grads,
                                       lambda buffer: comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM))
                began = mark("communicate", began)
                comm.at(phase="update")
                optimizer.step()
                mark("update", began)
            else:
                if strategy == "parameter_server":
                    comm.Gather(messenger.outgoing(network.grads), gathered, root=0)
                else:
                    comm.Reduce(messenger.outgoing(network.grads), total_gradient, op=MPI.SUM, root=0)
                began = mark("communicate", began)
                comm.at(phase="update")
                if rank == 0:
                    network.grads[...] = xp.asarray(gathered.sum(axis=0) if gathered is not None else total_gradient)
                    optimizer.step()
                began = mark("update", began)
                comm.at(phase="communicate")
                messenger.in_place(network.params, broadcast_params)
                mark("communicate", began)
            history.steps += 1
            total_steps += 1
            if on_step is not None:
                on_step(epoch, step, total_steps)
            if checkpoints is not None and step + 1 < len(plan) and checkpoints.due(total_steps, False):
                write_checkpoint(epoch, step + 1, rng_at_epoch_start, loss_sum, correct_sum)

        comm.at(phase="end of epoch")
        epoch_totals[:] = (float(loss_sum), int(correct_sum))
        history.seconds.append(time.perf_counter() - epoch_start)
        comm.Allreduce(MPI.IN_PLACE, epoch_totals, op=MPI.SUM)
        epoch_loss = float(epoch_totals[0]) / num_samples
        if not math.isfinite(epoch_loss):
            raise raised_on_every_rank(FloatingPointError(
                f"the loss became {epoch_loss} in epoch {epoch + 1} (learning rate {rate}); training diverged. "
                f"Try a smaller learning rate, e.g. {rate / 10:g}."
            ))
        history.loss.append(epoch_loss)
        history.train_accuracy.append(float(epoch_totals[1]) / num_samples)
        if validation is not None:  # every rank holds the same network: rank 0 scores it for all
            history.validation_accuracy.append(comm.bcast(network.accuracy(*validation) if rank == 0 else None))
        if progress and rank == 0:
            extra = f", validation accuracy {history.validation_accuracy[-1]:.4f}" if validation is not None else ""
            print(f"epoch {epoch + 1}/{epochs}: loss {epoch_loss:.4f}, training accuracy "
                  f"{history.train_accuracy[-1]:.4f}{extra}, {history.seconds[-1]:.2f} s", flush=True)
        if checkpoints is not None and checkpoints.due(total_steps, True):
            write_checkpoint(epoch + 1, 0, None if rng is None else rng.bit_generator.state, 0.0, 0)
    return history


def gather_phase_seconds(comm, history: ParallelHistory, root: int = 0):
    """Every rank's phase totals on ``root``: an array (ranks, phases) in PHASES order, else None."""
    mine = np.array([history.phase_seconds[phase] for phase in PHASES])
    return collectives.gather_rows(comm, mine[None, :], root)


def gather_timeline(comm, history: ParallelHistory, root: int = 0):
    """Every rank's timeline on ``root``: a list (one per rank) of (step, phase, start, end)."""
    return comm.gather(history.timeline, root=root)


def communication_split(comm, history: ParallelHistory):
    """Split the communicate phase into waiting for the other ranks and the transfer itself.

    A collective ends on every rank about when the last rank has arrived and the data has moved,
    so the rank that arrived last hardly waited. For every communication c of the run
    (one per step for allreduce, two for zero), with d_r(c) its duration on rank r:

        transfer(c)  = min over ranks r of d_r(c)
        waiting_r(c) = d_r(c) - transfer(c)         (rank r waiting for a slower rank)

    Needs the timeline of every step: ``train_parallel(..., timeline_steps=steps)`` or more.
    Every rank calls it. Returns (transfer, waiting): seconds per step, the transfer the same on
    every rank, and waiting (size,) per rank; their sum is that rank's communicate phase per step.
    """
    durations = np.array([end - start for _, phase, start, end in history.timeline if phase == "communicate"])
    recorded = {step for step, *_ in history.timeline}
    problem = None
    if history.steps == 0 or len(recorded) < history.steps:
        problem = (f"the timeline holds {len(recorded)} of the run's {history.steps} steps; train with "
                   f"timeline_steps={max(history.steps, 1)} (or more) to split its communication")
    fail_together(comm, problem)
    counts = comm.allgather(len(durations))
    fail_together(comm, None if len(set(counts)) == 1 else
                  f"the ranks' timelines hold different numbers of communications ({counts}): "
                  "pass every rank the history of the same run")
    transfer = np.empty_like(durations)
    comm.Allreduce(durations, transfer, op=MPI.MIN)
    waiting = np.array(comm.allgather(float(np.sum(durations - transfer))))
    return float(np.sum(transfer)) / history.steps, waiting / history.steps
