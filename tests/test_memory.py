"""Lesson 12 in one process: recomputation is bit-identical and costs what the formulas say; mixed
precision's loss scaler, underflow count, accuracy and bytes per parameter; gradient accumulation's
micro-batches. (Equality with sequential training on many ranks: tests/mpi/check_memory.py.)"""

import re
import tracemalloc

import numpy as np
import pytest

from nnlib import Network, train
from nnlib.lesson03_training.training import SGD, Settings
from nnlib.lesson12_memory.accumulation import MicroBatched, micro_batch_bounds
from nnlib.lesson12_memory.mixed_precision import (SGD_MOMENTUM_BYTES, MixedPrecision, ScaledStep, train_mixed,
                                                   underflow_per_layer)
from nnlib.lesson12_memory.recompute import (checkpoint_layers, extra_forward_flops, peak_activation_arrays,
                                             sqrt_every)

rng = np.random.default_rng(0)
DEEP = (16,) * 17  # 16 layers, 16 wide: a deep narrow network (16 classes)
INPUTS, LABELS = rng.random((203, 16)), rng.integers(0, 16, 203)
SHAPES = list(zip(DEEP[:-1], DEEP[1:]))


@pytest.mark.parametrize("every", [1, 2, 3, 4, 16])
def test_recomputation_gives_bit_identical_parameters(every):
    settings = dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, progress=False)
    plain = Network(DEEP, dtype="float64", seed=1)
    train(plain, INPUTS, LABELS, **settings)
    recomputed = MicroBatched(Network(DEEP, dtype="float64", seed=1), recompute_every=every)
    train(recomputed, INPUTS, LABELS, **settings)
    assert np.array_equal(plain.params, recomputed.params)


@pytest.mark.parametrize("every", [1, 2, 3, 4, 5, 16])
def test_peak_activations_and_extra_flops_are_the_formulas(every):
    network = MicroBatched(Network(DEEP, dtype="float64"), recompute_every=every)
    network.loss_and_gradient(INPUTS, LABELS)
    assert network.tally.peak_bytes == peak_activation_arrays(16, every) * 203 * 16 * 8
    assert network.tally.recomputed_flops == extra_forward_flops(203, SHAPES, every)
    assert extra_forward_flops(203, SHAPES, every) == 2 * 203 * 16 * 16 * (16 - len(checkpoint_layers(16, every)))


def test_sqrt_l_checkpoints_hold_the_fewest_arrays():
    assert sqrt_every(16) == 4 and checkpoint_layers(16, 4) == [0, 4, 8, 12] and checkpoint_layers(7, 3) == [0, 3, 6]
    assert peak_activation_arrays(16, 1) == 16 and peak_activation_arrays(16, 4) == 7
    assert min(peak_activation_arrays(16, every) for every in range(1, 17)) == 7


@pytest.mark.parametrize("every", [1, 4, 16])
def test_tracemalloc_measures_the_activations_plus_a_few_temporaries(every):
    """What NumPy really allocates (tracemalloc) lies between the activations the formula counts and the
    formula plus 7 arrays of the backward pass's temporaries (delta, dJ/da, a (1 - a), ...)."""
    rows, width = 1024, 64
    network = MicroBatched(Network((width,) * 17, dtype="float64"), recompute_every=every)
    inputs, labels = rng.random((rows, width)), rng.integers(0, width, rows)
    network.loss_and_gradient(inputs, labels)
    tracemalloc.start()
    network.loss_and_gradient(inputs, labels)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    array = rows * width * 8
    assert peak_activation_arrays(16, every) * array <= peak <= (peak_activation_arrays(16, every) + 7.1) * array


def test_micro_batches_cover_the_batch_unevenly():
    assert micro_batch_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert micro_batch_bounds(2, 3) == [(0, 1), (1, 2), (2, 2)]
    with pytest.raises(ValueError, match="micro_batches must be a whole number"):
        MicroBatched(Network((4, 3)), 0)


def test_accumulation_equals_the_whole_batch_within_1e_12():
    settings = dict(epochs=2, learning_rate=0.5, batch_size=50, momentum=0.9, progress=False)
    whole = Network((16, 9, 7, 16), dtype="float64", seed=2)
    train(whole, INPUTS, LABELS, **settings)
    for micro_batches in (2, 3, 7, 60):
        accumulated = MicroBatched(Network((16, 9, 7, 16), dtype="float64", seed=2), micro_batches)
        train(accumulated, INPUTS, LABELS, **settings)
        assert np.abs(accumulated.params - whole.params).max() <= 1e-12 * np.abs(whole.params).max()


def test_the_loss_scaler_skips_and_halves_on_overflow_and_doubles_after_good_steps():
    mixed = MixedPrecision(Network((16, 9, 16)), loss_scale=1024.0, growth_interval=3)
    step = ScaledStep(SGD(mixed, 0.1), mixed)
    verdicts = []
    for gradient in (np.inf, 2.0, 2.0, 2.0, np.nan, 4.0):
        before = mixed.params.copy()
        mixed.grads[...] = gradient
        step.step()
        verdicts.append((mixed.overflowed, mixed.loss_scale, not np.array_equal(before, mixed.params)))
    assert verdicts == [(True, 512.0, False), (False, 512.0, True), (False, 512.0, True), (False, 1024.0, True),
                        (True, 512.0, False), (False, 512.0, True)]
    assert mixed.skipped == 2


def test_training_from_a_huge_scale_skips_steps_then_learns():
    mixed = MixedPrecision(Network((16, 9, 16)), loss_scale=2.0 ** 24)  # S * g overflows float16 at first
    before = mixed.params.copy()
    history, _ = train_mixed(mixed, INPUTS.astype(np.float32), LABELS, Settings(epochs=2, learning_rate=0.5,
                                                                                  batch_size=20))
    assert 1 <= mixed.skipped < history.steps and mixed.loss_scale == 2.0 ** (24 - mixed.skipped)
    assert not np.array_equal(before, mixed.params) and np.isfinite(mixed.params).all()


def test_without_scaling_the_lower_layers_gradients_flush_to_zero():
    network = Network((16,) + (32,) * 15 + (16,), seed=0)
    unscaled = underflow_per_layer(network, INPUTS[:100].astype(np.float32), LABELS[:100])
    scaled = underflow_per_layer(network, INPUTS[:100].astype(np.float32), LABELS[:100], loss_scale=2.0 ** 15)
    assert unscaled[0] > 0.5 and unscaled[-1] == 0.0  # the first layer's gradients vanish in float16
    assert all(with_scale <= without for with_scale, without in zip(scaled, unscaled)) and scaled[0] < unscaled[0]


def test_mixed_precision_learns_as_float32_does_and_holds_the_bytes_predicted():
    settings = Settings(epochs=3, learning_rate=0.5, batch_size=20, momentum=0.9)
    inputs = (INPUTS[:, :1] > 0.5).astype(np.float32) * np.ones((1, 16), np.float32) + INPUTS.astype(np.float32)
    labels = (INPUTS[:, 0] > 0.5).astype(np.int64)  # learnable: the class is the first input's half
    single = Network((16, 12, 2), seed=4)
    train(single, inputs, labels, settings, progress=False)
    mixed = MixedPrecision(Network((16, 12, 2), seed=4))
    _, optimizer = train_mixed(mixed, inputs, labels, settings)
    assert abs(mixed.accuracy(inputs, labels) - single.accuracy(inputs, labels)) <= 0.02
    assert mixed.accuracy(inputs, labels) > 0.9
    held = mixed.state_bytes(optimizer)
    assert {kind: held[kind] / mixed.num_params for kind in held} == SGD_MOMENTUM_BYTES


# -- the batch job's memory options ----------------------------------------------------------------

def job_arguments(*arguments):
    import argparse

    from nnlib.train_command import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(arguments))


@pytest.mark.parametrize("arguments, message", [
    (["--recompute", "-1"], "--recompute must be 0 (keep every activation) or K >= 1"),
    (["--accumulate", "0"], "--accumulate must be at least 1"),
    (["--precision", "float16", "--dtype", "float64"], "keeps float32 master weights (--dtype float32)"),
    (["--precision", "bfloat16", "--device", "gpu"], "keeps float32 master weights (--dtype float32), on --device cpu"),
])
def test_the_batch_job_refuses_memory_options_with_wrong_values(arguments, message):
    """(What they do not combine with: tests/test_train_command.py, one table and one message.)"""
    from nnlib.train_command import check_settings

    with pytest.raises(ValueError, match=re.escape(message)):
        check_settings(job_arguments("--epochs", "1", *arguments), 2)


def test_the_batch_job_with_fsdp_recomputation_and_accumulation_equals_allreduce(tmp_path):
    import subprocess
    import sys

    from nnlib.course.environment import mpiexec_path

    saved = {}
    for name, extra in (("plain", []), ("memory", ["--strategy", "fsdp", "--recompute", "2", "--accumulate", "3"])):
        output = tmp_path / f"{name}.npz"
        run = subprocess.run([mpiexec_path(), "-n", "3", sys.executable, "-m", "nnlib", "train", "--samples", "1001",
                              "--epochs", "1", "--batch-size", "100", "--hidden", "16", "8", "--dtype", "float64",
                              "--output", str(output), *extra], capture_output=True, text=True, timeout=180)
        assert run.returncode == 0, run.stderr
        with np.load(output) as file:
            saved[name] = (file["params"], float(file["test_accuracy"]))
    assert "memory: strategy fsdp, recompute every 2, 3 micro-batch(es) per step, precision float32" in run.stdout
    assert np.abs(saved["memory"][0] - saved["plain"][0]).max() <= 1e-10 * np.abs(saved["plain"][0]).max()
    assert saved["memory"][1] == saved["plain"][1]


def test_the_batch_job_in_float16_learns_as_float32_does(tmp_path):
    from test_train_command_precision import learns_as_float32_does

    learns_as_float32_does(tmp_path, "float16")


# -- the budget of lesson 09's model parallelism and of mixed precision (measured: tests/mpi/check_memory.py) ----

def test_a_tensor_parallel_rank_holds_its_columns_and_the_whole_row_outputs():
    from nnlib.lesson12_memory.budget import predicted_bytes, tensor_parallel_bytes, tensor_parallel_sizes

    sizes = (64, 127, 96, 121, 80, 113, 72, 10)  # column, row, column, row, column, row, replicated
    assert tensor_parallel_sizes(sizes, 2, 0) == (64, 64, 96, 61, 80, 57, 72, 10)
    assert tensor_parallel_sizes(sizes, 2, 1) == (64, 63, 96, 60, 80, 56, 72, 10)
    assert tensor_parallel_sizes(sizes, 1, 0) == sizes
    held = tensor_parallel_bytes(sizes, 256, 2, 1)
    assert held["parameters"] == 8 * (64 * 63 + 63 + 63 * 96 + 96 + 96 * 60 + 60 + 60 * 80 + 80 + 80 * 56 + 56
                                      + 56 * 72 + 72 + 72 * 10 + 10)
    assert held["activations"] == 8 * 256 * (63 + 96 + 60 + 80 + 56 + 72 + 10)
    assert held == predicted_bytes((64, 63, 96, 60, 80, 56, 72, 10), 256)


def test_a_pipeline_stage_holds_the_micro_batches_its_schedule_keeps_alive():
    """Two layers per stage, 8 wide, 4 stages, m = 8 micro-batches of 1 row: GPipe keeps all 8 alive on every stage,
    1F1B at most P - s; what the Isends hold (each finished micro-batch's output and input gradient, 8 + 8
    values) comes on top."""
    from nnlib.lesson12_memory.budget import backward_widths, pipeline_activation_values, pipeline_bytes

    sizes, stages = (8,) * 9, 4
    assert backward_widths(sizes, 2, 4, stages, 1) == 3 * 8  # going down: the input gradient, 1 - a, a (1 - a)
    assert backward_widths((8, 8, 8), 1, 2, 2, 1) == 16  # one layer: its delta and the input gradient sent back
    for stage in range(stages):
        kept = 16 + 8 * (stage > 0) + 8 * (stage == stages - 1)  # outputs, received input, logits (last stage)
        gpipe = pipeline_activation_values(sizes, 8, stages, stage, 8, "gpipe")
        one_f_one_b = pipeline_activation_values(sizes, 8, stages, stage, 8, "1f1b")
        assert gpipe >= 8 * kept and one_f_one_b < gpipe
        assert one_f_one_b <= (stages - stage) * (kept + 8) + 8 * 16 + 3 * 8
    held = pipeline_bytes(sizes, 8, stages, 0, 8, "gpipe")
    assert held["parameters"] == held["gradients"] == held["optimizer state"] == 8 * 2 * (8 * 8 + 8)


def test_mixed_precision_holds_16_bytes_per_parameter_and_2_per_activation():
    from nnlib.lesson12_memory.budget import mixed_precision_bytes

    sizes = (16, 12, 2)
    count = Network(sizes).num_params
    held = mixed_precision_bytes(sizes, 100)
    assert held["parameters"] + held["gradients"] + held["optimizer state"] == sum(SGD_MOMENTUM_BYTES.values()) * count
    assert held["activations"] == 2 * 100 * (16 + 12 + 2)


def test_mixed_precision_bytes_by_hand_with_accumulation_fsdp_and_bfloat16():
    """Layers 4-3-2 (n = 15 + 8 = 23 parameters), 10 rows: by hand from mixed_precision_bytes's formulas."""
    from nnlib.lesson12_memory.budget import mixed_precision_bytes

    plain = mixed_precision_bytes((4, 3, 2), 10)
    assert plain == {"parameters": 6 * 23, "gradients": 6 * 23, "optimizer state": 4 * 23, "gathered": 0,
                     "activations": 2 * 10 * (4 + 3 + 2), "temporaries": 4 * (10 * 4 + 2 * 10 * 4 + 2 * 15),
                     "update": 5 * 23}
    accumulated = mixed_precision_bytes((4, 3, 2), 10, micro_batches=2)  # micro-batches of 5 rows
    assert accumulated["activations"] == 2 * 5 * (4 + 3 + 2)
    assert accumulated["temporaries"] == 4 * (10 * 4 + 2 * 5 * 4 + 2 * 15)  # the whole float32 batch stays
    assert accumulated["update"] == 4 * 23 + 4 * 10 * 4  # the float32 quotient half_grads / S, beside the batch
    # FSDP on 2 ranks, rank 1: chunks 7 of 15 and 4 of 8 (c = 11); the largest whole layer 15, gathered
    sharded = mixed_precision_bytes((4, 3, 2), 10, 2, 1, "fsdp")
    assert sharded == {"parameters": 6 * 11, "gradients": 8 * 11, "optimizer state": 4 * 11, "gathered": 12 * 15,
                       "activations": 2 * 10 * (4 + 3 + 2), "temporaries": 4 * (10 * 4 + 2 * 10 * 4),
                       "update": 4 * 7 + 11}
    # ZeRO-1/2 on 2 ranks, rank 0: the momentum and the update over its slice of 12 of the 23 values
    zero = mixed_precision_bytes((4, 3, 2), 10, 2, 0, "zero")
    assert zero == dict(plain, **{"optimizer state": 4 * 12, "update": 5 * 12})
    for arguments in ((10,), (10, 2, 1, "fsdp", 1, 3), (10, 3, 2, "allreduce", 2, 4)):
        assert mixed_precision_bytes((4, 3, 2), *arguments, "bfloat16") == mixed_precision_bytes((4, 3, 2), *arguments)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        mixed_precision_bytes((4, 3, 2), 10, precision="float8")
    with pytest.raises(ValueError, match="allreduce, zero or fsdp"):
        mixed_precision_bytes((4, 3, 2), 10, strategy="overlap")


def test_tensor_parallel_mixed_precision_bytes_by_hand():
    """Layers 4-7-3 on 2 ranks: the column layer's 7 units split 4 + 3; rank 1 holds the chain 4-3-3 (its 3
    columns, the row layer's 3 rows and whole bias): n = 15 + 12 = 27 parameters; 5 rows, the whole batch."""
    from nnlib.lesson12_memory.budget import mixed_tensor_parallel_bytes

    assert mixed_tensor_parallel_bytes((4, 7, 3), 5, 2, 1) == {
        "parameters": 6 * 27, "gradients": 6 * 27, "optimizer state": 4 * 27, "gathered": 0,
        "activations": 2 * 5 * (4 + 3 + 3), "temporaries": 4 * (5 * 4 + 2 * 5 * 4 + 2 * 15), "update": 5 * 27}
    assert mixed_tensor_parallel_bytes((4, 7, 3), 5, 2, 0)["parameters"] == 6 * (4 * 4 + 4 + 4 * 3 + 3)


def test_mixed_pipeline_bytes_by_hand():
    """Layers 4-3-2 on 2 stages, stage 1 (the last: layer 3-2, n = 8), 6 rows in 2 micro-batches of 3, float16."""
    from nnlib.lesson12_memory.budget import (LOSS_ARRAYS, MICRO_BATCH_OBJECT_BYTES, mixed_pipeline_bytes,
                                              pipeline_activation_values)

    held = mixed_pipeline_bytes((4, 3, 2), 6, 2, 1, 2, "gpipe")
    running = 4 * (3 + 2) + 2 * 3  # a backward's float32 input and delta beside its low input gradient, per row
    assert held == {"parameters": 6 * 8, "gradients": 6 * 8, "optimizer state": 4 * 8, "gathered": 0,
                    "activations": pipeline_activation_values((4, 3, 2), 6, 2, 1, 2, "gpipe", 2, running),
                    "temporaries": 6 * 6 * 4 + 4 * 8 + (4 * LOSS_ARRAYS * 3 + 2 * 6) * 2 + 2 * MICRO_BATCH_OBJECT_BYTES,
                    "update": 5 * 8}
    # GPipe on the last stage: after 2 forwards it keeps 2 x 3 rows of (3 received + 2 out + 2 logits) low values,
    # then the first backward adds 3 rows x running and the received output gradient is not there (no next stage)
    assert held["activations"] == 2 * 6 * (3 + 2 + 2) + 3 * running
    assert mixed_pipeline_bytes((4, 3, 2), 6, 2, 0, 2, "gpipe", "bfloat16")["temporaries"] == \
        6 * 6 * 4 + 4 * 15 + 2 * MICRO_BATCH_OBJECT_BYTES  # stage 0: layer 4-3 (15), no loss


def test_mixed_precision_with_recomputation_holds_the_larger_phase_by_hand():
    """Layers 1-2-2-2-1, checkpoints every 2 (a_0, a_2), 10 rows. Recomputing segment [2, 4) runs layer 2 (2 -> 2)
    beside the checkpoints and output (1 + 2 + 1), its delta (1); segment [0, 2) runs layer 0 (1 -> 2) beside the
    checkpoints, its delta (w_2 = 2) and the top z of segment [2, 4) (w_3 = 2, float32); a layer's own float32
    arrays: the larger of B (w_in + w_out) + w_in w_out and 3 B w_out (= 60 for both)."""
    from nnlib.lesson12_memory.budget import mixed_precision_bytes, mixed_recompute_bytes, recomputed_tops

    sizes = (1, 2, 2, 2, 1)
    assert recomputed_tops(sizes, 2) == [2, 2] and recomputed_tops(sizes, 1) == [] and recomputed_tops(sizes, 4) == [2]
    top = {"activations": 2 * 10 * (4 + 1), "temporaries": 4 * 60}
    bottom = {"activations": 2 * 10 * (4 + 2), "temporaries": 4 * (10 * 2 + 60)}
    assert mixed_recompute_bytes(sizes, 10, 2) == bottom  # 440 bytes against 340
    backward = 2 * 10 * 1 + 2 * 10 * (2 + 1 + 2) + 4 * (10 * 1 + 2 * 10 * 2 + 2 * 6) + 4 * 10 * 2  # 448
    held = mixed_precision_bytes(sizes, 10, every=2)
    assert sum(bottom.values()) + 4 * 10 * 1 > backward  # the recomputing forward, with the float32 batch, holds more
    assert (held["activations"], held["temporaries"]) == (bottom["activations"], bottom["temporaries"] + 4 * 10)
    assert sum(top.values()) < sum(bottom.values())


def test_the_weight_gradient_product_is_a_temporary_only_when_a_later_piece_adds_to_the_gradient():
    """The first micro-batch (and chunk) writes a_in.T @ delta in place; a later one adds a temporary of the largest
    layer's n_l values: with 2 micro-batches, or with one batch of more rows than Network.chunk_size."""
    from nnlib import Network
    from nnlib.lesson12_memory.budget import CHUNK_ROWS, predicted_bytes

    sizes = (5, 4, 3)
    largest = 8 * (5 * 4 + 4)
    one = predicted_bytes(sizes, 100)["temporaries"]
    assert CHUNK_ROWS == Network(sizes).chunk_size
    assert predicted_bytes(sizes, 100, micro_batches=2)["temporaries"] - one == largest - 8 * 3 * 50 * 4
    many_rows = predicted_bytes(sizes, CHUNK_ROWS + 1)["temporaries"]
    assert many_rows - 8 * (CHUNK_ROWS + 1) * (5 + 3 * 4) == largest
    assert one - 8 * 100 * (5 + 3 * 4) == 0


def test_recomputation_budget_in_float64_by_hand():
    """Layers 1-2-2-2-1 (n_l = 4, 6, 6, 3: 19 parameters), checkpoints every 2 (a_0, a_2), 10 rows, float64.
    Kept: a_2 and a_4 (2 + 1), the longest segment's a_1 or a_3 (2): 8 * 10 * 5 = 400 bytes of activations.
    Backward's temporaries: the batch (1), 3 arrays of the widest layer (3 * 2), and beside segment [0, 2) the
    delta carried in (w_2 = 2) and the recomputation's top z_1 (w_1 = 2); beside [2, 4) only z_3 (the top
    segment's delta is the loss's): 8 * 10 * (1 + 6 + 4) = 880. Recomputing segment [0, 2) runs layer 0 beside
    a_0 (a view of the batch), a_2, a_4, the delta (2) and the stale z_3 (2); its own z, z / 2, tanh (3 * 2):
    8 * 10 * (1 + 2 + 1 + 2 + 2 + 6) = 1120 bytes, less than the backward's 1280.
    FSDP on 2 ranks, rank 1, one row: chunks 2 + 3 + 3 + 1 = 9, one whole layer of 6 gathered; its whole gradient
    (6) beside delta (2) is more than 3 arrays of 2: temporaries 8 * (1 + 8 + 4)."""
    from nnlib.lesson12_memory.budget import mixed_recompute_bytes, predicted_bytes, recomputed_beside

    sizes = (1, 2, 2, 2, 1)
    assert recomputed_beside(sizes, 2) == [4, 2] and recomputed_beside(sizes, 4) == [2] and \
        recomputed_beside(sizes, 1) == [2, 2, 2, 0]
    assert predicted_bytes(sizes, 10, every=2) == {
        "parameters": 8 * 19, "gradients": 8 * 19, "optimizer state": 8 * 19, "gathered": 0,
        "activations": 400, "temporaries": 880, "update": 8 * 19}
    recomputing = mixed_recompute_bytes(sizes, 10, 2, 8, 8)
    assert recomputing == {"activations": 8 * 10 * (1 + 2 + 1 + 2), "temporaries": 8 * 10 * (2 + 6)}
    assert sum(recomputing.values()) == 1120 < 400 + 880  # (its a_0 is the batch's rows: counted once either way)
    assert predicted_bytes(sizes, 1, 2, 1, "fsdp", every=2) == {
        "parameters": 8 * 9, "gradients": 8 * 9, "optimizer state": 8 * 9, "gathered": 8 * 6,
        "activations": 8 * 5, "temporaries": 8 * (1 + 8 + 4), "update": 8 * 3}
    # without checkpoints nothing is beside: the batch and 3 arrays of the widest layer
    assert predicted_bytes(sizes, 10)["temporaries"] == 8 * 10 * (1 + 6)
