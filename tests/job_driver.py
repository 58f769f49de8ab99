"""Several batch jobs in one ``mpiexec -n P`` launch: ``mpiexec -n P python tests/job_driver.py SPEC.json FOLDER``.

Every rank runs the jobs of SPEC.json (a list of {"arguments": [...], "cupy": null or {"counting": bool, ...}}) one
after another, each through the batch job's own entry point: ``nnlib.train_command.run(args)``, with ``args`` from
``python -m nnlib train``'s parser. ``cupy``: the job runs with a stand-in CuPy (tests/stand_in_cupy.py: a
CountingCuPy if ``counting``, else a StandInCuPy, with the other keys as its settings) as ``cupy``, the GPU check
made again for it; null: with no ``cupy`` module of ours, as a CPU job.

Each rank writes FOLDER/job<I>.rank<R>.json per job: its return code (0, 2 for a refusal said by rank 0, or 1 where
the job would have ended with MPI_Abort), what it printed on stdout and stderr, and, for an error that would have
aborted the job, the rank's message as ``abort_job`` prints it. Such an error does not end the launch: ``abort_job``
is replaced by one that raises, so that one failing job does not hide the others' results.

:func:`run_jobs` does the same in the calling process (on its MPI.COMM_WORLD: one rank, in a test process).
"""

import contextlib
import io
import json
import sys
import traceback
from pathlib import Path


class JobAborted(Exception):
    """What the job would have ended with MPI_Abort for (abort_job's message)."""


def aborting_raises(error: BaseException) -> None:
    """In place of nnlib.train_command.job.abort_job: raise, with the message abort_job would print."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    raise JobAborted(f"error:\n{text}ending the whole job (MPI_Abort)")


@contextlib.contextmanager
def stand_in_cupy(settings):
    """``import cupy`` gives the stand-in ``settings`` asks for (None: no stand-in), and the GPU check (cached once
    per process in nnlib.course.environment) is made again; both restored afterwards."""
    from stand_in_cupy import CountingCuPy, StandInCuPy

    from nnlib.course import environment

    saved_module, saved_check = sys.modules.get("cupy"), environment._gpu_check
    if settings is None:
        sys.modules.pop("cupy", None)
    else:
        settings = dict(settings)
        kind = CountingCuPy if settings.pop("counting", False) else StandInCuPy
        sys.modules["cupy"] = kind(**settings)
    environment._gpu_check = None
    try:
        yield
    finally:
        environment._gpu_check = saved_check
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


def run_jobs(spec: list, folder) -> None:
    """Every job of ``spec``, in order, on every rank of MPI.COMM_WORLD; each rank writes its results to ``folder``."""
    from mpi4py import MPI

    from nnlib.train_command import job

    rank, saved_abort = MPI.COMM_WORLD.rank, job.abort_job
    job.abort_job = aborting_raises
    try:
        for index, each in enumerate(spec):
            result = run_job(each["arguments"], each.get("cupy"))
            (Path(folder) / f"job{index}.rank{rank}.json").write_text(json.dumps(result))
    finally:
        job.abort_job = saved_abort


if __name__ == "__main__":
    run_jobs(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2])
