"""Results made once per test session and shared by pytest-xdist's workers: batch jobs run several to a launch.

:func:`once_per_session` fills a folder of the session's ($NNLIB_TEST_SESSION, made by tests/conftest.py) once: the
first process to ask makes it under an exclusive ``fcntl.flock``, the others wait for that lock and read it. A make
that fails is noted, and every later ask fails with its message (it is not tried again).

:func:`jobs_run_once` runs a group of batch jobs that way: one launch of ``mpiexec -n P tests/job_driver.py`` runs
them one after another (in this process for one rank), and each test reads the :class:`JobRun` of the jobs it
compares.
"""

import fcntl
import json
import os
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from nnlib.course.environment import mpiexec_path

HERE = Path(__file__).resolve().parent
_OWN_SESSION = []  # without $NNLIB_TEST_SESSION (not under pytest's conftest): a folder for this process


def session_folder() -> Path:
    if os.environ.get("NNLIB_TEST_SESSION"):
        return Path(os.environ["NNLIB_TEST_SESSION"])
    if not _OWN_SESSION:
        _OWN_SESSION.append(Path(tempfile.mkdtemp(prefix="nnlib-shared-runs-")))
    return _OWN_SESSION[0]


def once_per_session(name: str, make) -> Path:
    """The session's folder ``name``, filled by ``make(folder)`` once in the session (by whichever process asks
    first); RuntimeError, with what went wrong, if that make failed."""
    root = session_folder()
    folder, lock_path = root / name, root / f"{name}.lock"
    done, failed = folder / ".done", folder / ".failed"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, even if this process dies
        if not done.exists() and not failed.exists():
            folder.mkdir(parents=True, exist_ok=True)
            try:
                make(folder)
            except Exception:
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
    """What a job did: its exit status as a launch would give it (0; 2: refused; 1: aborted), what its ranks printed
    (rank 0 first, as mpiexec relays it), and its --output file (written into the group's folder)."""

    returncode: int
    stdout: str
    stderr: str
    output: Path

    def saved(self) -> dict:
        with np.load(self.output) as saved:
            return dict(saved)

    def params(self) -> np.ndarray:
        return self.saved()["params"]


def jobs_run_once(group: str, ranks: int, jobs: dict, timeout: float = 900) -> dict:
    """{name: JobRun} for ``jobs`` ({name: Job}), run once in the session, one after another, in one launch of
    ``ranks`` ranks (tests/job_driver.py; for one rank, in this process). Each job writes --output to
    <group folder>/<its index>.npz."""
    names = list(jobs)
    spec = [dict(arguments=[*map(str, jobs[name].arguments), "--output", f"{{folder}}/{index}.npz"],
                 cupy=jobs[name].cupy) for index, name in enumerate(names)]

    def make(folder: Path) -> None:
        filled = [dict(each, arguments=[word.replace("{folder}", str(folder)) for word in each["arguments"]])
                  for each in spec]
        if ranks == 1:
            import job_driver

            job_driver.run_jobs(filled, folder)
            return
        (folder / "spec.json").write_text(json.dumps(filled))
        launch = subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, str(HERE / "job_driver.py"),
                                 str(folder / "spec.json"), str(folder)], capture_output=True, text=True,
                                timeout=timeout)
        if launch.returncode != 0:
            raise RuntimeError(f"the launch of {ranks} ranks ended with {launch.returncode}:\n{launch.stderr[-4000:]}")

    folder = once_per_session(group, make)
    return {name: job_run(folder, index, ranks) for index, name in enumerate(names)}


def job_run(folder: Path, index: int, ranks: int) -> JobRun:
    """Job ``index``'s JobRun from every rank's results (job_driver.py's job<I>.rank<R>.json)."""
    results = [json.loads((folder / f"job{index}.rank{rank}.json").read_text()) for rank in range(ranks)]
    aborted = [f"rank {rank}: {result['aborted']}" for rank, result in enumerate(results) if result["aborted"]]
    returncode = 1 if aborted else max(result["returncode"] for result in results)
    return JobRun(returncode, "".join(result["stdout"] for result in results),
                  "".join(result["stderr"] for result in results) + "\n".join(aborted), folder / f"{index}.npz")
