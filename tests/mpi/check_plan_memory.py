"""Run under mpiexec with 4 ranks: lesson 19's memory model against tracemalloc's peak on every rank.

For every layout of a small sweep (data parallelism with ZeRO 0-2 and FSDP, accumulation, recomputation; tensor;
GPipe and 1F1B pipelines; the 2-D grids data x tensor and data x pipeline, with ZeRO-1 on their data axis too),
momentum SGD and Adam, float64: on every rank |predicted - measured| / measured <= 15%, where predicted is
nnlib.lesson19_planning.memory.peak_bytes and measured is measured_peak (the layout's real training step, after a
warm-up). The model was fitted on the first network; the second (another shape, batch and depth) it never saw, nor
float32 (NumPy elides none of Adam's temporaries there) and mixed precision (float16, bfloat16: lesson 17's, on the
data axis), each on a few layouts.
The check can fail: without the terms the lessons leave out (the step's batch, the update's temporaries), some
layout is off by more than 15%.
"""

from harness import assert_on_every_rank, run_checks
from mpi4py import MPI

from nnlib.lesson19_planning.layout import Layout
from nnlib.lesson19_planning.memory import measured_peak, peak_bytes

comm = MPI.COMM_WORLD
BOUND = 0.15
NETWORKS = {"fitted": ((784, 130, 98, 66, 10), 256, "float64"), "unseen": ((784, 64, 61, 59, 57, 10), 512, "float64"),
            "float32": ((784, 64, 61, 59, 57, 10), 512, "float32"),
            "float16": ((784, 130, 98, 66, 10), 256, "float16"),
            "bfloat16": ((784, 64, 61, 59, 57, 10), 512, "bfloat16"),
            "fitted, cut": ((784, 130, 98, 66, 10), 256, "float64")}
SWEEP = [(Layout(data=4, zero=zero), "momentum") for zero in range(4)] + [
    (Layout(data=4, micro_batches=4), "adam"), (Layout(data=4, recompute=2), "momentum"),
    (Layout(data=4, zero=3, recompute=2, micro_batches=2), "adam"), (Layout(tensor=4), "momentum"),
    (Layout(pipeline=4, micro_batches=4, schedule="gpipe"), "adam"), (Layout(pipeline=4, micro_batches=8), "momentum"),
    (Layout(data=2, tensor=2), "adam"), (Layout(data=2, pipeline=2, micro_batches=4), "momentum"),
    (Layout(data=2, tensor=2, zero=1), "adam"), (Layout(data=2, pipeline=2, zero=1, micro_batches=4), "adam"),
    (Layout(tensor=2, pipeline=2, micro_batches=4), "momentum"),  # a 3-D grid's piece (grid.py), D = 1
    (Layout(tensor=2, pipeline=2, micro_batches=4, schedule="gpipe"), "adam")]
OTHER_SWEEPS = {  # the networks not in float64: a few layouts each (mixed precision: the data axis only)
    "float32": [(Layout(data=4, micro_batches=4), "adam"), (Layout(pipeline=4, micro_batches=4), "adam")],
    "float16": [(Layout(data=4), "momentum"), (Layout(data=4, zero=1), "adam"),
                (Layout(data=4, zero=3, recompute=2, micro_batches=2), "adam")],
    "bfloat16": [(Layout(data=4, micro_batches=4), "adam"), (Layout(data=4, zero=3), "momentum")],
    "fitted, cut": [(Layout(data=2, pipeline=2, micro_batches=4, cut=(1, 3)), "momentum"),  # stages cut by cost
                    (Layout(tensor=2, pipeline=2, micro_batches=4, cut=(3, 1)), "adam")]}
MEASURED = {}  # (network, layout, optimizer) -> every rank's peak, measured once


def errors(name: str, drop=()) -> dict:
    """(layout, optimizer) -> this rank's (predicted - measured) / measured on network ``name``, the kinds ``drop``
    left out of the prediction."""
    (sizes, batch, precision), found = NETWORKS[name], {}
    for layout, optimizer in OTHER_SWEEPS.get(name, SWEEP):
        if (name, layout, optimizer) not in MEASURED:
            MEASURED[name, layout, optimizer] = measured_peak(comm, sizes, batch, layout, optimizer, precision)
        measured = MEASURED[name, layout, optimizer][comm.rank]
        kinds = peak_bytes(sizes, batch, comm.size, comm.rank, layout, optimizer, precision)
        found[layout, optimizer] = (sum(kinds.values()) - sum(kinds.get(kind, 0) for kind in drop)) / measured - 1
    return found


def test_every_layout_is_within_15_percent_on_every_rank():
    if comm.size != 4:
        return
    failures = [f"{name} {layout} {optimizer}: {error:+.1%}" for name in NETWORKS
                for (layout, optimizer), error in errors(name).items() if abs(error) > BOUND]
    assert_on_every_rank(failures)


def test_without_the_terms_the_lessons_leave_out_the_check_fails():
    """The batch, and the update's temporaries: each left out, some layout of the sweep on some rank errs by more
    than 15% (so the check above would fail)."""
    if comm.size != 4:
        return
    for kind in ("batch", "update"):
        worst = comm.allreduce(max(abs(error) for error in errors("fitted", (kind,)).values()), op=MPI.MAX)
        assert worst > BOUND, f"without {kind}: worst error {worst:.1%}, within {BOUND:.0%}"


def test_a_bad_layout_is_refused_with_a_clear_error():
    small, fitted = (784, 3, 10), NETWORKS["fitted"][0]
    for layout, words, sizes in [(Layout(data=3), "but there are", fitted), (Layout(tensor=4), "too wide", small),
                                 (Layout(pipeline=4), "only 2 weight layers", small),
                                 (Layout(data=4, micro_batches=0), "at least 1", fitted),
                                 (Layout(data=4, zero=4), "zero must be", fitted)]:
        try:
            peak_bytes(sizes, 64, 4, 0, layout)
        except ValueError as error:
            assert words in str(error), (layout, str(error))
        else:
            raise AssertionError(f"{layout} was not refused")


if __name__ == "__main__":
    run_checks(globals())
