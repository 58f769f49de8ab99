"""Results made once per test session and shared by pytest-xdist's workers: batch jobs run several to a launch.

:func:`once_per_session` fills a folder of the session's ($NNLIB_TEST_SESSION, made by tests/conftest.py) once: the
first process to ask makes it under an exclusive ``fcntl.flock``, the others wait for that lock (up to a deadline)
and read it. A make that fails, or is interrupted, is noted, and every later ask fails with its message (it is not
tried again).

:func:`jobs_run_once` runs a group of batch jobs that way: one launch of ``mpiexec -n P tests/job_driver.py`` runs
them one after another (in this process for one rank), and each test reads the :class:`JobRun` of the jobs it
compares. A group is known by its name and its jobs: two groups of one name with other jobs do not share results.
A launch that runs past its deadline is ended with everything it started.
"""

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from nnlib.course.environment import mpiexec_path

HERE = Path(__file__).resolve().parent
SECONDS_PER_JOB = 60  # a group's launch may take this long per job (a small job takes a few seconds)
KILL_GRACE = 5  # seconds between SIGTERM and SIGKILL for a launch that ran past its deadline
LOCK_MARGIN = 60  # seconds that a process waits for another's make beyond the time the make may take
_OWN_SESSION = []  # without $NNLIB_TEST_SESSION (not under pytest's conftest): a folder for this process


def session_folder() -> Path:
    """$NNLIB_TEST_SESSION; without it, a folder of this process's own, removed when the process exits."""
    if os.environ.get("NNLIB_TEST_SESSION"):
        return Path(os.environ["NNLIB_TEST_SESSION"])
    if not _OWN_SESSION:
        _OWN_SESSION.append(Path(tempfile.mkdtemp(prefix="nnlib-shared-runs-")))
        atexit.register(shutil.rmtree, _OWN_SESSION[0], ignore_errors=True)
    return _OWN_SESSION[0]


@contextlib.contextmanager
def locked(lock_path: Path, seconds: float, what: str):
    """Hold an exclusive flock on ``lock_path`` (released when the file closes, even if this process dies), waited
    for at most ``seconds``; TimeoutError past that."""
    with open(lock_path, "a") as lock:
        give_up = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > give_up:
                    raise TimeoutError(f"{what}: another process of the test session has been making it for more "
                                       f"than {seconds:.0f} s (it holds {lock_path}); gave up waiting") from None
                time.sleep(0.2)
        yield


def once_per_session(name: str, make, seconds: float) -> Path:
    """The session's folder ``name``, filled by ``make(folder)`` once in the session (by whichever process asks
    first; ``make`` takes at most ``seconds``, and the others wait that long and LOCK_MARGIN more); RuntimeError,
    with what went wrong, if that make failed or was interrupted."""
    root = session_folder()
    folder, done, failed = root / name, root / f"{name}.done", root / f"{name}.failed"
    with locked(root / f"{name}.lock", seconds + LOCK_MARGIN, f"{name}, made once for the test session"):
        if not done.exists() and not failed.exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a make that died left
            folder.mkdir(parents=True)
            try:
                make(folder)
            except BaseException:  # KeyboardInterrupt and pytest's outcomes too: never made again into old files
                failed.write_text(traceback.format_exc())
                raise
            done.touch()
    if failed.exists():
        raise RuntimeError(f"{name}, made once for the test session, failed:\n{failed.read_text()}")
    return folder


class Job(NamedTuple):
    """A batch job: its arguments (``{folder}`` stands for the group's folder) and the stand-in CuPy it runs with
    (tests/job_driver.py: None, or {"counting": bool, ...the stand-in's settings})."""

    arguments: tuple
    cupy: dict | None = None


@dataclass
class JobRun:
    """What a job did: its exit status as a launch would give it (0; 2: refused; 1: aborted, or not run), what its
    ranks printed (rank 0 first, as mpiexec relays it), and its --output file (written into the group's folder)."""

    returncode: int
    stdout: str
    stderr: str
    output: Path

    def saved(self) -> dict:
        with np.load(self.output) as saved:
            return dict(saved)

    def params(self) -> np.ndarray:
        return self.saved()["params"]


def jobs_run_once(group: str, ranks: int, jobs: dict) -> dict:
    """{name: JobRun} for ``jobs`` ({name: Job}), run once in the session, one after another, in one launch of
    ``ranks`` ranks (tests/job_driver.py; for one rank, in this process), given SECONDS_PER_JOB per job. Each job
    writes --output to <group folder>/<its index>.npz."""
    names = list(jobs)
    spec = [dict(name=name, arguments=[*map(str, jobs[name].arguments), "--output", f"{{folder}}/{index}.npz"],
                 cupy=jobs[name].cupy) for index, name in enumerate(names)]
    seconds = SECONDS_PER_JOB * len(spec)

    def make(folder: Path) -> None:
        filled = [dict(each, arguments=[word.replace("{folder}", str(folder)) for word in each["arguments"]])
                  for each in spec]
        if ranks == 1:
            import job_driver

            job_driver.run_jobs(filled, folder)
            return
        (folder / "spec.json").write_text(json.dumps(filled))
        launch(folder, [mpiexec_path(), "-n", str(ranks), sys.executable, str(HERE / "job_driver.py"),
                        str(folder / "spec.json"), str(folder)], seconds)

    key = hashlib.sha256(json.dumps([ranks, spec]).encode()).hexdigest()[:12]
    folder = once_per_session(f"{group}-{key}", make, seconds)
    return {name: job_run(folder, index, ranks) for index, name in enumerate(names)}


def launch(folder: Path, command: list, seconds: float) -> None:
    """Run ``command`` (an mpiexec launch), what it prints into ``folder``/launch.txt; if it runs past ``seconds``,
    or this process is interrupted, end it and everything it started (TimeoutError for the first)."""
    with open(folder / "launch.txt", "w") as printed:
        process = subprocess.Popen(command, stdout=printed, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        process.wait(seconds)
    except BaseException as error:
        end_launch(process)
        if isinstance(error, subprocess.TimeoutExpired):
            raise TimeoutError(f"the launch {' '.join(command)} ran past {seconds:.0f} s: ended, with everything it "
                               f"started; what it printed:\n{(folder / 'launch.txt').read_text()[-4000:]}") from None
        raise


def end_launch(process: subprocess.Popen) -> None:
    """End mpiexec and what it started: SIGTERM to its process group (mpiexec ends its proxies and ranks, which
    Hydra starts in sessions of their own), SIGKILL to the group and to each of them left after KILL_GRACE s."""
    import psutil

    started = []
    with contextlib.suppress(psutil.NoSuchProcess):
        started = psutil.Process(process.pid).children(recursive=True)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    _, left = psutil.wait_procs(started, timeout=KILL_GRACE)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for each in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            each.kill()
    process.wait()


def job_run(folder: Path, index: int, ranks: int) -> JobRun:
    """Job ``index``'s JobRun from every rank's results (job_driver.py's job<I>.rank<R>.json), or from its note
    that the job was not run (job<I>.not-run)."""
    not_run, output = folder / f"job{index}.not-run", folder / f"{index}.npz"
    if not_run.exists():
        return JobRun(1, "", not_run.read_text(), output)
    results = [rank_result(folder, index, rank) for rank in range(ranks)]
    aborted = [f"rank {rank}: {result['aborted']}" for rank, result in enumerate(results) if result["aborted"]]
    returncode = 1 if aborted else max(result["returncode"] for result in results)
    return JobRun(returncode, "".join(result["stdout"] for result in results),
                  "".join(result["stderr"] for result in results) + "\n".join(aborted), output)


def rank_result(folder: Path, index: int, rank: int) -> dict:
    """What rank ``rank`` wrote of job ``index``; if it wrote nothing, an abort with what the launch printed."""
    path = folder / f"job{index}.rank{rank}.json"
    if path.exists():
        return json.loads(path.read_text())
    printed = (folder / "launch.txt").read_text()[-4000:] if (folder / "launch.txt").exists() else ""
    return dict(returncode=1, stdout="", stderr="", aborted="wrote no result (it died or hung)"
                + (f"; the launch printed:\n{printed}" if printed.strip() else ""))
