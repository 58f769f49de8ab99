"""The MPI checker scripts in tests/mpi/, each under mpiexec with 1, 2, 3 and 4 ranks.

check_collectives.py: every nnlib.collectives helper, exact values on every rank, uneven sizes.
check_parallel.py: data-parallel training equals sequential for every strategy; bad setups fail
on every rank at once. A rank that raises alone before a collective would hang the others: the
timeout in run_mpi_script turns that into a failure.
"""

from pathlib import Path

import pytest

from conftest import run_mpi_script

CHECKERS = Path(__file__).parent / "mpi"


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("checker", ["check_collectives.py", "check_parallel.py"])
def test_mpi_checker(checker, ranks):
    run = run_mpi_script(CHECKERS / checker, ranks)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{ranks} ranks: all checks passed" in run.stdout
