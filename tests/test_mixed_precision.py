"""Lesson 17's mixed precision in one process, beyond float16 alone (tests/test_memory.py): bfloat16 (the ml_dtypes
package) keeps the gradients float16 flushes to zero and learns as float32 does without loss scaling; mixed
precision combined with gradient accumulation (the verdict once per step, on the sum), with recomputation
(bit-identical), with FSDP on one rank (bit-identical to the unsharded network), and with checkpoints (the loss
scale and its good-step counter saved and restored: a resumed run equals an uninterrupted one bit for bit).
(On many ranks: tests/mpi/check_mixed_precision.py.)"""

import numpy as np
import pytest
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson03_training.training import Settings
from nnlib.lesson06_data_parallel import train_parallel
from nnlib.lesson06_data_parallel.data_parallel import Allreduce
from nnlib.lesson13_faults.checkpoint import CheckpointFolder, Checkpointing
from nnlib.lesson16_sharding.fsdp import FullySharded, FullyShardedNetwork
from nnlib.lesson17_activations.mixed_precision import (MixedPrecision, low_precision, train_mixed,
                                                   underflow_per_layer)

rng = np.random.default_rng(0)
INPUTS, LABELS = rng.random((203, 16)).astype(np.float32), rng.integers(0, 16, 203)
SIZES = (16, 12, 9, 16)


def separable():
    """A learnable task (tests/test_memory.py's): the class is the first input's half, shown in every input."""
    inputs = (INPUTS[:, :1] > 0.5).astype(np.float32) * np.ones((1, 16), np.float32) + INPUTS
    return inputs, (INPUTS[:, 0] > 0.5).astype(np.int64)


def test_bfloat16_keeps_the_gradients_float16_flushes_to_zero():
    """A deep sigmoid network's lowest gradients are below float16's smallest subnormal (2^-24) but far above
    bfloat16's smallest normal (2^-126, float32's exponent range): unscaled, float16 flushes most of the first
    layer's gradient to zero, bfloat16 none of it."""
    network = Network((16,) + (32,) * 15 + (16,), seed=0)
    half = underflow_per_layer(network, INPUTS[:100], LABELS[:100])
    brain = underflow_per_layer(network, INPUTS[:100], LABELS[:100], precision="bfloat16")
    assert half[0] > 0.5 and brain == [0.0] * len(brain), (half, brain)


def test_bfloat16_mixed_precision_learns_as_float32_does_without_loss_scaling():
    """Tolerance: the test accuracy of bfloat16 training within 0.02 of float32's on the same steps (bfloat16 has
    8 significant bits: the weights' copy is rounded to 2^-8 relative, the master is float32)."""
    inputs, labels = separable()
    settings = Settings(epochs=3, learning_rate=0.5, batch_size=20, momentum=0.9)
    single = Network((16, 12, 2), seed=4)
    train(single, inputs, labels, epochs=3, learning_rate=0.5, batch_size=20, momentum=0.9, progress=False)
    brain = MixedPrecision(Network((16, 12, 2), seed=4), precision="bfloat16")
    assert brain.loss_scale == 1.0 and not brain.scaler.dynamic and brain.half_params.dtype == low_precision("bfloat16")
    history, optimizer = train_mixed(brain, inputs, labels, settings)
    assert brain.scaler.skipped == 0 and brain.loss_scale == 1.0 and len(brain.scaler.verdicts) == history.steps
    assert brain.accuracy(inputs, labels) > 0.9
    assert abs(brain.accuracy(inputs, labels) - single.accuracy(inputs, labels)) <= 0.02
    held = brain.state_bytes(optimizer)
    assert held["bfloat16 weights"] == held["bfloat16 gradients"] == 2 * brain.num_params


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="mixed precision stores float16 or bfloat16; got 'float8'"):
        MixedPrecision(Network(SIZES), precision="float8")


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_mixed_precision_with_recomputation_is_bit_identical(precision):
    """Recomputation reruns the same low-precision forward: the same activations, gradients and weights."""
    settings = Settings(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=3)
    plain = MixedPrecision(Network(SIZES, seed=1), precision=precision, loss_scale=2.0 ** 20, growth_interval=3)
    recomputed = MixedPrecision(Network(SIZES, seed=1), precision=precision, loss_scale=2.0 ** 20,
                                growth_interval=3, recompute_every=2)
    forwards = {}
    for name, mixed in (("plain", plain), ("recomputed", recomputed)):
        forwards[name] = count_forwards(mixed)
        train_mixed(mixed, INPUTS, LABELS, settings)
    assert np.array_equal(plain.params, recomputed.params) and plain.scaler.verdicts == recomputed.scaler.verdicts
    assert forwards["recomputed"][0] > forwards["plain"][0]  # the layers between checkpoints ran forward again


def count_forwards(mixed) -> list:
    """Wrap each of ``mixed``'s layers' forward to count its calls; returns the count, [calls]."""
    calls = [0]
    for layer in mixed.layers:
        def forward(inputs, layer_forward=layer.forward):
            calls[0] += 1
            return layer_forward(inputs)
        layer.forward = forward
    return calls


def test_mixed_precision_with_accumulation_checks_the_scale_once_per_step_on_the_sum():
    """k = 3 micro-batches (uneven: 32 rows = 11 + 11 + 10) against one, from a scale that overflows at first: the
    same scale decisions on every step (one verdict per step, on the float32 sum), weights within 1e-2 of the
    largest (float16 rounds the micro-batches' partial sums, not the batch's sum); an inf stays in the sum."""
    settings = Settings(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=3)
    runs = {}
    for k in (1, 3):
        runs[k] = MixedPrecision(Network(SIZES, seed=1), loss_scale=2.0 ** 24, growth_interval=4, micro_batches=k)
        history, _ = train_mixed(runs[k], INPUTS, LABELS, settings)
        assert len(runs[k].scaler.verdicts) == history.steps
    assert runs[1].scaler.verdicts == runs[3].scaler.verdicts and runs[3].scaler.skipped >= 1
    error = np.abs(runs[3].params - runs[1].params).max() / np.abs(runs[1].params).max()
    assert error <= 1e-2, error
    one = MixedPrecision(Network(SIZES, seed=1), loss_scale=2.0 ** 40, micro_batches=3)
    one.loss_and_gradient(INPUTS[:32], LABELS[:32])  # every micro-batch's float16 gradient overflows
    assert np.isinf(one.grads).any() and one.scaler.found_inf(one.grads)


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_fsdp_in_mixed_precision_on_one_rank_is_the_unsharded_run(precision):
    """One rank holds every chunk: the gathered low layer is the whole low copy, the float32 reduce-scatter of one
    rank is a copy, so FSDP + mixed precision (+ accumulation, + recomputation) is bit-identical to the plain one."""
    comm = MPI.COMM_WORLD.Split(MPI.COMM_WORLD.rank, 0)  # (one rank, whatever launched this)
    settings = dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=3)
    options = dict(precision=precision, loss_scale=2.0 ** 20 if precision == "float16" else None,
                   growth_interval=3, micro_batches=2, recompute_every=2)
    plain = MixedPrecision(Network(SIZES, seed=1), **options)
    train_parallel(comm, plain, INPUTS, LABELS, num_samples=203, start=0, strategy=Allreduce, scaler=plain.scaler,
                   **settings)
    sharded = MixedPrecision(FullyShardedNetwork(comm, SIZES, dtype="float32", seed=1), **options)
    train_parallel(comm, sharded, INPUTS, LABELS, num_samples=203, start=0, strategy=FullySharded,
                   scaler=sharded.scaler, **settings)
    assert np.array_equal(sharded.full_params(), plain.params) and sharded.scaler.verdicts == plain.scaler.verdicts
    comm.Free()


def test_a_loss_scaler_is_refused_where_rank_0_alone_updates():
    """parameter_server and reduce_broadcast update on rank 0 only: a scaler there would judge on rank 0 alone."""
    mixed = MixedPrecision(Network(SIZES, seed=1))
    for strategy in ("parameter_server", "reduce_broadcast"):
        with pytest.raises(ValueError, match=f"a loss scaler needs every rank to update .*; {strategy} updates on"):
            train_parallel(MPI.COMM_WORLD, mixed, INPUTS, LABELS, num_samples=203, start=0, strategy=strategy,
                           scaler=mixed.scaler, epochs=1, learning_rate=0.1)


def train_checkpointed(folder=None, resume=False, fail_at=None, sharded=False, precision="float16"):
    """Mixed-precision training on one rank from a loss scale that overflows at first and grows every 4 good steps
    (so the scaler's state matters), with checkpoints every 5 steps; stopped after step ``fail_at``."""
    comm = MPI.COMM_WORLD.Split(MPI.COMM_WORLD.rank, 0)
    master = FullyShardedNetwork(comm, SIZES, dtype="float32", seed=1) if sharded else Network(SIZES, seed=1)
    mixed = MixedPrecision(master, loss_scale=2.0 ** 24 if precision == "float16" else None, growth_interval=4,
                           precision=precision)

    def on_step(epoch, step, total_steps):
        if total_steps == fail_at:
            raise RuntimeError("stopped on purpose")

    hooks = [] if folder is None else [Checkpointing(folder, resume)]
    history = train_parallel(comm, mixed, INPUTS, LABELS, num_samples=203, start=0, hooks=hooks, on_step=on_step,
                             strategy=FullySharded if sharded else Allreduce, scaler=mixed.scaler, epochs=3,
                             learning_rate=0.5, batch_size=16, momentum=0.9, seed=4)
    return mixed, history


@pytest.mark.parametrize("sharded", [False, True], ids=["allreduce", "fsdp"])
def test_a_resumed_mixed_precision_run_is_bit_identical_to_an_uninterrupted_one(tmp_path, sharded):
    expected, expected_history = train_checkpointed(sharded=sharded)
    skipped = expected.scaler.skipped
    assert skipped >= 1 and expected.loss_scale not in (2.0 ** 24, 2.0 ** 24 / 2 ** skipped)
    folder = CheckpointFolder(tmp_path, every=5)
    with pytest.raises(RuntimeError, match="stopped on purpose"):
        train_checkpointed(folder, fail_at=22, sharded=sharded)  # mid second epoch (13 steps per epoch)
    resumed, history = train_checkpointed(folder, resume=True, sharded=sharded)
    assert np.array_equal(resumed.full_params() if sharded else resumed.params,
                          expected.full_params() if sharded else expected.params)
    assert (resumed.loss_scale, resumed.scaler.good_steps, resumed.scaler.skipped) == \
        (expected.loss_scale, expected.scaler.good_steps, expected.scaler.skipped)
    assert history.loss == pytest.approx(expected_history.loss, rel=1e-12)


def test_resume_refuses_a_checkpoint_of_another_precision(tmp_path):

    folder = CheckpointFolder(tmp_path, every=5)
    with pytest.raises(RuntimeError, match="stopped on purpose"):
        train_checkpointed(folder, fail_at=7)
    with pytest.raises(ValueError, match="precision: the checkpoint has 'float16', this run 'bfloat16'"):
        train_checkpointed(folder, resume=True, precision="bfloat16")
