"""nnlib.parallel under mpiexec with 1 to 4 ranks: equal to sequential; bad setups fail on every rank."""

from pathlib import Path

import pytest

from conftest import run_mpi_script

CHECKER = Path(__file__).parent / "mpi" / "check_parallel.py"


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_data_parallel_training_equals_sequential(ranks):
    run = run_mpi_script(CHECKER, ranks)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{ranks} ranks: all checks passed" in run.stdout
