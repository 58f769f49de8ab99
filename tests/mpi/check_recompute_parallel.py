"""Run under mpiexec with 1 to 4 ranks: lesson 09's pipeline and tensor parallelism with recomputation.

nnlib.lesson12_memory.recompute_parallel: a pipeline stage keeping only each micro-batch's stage input (and
the output it sends) and recomputing its forward before the backward, under GPipe, 1F1B and lesson 13's
interleaved and zero-bubble schedules; a tensor-parallel rank keeping every k-th layer's input. On uneven
sizes (203 rows, m = 3 and 7 micro-batches that do not divide them, 4 and 9 layers on up to 4 stages, hidden
sizes the ranks do not divide), float64, sigmoid and softmax, full batch and mini-batch with momentum: the
parameters are bit-identical to the same run without recomputation and within 1e-10 of sequential training;
a stage recomputes exactly its forward FLOPs; fewer activation bytes are kept; bad settings fail everywhere.
"""

import numpy as np
from harness import expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson09_model_parallel.pipeline import PipelineMLP
from nnlib.lesson09_model_parallel.tensor import TensorParallelMLP
from nnlib.lesson12_memory.recompute import forward_flops
from nnlib.lesson12_memory.recompute_parallel import (RecomputedPipelineMLP, RecomputedStages,
                                                      RecomputedTensorParallelMLP)
from nnlib.lesson13_pipeline_schedules.schedules import ScheduledPipeline

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(0)
INPUTS, LABELS = rng.random((203, 12)), rng.integers(0, 4, 203)
SETTINGS = (("sigmoid", dict(epochs=2, learning_rate=0.5)),
            ("softmax", dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=5)))


class RecomputedScheduledPipeline(RecomputedStages, ScheduledPipeline):
    """Lesson 13's schedules with lesson 12's recomputation: the hooks compose with any PipelineMLP."""


def trained(network, settings, inputs=INPUTS, labels=LABELS):
    """(the whole network's parameters after training, the history): one process's or gathered from the ranks."""
    history = train(network, inputs, labels, progress=False, **settings)
    return (network.full_params() if hasattr(network, "full_params") else network.params.copy()), history


def assert_same_as_plain_and_sequential(plain, recomputed, expected, where):
    """recomputed = (params, history) equal to plain's bit for bit and to expected's (sequential) within 1e-10."""
    (plain_params, plain_history), (params, history), (expected_params, expected_history) = plain, recomputed, expected
    assert np.array_equal(params, plain_params), f"{where}: not bit-identical to the run without recomputation"
    assert history.loss == plain_history.loss, where
    error = np.abs(params - expected_params).max() / np.abs(expected_params).max()
    assert error <= 1e-10, f"{where}: relative error {error:.1e} against sequential training"
    assert np.allclose(history.loss, expected_history.loss, rtol=1e-12), where


def test_pipeline_with_recomputation_is_bit_identical_and_equal_to_sequential():
    sizes = (12, 9, 8, 7, 4)  # 4 layers: uneven stages on 3 ranks
    for output, settings in SETTINGS:
        expected = trained(Network(sizes, output=output, dtype="float64", seed=3), settings)
        for schedule in ("gpipe", "1f1b"):
            for micro_batches in (3, 7):
                arguments = dict(output=output, dtype="float64", seed=3, micro_batches=micro_batches,
                                 schedule=schedule)
                plain = trained(PipelineMLP(comm, sizes, **arguments), settings)
                recomputed = trained(RecomputedPipelineMLP(comm, sizes, **arguments), settings)
                assert_same_as_plain_and_sequential(plain, recomputed, expected,
                                                    f"pipeline {schedule} m={micro_batches} {output}")


def test_lesson_13_schedules_with_recomputation_are_bit_identical():
    sizes = (10, 9, 8, 8, 7, 7, 6, 6, 5, 3)  # 9 layers: 2 chunks of uneven stages on up to 4 ranks
    inputs, labels = np.ascontiguousarray(INPUTS[:, :10]), LABELS % 3
    output, settings = SETTINGS[1]
    expected = trained(Network(sizes, output=output, dtype="float64", seed=3), settings, inputs, labels)
    for schedule, chunks in (("interleaved", 2), ("zb-h1", 1), ("zb-h2", 1)):
        arguments = dict(output=output, dtype="float64", seed=3, micro_batches=7, schedule=schedule, chunks=chunks)
        plain = trained(ScheduledPipeline(comm, sizes, **arguments), settings, inputs, labels)
        recomputed = trained(RecomputedScheduledPipeline(comm, sizes, **arguments), settings, inputs, labels)
        assert_same_as_plain_and_sequential(plain, recomputed, expected, f"{schedule} v={chunks}")


def test_a_stage_recomputes_its_forward_once_and_keeps_less():
    sizes = (12,) + (30,) * 7 + (4,)  # 8 layers: at least 2 per stage, so that there is something to recompute
    plain = PipelineMLP(comm, sizes, dtype="float64", seed=3, micro_batches=5, schedule="gpipe")
    pipeline = RecomputedPipelineMLP(comm, sizes, dtype="float64", seed=3, micro_batches=5, schedule="gpipe")
    for network in (plain, pipeline):
        network.loss_and_gradient(INPUTS, LABELS)
    assert pipeline.tally.recomputed_flops == forward_flops(203, pipeline.shapes), pipeline.tally.recomputed_flops
    assert pipeline.peak_alive == plain.peak_alive == 5
    assert pipeline.peak_activation_bytes < plain.peak_activation_bytes, \
        (pipeline.peak_activation_bytes, plain.peak_activation_bytes)
    first, stop = pipeline.first, pipeline.stop
    kept_values = sizes[first] * (rank > 0) + sizes[stop] * (rank < size - 1)  # input received, output sent
    assert pipeline.peak_activation_bytes == 203 * kept_values * 8, (pipeline.peak_activation_bytes, kept_values)


def test_tensor_parallel_with_recomputation_is_bit_identical_and_equal_to_sequential():
    for sizes in ((12, 9, 6, 5, 4), (12, 7, 9, 5, 6, 3, 4)):  # 4 and 6 layers (pairs), 5: a replicated last one
        for output, settings in SETTINGS:
            expected = trained(Network(sizes, output=output, dtype="float64", seed=3), settings)
            plain = trained(TensorParallelMLP(comm, sizes, output=output, dtype="float64", seed=3), settings)
            for every in (1, 2, 3, len(sizes) - 1):
                network = RecomputedTensorParallelMLP(comm, sizes, output=output, dtype="float64", seed=3,
                                                      recompute_every=every)
                assert_same_as_plain_and_sequential(plain, trained(network, settings), expected,
                                                    f"tensor {sizes} every={every} {output}")
                assert (network.tally.recomputed_flops > 0) == (every > 1), (every, network.tally.recomputed_flops)


def test_bad_recomputation_settings_fail_on_every_rank():
    expect_error_everywhere(lambda: RecomputedTensorParallelMLP(comm, (12, 9, 4), recompute_every=0),
                            "recompute_every must be a whole number")
    if size > 1:
        expect_error_everywhere(lambda: RecomputedTensorParallelMLP(comm, (12, 9, 4), recompute_every=1 + (rank == 0)),
                                "the ranks disagree on recompute_every")


if __name__ == "__main__":
    run_checks(globals())
