"""The data-parallel batch job across 2 and 3 hosts joined by a (virtual) network. Needs root.

Each host is a network namespace with its own name and address (tests/multihost.py); the ranks
talk TCP over the hosts' eth0. The tests check that (1) the ranks really run on different hosts,
(2) the result equals the one-host run, (3) the gradients' bytes crossed the links (interface
counters), and (4) a host cut off the switch mid-run gives the watchdog's error naming the lost rank within
the deadline, not a hang. Everything is removed afterwards, also when a test fails. `make multihost`
runs just these.
"""

import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest
from multihost import VirtualHosts, can_make_namespaces

possible, why_not = can_make_namespaces()
pytestmark = pytest.mark.skipif(not possible, reason=why_not)

SETTINGS = ["--samples", "1001", "--epochs", "2", "--batch-size", "50", "--hidden", "16", "--dtype", "float64",
            "--timeout", "30"]
STEPS = 2 * 21
GRADIENT_BYTES = (784 * 16 + 16 + 16 * 10 + 10) * 8
WHERE = ("from mpi4py import MPI; import socket; comm = MPI.COMM_WORLD; "
         "names = comm.gather(socket.gethostname()); comm.rank == 0 and print(' '.join(names))")


def train(output, hosts=None, ranks=None):
    program = [sys.executable, "-m", "nnlib", "train", *SETTINGS, "--output", str(output)]
    if hosts is None:
        from nnlib.course.environment import mpiexec_path

        return subprocess.run([mpiexec_path(), "-n", str(ranks), *program], capture_output=True, text=True,
                              timeout=120)
    return hosts.mpiexec(program)


@pytest.mark.parametrize("count", [2, 3])
def test_the_batch_job_across_hosts_equals_the_one_host_run_and_its_gradients_cross_the_links(tmp_path, count):
    one_host = train(tmp_path / "one-host.npz", ranks=count)
    assert one_host.returncode == 0, one_host.stderr
    hosts = VirtualHosts(count)
    try:
        with hosts:
            where = hosts.mpiexec([sys.executable, "-c", WHERE])
            assert where.returncode == 0, where.stderr
            assert where.stdout.split() == hosts.names  # rank k runs on host k+1
            before = hosts.bytes_sent()
            across = train(tmp_path / "across.npz", hosts=hosts)
            sent = {name: count_after - before[name] for name, count_after in hosts.bytes_sent().items()}
            assert across.returncode == 0, across.stderr
    finally:
        assert hosts.leftovers() == []
    with np.load(tmp_path / "one-host.npz") as expected, np.load(tmp_path / "across.npz") as got:
        difference = np.abs(got["params"] - expected["params"]).max() / np.abs(expected["params"]).max()
        assert difference <= 1e-10
    # An Allreduce of n bytes over P ranks makes every rank send at least (P - 1) / P * n bytes.
    least = STEPS * GRADIENT_BYTES * (count - 1) / count
    assert all(bytes_sent >= least for bytes_sent in sent.values()), (sent, least)


TIMEOUT = 4.0


def cut_a_host_off() -> str | None:
    """One run: train across 2 hosts, cut host 2 off the switch in epoch 3. None if rank 0 reported the lost rank
    within the deadline (and everything was cleaned up), else what happened instead."""
    program = [sys.executable, "-m", "nnlib", "train", "--samples", "6000", "--epochs", "1000", "--batch-size", "100",
               "--hidden", "16", "--timeout", str(TIMEOUT)]
    hosts = VirtualHosts(2)
    problem = None
    try:
        with hosts:
            job = hosts.start(program)
            lines, seen = [], threading.Event()

            def read(stream, name):
                for line in stream:
                    lines.append((time.monotonic(), name, line))
                    if "did not arrive" in line:
                        seen.set()

            readers = [threading.Thread(target=read, args=(job.stdout, "out"), daemon=True),
                       threading.Thread(target=read, args=(job.stderr, "err"), daemon=True)]
            for reader in readers:
                reader.start()
            deadline = time.monotonic() + 60
            while not any("epoch 2/" in line for _, _, line in lines) and time.monotonic() < deadline:
                assert job.poll() is None, "".join(line for _, _, line in lines)
                time.sleep(0.05)
            assert any("epoch 2/" in line for _, _, line in lines), "".join(line for _, _, line in lines)
            hosts.cut_link(hosts.names[1])
            cut = time.monotonic()
            text = lambda: "".join(line for _, _, line in lines)  # noqa: E731
            if not seen.wait(TIMEOUT + 10):
                state = "still running" if job.poll() is None else f"exited with status {job.returncode}"
                problem = ("no watchdog error after host 2 was cut off:\n" + text()[-3000:]
                           + f"\nmpiexec, 14 s after the cut: {state}; the processes in the hosts:\n"
                           + hosts.describe_processes())
            else:
                told_after = min(when for when, _, line in lines if "did not arrive" in line) - cut
                if told_after > TIMEOUT + 5:
                    problem = f"the watchdog's error came {told_after:.1f} s after the cut:\n{text()[-3000:]}"
                elif "rank 1 did not arrive in Allreduce within 4 s" not in text():
                    problem = "the error does not name rank 1 in Allreduce:\n" + text()[-3000:]
                try:
                    job.wait(10)  # mpiexec may not reach the lost host's proxy to end it: the clean-up does
                except subprocess.TimeoutExpired:
                    pass
    finally:
        if "job" in locals() and job.poll() is None:
            job.kill()
            job.wait()
        assert hosts.leftovers() == []
        assert hosts.processes() == []
    return problem


def test_a_host_cut_off_gives_the_watchdogs_error_within_the_deadline():
    """Host 2 leaves the switch; both hosts keep their carrier, so only the deadline can tell.

    (When the cut was made by taking host 2's port down, now and then nothing at all came out: host 2
    lost its carrier, its rank and proxy were gone within seconds, mpiexec exited, and rank 0 was left
    blocked in a PMI call to its proxy, its printed error never relayed. That is another failure, a
    rank that ends: the batch job's MPI_Abort now gives up after 10 s (test_train_command). Should this
    test fail once, the first failure is a warning with every process's state and a second run decides.)"""
    first = cut_a_host_off()
    if first is None:
        return
    warnings.warn("the cut-off run failed once; trying again. What happened:\n" + first)
    second = cut_a_host_off()
    assert second is None, f"{second}\n\nthe first run:\n{first}"
