"""Gradient accumulation: one optimizer step from k micro-batches, holding the activations of one at a time.

A step's gradient is a sum over its samples, so it splits into sums over k micro-batches of the batch
(uneven where k does not divide it: ``split_evenly``), computed one after another and added up in
``grads``; each divides by the whole batch's size, so the sum is the big batch's gradient (equal to
one step on it within 1e-12 in float64, the additions being in another order):

    grads  = sum over micro-batches m of  dJ_m/dparams      (backward_layers with accumulate=True)
    update once, with the whole sum

Activations are held for one micro-batch only: B / k rows instead of B. In data parallelism the
ranks need to agree only on the final sum, so nothing is sent until the last micro-batch's backward
(PyTorch DDP's ``no_sync``): a gradient hook (``on_layer_done``, lesson 10's overlap) hears only the
last micro-batch, and the sync's one Allreduce follows it. Sending after every micro-batch would
send k times the bytes (nnlib.lesson09_ring_allreduce.counting counts them on the real calls).
"""

from __future__ import annotations

from nnlib.lesson02_network.network import output_loss
from nnlib.lesson04_collectives.collectives import split_evenly
from nnlib.lesson17_activations.recompute import checkpointed_forward, recomputed_backward

LESSON = 17


class MicroBatched:
    """``network`` trained k = ``micro_batches`` micro-batches per step (and, with ``recompute_every`` = k_r,
    keeping every k_r-th layer's input only). Everything but :meth:`loss_and_gradient` is the network's own
    (params, grads, layers, accuracy, ...)."""

    loss_scale = 1.0  # S: backpropagation starts from S dJ/dz_L (mixed precision's loss scaling; 1 here)

    def __init__(self, network, micro_batches: int = 1, recompute_every: int | None = None):
        if int(micro_batches) != micro_batches or micro_batches < 1:
            raise ValueError(f"micro_batches must be a whole number >= 1; got {micro_batches!r}")
        if recompute_every is not None and (int(recompute_every) != recompute_every or recompute_every < 1):
            raise ValueError(f"recompute_every must be a whole number >= 1 (or None); got {recompute_every!r}")
        self.network, self.micro_batches, self.recompute_every = network, int(micro_batches), recompute_every
        self.last_correct = 0

    def __getattr__(self, name):  # only for names not found on self: the network's own
        if name == "network":  # not set yet (a copy or an unpickling in progress): no endless recursion
            raise AttributeError(name)
        return getattr(self.network, name)

    def loss_and_gradient(self, inputs, labels, normalizer=None, check: bool = True, on_device: bool = False,
                          on_layer_done=None):
        """As lesson 02's ``loss_and_gradient`` (the sums divided by ``normalizer``, default N), micro-batch by
        micro-batch; ``on_layer_done`` hears the last micro-batch only (no_sync before it)."""
        if check:
            self.network.check_inputs(inputs)
            self.network.check_labels(labels, inputs.shape[0])
        scale = self.loss_scale / (inputs.shape[0] if normalizer is None else normalizer)
        loss, self.last_correct = 0.0, 0
        counts, starts = split_evenly(inputs.shape[0], self.micro_batches)  # the first rows mod k one row longer
        for number, (start, count) in enumerate(zip(starts, counts)):  # (some empty when k > rows: they add 0)
            hook = on_layer_done if number == self.micro_batches - 1 else None
            rows = slice(start, start + count)
            loss += self.micro_batch(inputs[rows], labels[rows], scale, number > 0, hook)
        if on_device:
            return loss
        self.last_correct = int(self.last_correct)
        return float(loss)

    def micro_batch(self, inputs, labels, scale: float, accumulate: bool, on_layer_done):
        """Forward, loss and backward of one micro-batch, adding its gradient (after the first); its loss. Without
        recomputation every layer's input is a checkpoint (k = 1: nothing recomputed, lesson 02's passes). The
        loss is computed in the network's own dtype (mixed precision's float32 master: from its low a_L)."""
        kept, output, logits = checkpointed_forward(self.layers, inputs, self.recompute_every or 1)
        loss, correct, delta = output_loss(logits, output.astype(self.dtype, copy=False), labels, scale, self.output)
        recomputed_backward(self.layers, kept, delta, accumulate, on_layer_done)
        self.last_correct += correct
        return loss
