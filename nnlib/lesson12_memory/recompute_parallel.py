"""Recomputation for lesson 09's model parallelism: a pipeline stage or a tensor-parallel rank keeps only inputs.

**Pipeline** (GPipe's re-materialization, Huang et al. 2019). A stage of layers [first, stop) keeps, without
recomputation, every activation of every micro-batch between its forward and its backward:
B_k (n_first+1 + ... + n_stop) values each, and GPipe keeps all m micro-batches alive. With recomputation the
forward keeps only

    a_first    the stage's input (the batch's own rows on stage 0: a view, nothing new)
    a_stop     its output, only on a stage that sends it on (the Isend holds it until the step ends anyway)

and, just before micro-batch k's backward, runs the stage's forward once more from a_first, giving back
[a_first, ..., a_stop] and the logits z_L (the last stage computes the loss from them). The recomputed arrays
are the very ones the first forward made (the same operations on the same numbers), so the gradients, and the
parameters after training, are bit-identical to the same schedule without recomputation. Cost: every stage
runs its forward twice, 2 B_k sum over its layers of n_in n_out multiply-adds more per micro-batch
(``tally.recomputed_flops``); saved: all but the stage's inputs (and outputs) of the micro-batches alive,
one micro-batch's activations being rebuilt at a time. Lesson 09's PipelineMLP calls the hooks
``keep_for_backward`` and ``restore_for_backward``; :class:`RecomputedStages` fills them, so any of its
schedules (GPipe, 1F1B, and lesson 13's interleaved and zero-bubble ones) recomputes. (Zero-bubble's W
still needs its layers' inputs: the recomputing B leaves them waiting for W, as without recomputation.)

**Tensor parallel** (Megatron-LM's full recomputation). A rank keeps every layer's activations of its
slice: its column layers' B h_r, its row layers' B n_out. With recomputation it keeps the input of every
k-th layer only (``recompute_every`` = 2: each column/row pair's input, like Megatron's transformer layer)
and reruns each segment's forward in backward (nnlib.lesson12_memory.recompute), every rank in step: a row
layer's forward Allreduce runs again in the recomputation, one more (B, n_out) Allreduce per pair per step.
"""

from __future__ import annotations

from nnlib.lesson02_network.network import forward_layers, output_loss
from nnlib.lesson04_collectives.collectives import require_same_on_every_rank
from nnlib.lesson09_model_parallel.pipeline import PipelineMLP
from nnlib.lesson09_model_parallel.tensor import TensorParallelMLP
from nnlib.lesson12_memory.recompute import Tally, checkpointed_forward, forward_flops, recomputed_backward

LESSON = 12


class RecomputedStages:
    """Put before lesson 09's PipelineMLP (or a subclass) in the bases: each micro-batch's forward keeps its
    stage input (and the output it sends on); its backward reruns the stage's forward first. ``tally``: the
    recomputed FLOPs since construction (nnlib.lesson12_memory.recompute.Tally)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tally = Tally()

    def is_last_virtual(self, chunk: int) -> bool:
        """Whether ``chunk`` of this stage is the pipeline's last virtual stage (the one with the loss)."""
        return self.virtual(chunk) == self.stages * self.chunks - 1

    def keep_for_backward(self, chunk: int, activations, logits):
        """[a_in] on the last virtual stage, [a_in, a_out] elsewhere (a_out is what send_forward sends); no logits."""
        return (activations[:1] if self.is_last_virtual(chunk) else [activations[0], activations[-1]]), None

    def restore_for_backward(self, chunk: int, kept):
        """The chunk's forward rerun from the kept input: ([a_in, ..., a_out], z_L on the last virtual stage)."""
        layers, inputs = self.chunk_layers[chunk], kept[0][0]
        activations, logits = forward_layers(layers, inputs)
        self.tally.recomputed_flops += forward_flops(inputs.shape[0], [layer.shape for layer in layers])
        return activations, (logits if self.is_last_virtual(chunk) else None)


class RecomputedPipelineMLP(RecomputedStages, PipelineMLP):
    """Lesson 09's PipelineMLP (the same arguments) keeping only each micro-batch's stage input (and sent output)
    until its backward, which recomputes the stage's forward: bit-identical parameters, fewer bytes alive."""


class RecomputedLayers:
    """Put before a lesson 02 LayerStack (e.g. lesson 09's TensorParallelMLP) in the bases: every chunk of rows
    keeps the input of every ``recompute_every``-th layer (keyword argument, default 2) and backward recomputes
    the rest segment by segment (nnlib.lesson12_memory.recompute). ``tally``: recomputed FLOPs, peak bytes."""

    def __init__(self, *args, recompute_every: int = 2, **kwargs):
        super().__init__(*args, **kwargs)
        if hasattr(self, "comm"):  # ranks recomputing different segments would call different Allreduces
            require_same_on_every_rank(self.comm, "recompute_every", recompute_every)
        if isinstance(recompute_every, bool) or not isinstance(recompute_every, int) or recompute_every < 1:
            raise ValueError(f"recompute_every must be a whole number >= 1; got {recompute_every!r}")
        self.recompute_every, self.tally = recompute_every, Tally()

    def _chunk_loss_and_gradient(self, inputs, labels, scale: float, accumulate: bool, on_layer_done=None):
        """LayerStack's step on one chunk of rows, keeping the checkpoints only; the chunk's scaled loss."""
        kept, output, logits = checkpointed_forward(self.layers, inputs, self.recompute_every, self.tally)
        loss, correct, delta = output_loss(logits, output, labels, scale, self.output)
        self.last_correct += correct
        recomputed_backward(self.layers, kept, output, delta, accumulate, self.tally, on_layer_done)
        return loss


class RecomputedTensorParallelMLP(RecomputedLayers, TensorParallelMLP):
    """Lesson 09's TensorParallelMLP (the same arguments, and ``recompute_every``, default 2: each pair's input)
    keeping only every k-th layer's input: bit-identical parameters, fewer bytes alive."""
