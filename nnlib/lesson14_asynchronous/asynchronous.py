"""Asynchronous SGD with a parameter server, and its bounded-staleness (stale-synchronous) variant.

Rank 0 is the server and holds the parameters w; ranks 1..P-1 are the workers, each with its own
shard of the training set (split as evenly as possible). A worker repeatedly

    receives w (at the server's version v), computes the gradient g of its next batch, sends g

and the server applies every gradient the moment it arrives (Downpour SGD's server)::

    w <- w - eta g,   v <- v + 1,   staleness of g = v_applied - v_computed

so no worker waits for another, but its gradients may have been computed from parameters several
updates old (*stale*).

Bounded staleness (stale-synchronous parallel, Ho et al. 2013): every worker counts its updates (its clock c_w);
the server answers a worker only while c_w - min_u c_u <= s, so no worker runs more than s steps ahead of the
slowest. At s = 0 every worker computes its step-c gradient from the parameters after all step c-1 gradients, and
the server's updates add up to the synchronous step w <- w - eta sum_w g_w (each g_w normalized by the global
batch) in another order: ``staleness=0`` equals synchronous data parallelism with lesson 10's per-rank sampler
(per_rank_plan) on the P-1 workers, to rounding; ``staleness=None`` is fully asynchronous.

The server keeps one ``Irecv`` open per worker and waits for any of them (MPI's Waitany). Plain SGD (no
momentum): Downpour's server applied each gradient alone; momentum across stale updates is another algorithm.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from nnlib.lesson02_network.arrays import through_host, to_numpy
from nnlib.lesson03_training.optimizers import sgd_update
from nnlib.lesson03_training.training import Settings
from nnlib.lesson04_collectives.collectives import raised_on_every_rank, split_evenly
from nnlib.lesson10_zero_overlap.sampling import PerRankBatches
from nnlib.course.deadline import watch

LESSON = 14


GRADIENT, PARAMETERS = 21, 22
EXTRA = 3  # loss summed over the batch, correct predictions, rows


@dataclass
class AsyncHistory:
    """What the server (rank 0) saw.

    Per update, in the order applied: ``worker`` (its rank), ``staleness`` (updates applied since the gradient's
    parameters were sent) and ``seconds`` (since the start). Per epoch (every ``steps x workers`` updates):
    ``epoch_seconds`` (time at its end), ``loss`` and ``train_accuracy`` (over the samples of its updates),
    ``params`` (a copy, to score later). ``largest_lead``: the most any worker ran ahead of the slowest (at most s).
    """

    worker: list = field(default_factory=list)
    staleness: list = field(default_factory=list)
    seconds: list = field(default_factory=list)
    epoch_seconds: list = field(default_factory=list)
    loss: list = field(default_factory=list)
    train_accuracy: list = field(default_factory=list)
    params: list = field(default_factory=list)
    largest_lead: int = 0


#: How asynchronous_problems names what it checks (the batch job passes its flags instead)
NAMES = dict(asynchronous="asynchronous training", batch_size="batch_size", staleness="the staleness bound",
             unbounded="None", slow="a slowed rank", delay="the delay of slowed rank")


def asynchronous_problems(size: int, settings: Settings, staleness, slow, names=NAMES) -> list[str]:
    """What is wrong for asynchronous training in particular (an empty list if nothing), in ``names``' words."""
    problems = []
    if size < 2:
        problems.append(f"{names['asynchronous']} needs a server and at least one worker: 2 or more ranks, got {size}")
    if settings.batch_size is None:
        problems.append(f"{names['asynchronous']} needs mini-batches: give {names['batch_size']} (the global batch)")
    if callable(settings.learning_rate):
        problems.append(f"{names['asynchronous']} takes a constant learning_rate, not a schedule")
    if settings.optimizer != "sgd":  # (the server applies each gradient alone: plain SGD)
        problems.append(f"{names['asynchronous']} updates with plain SGD, not {settings.optimizer}")
    if staleness is not None and (not isinstance(staleness, (int, np.integer)) or isinstance(staleness, bool)
                                  or staleness < 0):
        problems.append(f"{names['staleness']} must be a whole number of steps, 0 or more (or {names['unbounded']}: "
                        f"unbounded); got {staleness!r}")
    for rank, seconds in (slow or {}).items():
        if not (isinstance(rank, (int, np.integer)) and 1 <= rank < max(size, 2)):
            problems.append(f"{names['slow']} must be a worker, 1 to {size - 1}; got {rank!r}")
        if not (isinstance(seconds, (int, float)) and 0 <= seconds < 60):
            problems.append(f"{names['delay']} {rank} must be 0 to 60 seconds per step; got {seconds!r}")
    return problems


def train_async(comm, network, inputs, labels, settings: Settings | None = None, *, staleness: int | None = None,
                slow=None, **keywords):
    """Train ``network`` with a parameter server on rank 0 and workers on ranks 1..P-1 (see the module).

    inputs (N, n_0), labels (N,): the whole training set on every rank; each worker takes its shard (split_evenly
    over the P-1 workers). ``settings``: lesson 03's Settings, or its fields as keywords; a worker's batches are its
    share of the batch size through its shard (lesson 10's PerRankBatches), as many updates as synchronous
    training makes. ``staleness``: the bound s (None: fully asynchronous); ``slow``: {rank: seconds} added to every
    step of those workers (a straggler). Every message has ``comm``'s deadline (a WatchedComm's, or the default).
    Every rank ends with the server's final parameters; rank 0 returns the :class:`AsyncHistory`, the workers None.
    """
    settings = Settings.from_keywords(settings, keywords)
    problems = settings.problems() + asynchronous_problems(comm.size, settings, staleness, slow)  # (every rank's own)
    if problems:  # the same verdict on every rank: the checks read only what every rank has
        raise raised_on_every_rank(ValueError("; ".join(problems)))
    comm = watch(comm)  # the run's own communicator; every message below has a deadline
    with comm.guard():
        workers = comm.size - 1
        shard_sizes, starts = split_evenly(len(inputs), workers)
        steps = len(PerRankBatches(shard_sizes, 0, settings).epoch(0))  # the same for every worker
        comm.at(phase="sending the first parameters")
        through_host(network.params, lambda host: comm.Bcast(host, root=0))  # (a GPU's: through a host copy)
        history = None
        if comm.rank == 0:
            history = serve(comm, network, steps, settings, staleness)
        else:
            start, stop = starts[comm.rank - 1], starts[comm.rank - 1] + shard_sizes[comm.rank - 1]
            work(comm, network, inputs[start:stop], labels[start:stop],
                 PerRankBatches(shard_sizes, comm.rank - 1, settings), steps, (slow or {}).get(comm.rank, 0.0))
        comm.at(phase="sending the final parameters")
        through_host(network.params, lambda host: comm.Bcast(host, root=0))
    return history


def serve(comm, network, steps: int, settings: Settings, staleness):
    """The server's loop: apply each gradient as it arrives; answer a worker with the parameters while
    updates are still needed (``epochs x steps x workers`` in all) and the bound allows, else with "stop"."""
    size, workers, learning_rate = network.num_params, comm.size - 1, settings.learning_rate
    inbox = np.zeros((workers, size + EXTRA))
    reply = np.zeros(size + 1)  # the parameters, then 1 (go on) or 0 (stop)
    receives = [comm.comm.Irecv(inbox[w], source=w + 1, tag=GRADIENT) for w in range(workers)]
    clock = [0] * workers  # gradients applied from each worker
    sent_version = [0] * workers  # the version of the parameters each worker is computing from
    active = set(range(workers))  # not yet told to stop
    waiting: list[int] = []
    version, outstanding, target, per_epoch = 0, workers, steps * settings.epochs * workers, steps * workers
    history = AsyncHistory()
    totals = np.zeros(EXTRA)  # this epoch's summed loss, correct predictions, rows
    began = time.perf_counter()
    while active:
        comm.at(phase="waiting for a gradient", update=version + 1)
        w = comm.wait_any(receives, "a gradient from any worker")
        message = inbox[w]
        sgd_update(network.params, network.xp.asarray(message[:size]), None, learning_rate, 0.0)
        totals += message[size:]
        history.staleness.append(version - sent_version[w])
        history.worker.append(w + 1)
        version, outstanding = version + 1, outstanding - 1
        clock[w] += 1
        history.seconds.append(time.perf_counter() - began)
        receives[w] = comm.comm.Irecv(inbox[w], source=w + 1, tag=GRADIENT)  # its next gradient, if any
        waiting.append(w)
        if version % per_epoch == 0:
            history.epoch_seconds.append(history.seconds[-1])
            history.loss.append(float(totals[0] / max(totals[2], 1)))
            history.train_accuracy.append(float(totals[1] / max(totals[2], 1)))
            history.params.append(to_numpy(network.params).copy())
            totals[:] = 0
        for w in list(waiting):
            slowest = min(clock[u] for u in active)
            if version + outstanding >= target:  # enough gradients are applied or on their way
                reply[size] = 0
                active.discard(w)
            elif staleness is None or clock[w] - slowest <= staleness:
                reply[:size], reply[size] = to_numpy(network.params), 1
                outstanding += 1
                sent_version[w] = version
                history.largest_lead = max(history.largest_lead, clock[w] - slowest)
            else:
                continue  # too far ahead: it waits for the slowest
            waiting.remove(w)
            comm.at(phase=f"answering rank {w + 1}")
            comm.wait(comm.comm.Isend(reply, dest=w + 1, tag=PARAMETERS), f"Send to rank {w + 1}")
    for request in receives:
        request.Cancel()  # the last Irecv of every worker: nothing more will come
        request.Wait()
    return history


def work(comm, network, inputs, labels, plan: PerRankBatches, steps: int, delay: float) -> None:
    """A worker's loop: compute a gradient from the last parameters received, send it, wait for the answer
    (new parameters, or stop). inputs, labels: its shard; its batches go through them epoch after epoch."""
    size = network.num_params
    message, reply = np.zeros(size + EXTRA), np.zeros(size + 1)
    clock = 0
    while True:
        epoch, step = divmod(clock, steps)
        if step == 0:  # a new epoch: its batches
            batches = plan.epoch(epoch)
        rows, normalizer = batches[step]
        rows = np.arange(len(labels)) if rows is None else rows  # (None: the full batch, all of the shard)
        comm.at(epoch=epoch + 1, step=step + 1, phase="compute")
        if delay:
            time.sleep(delay)  # the straggler's extra time
        if len(rows):
            loss = network.loss_and_gradient(network.xp.asarray(inputs[rows]), network.xp.asarray(labels[rows]),
                                             normalizer=normalizer, check=False)
            message[:size] = to_numpy(network.grads)
            message[size:] = (loss * normalizer, network.last_correct, len(rows))
        else:  # this worker's shard is used up for this epoch: a zero gradient keeps the clocks in step
            message[:] = 0
        comm.at(phase="sending a gradient")
        comm.wait(comm.comm.Isend(message, dest=0, tag=GRADIENT), "Send of a gradient to the server")
        comm.at(phase="waiting for parameters")
        comm.Recv(reply, source=0, tag=PARAMETERS)
        if reply[size] == 0:
            return
        network.params[...] = network.xp.asarray(reply[:size])
        clock += 1

