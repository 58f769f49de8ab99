"""Run under mpiexec with 1 to 4 ranks: pipeline-parallel training equals sequential training.

Consecutive layers on consecutive ranks (nnlib.lesson12_pipeline.pipeline), m micro-batches (1, 3 and 8; batches of 203
and 32 samples, which do not divide), GPipe and 1F1B, sigmoid and softmax, full batch and mini-batch with momentum,
float64: the stages' parameters, put together, equal the sequential run's to 1e-10, with the even cut of the layers and
with every uneven one (PipelineMLP's cut). Also: 1F1B keeps at most P - s micro-batches alive on stage s and GPipe all
m, the bytes sent (counted on a communicator that records its calls: the pipeline uses the one it is given), lesson 12's
bubble measurement (nnlib.lesson12_pipeline.bubbles.measure_bubbles) gives its rows,
bad settings fail on every rank at once, and a stage that stalls is caught at the deadline
when the caller passes a watched communicator (nnlib.lesson13_faults.watchdog). The schedules' instruction lists
are tested on their own, without MPI, in tests/test_schedules.py.
"""

import itertools
import time

import numpy as np
from harness import expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson12_pipeline.pipeline import PipelineMLP, stage_layers
from nnlib.course.deadline import CollectiveTimeout, watch

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(0)
INPUTS, LABELS = rng.random((203, 12)), rng.integers(0, 4, 203)
SIZES = (12, 9, 8, 7, 4)  # 4 weight layers: one to four per stage


def test_equal_to_sequential_training():
    for output in ("sigmoid", "softmax"):
        for schedule in ("gpipe", "1f1b"):
            for micro_batches in (1, 3, 8):
                for settings in (dict(epochs=3, learning_rate=0.5),
                                 dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=5),
                                 dict(epochs=2, learning_rate=0.01, batch_size=32, optimizer="adam", seed=5)):
                    sequential = Network(SIZES, output=output, dtype="float64", seed=3)
                    expected = train(sequential, INPUTS, LABELS, progress=False, **settings)
                    pipeline = PipelineMLP(comm, SIZES, output=output, dtype="float64", seed=3,
                                           micro_batches=micro_batches, schedule=schedule)
                    history = train(pipeline, INPUTS, LABELS, progress=False, **settings)
                    full = pipeline.full_params()
                    error = np.abs(full - sequential.params).max() / np.abs(sequential.params).max()
                    where = f"{output} {schedule} m={micro_batches} {settings}"
                    assert error <= 1e-10, f"{where}: relative error {error:.1e}"
                    assert np.allclose(history.loss, expected.loss, rtol=1e-12), where
                    assert history.train_accuracy == expected.train_accuracy, where
                    assert pipeline.accuracy(INPUTS, LABELS) == sequential.accuracy(INPUTS, LABELS), where
                    alive = comm.allgather(pipeline.peak_alive)
                    batch = min(micro_batches, 203 % 32 if "batch_size" in settings else 203)  # the last step's m
                    if schedule == "gpipe":
                        assert alive == [batch] * size, (where, alive)
                    else:
                        assert alive == [min(size - stage, batch) for stage in range(size)], (where, alive)


def test_an_uneven_cut_equals_sequential_training():
    settings = dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=5)
    sequential = Network(SIZES, output="softmax", dtype="float64", seed=3)
    expected = train(sequential, INPUTS, LABELS, progress=False, **settings)
    cuts = [cut for cut in itertools.product(range(1, 5), repeat=size) if sum(cut) == len(SIZES) - 1]
    assert len(cuts) == {1: 1, 2: 3, 3: 3, 4: 1}[size], cuts  # every cut of 4 layers into P stages
    for cut, schedule in itertools.product(cuts, ("gpipe", "1f1b")):
        pipeline = PipelineMLP(comm, SIZES, output="softmax", dtype="float64", seed=3, micro_batches=3,
                               schedule=schedule, cut=list(cut))
        assert (pipeline.first, pipeline.stop) == (sum(cut[:rank]), sum(cut[:rank + 1])), (cut, rank)
        history = train(pipeline, INPUTS, LABELS, progress=False, **settings)
        error = np.abs(pipeline.full_params() - sequential.params).max() / np.abs(sequential.params).max()
        assert error <= 1e-10, f"cut {cut} {schedule}: relative error {error:.1e}"
        assert np.allclose(history.loss, expected.loss, rtol=1e-12), (cut, schedule)


class RecordingComm:
    """``comm`` with the bytes of every Isend recorded in ``sent``."""

    def __init__(self, comm):
        self.comm, self.sent = comm, []

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def Isend(self, buffer, dest, tag=0):
        self.sent.append(buffer.nbytes)
        return self.comm.Isend(buffer, dest=dest, tag=tag)


def test_stages_take_consecutive_layers():
    assert stage_layers(4, 3) == [(0, 2), (2, 3), (3, 4)]
    assert stage_layers(7, 2, (2, 5)) == [(0, 2), (2, 7)]
    assert stage_layers(4, 3, [1, 1, 2]) == [(0, 1), (1, 2), (2, 4)]


def test_the_bytes_sent_are_what_the_model_counts():
    from nnlib.lesson12_pipeline.tradeoffs import handed_bytes

    for micro_batches in (1, 3):
        recording = RecordingComm(comm)
        pipeline = PipelineMLP(recording, SIZES, dtype="float64", micro_batches=micro_batches)
        pipeline.loss_and_gradient(INPUTS[:50], LABELS[:50])
        busiest = max(comm.allgather(sum(recording.sent)))
        assert busiest == handed_bytes("pipeline", SIZES, 50, size, itemsize=8)["point_to_point"], micro_batches


def test_bad_settings_fail_on_every_rank():
    expect_error_everywhere(lambda: PipelineMLP(comm, SIZES, schedule="interleaved"), "schedule must be one of")
    expect_error_everywhere(lambda: PipelineMLP(comm, SIZES, micro_batches=0), "micro_batches must be")
    expect_error_everywhere(lambda: PipelineMLP(comm, (12,)), "layer_sizes needs at least two")
    if size > 1:
        expect_error_everywhere(lambda: PipelineMLP(comm, (12, 4)), "every stage needs at least one")
        expect_error_everywhere(lambda: PipelineMLP(comm, SIZES, micro_batches=2 + (rank == 0)),
                                "the ranks disagree on the pipeline")
        expect_error_everywhere(lambda: PipelineMLP(comm, SIZES, cut=(1, 2, 3, 4)[rank:rank + 2]),
                                "the ranks disagree on the pipeline")
    try:
        PipelineMLP(comm, SIZES, cuts=(2, 2))  # a misspelt name
        raise AssertionError("no error for the keyword cuts")
    except TypeError as error:
        assert "takes device and cut by name, nothing else; got cuts" in str(error), str(error)
    zero = (0,) * (size - 1) + (4,) if size > 1 else (0,)
    for cut in ((1,) * (size + 1), zero, (1,) * size if size < 4 else (1, 1, 1, 2), (2.5, 1.5), "4", (True,) * 4):
        expect_error_everywhere(lambda: PipelineMLP(comm, SIZES, cut=cut), f"cut must give each of the {size} stages")



def test_measured_bubbles_come_with_the_formula_the_simulation_and_the_peaks():
    from nnlib.lesson12_pipeline.bubbles import bubble_fraction, measure_bubbles

    rows = measure_bubbles(comm, SIZES, 60, micro_batch_counts=(1, 3), schedule="1f1b", repeats=2, dtype="float64")
    if rank != 0:
        assert rows is None
        return
    assert [row["micro_batches"] for row in rows] == [1, 3]
    for row in rows:
        m = row["micro_batches"]
        assert row["formula"] == bubble_fraction(size, m)
        assert row["peak_alive"] == [min(size - stage, m) for stage in range(size)]
        assert 0 <= row["measured"] < 1 and 0 <= row["simulated"] < 1 and row["step_seconds"] > 0
        assert row["spread"][0] <= row["step_seconds"] <= row["spread"][1]
        assert [sorted({letter for letter, *_ in timeline}) for timeline in row["timelines"]] == [["B", "F"]] * size
        if size == 1:
            assert row["simulated"] == 0.0  # nothing to wait for


def test_a_stalled_stage_is_caught_when_the_communicator_is_watched():
    if size == 1:
        return
    for schedule in ("gpipe", "1f1b"):
        pipeline = PipelineMLP(watch(comm, timeout=1.5), SIZES, dtype="float64", micro_batches=3, schedule=schedule)
        began = time.monotonic()
        outcome = "ok"
        if rank == size - 1:
            time.sleep(4)  # the last stage stalls: it never runs this step
        else:
            try:
                pipeline.loss_and_gradient(INPUTS[:50], LABELS[:50])
            except CollectiveTimeout as error:
                outcome = error
            assert isinstance(outcome, CollectiveTimeout), f"rank {rank}, {schedule}: {outcome!r}"
            assert time.monotonic() - began < 4, f"rank {rank} waited past the deadline"
            assert "did not arrive" in str(outcome) or "had stopped waiting" in str(outcome), str(outcome)
        comm.Barrier()  # the world communicator is still fine


if __name__ == "__main__":
    run_checks(globals())
