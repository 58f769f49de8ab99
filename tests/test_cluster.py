"""nnlib.course.cluster: MPI engines start, map to ranks, recover, stop cleanly, and fail clearly.

One cluster of ENGINES engines serves the module (the ``running`` fixture; conftest's ONE_WORKER keeps the module in
one worker, so it is started once): its tests run on it in order, two of them restart its engines, and the last
stops it and checks that nothing is left. The tests of a start that fails use stand-in mpiexecs; the test of stop's
steps uses stand-ins for ipyparallel.
"""

import os
import stat
import time

import psutil
import pytest

from nnlib.course import cluster
from nnlib.course.environment import ONE_BLAS_THREAD

ENGINES = 3


@pytest.fixture
def private_ipython_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """The module's cluster. It starts, and restarts, without the ONE_BLAS_THREAD variables that conftest sets for
    the tests (removed until the module ends), so the engines' values can only come from the cluster itself."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))
        for name in ONE_BLAS_THREAD:
            patch.delenv(name, raising=False)
        handle = cluster.start(n=ENGINES, activate=False)
        try:
            yield handle
        finally:
            handle.stop()  # (safe twice: the last test has stopped it)


def cluster_processes():
    """{pid: command line} of our descendant processes that belong to a cluster (controller, mpiexec, hydra's
    proxy, engines, reaper)."""
    found = {}
    for process in psutil.Process().children(recursive=True):
        try:
            command = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if any(word in command for word in ("ipyparallel", "mpiexec", "hydra_pmi_proxy", "nnlib.course.reaper")):
            found[process.pid] = command
    return found


def on_engines(view, expression):
    """Evaluate ``expression`` in every engine's namespace; the values in the view's (rank) order."""
    view.execute(f"_value = {expression}", block=True)
    return view.pull("_value", block=True)


def wait_until_gone(seconds=10, besides=()):
    """The command lines of the cluster processes still running after up to ``seconds`` (those whose pid is in
    ``besides`` left out: they ran before the test began)."""
    deadline = time.monotonic() + seconds
    while (left := [command for pid, command in cluster_processes().items() if pid not in besides]) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def assert_ranks_in_order(running):
    """Every engine has one rank of 0..ENGINES-1, and the view's engine k is rank k (after a start or a restart)."""
    assert sorted(running.rank_of.values()) == list(range(ENGINES))
    assert on_engines(running.view, "rank") == list(range(ENGINES))
    assert on_engines(running.view, "comm.allreduce(1)") == [ENGINES] * ENGINES


def assert_one_blas_thread(running):
    """Every engine has the ONE_BLAS_THREAD variables (OMP_NUM_THREADS=1 and the others)."""
    names = sorted(ONE_BLAS_THREAD)
    assert on_engines(running.view, f"[__import__('os').environ.get(name) for name in {names}]") == \
        [[ONE_BLAS_THREAD[name] for name in names]] * ENGINES


def test_missing_mpiexec_fails_at_once():
    start = time.monotonic()
    with pytest.raises(cluster.ClusterStartError, match="no usable mpiexec.*pip install mpich mpi4py"):
        cluster.start(n=2, mpiexec="/nonexistent/bin/mpiexec", activate=False)
    assert time.monotonic() - start < 5


def test_failing_mpiexec_reports_command_output_and_fix_within_the_bound(tmp_path, private_ipython_dir):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'fake mpiexec: no ranks for you' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    before = set(cluster_processes())  # the module's cluster, if it runs already
    start = time.monotonic()
    with pytest.raises(cluster.ClusterStartError) as caught:
        cluster.start(n=2, mpiexec=str(fake), timeout=15, activate=False)
    assert time.monotonic() - start < 15
    message = str(caught.value)
    assert f"{fake} -n 2" in message and "fake mpiexec: no ranks for you" in message
    assert "Likely fixes" in message
    assert wait_until_gone(besides=before) == []


def test_silent_mpiexec_times_out_within_the_bound(tmp_path, private_ipython_dir):
    """An mpiexec that neither starts engines nor exits: the timeout bounds the wait."""
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'waiting for a scheduler...'\nsleep 60\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    start = time.monotonic()
    with pytest.raises(cluster.ClusterStartError, match=r"only 0 of 2 engines registered within 3 s"):
        cluster.start(n=2, mpiexec=str(fake), timeout=3, activate=False)
    # The timeout, plus stopping: this sh script ignores the first signal, so ipyparallel waits before killing it.
    assert time.monotonic() - start < 3 + 20


def test_a_stop_interrupted_by_ctrl_c_raises_the_interrupt_with_the_other_failures_in_its_notes():
    """Every step of stop() runs; a KeyboardInterrupt wins over an ordinary error, which is told in its notes; a
    failed engine stop keeps the cluster (a second stop() can try again). No processes: stand-ins for ipyparallel."""
    import logging
    import types

    steps = []

    def step(name, error=None):
        def run():
            steps.append(name)
            if error is not None:
                raise error
        return run

    stand_in = types.SimpleNamespace(log=logging.getLogger("stand-in"), engines={}, controller=None,
                                     stop_engines_sync=step("engines", KeyboardInterrupt()),
                                     stop_controller_sync=step("controller"))
    client = types.SimpleNamespace(close=step("client", RuntimeError("the client could not close")))
    handle = cluster.MPICluster(stand_in, client, n=2, timeout=1.0)
    with pytest.raises(KeyboardInterrupt) as raised:
        handle.stop()
    assert steps == ["client", "engines", "controller"]
    assert raised.value.__notes__ == ["while stopping the cluster, also: RuntimeError('the client could not close')"]
    assert handle.cluster is stand_in  # kept for a second stop()


def test_open_mpi_gets_its_root_and_oversubscribe_settings(tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\necho 'mpiexec (Open MPI) 5.0.8'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    environment = cluster.engine_environment(str(fake))
    assert environment["OMPI_ALLOW_RUN_AS_ROOT"] == "1"
    assert environment["PRTE_MCA_rmaps_default_mapping_policy"] == ":oversubscribe"
    from nnlib.course.environment import mpiexec_path

    assert "OMPI_ALLOW_RUN_AS_ROOT" not in cluster.engine_environment(mpiexec_path())  # this environment's MPICH


TRAINING = """
import os, signal
import numpy as np
from nnlib import Network
from nnlib.lesson06_data_parallel import shard, train_parallel
from nnlib.lesson13_faults.watchdog import train_watched

_rng = np.random.default_rng(0)
_inputs, _labels = _rng.random((997, 12)), _rng.integers(0, 4, 997)
_local = shard(comm, _inputs if rank == 0 else None, _labels if rank == 0 else None)

def _fault(epoch, step, total_steps):
    if rank == 2 and total_steps == 5 and FAULT == "raise":
        raise RuntimeError("rank 2 failed on purpose")
    if rank == 2 and total_steps == 5 and FAULT == "kill":
        os.kill(os.getpid(), signal.SIGKILL)

_network = Network((12, 7, 4), dtype="float64", seed=3)
train_watched(train_parallel, comm, _network, *_local[:2], num_samples=997, start=_local[2], epochs=2,
              learning_rate=0.5, batch_size=64, momentum=0.9, on_step=_fault)
_params = _network.params.copy()
"""


def errors_by_rank(running, failed_result):
    """{rank: exception name} of a failed AsyncResult, from ipyparallel's CompositeError."""
    import ipyparallel

    with pytest.raises(ipyparallel.error.CompositeError) as caught:
        failed_result.get(1)
    return {running.rank_of.get(info.get("engine_id"), f"engine {index}"): name
            for index, (name, _, _, info) in enumerate(caught.value.elist)}



# -- the module's cluster: these tests run in this order on the one cluster, the last stops it ----------------------


def test_ranks_are_mapped_in_order_and_the_cluster_gives_one_blas_thread(running):
    assert not set(ONE_BLAS_THREAD) & set(os.environ)  # not inherited: the fixture removed them
    assert_ranks_in_order(running)
    assert_one_blas_thread(running)


def test_engines_have_the_classroom_deadline(running):
    deadline = "__import__('importlib').import_module('nnlib.course.deadline').default_timeout()"
    assert on_engines(running.view, deadline) == [cluster.CLASSROOM_TIMEOUT] * ENGINES


def test_restart_recovers_from_a_rank_that_raised_before_a_collective(running):
    """A silent execute (no post_run_cell: rank 1 tells nobody) leaves the others waiting in Barrier; restart
    ends that at once, and the restarted engines again have their ranks in order and one BLAS thread."""
    stuck = running.view.execute("if rank == 1:\n    raise RuntimeError('boom')\ncomm.Barrier()", block=False)
    stuck.wait(2)
    assert not stuck.ready()  # rank 0 waits in Barrier for rank 1, which will never come
    running.restart()
    assert_ranks_in_order(running)
    assert_one_blas_thread(running)


def test_a_rank_failing_in_training_stops_every_rank_at_once_and_the_next_run_needs_no_restart(running):
    running.view.push({"FAULT": "raise"}, block=True)
    began = time.monotonic()
    failed = running.view.execute(TRAINING, block=False)
    failed.wait(15)
    assert failed.ready() and time.monotonic() - began < 15  # not the 20 s deadline: rank 2 told them
    assert errors_by_rank(running, failed) == {0: "CollectiveTimeout", 1: "CollectiveTimeout", 2: "RuntimeError"}
    running.view.push({"FAULT": None}, block=True)
    running.view.execute(TRAINING, block=True)  # the same engines, no restart
    import numpy as np

    params = running.view.pull("_params", block=True)
    assert all(np.array_equal(params[0], other) for other in params[1:])  # the same trained network


def test_a_killed_engine_ends_the_cell_and_restart_recovers(running):
    running.view.push({"FAULT": "kill"}, block=True)
    failed = running.view.execute(TRAINING, block=False)
    failed.wait(25)
    assert failed.ready()  # hydra ends the whole MPI job when one rank dies
    assert set(errors_by_rank(running, failed).values()) == {"EngineError"}
    running.restart()
    assert_ranks_in_order(running)


def test_stop_leaves_nothing(running):
    """Last: stop ends the engines, mpiexec, the controller and the reaper; the handle says it is stopped."""
    assert cluster_processes()  # (it ran until now)
    running.stop()
    assert repr(running) == "<MPICluster: stopped>"
    assert wait_until_gone() == []
