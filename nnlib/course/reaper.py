"""No orphans: a cluster's processes end when the process that started them is gone (notebook 13).

Every process of a cluster (the controller, ``mpiexec`` and the engines) carries ``NNLIB_CLUSTER_OWNER`` =
``"<pid>:<start time>"`` of its owner, the kernel that started it (the start time tells a dead owner from a new
process with its pid). A *reaper* (``python -m nnlib.course.reaper OWNER``, in its own session: signals to the
kernel's process group miss it) looks every ``POLL`` seconds whether the owner is alive; once it is gone, it ends
every process with that tag (SIGTERM, SIGKILL after ``GRACE`` s), as cluster.start's :func:`clean_up_orphans` does.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

LESSON = 0  # the course's own tools: any lesson may use them

TAG = "NNLIB_CLUSTER_OWNER"
POLL = 0.5
GRACE = 3.0


def tag_of(process=None) -> str:
    """'<pid>:<start time>' of ``process`` (a psutil.Process; default: this one)."""
    import psutil

    process = process or psutil.Process()
    return f"{process.pid}:{process.create_time():.2f}"


def is_alive(tag: str) -> bool:
    """Whether the process the tag names still runs (same pid *and* same start time; zombies count as gone)."""
    import psutil

    pid = int(tag.split(":")[0])
    try:
        process = psutil.Process(pid)
        return tag_of(process) == tag and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def tagged_processes(tag: str | None = None):
    """This user's processes carrying ``TAG`` (equal to ``tag`` if given): [(psutil.Process, its tag)]."""
    import psutil

    found, me = [], os.getpid()
    for process in psutil.process_iter(["uids"]):
        try:
            if process.pid == me or process.info["uids"] is None or process.info["uids"].real != os.getuid():
                continue
            value = process.environ().get(TAG)
        except psutil.Error:
            continue
        if value is not None and (tag is None or value == tag):
            found.append((process, value))
    return found


def end_processes(processes) -> None:
    """SIGTERM, then SIGKILL whatever is left after GRACE seconds."""
    import psutil

    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=GRACE)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=GRACE)


def clean_up_orphans() -> int:
    """End this user's cluster processes whose owner is gone; return how many were ended."""
    orphans = [process for process, owner in tagged_processes() if not is_alive(owner)]
    end_processes(orphans)
    return len(orphans)


def start_reaper(tag: str) -> subprocess.Popen:
    """Start the reaper for the owner ``tag`` in its own session, without the tag in its environment."""
    environment = {name: value for name, value in os.environ.items() if name != TAG}
    return subprocess.Popen([sys.executable, "-m", "nnlib.course.reaper", tag], env=environment, start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def watch_owner(tag: str) -> None:
    """Wait until the owner is gone, then end every process with its tag."""
    while is_alive(tag):
        time.sleep(POLL)
    for _ in range(3):  # processes started in the last moments are found by a second look
        found = [process for process, _ in tagged_processes(tag)]
        if not found:
            break
        end_processes(found)


if __name__ == "__main__":
    watch_owner(sys.argv[1])
