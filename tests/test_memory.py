"""Lesson 17 in one process: recomputation is bit-identical and costs what the formulas say; mixed
precision's loss scaler, underflow count, accuracy and bytes per parameter; gradient accumulation's
micro-batches; the memory model's counts by hand, and against tracemalloc. (Equality with sequential training
on many ranks, and the memory model on them: tests/mpi/check_memory.py.)"""

import re
import weakref

import numpy as np
import pytest

from nnlib import Network, train
from nnlib.lesson03_training.optimizers import Adam
from nnlib.lesson03_training.training import Settings
from nnlib.lesson17_activations.accumulation import MicroBatched
from nnlib.lesson17_activations.mixed_precision import MixedPrecision, train_mixed, underflow_per_layer
from nnlib.lesson17_activations.budget import MODEL_ERROR, activation_widths, predicted_bytes
from nnlib.lesson17_activations.recompute import checkpoint_layers, extra_forward_flops, sqrt_every

rng = np.random.default_rng(0)
DEEP = (16,) * 17  # 16 layers, 16 wide: a deep narrow network (16 classes)
INPUTS, LABELS = rng.random((203, 16)), rng.integers(0, 16, 203)
SGD_MOMENTUM_BYTES = {"float16 weights": 2, "float16 gradients": 2, "float32 master": 4, "float32 gradient": 4,
                      "float32 momentum": 4}  # mixed precision's bytes per parameter, with momentum
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
def test_the_activations_really_alive_at_the_peak_are_the_models(every):
    """A weak reference to every layer output a_l, and the most of them alive whenever a layer's forward or
    weight_gradient runs (a segment kept too long, or a model one array off, shows here); the forwards really run
    cost the formula's extra FLOPs, 2 N n^2 for each of the L layers whose input is not a checkpoint."""
    network, outputs, most, flops = MicroBatched(Network(DEEP, dtype="float64"), recompute_every=every), [], [0], [0]

    def note_alive():
        outputs[:] = [output for output in outputs if output() is not None]
        most[0] = max(most[0], len(outputs))

    for layer in network.layers:
        def forward(inputs, layer_forward=layer.forward, n_out=layer.shape[1]):
            flops[0] += 2 * inputs.shape[0] * inputs.shape[1] * n_out
            logits, activation = layer_forward(inputs)
            outputs.append(weakref.ref(activation))
            note_alive()
            return logits, activation

        def weight_gradient(*arguments, layer_gradient=layer.weight_gradient):
            note_alive()
            return layer_gradient(*arguments)
        layer.forward, layer.weight_gradient = forward, weight_gradient
    network.loss_and_gradient(INPUTS, LABELS)
    assert most[0] == activation_widths(DEEP, every) // 16
    assert flops[0] - 2 * 203 * 16 * 16 * 16 == extra_forward_flops(203, SHAPES, every)
    assert extra_forward_flops(203, SHAPES, every) == 2 * 203 * 16 * 16 * (16 - len(checkpoint_layers(16, every)))


def test_sqrt_l_checkpoints_hold_the_fewest_arrays():
    assert sqrt_every(16) == 4 and checkpoint_layers(16, 4) == [0, 4, 8, 12] and checkpoint_layers(7, 3) == [0, 3, 6]
    arrays = {every: activation_widths((1,) * 17, every) for every in range(1, 17)}  # widths of 1: arrays
    assert arrays[1] == arrays[16] == 16 and arrays[4] == 7 == min(arrays.values())


@pytest.mark.parametrize("every", [None, 4, 16])
@pytest.mark.parametrize("micro_batches", [1, 4])
def test_tracemalloc_measures_what_the_model_counts_and_its_temporaries(every, micro_batches):
    """What NumPy really holds over a training step of a deep narrow network (tracemalloc) lies within the
    memory model's stated error of its count (a few arrays of temporaries more)."""
    from nnlib.lesson17_activations.demo import measured_peak

    sizes, rows = (64,) * 17, 1024
    inputs, labels = rng.random((2 * rows, 64)), rng.integers(0, 64, 2 * rows)
    peak, _ = measured_peak(lambda: MicroBatched(Network(sizes, dtype="float64"), micro_batches, every),
                            lambda network: train(network, inputs, labels, epochs=1, learning_rate=0.1,
                                                  batch_size=rows, momentum=0.9, progress=False))
    predicted = sum(predicted_bytes(sizes, rows, every=every, micro_batches=micro_batches).values())
    assert MODEL_ERROR[0] <= (predicted - peak) / peak <= MODEL_ERROR[1], (peak, predicted)


def test_micro_batches_cover_the_batch_unevenly():
    class Recording(MicroBatched):
        def micro_batch(self, inputs, labels, scale, accumulate, on_layer_done):
            self.rows.append((inputs.shape[0], accumulate))
            return super().micro_batch(inputs, labels, scale, accumulate, on_layer_done)

    for rows, expected in ((10, [4, 3, 3]), (2, [1, 1, 0])):
        recording = Recording(Network((16, 9, 16), dtype="float64"), 3)
        recording.rows = []
        recording.loss_and_gradient(INPUTS[:rows], LABELS[:rows])
        assert recording.rows == [(count, number > 0) for number, count in enumerate(expected)]
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
    optimizer, verdicts = Adam(mixed.params, 0.1), []  # (its step count t: the skipped steps do not count)
    for gradient in (np.inf, 2.0, 2.0, 2.0, np.nan, 4.0):
        before = mixed.params.copy()
        mixed.grads[...] = gradient
        mixed.scaler.step(optimizer, mixed.params, mixed.grads)  # as Run.update calls it
        verdicts.append((mixed.scaler.overflowed, mixed.loss_scale, not np.array_equal(before, mixed.params)))
    assert verdicts == [(True, 512.0, False), (False, 512.0, True), (False, 512.0, True), (False, 1024.0, True),
                        (True, 512.0, False), (False, 512.0, True)]
    assert mixed.scaler.skipped == 2 and optimizer.steps == 4


def test_training_from_a_huge_scale_skips_steps_then_learns():
    mixed = MixedPrecision(Network((16, 9, 16)), loss_scale=2.0 ** 24)  # S * g overflows float16 at first
    before = mixed.params.copy()
    history, _ = train_mixed(mixed, INPUTS.astype(np.float32), LABELS, Settings(epochs=2, learning_rate=0.5,
                                                                                  batch_size=20))
    assert 1 <= mixed.scaler.skipped < history.steps and mixed.loss_scale == 2.0 ** (24 - mixed.scaler.skipped)
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
    (["--precision", "bfloat16", "--device", "gpu"], "--precision bfloat16 needs --device cpu (CuPy has no bfloat16"),
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
    held = predicted_bytes((784, 16, 8, 10), 34, 3, 0, "fsdp", 2, 3, "float64")  # rank 0: 34 rows of a batch of 100
    assert f"rank 0 holds {sum(held.values()) / 2 ** 20:.2f} MiB at a step's peak" in run.stdout, run.stdout
    assert np.abs(saved["memory"][0] - saved["plain"][0]).max() <= 1e-10 * np.abs(saved["plain"][0]).max()
    assert saved["memory"][1] == saved["plain"][1]


def test_the_batch_job_in_float16_learns_as_float32_does(tmp_path):
    from test_train_command_precision import learns_as_float32_does

    learns_as_float32_does(tmp_path, "float16")


# -- the memory model by hand (measured: tests/mpi/check_memory.py) ------------------------------------------

def test_the_memory_model_by_hand_with_zero_fsdp_accumulation_and_mixed_precision():
    """Layers 4-3-2 (n = 15 + 8 = 23 parameters), 10 rows: by hand from predicted_bytes's table. Backward's arrays
    going down to a_1: delta_2 (2), delta_2 W_2.T and a_1 (1 - a_1) (3 each)."""
    plain = predicted_bytes((4, 3, 2), 10)
    assert plain == {"parameters": 8 * 23, "gradients": 8 * 23, "optimizer state": 8 * 23, "gathered": 0,
                     "activations": 8 * 10 * (4 + 3 + 2), "backward": 8 * 10 * (2 + 3 + 3)}
    accumulated = predicted_bytes((4, 3, 2), 10, micro_batches=3)  # micro-batches of at most 4 rows
    assert accumulated == dict(plain, activations=8 * 4 * 9, backward=8 * 4 * 8)
    # ZeRO-1/2 on 2 ranks, rank 0: the momentum of its slice, 12 of the 23 values
    assert predicted_bytes((4, 3, 2), 10, 2, 0, "zero") == dict(plain, **{"optimizer state": 8 * 12})
    # FSDP on 2 ranks, rank 1: chunks 7 of 15 and 4 of 8 (c = 11); the largest whole layer, 15, gathered
    sharded = predicted_bytes((4, 3, 2), 10, 2, 1, "fsdp")
    assert sharded == dict(plain, parameters=8 * 11, gradients=8 * 11, gathered=8 * 15, **{"optimizer state": 8 * 11})
    mixed = predicted_bytes((4, 3, 2), 10, precision="float16")  # 2 + 4, 2 + 4, 4 bytes per parameter
    assert mixed == {"parameters": 6 * 23, "gradients": 6 * 23, "optimizer state": 4 * 23, "gathered": 0,
                     "activations": 2 * 10 * 9, "backward": 2 * 10 * 8}
    mixed_sharded = predicted_bytes((4, 3, 2), 10, 2, 1, "fsdp", precision="float16")  # float32 low-gradient chunks
    assert (mixed_sharded["gradients"], mixed_sharded["gathered"]) == (8 * 11, 2 * 15)
    assert mixed_sharded == predicted_bytes((4, 3, 2), 10, 2, 1, "fsdp", precision="bfloat16")
    assert sum(SGD_MOMENTUM_BYTES.values()) * 23 == sum(mixed[kind] for kind in ("parameters", "gradients",
                                                                                 "optimizer state"))
    with pytest.raises(ValueError, match="precision one of float64, float32, float16, bfloat16; got 'overlap', 'float8'"):
        predicted_bytes((4, 3, 2), 10, strategy="overlap", precision="float8")


def test_recomputation_keeps_the_checkpoints_the_output_and_the_longest_segment_by_hand():
    """Layers 1-2-2-2-1, checkpoints every 2 (a_0, a_2), 10 rows: kept a_2 and a_4 (2 + 1), and the longest
    segment's recomputed a_1 or a_3 (2); with a_0 (1): 8 * 10 * 6 bytes. Every 1 keeps everything (2 + 2 + 2 + 1)."""
    sizes = (1, 2, 2, 2, 1)
    assert activation_widths(sizes, 2) == 5 and activation_widths(sizes, 1) == activation_widths(sizes) == 7
    assert activation_widths(sizes, 4) == 1 + 2 + 2 + 2  # one segment: a_4 and the recomputed a_1 .. a_3
    assert predicted_bytes(sizes, 10, every=2)["activations"] == 8 * 10 * (1 + 5)
