"""A student's own MPI code never hangs the class (nnlib.course.classroom).

Driven as JupyterLab drives it: a real Jupyter kernel (jupyter_client) starts a cluster of 4 MPI
engines with a 4 s deadline, and runs cells in which a rank raises before a collective, stalls,
or deadlocks, on ``comm`` and on ``MPI.COMM_WORLD``, with ``%%px`` and with ``view.apply_sync``;
one cell is interrupted (Interrupt Kernel). Each must end within the deadline plus 10 s, show the
failing rank's own error first, and leave a cluster whose next collective works. When the kernel
shuts down, no MPI process is left.
"""

import os
import re
import time

import psutil
import pytest

from nnlib.course.classroom import SETTLE_SECONDS
from nnlib.course.reaper import TAG, tag_of, tagged_processes

DEADLINE = 4
WORKS = "%%px\nimport numpy as np\ntotal = np.zeros(1)\ncomm.Allreduce(np.ones(1), total)\nprint(int(total[0]))"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    from jupyter_client.manager import start_new_kernel

    folder = tmp_path_factory.mktemp("classroom")
    environment = dict(os.environ, IPYTHONDIR=str(folder / "ipython"), NNLIB_TIMEOUT=str(DEADLINE))
    environment.pop(TAG, None)
    server_log = open(folder / "kernel-stderr.log", "w")  # what the Jupyter server's log would show
    manager, client = start_new_kernel(kernel_name="python3", env=environment, cwd=str(folder), stderr=server_log)
    tag = tag_of(psutil.Process(manager.provisioner.process.pid))
    try:
        status, text, _ = run(client, "from nnlib.course import cluster\nmpi = cluster.start(n=4, timeout=90)",
                              timeout=120)
        assert status == "ok", text
        yield manager, client
        assert "without topic" not in (folder / "kernel-stderr.log").read_text()
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=False)
        deadline = time.monotonic() + 30
        while tagged_processes(tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not tagged_processes(tag), "MPI processes left after the kernel shut down"


def run(client, code, timeout=DEADLINE + 10):
    """Run ``code`` in the kernel: (status, everything it showed, seconds it took)."""
    shown = []

    def keep(message):
        content = message["content"]
        if message["msg_type"] == "stream":
            shown.append(content["text"])
        elif message["msg_type"] == "error":
            shown.append("\n".join(content["traceback"]))
        elif message["msg_type"] in ("execute_result", "display_data"):
            shown.append(content["data"].get("text/plain", ""))

    began = time.monotonic()
    reply = client.execute_interactive(code, timeout=timeout, output_hook=keep)
    return reply["content"]["status"], re.sub(r"\x1b\[[0-9;]*m", "", "".join(shown)), time.monotonic() - began


def assert_it_works_again(client):
    """The next %%px collective works on every rank. It queues behind the engines' settle, which waits up to
    SETTLE_SECONDS for a rank that got it late (a loaded machine), so it may take that long."""
    status, text, _ = run(client, WORKS, timeout=SETTLE_SECONDS + DEADLINE + 10)
    assert status == "ok" and len(re.findall(r"\[stdout:\d\]\s+4\b", text)) == 4, text


def stops_in_time_and_recovers(client, code, within=DEADLINE + 10):
    """Run ``code``: it must fail within ``within`` seconds; then the next collective must work. Its text."""
    status, text, seconds = run(client, code)
    assert status == "error" and seconds < within, (seconds, text)
    assert_it_works_again(client)
    return text


def test_comm_and_mpi_comm_world_are_one_classroom_comm(kernel):
    """install() makes MPI.COMM_WORLD the engines' ``comm``: one object, so a cell on either takes one path."""
    status, text, _ = run(kernel[1], "%%px\nprint(type(MPI.COMM_WORLD).__name__, MPI.COMM_WORLD is comm)")
    assert status == "ok" and text.count("ClassroomComm True") == 4, text


RAISING = [  # (the communicator, the collective, the rank that raises before it: the root, if any); one per path
    # unrooted: ClassroomComm.__getattr__ gives the WatchedComm's (Allreduce, Barrier... take this path; Allreduce is
    # also the stalled rank's collective below)
    ("comm", "Reduce_scatter_block(np.ones(8), np.zeros(2))", 1),
    # rooted: the others wait in same_root's Allgather (Bcast, Reduce, Gather... take this path)
    ("MPI.COMM_WORLD", "Scatterv([np.ones(10), [3, 3, 2, 2]], np.zeros(3 if rank < 2 else 2), root=0)", 0),
]


@pytest.mark.parametrize("communicator, collective, failing", RAISING)
def test_a_rank_raising_before_a_collective_stops_every_rank_at_once(kernel, communicator, collective, failing):
    _, client = kernel
    code = (f"%%px\nimport numpy as np\nif rank == {failing}:\n    raise ValueError('rank {failing} has a bad shard')\n"
            f"{communicator}.{collective}")
    text = stops_in_time_and_recovers(client, code)
    assert f"ValueError: rank {failing} has a bad shard" in text, text
    first_error = min(text.find(word) for word in ("ValueError", "CollectiveTimeout") if word in text)
    assert text.find("ValueError") == first_error, text  # the failing rank's own error comes first
    assert text.count("CollectiveTimeout: Rank") == 3, text  # then one line for each rank that waited for it
    assert text.count(f"stopped waiting in {collective.split('(')[0]}") == 3, text  # in its call


def test_a_stalled_rank_is_named_at_the_deadline(kernel):
    code = (f"%%px\nimport time\nimport numpy as np\nif rank == 1:\n    time.sleep({DEADLINE + 2})\n"
            "comm.Allreduce(np.ones(3), np.zeros(3))")
    text = stops_in_time_and_recovers(kernel[1], code)
    assert f"rank 1 did not arrive in Allreduce within {DEADLINE} s" in text, text


def test_a_barrier_on_only_some_ranks_names_the_missing_one(kernel):
    text = stops_in_time_and_recovers(kernel[1], "%%px\nif rank != 3:\n    comm.Barrier()")
    assert f"rank 3 did not arrive in Barrier within {DEADLINE} s" in text, text


def test_two_ranks_both_sending_first_is_named_a_deadlock(kernel):
    code = ("%%px\nimport numpy as np\nbig = np.ones(1_000_000)\nif rank < 2:\n    comm.Send(big, dest=1 - rank)\n"
            "    comm.Recv(big, source=1 - rank)")
    text = stops_in_time_and_recovers(kernel[1], code)
    assert "waited 4 s in Send to rank" in text and "was waiting too (a deadlock" in text, text
    assert "rank 1 was waiting in Send to rank 0" in text or "rank 0 was waiting in Send to rank 1" in text, text


def test_python_objects_sent_and_received_and_a_receive_nobody_answers(kernel):
    _, client = kernel
    status, text, _ = run(client, "%%px\nif rank == 0:\n    comm.send({'a': 1}, dest=1)\nif rank == 1:\n"
                                  "    print('got', comm.recv(source=0))")
    assert status == "ok" and "got {'a': 1}" in text, text
    text = stops_in_time_and_recovers(kernel[1], "%%px\nif rank == 1:\n    comm.recv(source=2)")
    assert f"rank 2 did not arrive in Recv from rank 2 within {DEADLINE} s" in text, text


def test_broadcasts_from_different_roots_are_named(kernel):
    code = "%%px\nimport numpy as np\ncomm.Bcast(np.ones(1_000_000), root=0 if rank < 2 else 1)"
    text = stops_in_time_and_recovers(kernel[1], code)  # MPI would not hang here, but give wrong data
    assert text.count("RootMismatch: Bcast with different roots (rank 0: root=0, rank 1: root=0, rank 2: root=1, "
                      "rank 3: root=1)") == 4, text


def test_a_rank_raising_in_a_function_applied_to_all_engines_stops_every_rank_at_once(kernel):
    """As with %%px: the others are told at once (they say they stopped waiting), not left to the deadline."""
    code = ("def step():  # run on every engine, with the engine's rank and comm\n    if rank == 1:\n"
            "        raise ValueError('rank 1 failed')\n    comm.Barrier()\n\nmpi.view.apply_sync(step)")
    text = stops_in_time_and_recovers(kernel[1], code)
    assert "ValueError: rank 1 failed" in text and "did not arrive" not in text, text
    assert text.count("stopped waiting in Barrier") == 3, text


def interrupted(manager, client, code):
    """Run ``code``, press Interrupt Kernel after 1.5 s: (seconds from the interrupt to the end, what it showed)."""
    message_id = client.execute(code)
    time.sleep(3)  # every rank is in the cell by now
    began = time.monotonic()
    manager.interrupt_kernel()
    shown = []
    while True:
        message = client.get_iopub_msg(timeout=DEADLINE + 10)
        if message["parent_header"].get("msg_id") != message_id:
            continue
        if message["msg_type"] == "stream":
            shown.append(message["content"]["text"])
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return time.monotonic() - began, "".join(shown)


def test_interrupt_kernel_ends_a_cell_waiting_in_comm_and_the_cluster_works(kernel):
    manager, client = kernel
    seconds, _ = interrupted(manager, client, "%%px\nimport time\nif rank == 0:\n    time.sleep(60)\ncomm.Barrier()")
    assert seconds < 10, seconds
    assert_it_works_again(client)


def test_interrupt_kernel_while_one_rank_is_idle_and_the_others_wait(kernel):
    """Rank 0 has finished the cell (idle: the interrupt does not reach it); ranks 1-3 wait in Barrier.
    After the interrupt every rank must start the next cell on the same, fresh communicator."""
    manager, client = kernel
    seconds, _ = interrupted(manager, client, "%%px\nif rank != 0:\n    comm.Barrier()")
    assert seconds < 10, seconds
    assert_it_works_again(client)


def test_a_cell_that_catches_the_ranks_errors_leaves_a_working_cluster(kernel):
    """As lesson 04 does: the client catches the engines' errors itself, so its cell does not fail."""
    _, client = kernel
    code = ("try:\n    mpi.view.execute(\"if rank == 3:\\n    raise ValueError('x')\\ncomm.Barrier()\", silent=False)\n"
            "except Exception as error:\n    print(sorted(name for name, *_ in error.elist))")
    status, text, _ = run(client, code)
    assert status == "ok" and "ValueError" in text, text
    assert_it_works_again(client)


def test_the_settle_runs_on_an_engine_still_dropping_requests_after_an_error(kernel):
    """An engine whose cell raised drops the execute requests that reach it before it has finished replying
    (ipykernel's stop_on_error); on a loaded machine the settle came in that window and one rank kept its
    abandoned communicator. Here every engine drops execute requests while the settle is sent: it must still run."""
    _, client = kernel
    code = ("generation = lambda: comm.generation\nbefore = mpi.view.apply_sync(generation)\n"
            "try:\n    mpi.view.execute(\"if rank == 3:\\n    raise ValueError('x')\\ncomm.Barrier()\", silent=False)\n"
            "except Exception as error:\n    print(sorted(name for name, *_ in error.elist))\n"
            "dropping = lambda on: setattr(get_ipython().kernel, '_aborting', on)\n"
            "mpi.view.apply_sync(dropping, True)  # as right after an error reply")
    status, text, _ = run(client, code)
    assert status == "ok" and "ValueError" in text, text
    code = ("mpi.view.apply_sync(dropping, False)\n"  # the settle this cell sends would renew the ranks too
            "print('renewed on ranks', [rank for rank, (old, new) in enumerate(zip(before, "
            "mpi.view.apply_sync(generation))) if new == old + 1])")
    status, text, _ = run(client, code, timeout=SETTLE_SECONDS + DEADLINE + 10)
    assert status == "ok" and "renewed on ranks [0, 1, 2, 3]" in text, text
    assert_it_works_again(client)


def test_an_engine_whose_cell_raised_drops_no_later_cell(kernel):
    """Right after a cell raised, ipykernel (stop_on_error) would drop the execute requests that reach the engine
    before it has finished replying: a rank's share of a quick next %%px cell was lost ('rank 2 did not arrive in
    Allreduce', a fresh-clone run). Here every engine runs what ipykernel runs after an error reply, and is then
    still not dropping requests (it was, without the classroom's install)."""
    _, client = kernel
    code = ("def after_an_error():\n    kernel = get_ipython().kernel\n    kernel._abort_queues()\n"
            "    return kernel._aborting\nprint('dropping on ranks', [rank for rank, dropping in "
            "enumerate(mpi.view.apply_sync(after_an_error)) if dropping])")
    status, text, _ = run(client, code)
    assert status == "ok" and "dropping on ranks []" in text, text
    assert_it_works_again(client)


def test_interrupt_kernel_on_a_cell_stuck_outside_comm_says_what_to_run(kernel):
    manager, client = kernel
    seconds, text = interrupted(manager, client,
                                "%%px\nif rank != 0:\n    comm.world.Barrier()  # MPI's own: no deadline")
    assert seconds < 10 and "run mpi.restart()" in text, (seconds, text)
    status, text, _ = run(client, "mpi.restart()", timeout=120)
    assert status == "ok", text
    assert_it_works_again(client)


def test_stopping_the_cluster_is_quiet(kernel):
    """Last: no "Monitor message without topic: iopub_welcome" in the controller's log, nothing printed on stop."""
    _, client = kernel
    status, text, _ = run(client, "print([line for line in mpi.cluster.controller.get_output(remove=False).splitlines()"
                                  " if 'without topic' in line])")
    assert status == "ok" and text.strip() == "[]", text
    status, text, _ = run(client, "mpi.stop()")
    assert status == "ok" and text == "", text
