"""nnlib.collectives under mpiexec with 1, 2, 3 and 4 ranks (uneven sizes included), plus the guard."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nnlib import collectives
from nnlib.environment import mpiexec_path

CHECKER = Path(__file__).parent / "mpi" / "check_collectives.py"


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_every_collective_exact_on_every_rank(ranks):
    # A rank that fails before a collective leaves the others waiting forever: the timeout catches that.
    run = subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, str(CHECKER)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{ranks} ranks: all checks passed" in run.stdout


def test_split_counts_and_offsets():
    assert collectives.split_counts(10, 4).tolist() == [3, 3, 2, 2]
    assert collectives.offsets([3, 3, 2, 2]).tolist() == [0, 3, 6, 8]
    assert collectives.split_counts(2, 4).tolist() == [1, 1, 0, 0]
    assert [collectives.row_range(997, 3, r) for r in range(3)] == [(0, 333), (333, 665), (665, 997)]
    with pytest.raises(ValueError, match="parts must be at least 1"):
        collectives.split_counts(5, 0)


def test_guard_messages():
    with pytest.raises(ValueError, match=r"Fortran-ordered.*np\.ascontiguousarray\(weights\)"):
        collectives.require_contiguous(np.asfortranarray(np.ones((2, 3))), "weights")
    with pytest.raises(ValueError, match="strided view"):
        collectives.require_contiguous(np.ones((4, 4))[::2])
    with pytest.raises(TypeError, match="must be a NumPy array"):
        collectives.require_contiguous([1, 2, 3])
    row_major = np.ones((2, 3))
    assert collectives.require_contiguous(row_major) is row_major
