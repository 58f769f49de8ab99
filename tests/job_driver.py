"""Several batch jobs in one ``mpiexec -n P`` launch: ``mpiexec -n P python tests/job_driver.py SPEC.json FOLDER``.

Every rank runs the jobs of SPEC.json (a list of {"name": ..., "arguments": [...], "cupy": null or {"counting": bool,
...}}) one after another, each through the batch job's own entry point: ``nnlib.train_command.run(args)``, with
``args`` from ``python -m nnlib train``'s parser. ``cupy``: the job runs with a stand-in CuPy (tests/stand_in_cupy.py: a
CountingCuPy if ``counting``, else a StandInCuPy, with the other keys as its settings) as ``cupy``, the GPU check
made again for it; null: with no ``cupy`` module of ours, as a CPU job.

Each job gets ``--timeout JOB_TIMEOUT`` unless it sets one. Each rank writes FOLDER/job<I>.rank<R>.json per job: its
return code (0, 2 for a refusal said by rank 0, or 1 where the job would have ended with MPI_Abort), what it printed
on stdout and stderr, and, for an error that would have aborted the job, the rank's message as ``abort_job`` prints
it (``abort_job`` is replaced by one that raises, so that the rank writes it). After each job the ranks agree, under
a deadline, whether it aborted on any rank; if it did, no later job runs (a rank may still be waiting in the failed
job's collectives): each is noted FOLDER/job<I>.not-run, and the launch ends with exit status 1.

:func:`run_jobs` does the same in the calling process (on its MPI.COMM_WORLD: one rank, in a test process).
"""

import contextlib
import io
import json
import os
import sys
import traceback
from pathlib import Path

JOB_TIMEOUT = 30.0  # seconds a job's collective may wait (its --timeout), unless the job sets one
VERDICT_GRACE = 15.0  # seconds beyond a job's --timeout for every rank to give its verdict on the job


class JobAborted(Exception):
    """What the job would have ended with MPI_Abort for (abort_job's message)."""


def aborting_raises(error: BaseException) -> None:
    """In place of nnlib.train_command.job.abort_job: raise, with the message abort_job would print."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    raise JobAborted(f"error:\n{text}ending the whole job (MPI_Abort)")


@contextlib.contextmanager
def stand_in_cupy(settings):
    """``import cupy`` gives the stand-in ``settings`` asks for (None: no stand-in), and the GPU check (cached once
    per process in nnlib.course.environment) is made again; afterwards ``cupy`` is restored and the check made again."""
    from stand_in_cupy import CountingCuPy, StandInCuPy

    from nnlib.course import environment

    saved_module = sys.modules.get("cupy")
    if settings is None:
        sys.modules.pop("cupy", None)
    else:
        settings = dict(settings)
        kind = CountingCuPy if settings.pop("counting", False) else StandInCuPy
        sys.modules["cupy"] = kind(**settings)
    environment.gpu_status.cache_clear()
    try:
        yield
    finally:
        environment.gpu_status.cache_clear()
        if saved_module is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved_module


def run_job(arguments, cupy) -> dict:
    """One job on this rank: {"returncode", "stdout", "stderr", "aborted"} (aborted: abort_job's message, or None)."""
    from nnlib.__main__ import build_parser
    from nnlib.train_command import run

    stdout, stderr, aborted = io.StringIO(), io.StringIO(), None
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), stand_in_cupy(cupy):
        try:
            returncode = run(build_parser().parse_args(["train", *arguments]))
        except JobAborted as error:
            returncode, aborted = 1, str(error)
        except SystemExit as error:  # argparse's refusal of an argument
            returncode = error.code
    return dict(returncode=returncode, stdout=stdout.getvalue(), stderr=stderr.getvalue(), aborted=aborted)


def with_timeout(arguments: list) -> list:
    """``arguments`` with ``--timeout JOB_TIMEOUT`` unless they set a --timeout."""
    if any(word == "--timeout" or word.startswith("--timeout=") for word in arguments):
        return list(arguments)
    return [*arguments, "--timeout", str(JOB_TIMEOUT)]


def collective_timeout(arguments: list) -> float:
    """How long a rank of the job may wait in one collective: its --timeout (JOB_TIMEOUT for one that the job's
    settings check refuses, before any collective)."""
    from nnlib.__main__ import build_parser
    from nnlib.course.deadline import LONGEST_TIMEOUT, check_timeout

    with contextlib.suppress(SystemExit, ValueError), contextlib.redirect_stderr(io.StringIO()):
        return min(check_timeout(build_parser().parse_args(["train", *arguments]).timeout),
                   LONGEST_TIMEOUT - VERDICT_GRACE)
    return JOB_TIMEOUT


def aborted_anywhere(result: dict, seconds: float) -> bool:
    """Every rank's verdict on a job (its ``result``): whether it aborted on some rank, or some rank did not give
    its verdict within ``seconds`` (a collective with a deadline: nothing waits forever)."""
    from mpi4py import MPI

    from nnlib.course.deadline import CollectiveTimeout, watch

    try:
        return any(watch(MPI.COMM_WORLD, seconds).allgather(result["aborted"] is not None))
    except CollectiveTimeout:
        return True


def write_whole(path: Path, text: str) -> None:
    """``path`` holds ``text``, whole even if the launch ends this rank just then."""
    from nnlib.lesson01_mnist.files import atomic_write

    with atomic_write(path) as stream:
        stream.write(text.encode())


def run_jobs(spec: list, folder) -> bool:
    """Every job of ``spec`` ({"name", "arguments", "cupy"}), in order, on every rank of MPI.COMM_WORLD; each rank
    writes its results to ``folder``. Whether every job ran: after a job that aborted on some rank, the later ones
    are noted as not run."""
    from mpi4py import MPI

    from nnlib.train_command import job

    rank, saved_abort, folder = MPI.COMM_WORLD.rank, job.abort_job, Path(folder)
    job.abort_job = aborting_raises
    try:
        for index, each in enumerate(spec):
            arguments = with_timeout(each["arguments"])
            result = run_job(arguments, each.get("cupy"))
            write_whole(folder / f"job{index}.rank{rank}.json", json.dumps(result))
            if aborted_anywhere(result, collective_timeout(arguments) + VERDICT_GRACE):
                for later in range(index + 1, len(spec)):
                    write_whole(folder / f"job{later}.not-run", f"not run because job {each['name']!r} failed "
                                                                "before it in the same launch")
                return False
    finally:
        job.abort_job = saved_abort
    return True


if __name__ == "__main__":
    if not run_jobs(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2]):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # without MPI_Finalize, which could wait for a rank still in the failed job (mpiexec ends it)
