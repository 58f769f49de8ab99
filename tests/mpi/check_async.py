"""Run under mpiexec with 1 to 4 ranks: asynchronous and bounded-staleness SGD (nnlib.lesson14_asynchronous.asynchronous).

With s = 0 the server's run equals synchronous data parallelism with the per-rank sampler on the
P - 1 workers, both computed in one process (synchronous_reference) and by train_parallel on the
workers' own communicator, to 1e-10 in float64; 203 samples and batches of 32 do not divide. With a
bound s the server never lets a worker run more than s steps ahead, and every update's staleness is
recorded (without a bound, as exercise 14.1's worked answer computes it from the order of the updates);
fully asynchronous runs with a straggler still learn. Bad settings fail on every rank at once
(1 rank: "needs a server and at least one worker").
"""

import numpy as np
from harness import expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib import Network
from nnlib.exercises.lesson_14 import staleness_of_updates
from nnlib.lesson03_training.optimizers import sgd_update
from nnlib.lesson04_collectives.collectives import split_evenly
from nnlib.lesson06_data_parallel import train_parallel
from nnlib.lesson10_zero_overlap.sampling import PerRankBatches, per_rank_plan
from nnlib.lesson14_asynchronous.asynchronous import train_async

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(0)
INPUTS, LABELS = rng.random((203, 12)), rng.integers(0, 4, 203)
SIZES = (12, 9, 4)
SETTINGS = dict(epochs=3, learning_rate=0.5, batch_size=32, seed=7)


def network():
    return Network(SIZES, dtype="float64", seed=3)


def synchronous_reference(network, inputs, labels, *, workers: int, epochs: int, learning_rate: float,
                          batch_size: int, seed: int = 0) -> np.ndarray:
    """What synchronous data parallelism on ``workers`` ranks with the per-rank sampler computes, in one
    process: every step, the sum over workers of their batches' gradients (normalized by the global
    batch), then one SGD step. Returns the final parameters (``network`` is trained in place)."""
    shard_sizes, starts = split_evenly(len(inputs), workers)
    total = np.zeros(network.num_params)
    for epoch in range(epochs):
        plans = [per_rank_plan(shard_sizes, batch_size, w, seed, epoch) for w in range(workers)]
        for step in range(len(plans[0])):
            total[:] = 0
            for w in range(workers):
                rows, normalizer = plans[w][step]
                if len(rows):
                    network.loss_and_gradient(inputs[starts[w] + rows], labels[starts[w] + rows],
                                              normalizer=normalizer, check=False)
                    total += network.grads
            sgd_update(network.params, total, None, learning_rate, 0.0)
    return network.params.copy()


def relative(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def test_staleness_zero_equals_synchronous_data_parallelism():
    if size < 2:
        return
    model = network()
    history = train_async(comm, model, INPUTS, LABELS, staleness=0, **SETTINGS)
    expected = synchronous_reference(network(), INPUTS, LABELS, workers=size - 1, **SETTINGS)
    assert relative(model.params, expected) <= 1e-10, relative(model.params, expected)
    # the same synchronous run by train_parallel, on the workers alone
    workers = comm.Split(0 if rank > 0 else MPI.UNDEFINED, rank)
    if rank > 0:
        counts, starts = split_evenly(len(INPUTS), size - 1)
        start, stop = starts[rank - 1], starts[rank - 1] + counts[rank - 1]
        synchronous = network()
        train_parallel(workers, synchronous, INPUTS[start:stop], LABELS[start:stop], num_samples=len(INPUTS),
                       start=start, batches=PerRankBatches, **SETTINGS)
        assert relative(synchronous.params, expected) <= 1e-10
        workers.Free()
    if rank == 0:
        steps = len(history.staleness) // ((size - 1) * SETTINGS["epochs"])
        assert len(history.staleness) == steps * (size - 1) * SETTINGS["epochs"]
        assert history.largest_lead == 0 and max(history.staleness) <= size - 2
        assert len(history.params) == len(history.loss) == SETTINGS["epochs"]
        assert np.array_equal(history.params[-1], model.params)
    else:
        assert history is None


def test_a_bound_is_kept_and_staleness_recorded_with_a_straggler():
    if size < 3:
        return
    problems = []  # checked after the loop: a rank leaving it early would leave the others waiting
    for bound in (1, 3, None):
        model = network()
        history = train_async(comm, model, INPUTS, LABELS, staleness=bound, slow={1: 0.02}, **SETTINGS)
        everyone = comm.allgather(model.params)
        if not all(np.array_equal(params, everyone[0]) for params in everyone):
            problems.append(f"s={bound}: the ranks end with different parameters")
        if rank == 0:
            if bound is not None and history.largest_lead > bound:
                problems.append(f"s={bound}: a worker ran {history.largest_lead} steps ahead")
            if not len(history.staleness) == len(history.worker) == len(history.seconds):
                problems.append(f"s={bound}: per-update records of different lengths")
            if sorted(set(history.worker)) != list(range(1, size)):
                problems.append(f"s={bound}: not every worker's gradients were applied")
            if bound is None and history.staleness != staleness_of_updates(history.worker).tolist():
                problems.append("s=None: the staleness recorded is not the one the order of updates gives (14.1)")
            if not history.loss[-1] < history.loss[0]:
                problems.append(f"s={bound}: it did not learn: {history.loss}")
            # (with more ranks than cores one fast worker may be starved too: compare with the busiest)
            per_worker = np.bincount(history.worker, minlength=size)[1:]
            if bound is None and not per_worker[0] < per_worker[1:].max() / 2:
                problems.append(f"s=None: the fast workers waited for the straggler: updates per worker {per_worker}")
    assert not problems, problems


def test_bad_settings_fail_on_every_rank_at_once():
    model = network()
    if size < 2:
        expect_error_everywhere(lambda: train_async(comm, model, INPUTS, LABELS, **SETTINGS),
                                "needs a server and at least one worker")
        return
    for settings, words in [(dict(staleness=-1), "the staleness bound must be a whole number of steps, 0 or more"),
                            (dict(staleness=1.5), "the staleness bound must be a whole number"),
                            (dict(slow={0: 1.0}), "a slowed rank must be a worker"),
                            (dict(slow={1: -1.0}), "the delay of slowed rank 1 must be 0 to 60 seconds")]:
        expect_error_everywhere(lambda: train_async(comm, model, INPUTS, LABELS, **settings, **SETTINGS), words)
    expect_error_everywhere(lambda: train_async(comm, model, INPUTS, LABELS, staleness=0, epochs=3,
                                                learning_rate=0.5, batch_size=0), "batch_size must be")


if __name__ == "__main__":
    run_checks(globals())
