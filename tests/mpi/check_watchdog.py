"""Run under mpiexec (2 or more ranks): no collective of nnlib waits forever.

Each fault is made to happen on the last rank, while the others train (nnlib.lesson06_data_parallel, under
nnlib.lesson13_faults.watchdog.train_watched) or wait in a watched collective (nnlib.course.deadline),
and every rank checks what it was told and how soon:

* a rank raising between two steps, and inside a step's compute (others in the Allreduce):
  the others stop at once with the failing rank's traceback; then the same ranks train again,
  on the same MPI.COMM_WORLD, and get the sequential result (it recovered by itself);
* a rank that hangs past the deadline: the others name it within timeout + grace;
* a rank raising in user code outside nnlib before a watched Barrier: named at the deadline;
* a deadline of 0, negative, NaN, infinite or absurd: ValueError on every rank, no collective;
* the object collectives (bcast, gather, allgather) and a Scatterv under the watchdog;
* the notebook cluster's settle (nnlib.course.classroom): a rank that comes to it several deadlines late
  (its engine got the client's message late) is waited for, and every rank goes on on a fresh communicator;
  one that comes after the first stopped waiting makes every rank say to restart (none renews alone).
Exits 1 on any failure.
"""

import re
import sys
import time
import traceback

import numpy as np
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson06_data_parallel import shard, train_parallel
from nnlib.course import classroom
from nnlib.course.classroom import ClassroomComm
from nnlib.course.deadline import CollectiveTimeout, watch
from nnlib.lesson13_faults.watchdog import train_watched

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
last = size - 1
failures = []
rng = np.random.default_rng(0)
N = 997
INPUTS, LABELS = rng.random((N, 12)), rng.integers(0, 4, N)
SETTINGS = dict(epochs=2, learning_rate=0.5, batch_size=64, momentum=0.9, seed=5)
TIMEOUT = 3.0
LOCAL = shard(comm, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)


def run(on_step=None, network=None, timeout=TIMEOUT):
    """Train; return (outcome, seconds): outcome is 'ok' or the error raised on this rank."""
    network = network or Network((12, 7, 4), dtype="float64", seed=3)
    began = time.monotonic()
    try:
        train_watched(train_parallel, comm, network, *LOCAL[:2], num_samples=N, start=LOCAL[2], timeout=timeout,
                      on_step=on_step, **SETTINGS)
        return "ok", time.monotonic() - began, network
    except Exception as error:  # noqa: BLE001 - what each rank got is the point
        return error, time.monotonic() - began, network


def check_a_rank_raising_between_steps_stops_everyone_at_once_then_they_recover():
    def fail(epoch, step, total_steps):
        if rank == last and total_steps == 5:
            raise RuntimeError("rank exploded on purpose")

    outcome, seconds, _ = run(fail)
    if rank == last:
        assert isinstance(outcome, RuntimeError) and "exploded" in str(outcome), outcome
    else:
        assert isinstance(outcome, CollectiveTimeout), f"rank {rank} got {outcome!r}"
        assert list(outcome.failed) == [last] and "rank exploded on purpose" in outcome.failed[last]
        message = str(outcome)
        assert message.startswith(f"rank {last} failed at epoch 1, step 5"), message
        assert "Traceback" in message and "Fix the error above and run again" in message
        assert seconds < TIMEOUT, f"rank {rank} took {seconds:.1f} s: it waited for the deadline"
    # Every rank is alive: the next run works on the same COMM_WORLD and equals the sequential run.
    outcome, _, network = run()
    assert outcome == "ok", f"rank {rank}: the run after the failure gave {outcome!r}"
    expected = Network((12, 7, 4), dtype="float64", seed=3)
    train(expected, INPUTS, LABELS, progress=False, **SETTINGS)
    error = float(np.abs(network.params - expected.params).max() / np.abs(expected.params).max())
    assert error <= 1e-10, f"after recovering: relative error {error:.1e}"


def check_a_rank_raising_inside_its_compute_stops_everyone_at_once():
    network = Network((12, 7, 4), dtype="float64", seed=3)
    if rank == last:
        calls = []
        original = network.loss_and_gradient

        def broken(*args, **kwargs):
            calls.append(1)
            if len(calls) == 3:
                raise MemoryError("out of memory in the forward pass (on purpose)")
            return original(*args, **kwargs)

        network.loss_and_gradient = broken
    outcome, seconds, _ = run(network=network)
    if rank == last:
        assert isinstance(outcome, MemoryError), outcome
    else:
        assert isinstance(outcome, CollectiveTimeout) and list(outcome.failed) == [last], outcome
        assert "compute" in str(outcome).splitlines()[0] and "MemoryError" in str(outcome)
        assert seconds < TIMEOUT


def check_a_hanging_rank_is_named_at_the_deadline():
    def hang(epoch, step, total_steps):
        if rank == last and total_steps == 3:
            time.sleep(TIMEOUT + 2)

    outcome, seconds, _ = run(hang)
    assert isinstance(outcome, CollectiveTimeout), f"rank {rank} got {outcome!r}"
    if rank == last:  # it came late: the others had given up, and it is told so at once
        assert f"had stopped waiting for it after {TIMEOUT:g} s" in str(outcome), str(outcome)
    else:
        assert outcome.missing == [last] and not outcome.failed, (outcome.missing, outcome.failed)
        assert f"rank {last} did not arrive in Allreduce within {TIMEOUT:g} s" in str(outcome)
        assert "epoch 1, step 4, communicate" in str(outcome)
        assert TIMEOUT <= seconds < TIMEOUT + 3, f"rank {rank} gave up after {seconds:.1f} s"
    comm.Barrier()  # the world communicator is still fine


def check_a_rank_raising_in_user_code_before_a_watched_barrier_is_named():
    watched = watch(comm, timeout=1.5)
    began = time.monotonic()
    try:
        if rank == last:
            raise KeyError("not inside nnlib: nobody is told")
        watched.Barrier()
        outcome = "ok"
    except KeyError:
        outcome = "raised"
    except CollectiveTimeout as error:
        outcome = error
    seconds = time.monotonic() - began
    if rank != last:
        assert isinstance(outcome, CollectiveTimeout) and outcome.missing == [last], outcome
        assert 1.5 <= seconds < 5, seconds
        try:
            watched.Barrier()
            raise AssertionError("a communicator with an abandoned collective was used again")
        except RuntimeError as error:
            assert "cannot be used any more" in str(error)
    time.sleep(0.5)  # let the others finish listening before the world goes on
    comm.Barrier()


def check_bad_deadlines_fail_on_every_rank_before_any_collective():
    for bad in (0, -1, float("nan"), float("inf"), 1e9, "5", True):
        try:
            watch(comm, timeout=bad)
            raise AssertionError(f"timeout={bad!r} was accepted")
        except ValueError as error:
            assert "timeout must be a number of seconds above 0" in str(error)
        outcome, _, _ = run(timeout=bad)
        assert isinstance(outcome, ValueError), f"train_parallel with timeout={bad!r} gave {outcome!r}"


def check_object_and_buffer_collectives_under_the_watchdog():
    watched = watch(comm, timeout=10)
    assert watched.bcast({"from": "root", "n": [1, 2]} if rank == 0 else None) == {"from": "root", "n": [1, 2]}
    assert watched.allgather(("rank", rank)) == [("rank", other) for other in range(size)]
    gathered = watched.gather(rank * 10, root=last)
    assert gathered == ([other * 10 for other in range(size)] if rank == last else None)
    mine = shard(watched, INPUTS if rank == 0 else None, LABELS if rank == 0 else None)
    assert np.array_equal(mine[0], LOCAL[0]) and np.array_equal(mine[1], LOCAL[1]) and mine[2] == LOCAL[2]
    total = np.array([float(rank)])
    watched.Allreduce(MPI.IN_PLACE, total)
    assert total[0] == sum(range(size))


def check_a_rank_late_to_settle_is_waited_for():
    classroom = ClassroomComm(comm, timeout=0.5)
    classroom.watched.broken = "a collective was abandoned in Barrier" if rank == 0 else None  # as after a cell
    time.sleep(2.0 if rank == last else 0)  # four deadlines after the others
    verdict = classroom.settle()
    assert verdict == "renewed", f"rank {rank}: settle said {verdict!r}"
    total = np.zeros(1)
    classroom.Allreduce(np.ones(1), total)
    assert total[0] == size


def check_a_rank_later_to_settle_than_the_others_wait_is_told_so_too():
    """Every rank reaches one verdict when the last rank comes after the first stopped waiting (its engine got the
    client's message late), and a rank in between completes the agreement in its own window: none renews alone,
    every later call says to restart."""
    waited, classroom.SETTLE_SECONDS = classroom.SETTLE_SECONDS, 0.5
    try:
        late = ClassroomComm(comm, timeout=0.2)
        late.watched.broken = "a collective was abandoned in Barrier"
        time.sleep(0.75 if rank == last else 0.0 if rank == 0 else 0.4)  # rank 0 gives up at 0.5 s, rank 1 at 0.9
        verdict = late.settle()
    finally:
        classroom.SETTLE_SECONDS = waited
    assert "mpi.restart()" in verdict and late.generation == 0, f"rank {rank} renewed alone: {verdict!r}"
    if rank == last:
        assert re.search(rf"rank {last} came to settle \d+ s after rank 0, too late", verdict), verdict
    try:
        late.Allreduce(np.ones(1), np.zeros(1))
        raise AssertionError(f"rank {rank}: an Allreduce after an unsettled cell ran")
    except RuntimeError as error:
        assert str(error) == verdict, f"rank {rank}: {error}"


CHECKS = [check_object_and_buffer_collectives_under_the_watchdog,
          check_a_rank_late_to_settle_is_waited_for,
          check_a_rank_later_to_settle_than_the_others_wait_is_told_so_too,
          check_bad_deadlines_fail_on_every_rank_before_any_collective,
          check_a_rank_raising_between_steps_stops_everyone_at_once_then_they_recover,
          check_a_rank_raising_inside_its_compute_stops_everyone_at_once,
          check_a_hanging_rank_is_named_at_the_deadline,
          check_a_rank_raising_in_user_code_before_a_watched_barrier_is_named]

for check in CHECKS:
    try:
        check()
    except Exception:  # noqa: BLE001 - collect and report every failing check
        failures.append(f"rank {rank}: {check.__name__}\n{traceback.format_exc()}")
    comm.Barrier()

failures = comm.gather(failures)
if rank == 0:
    problems = [problem for rank_failures in failures for problem in rank_failures]
    print("\n".join(problems) if problems else f"{size} ranks: all checks passed", flush=True)
sys.exit(1 if comm.bcast(rank == 0 and bool(problems)) else 0)
