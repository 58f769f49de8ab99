"""No process of a notebook cluster outlives the process that started it, however that ends.

Each test starts a cluster (2 MPI engines) from a separate "kernel" process: a plain Python
process, or a real Jupyter kernel driven with jupyter_client. It checks that the cluster's
processes exist (the controller, mpiexec, hydra's proxy, the engines: all carry the owner's
NNLIB_CLUSTER_OWNER tag), ends the cluster or its owner one way (stop() failing in one step,
leaving a with block, SIGTERM, SIGKILL while a rank is stuck, a kernel restart), and requires that
none of them, and no reaper, is left within GONE_WITHIN seconds. Being killed by the out-of-memory
killer is a SIGKILL, the case tested here.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from nnlib.course.reaper import GRACE, POLL, TAG, clean_up_orphans, tag_of, tagged_processes

GONE_WITHIN = POLL + 2 * GRACE + 5.0  # the reaper's look, SIGTERM's grace, SIGKILL, and slack

OWNER = textwrap.dedent("""
    import os, sys, time
    from nnlib.course import cluster

    mode = sys.argv[1]
    if mode == "with, its stop failing once":
        # Inside the block, stop() cannot stop the engines: it raises and keeps the cluster (and its reaper);
        # leaving the block stops everything (__exit__ is stop()); the owner lives on until told to exit.
        with cluster.start(n=2, timeout=90, activate=False) as mpi:
            print("started", os.environ["NNLIB_CLUSTER_OWNER"], flush=True)
            real, calls = mpi.cluster.stop_engines_sync, []
            def stop_engines_once_failing():
                calls.append(1)
                if len(calls) == 1:
                    raise RuntimeError("the engines could not be stopped")
                return real()
            mpi.cluster.stop_engines_sync = stop_engines_once_failing
            try:
                mpi.stop()
            except RuntimeError as error:
                print("raising", error, "and keeping the cluster:", mpi.cluster is not None, flush=True)
            else:
                print("stopped without an error", flush=True)
            sys.stdin.readline()  # (the test looks at the processes now)
        print("stopped", flush=True)
        sys.stdin.readline()  # alive: neither the reaper nor an exit handler can be what ended the cluster
        sys.exit(0)
    mpi = cluster.start(n=2, timeout=90, activate=False)
    print("started", os.environ["NNLIB_CLUSTER_OWNER"], flush=True)
    if mode == "failing close":  # the client cannot close: stop still ends everything, then says why
        def close():
            raise RuntimeError("the client could not close")
        mpi.client.close = close
        try:
            mpi.stop()
        except RuntimeError as error:
            print("stopped, raising", error, flush=True)
        else:
            print("stopped without an error", flush=True)
        time.sleep(600)  # alive: neither the reaper nor an exit handler can be what ends the cluster
    if mode == "stuck":  # rank 1 fails, rank 0 waits in MPI's own blocking Barrier (no deadline) for ever
        mpi.view.execute("if rank == 1:\\n    raise RuntimeError('rank 1 failed')\\ncomm.world.Barrier()", block=False)
        time.sleep(2)
    print("waiting", flush=True)
    time.sleep(600)
""")


def command_line(process) -> str:
    """The process's command line, or '' if it has ended (or is a zombie) since it was listed."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def reapers(tag):
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "nnlib.course.reaper" in cmdline and tag in cmdline:
            found.append(process)
    return found


def leftovers(tag):
    return [process.pid for process, _ in tagged_processes(tag)] + [process.pid for process in reapers(tag)]


def wait_until_gone(tag, within=GONE_WITHIN):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not leftovers(tag):
            return True
        time.sleep(0.25)
    return False


def tell(process):
    """Send the owner a line: it goes on to its next step."""
    process.stdin.write("\n")
    process.stdin.flush()


def describe(pids):
    text = []
    for pid in pids:
        try:
            text.append(f"{pid}: {command_line(psutil.Process(pid))[:120]}")
        except psutil.Error:
            pass
    return "\n".join(text)


@pytest.fixture
def owner(tmp_path):
    """Start the owner script in a given mode; yields a function returning (process, tag); cleans up afterwards."""
    started = []

    def start(mode):
        environment = dict(os.environ, IPYTHONDIR=str(tmp_path / "ipython"))
        environment.pop(TAG, None)
        process = subprocess.Popen([sys.executable, "-c", OWNER, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, env=environment, cwd=tmp_path)
        started.append(process)
        line = process.stdout.readline().split()
        assert line[:1] == ["started"], f"the cluster did not start: {line}"
        tag = line[1]
        assert tag == tag_of(psutil.Process(process.pid))
        running = tagged_processes(tag)
        names = " ".join(command_line(process) for process, _ in running)
        assert len(running) >= 4 and "ipyparallel.engine" in names and "mpiexec" in names, names
        assert len(reapers(tag)) == 1
        return process, tag

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_with_block_whose_stop_fails_once_keeps_the_cluster_then_its_exit_ends_everything(owner):
    """stop() that cannot stop the engines raises and keeps the cluster and its reaper (a second stop can try
    again); the block's exit (stop() again) then ends every process while the owner still runs, and it exits 0."""
    process, tag = owner("with, its stop failing once")
    assert process.stdout.readline().strip() == "raising the engines could not be stopped and keeping the cluster: True"
    engines = [proc for proc, _ in tagged_processes(tag) if "ipyparallel.engine" in command_line(proc)]
    assert engines and len(reapers(tag)) == 1, describe(leftovers(tag))  # still running, still watched
    tell(process)
    assert process.stdout.readline().strip() == "stopped"
    assert wait_until_gone(tag, within=5), describe(leftovers(tag))
    assert process.poll() is None  # the owner still runs: the block's exit ended them
    tell(process)
    assert process.wait(30) == 0


def test_a_stop_whose_first_step_fails_still_ends_every_process_and_then_raises(owner):
    process, tag = owner("failing close")
    assert process.stdout.readline().strip() == "stopped, raising the client could not close"
    assert wait_until_gone(tag, within=5), describe(leftovers(tag))
    assert process.poll() is None  # the owner still runs


def test_an_owner_ended_by_sigterm_leaves_nothing(owner):
    """(SIGKILL, the out-of-memory killer's: test_an_owner_killed_while_a_rank_is_stuck_in_a_collective_...)"""
    process, tag = owner("idle")
    assert process.stdout.readline().strip() == "waiting"
    process.send_signal(signal.SIGTERM)
    process.wait(10)
    assert wait_until_gone(tag), describe(leftovers(tag))


def test_an_owner_killed_while_a_rank_is_stuck_in_a_collective_leaves_nothing(owner):
    process, tag = owner("stuck")
    assert process.stdout.readline().strip() == "waiting"
    engines = [proc for proc, _ in tagged_processes(tag) if "ipyparallel.engine" in command_line(proc)]
    assert max(proc.cpu_percent(0.5) for proc in engines) > 20  # the waiting rank spins in MPI_Barrier
    process.kill()
    process.wait(10)
    assert wait_until_gone(tag), describe(leftovers(tag))


def test_orphans_of_a_dead_owner_are_cleaned_up_by_the_next_start(tmp_path):
    """A tagged process whose owner is gone (its reaper killed too) is ended by clean_up_orphans."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    fake_tag = f"{dead.pid}:1.00"
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env=dict(os.environ, **{TAG: fake_tag}))
    try:
        deadline = time.monotonic() + 5
        while not tagged_processes(fake_tag) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [process.pid for process, _ in tagged_processes(fake_tag)] == [orphan.pid]
        assert clean_up_orphans() >= 1
        assert orphan.wait(10) is not None
    finally:
        orphan.kill()


def test_a_jupyter_kernel_restarted_while_a_cell_is_stuck_leaves_nothing(tmp_path):
    """As JupyterLab does: a kernel starts a cluster, a %%px cell hangs in a collective, then the kernel is
    restarted from the menu. (Shut down takes the same path: jupyter_client's restart_kernel is shutdown_kernel
    with restart=True, then a new kernel; the kernel only echoes restart in its reply, ipykernel's do_shutdown.)"""
    from jupyter_client.manager import start_new_kernel

    environment = dict(os.environ, IPYTHONDIR=str(tmp_path / "ipython"))
    environment.pop(TAG, None)
    manager, client = start_new_kernel(kernel_name="python3", env=environment, cwd=str(tmp_path))
    try:
        reply = client.execute_interactive("from nnlib.course import cluster\nmpi = cluster.start(n=2, timeout=90)",
                                           timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        kernel = psutil.Process(manager.provisioner.process.pid)
        tag = tag_of(kernel)
        assert len(tagged_processes(tag)) >= 4
        client.execute("%%px\nif rank == 1:\n    raise RuntimeError('rank 1 failed')\ncomm.world.Barrier()")
        time.sleep(3)  # the cell is stuck: rank 0 waits in MPI's own Barrier (no deadline) for rank 1
        manager.restart_kernel(now=False)
        assert wait_until_gone(tag), describe(leftovers(tag))
    finally:
        client.stop_channels()
        if manager.is_alive():
            manager.shutdown_kernel(now=True)
