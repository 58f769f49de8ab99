"""Mixed precision for lesson 09's pipeline: each stage's layers, activations and messages in float16 or bfloat16.

A stage keeps its float32 master weights and gradient (the PipelineMLP's own ``params`` and ``grads``) and works on
a low copy, as :class:`~nnlib.lesson12_memory.mixed_precision.MixedPrecision` does in one process:

    half  <- low(master)                                       at the start of every step
    stage 0 casts each micro-batch to low; every layer is a HalfLayer (products in float32, results stored low)
    messages: the activations sent forward and the input gradients sent back are low (2 bytes a value)
    the last stage's loss in float32 from low(a_L), its backward from S dJ/dz_L (the loss scale S)
    each micro-batch's weight gradient: computed in float32, stored low (scaled), then unscaled into the
    float32 master gradient, added after the first micro-batch  (:class:`UnscaledHalfLayer`)

These are the single-process run's operations on the same numbers, micro-batch by micro-batch (the pipeline's
micro-batches are its accumulation), so the stages end with MixedPrecision(Network, micro_batches=m)'s weights
bit for bit (tests/mpi/check_mixed_precision.py). Each stage holds its own layers' gradient: the overflow verdict
is one Allreduce of a flag over the stages (:class:`~nnlib.lesson12_memory.mixed_precision.LossScaler`).

MPI knows float16 but not ml_dtypes' bfloat16: :class:`LowPrecisionMessages` hands MPI a uint16 view of a
bfloat16 buffer (the same 2 bytes a value; nothing is converted).

:class:`MixedStages` is a mixin, as recomputation's is: ``MixedPipelineMLP`` (GPipe, 1F1B),
``MixedRecomputedPipelineMLP`` (stages that keep only their inputs), and lesson 13's
``MixedScheduledPipeline`` (interleaved, zero-bubble: tested the same way).
"""

from __future__ import annotations

import numpy as np

from nnlib.lesson02_network.network import layer_views, parameter_offsets
from nnlib.lesson09_model_parallel.pipeline import PipelineMLP
from nnlib.lesson12_memory.mixed_precision import SINGLE, HalfLayer, LossScaler
from nnlib.lesson12_memory.recompute_parallel import RecomputedStages

LESSON = 12


class LowPrecisionMessages:
    """``comm`` (used as given, e.g. watched) whose point-to-point and broadcast buffers of a dtype MPI does not
    know (bfloat16) travel as uint16 views of the same memory. Everything else is ``comm``'s own."""

    def __init__(self, comm, low):
        self.comm, self.low = comm, np.dtype(low)

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def _message(self, buffer):
        return buffer.view(np.uint16) if getattr(buffer, "dtype", None) == self.low else buffer

    def Isend(self, buffer, *args, **kwargs):  # noqa: N802 (MPI's names; the pipeline sends only with Isend)
        return self.comm.Isend(self._message(buffer), *args, **kwargs)

    def Recv(self, buffer, *args, **kwargs):  # noqa: N802
        return self.comm.Recv(self._message(buffer), *args, **kwargs)

    def Bcast(self, buffer, *args, **kwargs):  # noqa: N802
        return self.comm.Bcast(self._message(buffer), *args, **kwargs)


class UnscaledHalfLayer(HalfLayer):
    """A HalfLayer whose weight gradient, once stored low (S dJ/dW of one micro-batch), is unscaled into float32
    master views: master = low / S for the first micro-batch, master += low / S after it (the quotient computed
    straight in float32, as MixedPrecision.micro_batch does for the whole vector)."""

    def __init__(self, low_views, master_grads, scaler, activation: str):
        super().__init__(*low_views, activation)
        self.master_grads, self.scaler = master_grads, scaler  # (dJ/dW, dJ/db) float32 views; its loss_scale

    def weight_gradient(self, inputs, delta, accumulate: bool = False) -> None:
        super().weight_gradient(inputs, delta, False)  # this micro-batch's scaled gradient, stored low
        scale = SINGLE(self.scaler.loss_scale)
        for low, master in zip((self.grad_weights, self.grad_biases), self.master_grads):
            if accumulate:
                master += np.divide(low, scale, dtype=SINGLE)
            else:
                np.divide(low, scale, out=master)


class MixedStages(LossScaler):
    """A pipeline stage (a PipelineMLP subclass, mixed in before it) trained in mixed precision.

    Arguments: the pipeline's (its dtype must be float32: the master), and ``precision``, ``loss_scale``,
    ``growth_interval``, ``dynamic`` as MixedPrecision's. ``network`` is the stage itself (the float32 master the
    optimizer updates, wrapped by nnlib.lesson12_memory.mixed_precision.loss_scaled's ScaledStep);
    ``half_params``, ``half_grads``: the low copy; ``master_chunk_layers``: the float32 layers, which evaluate.
    """

    split_over_ranks = True  # each stage holds its own layers' gradient

    def __init__(self, *args, precision: str = "float16", loss_scale: float | None = None,
                 growth_interval: int = 100, dynamic: bool | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if str(self.params.dtype) != "float32":
            raise ValueError(f"the master weights must be float32; got {self.params.dtype}")
        self.start_scaling(precision, loss_scale, growth_interval, dynamic)
        self.network, self.comm = self, LowPrecisionMessages(self.comm, self.low)
        self.half_params, self.half_grads = self.params.astype(self.low), np.zeros(self.params.size, self.low)
        self.master_chunk_layers, self.chunk_layers = self.chunk_layers, self.low_chunk_layers()
        self.dtype = self.low  # the stage's activations and messages

    def low_chunk_layers(self) -> list:
        """UnscaledHalfLayers over the low copies, at the master layers' offsets, one list per chunk."""
        offset, chunks = 0, []
        for layers in self.chunk_layers:
            shapes = [layer.shape for layer in layers]
            size = parameter_offsets(shapes)[-1]
            weights, biases = layer_views(self.half_params[offset:offset + size], shapes)
            grad_weights, grad_biases = layer_views(self.half_grads[offset:offset + size], shapes)
            chunks.append([UnscaledHalfLayer(views, (layer.grad_weights, layer.grad_biases), self, layer.activation)
                           for *views, layer in zip(weights, biases, grad_weights, grad_biases, layers)])
            for layer in chunks[-1]:
                layer.low_dtype = self.low
            offset += size
        return chunks

    def loss_and_gradient(self, inputs, labels, normalizer=None, check: bool = True, on_device: bool = False,
                          on_layer_done=None):
        """The pipeline's step in low precision on the batch cast to low, from S dJ/dz_L; returns J."""
        if check:
            self.check_inputs(inputs)
            self.check_labels(labels, inputs.shape[0])
        self.half_params[...] = self.params  # low(master)
        divide_by = inputs.shape[0] if normalizer is None else normalizer
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is what the loss scaler looks for
            loss = super().loss_and_gradient(inputs.astype(self.low), labels, divide_by / self.loss_scale, False,
                                             on_device, on_layer_done)
        return loss / self.loss_scale

    def loss_outputs(self, outputs):
        """The loss in float32, from low(a_L)."""
        return outputs.astype(SINGLE)

    def predict_probabilities(self, inputs):
        """In float32 with the master weights (as MixedPrecision's network evaluates)."""
        low = self.chunk_layers, self.dtype
        self.chunk_layers, self.dtype = self.master_chunk_layers, np.dtype(SINGLE)
        try:
            return super().predict_probabilities(inputs)
        finally:
            self.chunk_layers, self.dtype = low


class MixedPipelineMLP(MixedStages, PipelineMLP):
    """Lesson 09's PipelineMLP (GPipe, 1F1B) in mixed precision."""


class MixedRecomputedPipelineMLP(MixedStages, RecomputedStages, PipelineMLP):
    """Mixed precision, and stages that keep only each micro-batch's input (RecomputedStages)."""
