"""nnlib.lesson04_collectives.collectives: splits, the contiguity guard, and the plain-MPI twin of notebook 04 under mpiexec.

The collectives themselves run under mpiexec in tests/test_mpi.py (tests/mpi/check_collectives.py)."""

import subprocess
import sys

import numpy as np
import pytest

from nnlib.course.environment import mpiexec_path
from nnlib.lesson04_collectives import collectives


def test_split_evenly_and_offsets():
    assert collectives.split_evenly(10, 4) == ([3, 3, 2, 2], [0, 3, 6, 8])
    assert collectives.offsets([3, 3, 2, 2]).tolist() == [0, 3, 6, 8]
    assert collectives.split_evenly(2, 4)[0] == [1, 1, 0, 0]
    assert collectives.split_evenly(997, 3) == ([333, 332, 332], [0, 333, 665])
    with pytest.raises(ValueError, match="parts must be at least 1"):
        collectives.split_evenly(5, 0)


@pytest.mark.parametrize("total, parts", [(10, 4), (2, 4), (997, 3), (7, 7), (0, 3), (1001, 1)])
def test_one_split_of_n_items_over_p_ranks(total, parts):
    """split_evenly is nnlib's one split (rows, the ring's chunks, hidden units, layers): counts and starts."""
    counts, starts = collectives.split_evenly(total, parts)
    assert all(isinstance(value, int) for value in counts + starts)
    assert sum(counts) == total and max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)
    assert starts == [sum(counts[:rank]) for rank in range(parts)]
    assert collectives.offsets(counts).tolist() == starts


def test_the_one_timer_warms_up_then_times_each_call():
    from nnlib.lesson04_collectives.timing import median_seconds, timed_calls

    calls = []
    seconds = timed_calls(lambda: calls.append("call"), repeats=3, warmup=2,
                          synchronize=lambda: calls.append("wait"), before=lambda: calls.append("before"))
    assert calls == ["call", "call", "wait"] + ["before", "call", "wait"] * 3
    assert seconds.shape == (3,) and (seconds >= 0).all()
    assert median_seconds(lambda: None, repeats=5) >= 0
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        timed_calls(lambda: None, repeats=0)


def test_guard_messages():
    with pytest.raises(ValueError, match=r"Fortran-ordered.*np\.ascontiguousarray\(weights\)"):
        collectives.require_contiguous(np.asfortranarray(np.ones((2, 3))), "weights")
    with pytest.raises(ValueError, match="strided view"):
        collectives.require_contiguous(np.ones((4, 4))[::2])
    with pytest.raises(TypeError, match="must be a NumPy array"):
        collectives.require_contiguous([1, 2, 3])
    row_major = np.ones((2, 3))
    assert collectives.require_contiguous(row_major) is row_major


def expected_demo_lines(size):
    """What `python -m nnlib collectives` must print for `size` ranks, computed independently."""
    def fmt(values):
        return "-" if values is None else " ".join(f"{v:g}" for v in values)

    counts = [10 // size + (1 if r < 10 % size else 0) for r in range(size)]
    starts = [sum(counts[:r]) for r in range(size)]
    rows = {
        "bcast": [([1, 2, 3, 4] if r == 0 else [0] * 4, [1, 2, 3, 4]) for r in range(size)],
        "scatter": [(list(range(0, 20 * size, 10)) if r == 0 else None, [20 * r, 20 * r + 10]) for r in range(size)],
        "gather": [([10 * r, 10 * r + 1], [v for k in range(size) for v in (10 * k, 10 * k + 1)] if r == 0 else None)
                   for r in range(size)],
        "allgather": [([10 * r, 10 * r + 1], [v for k in range(size) for v in (10 * k, 10 * k + 1)])
                      for r in range(size)],
        "reduce": [([r + 1] * 3, [size * (size + 1) / 2] * 3 if r == 0 else None) for r in range(size)],
        "allreduce": [([r + 1] * 3, [size * (size + 1) / 2] * 3) for r in range(size)],
        "barrier": [(None, [r]) for r in range(size)],
        "scatterv": [(list(range(10)) if r == 0 else None, list(range(starts[r], starts[r] + counts[r])))
                     for r in range(size)],
        "gatherv": [(list(range(starts[r], starts[r] + counts[r])), list(range(10)) if r == 0 else None)
                    for r in range(size)],
        "contiguity_guard": [([1 if r == 0 else 0], list(range(6))) for r in range(size)],
    }
    return [f"{name:16s} rank {r}: {fmt(before)} -> {fmt(after)}"
            for name, per_rank in rows.items() for r, (before, after) in enumerate(per_rank)]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_notebook_04_script_twin(ranks):
    run = subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "nnlib", "collectives"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == expected_demo_lines(ranks)


def test_the_range_rule_calls_a_difference_only_where_the_ranges_are_apart():
    """Lesson 10's rule (waiting.range_verdict), used by lessons 10 and 18 and the schedules benchmark."""
    from nnlib.lesson10_zero_overlap.waiting import range_verdict

    assert range_verdict([1.0, 1.2, 1.1], [1.3, 1.5]) == "faster"
    assert range_verdict([1.6, 1.7], [1.3, 1.5]) == "slower"
    assert range_verdict([1.0, 1.4], [1.3, 1.5]) == "within noise"  # the medians differ, the ranges touch
    assert range_verdict([1.3], [1.3, 1.5]) == "within noise"
