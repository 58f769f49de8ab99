"""nnlib.parallel under mpiexec with 1 to 4 ranks: equal to sequential; bad setups fail on every rank."""

import subprocess
import sys
from pathlib import Path

import pytest

from nnlib.environment import mpiexec_path

CHECKER = Path(__file__).parent / "mpi" / "check_parallel.py"


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_data_parallel_training_equals_sequential(ranks):
    # A hang (a rank raising alone before a collective) would hit the timeout and fail the test.
    run = subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, str(CHECKER)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{ranks} ranks: all checks passed" in run.stdout
