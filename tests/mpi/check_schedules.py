"""Run under mpiexec with 1 to 4 ranks: lesson 18's schedules train exactly as sequential training.

Interleaved 1F1B (v = 2 chunks per rank), ZB-H1 and ZB-H2 (the backward split into B and W, W
deferred) on a network of 9 weight layers (uneven over 1-4 stages and over their 2-8 virtual
stages), m = 3 and 7 micro-batches (not multiples of P), batches of 203 and 32 samples, sigmoid and
softmax, float64: the parameters put together equal the sequential run's to 1e-10, and the peak of
micro-batches alive on each stage is the schedule's (tests/test_pipeline_schedules.py), by the executor's count
and by live_peak's count of the arrays themselves (which sees a stage that keeps one too long). So do 1F1B,
interleaved and ZB-H1 with a custom split of the layers over the (virtual) stages (one layer on each
but the last, which holds the rest). measure_schedules gives each schedule's row. Bad settings, bad splits included,
fail on every rank at once.
"""

import numpy as np
from harness import expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson18_pipeline_schedules.schedules import ScheduledPipeline, live_peak, peak_alive, schedule_programs

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(1)
INPUTS, LABELS = rng.random((203, 10)), rng.integers(0, 3, 203)
SIZES = (10, 9, 8, 8, 7, 7, 6, 6, 5, 3)  # 9 weight layers


def test_equal_to_sequential_training():
    for schedule, chunks in (("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1)):
        for output, micro_batches, settings in (("sigmoid", 3, dict(epochs=2, learning_rate=0.5)),
                                                ("softmax", 7, dict(epochs=2, learning_rate=0.5, batch_size=32,
                                                                    momentum=0.9, seed=5)),
                                                ("sigmoid", 7, dict(epochs=2, learning_rate=0.01, batch_size=32,
                                                                    optimizer="adam", seed=5))):  # m >= 2P - 1
            sequential = Network(SIZES, output=output, dtype="float64", seed=3)
            expected = train(sequential, INPUTS, LABELS, progress=False, **settings)
            pipeline = ScheduledPipeline(comm, SIZES, output=output, dtype="float64", seed=3,
                                         micro_batches=micro_batches, schedule=schedule, chunks=chunks)
            history = train(pipeline, INPUTS, LABELS, progress=False, **settings)
            full = pipeline.full_params()
            error = np.abs(full - sequential.params).max() / np.abs(sequential.params).max()
            where = f"{schedule} v={chunks} {output} m={micro_batches}"
            assert error <= 1e-10, f"{where}: relative error {error:.1e}"
            assert np.allclose(history.loss, expected.loss, rtol=1e-12), where
            assert pipeline.accuracy(INPUTS, LABELS) == sequential.accuracy(INPUTS, LABELS), where
            last_m = min(micro_batches, 203 % 32 if "batch_size" in settings else 203)
            wanted = [peak_alive(instructions) for instructions in schedule_programs(schedule, size, last_m, chunks)]
            assert comm.allgather(pipeline.peak_alive) == wanted, (where, wanted)


def test_the_arrays_alive_are_as_the_lists_say_and_one_kept_too_long_is_seen():
    for schedule, chunks in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1)):
        wanted = [peak_alive(instructions) for instructions in schedule_programs(schedule, size, 7, chunks)][rank]
        pipeline = ScheduledPipeline(comm, SIZES, dtype="float64", micro_batches=7, schedule=schedule, chunks=chunks)
        assert live_peak(pipeline, INPUTS[:50], LABELS[:50]) == (wanted, 0), (schedule, wanted)
    broken = ScheduledPipeline(comm, SIZES, dtype="float64", micro_batches=7, schedule="1f1b")
    stage, stash = broken.held[0], []
    backward = stage.backward

    def backward_keeping_one(step, k):  # keeps micro-batch k's arrays until the next backward
        stash[:] = [stage.kept[k]]
        backward(step, k)

    stage.backward = backward_keeping_one  # (before the first step: the executor looks its methods up then)
    wanted = peak_alive(schedule_programs("1f1b", size, 7)[rank])
    assert live_peak(broken, INPUTS[:50], LABELS[:50]) == (wanted + 1, 1)


def lopsided(virtual_stages: int) -> tuple:
    """A split unlike the even one: one layer on every virtual stage but the last, the rest on the last."""
    return (1,) * (virtual_stages - 1) + (len(SIZES) - virtual_stages,)


def test_equal_to_sequential_training_with_a_custom_split():
    settings = dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=5)
    for schedule, virtual_stages in (("1f1b", size), ("interleaved", 2 * size), ("zb-h1", size)):
        sequential = Network(SIZES, output="softmax", dtype="float64", seed=3)
        train(sequential, INPUTS, LABELS, progress=False, **settings)
        pipeline = ScheduledPipeline(comm, SIZES, output="softmax", dtype="float64", seed=3, micro_batches=7,
                                     schedule=schedule, chunks=lopsided(virtual_stages))
        assert [stop - first for first, stop in pipeline.chunk_ranges] == \
            [lopsided(virtual_stages)[chunk * size + rank] for chunk in range(pipeline.chunks)], schedule
        train(pipeline, INPUTS, LABELS, progress=False, **settings)
        error = np.abs(pipeline.full_params() - sequential.params).max() / np.abs(sequential.params).max()
        assert error <= 1e-10, f"{schedule} split {lopsided(virtual_stages)}: relative error {error:.1e}"


def test_measured_schedules_come_with_their_formula_simulation_peaks_and_layers():
    from nnlib.lesson18_pipeline_schedules.schedules import measure_schedules

    results = measure_schedules(comm, SIZES, 60, 4, ("1f1b", "interleaved", "zb-h1"), repeats=2)
    if rank != 0:
        assert results is None
        return
    for name, row in results.items():
        chunks = 2 if name == "interleaved" else 1
        assert row["peak_alive"] == [peak_alive(instructions) for instructions in schedule_programs(name, size, 4, chunks)]
        assert sum(row["layers"]) == len(SIZES) - 1 and len(row["layers"]) == size * chunks
        assert 0 <= row["measured"] < 1 and 0 <= row["simulated"] < 1 and 0 <= row["formula"] < 1
        letters = {letter for timeline in row["timelines"] for letter, *_ in timeline}
        assert letters == ({"F", "B", "W"} if name == "zb-h1" else {"F", "B"}), (name, letters)


def test_bad_settings_fail_on_every_rank():
    expect_error_everywhere(lambda: ScheduledPipeline(comm, SIZES, schedule="zb-h3"), "schedule must be one of")
    expect_error_everywhere(lambda: ScheduledPipeline(comm, SIZES, schedule="zb-h1", chunks=2), "chunks must be")
    expect_error_everywhere(lambda: ScheduledPipeline(comm, (10, 3), schedule="interleaved", chunks=2),
                            "every stage needs at least one")
    expect_error_everywhere(lambda: ScheduledPipeline(comm, SIZES, chunks=(1,) * size), f"holds {size} layers but")
    zero = (0,) + (1,) * (2 * size - 2) + (11 - 2 * size,)  # 2P virtual stages, the first without a layer
    expect_error_everywhere(lambda: ScheduledPipeline(comm, SIZES, schedule="interleaved", chunks=zero),
                            "split must give each of the")
    if size > 1:
        expect_error_everywhere(lambda: ScheduledPipeline(comm, SIZES, chunks=(1,) * (2 * size + 1)),
                                "chunks as layer counts must name")
        expect_error_everywhere(lambda: ScheduledPipeline(comm, SIZES, schedule="interleaved", chunks=1 + (rank == 0)),
                                "the ranks disagree on the schedule and chunks")


if __name__ == "__main__":
    run_checks(globals())
