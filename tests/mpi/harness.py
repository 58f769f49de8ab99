"""What the MPI checker scripts share: run every test_* (or check_*) function, gather the failures, one verdict.

A failing check is recorded on its rank (with its traceback) and the others go on, so that no
rank leaves a collective early; rank 0 prints everything and every rank exits with the same code.
A checker run alone (``mpiexec -n P python check_x.py``) calls run_checks; run_checkers.py runs several checkers
in one job through failures_here and gathered, one verdict each.
"""

import sys
import traceback

from mpi4py import MPI


def failures_here(namespace: dict, prefix: str = "test_") -> list[str]:
    """Call each function of ``namespace`` (a checker's globals()) named ``prefix``..., in order: this rank's
    failures, each with its traceback (a failing check does not stop the others)."""
    rank = MPI.COMM_WORLD.rank
    failures = []
    for name, function in list(namespace.items()):
        if name.startswith(prefix) and callable(function):
            try:
                function()
            except Exception:
                failures.append(f"rank {rank}: {name}\n{traceback.format_exc()}")
    return failures


def gathered(failures: list[str]) -> list[str]:
    """Every rank's ``failures`` on rank 0, in rank order (an empty list on the other ranks)."""
    everyone = MPI.COMM_WORLD.gather(failures, root=0)
    return [failure for rank_failures in everyone for failure in rank_failures] if everyone else []


def run_checks(namespace: dict, prefix: str = "test_") -> None:
    """Call each function of ``namespace`` (a checker's globals()) named ``prefix``..., then exit 0 or 1 everywhere."""
    comm = MPI.COMM_WORLD
    flat = gathered(failures_here(namespace, prefix))
    code = 0
    if comm.rank == 0:
        for failure in flat:
            print(failure, file=sys.stderr)
        print(f"{comm.size} ranks: {'all checks passed' if not flat else f'{len(flat)} failures'}")
        code = 1 if flat else 0
    sys.exit(comm.bcast(code, root=0))


def expect_error_everywhere(function, words: str) -> None:
    """``function()`` raises a ValueError mentioning ``words`` on this rank; then a Barrier proves that
    no rank was left waiting in a collective (every rank calls this together)."""
    try:
        function()
    except ValueError as error:
        assert words in str(error), f"expected {words!r} in: {error}"
    else:
        raise AssertionError(f"no error raised (expected one mentioning {words!r})")
    MPI.COMM_WORLD.Barrier()


def assert_on_every_rank(failures: list) -> None:
    """Every rank's failures, gathered after the loop of collective runs (a rank that stopped at its first
    failure would leave the others waiting in the next run's collectives): the same verdict everywhere."""
    found = MPI.COMM_WORLD.allgather(failures)
    everyone = [f"rank {where}: {message}" for where, messages in enumerate(found) for message in messages]
    assert not everyone, "\n".join(everyone)
