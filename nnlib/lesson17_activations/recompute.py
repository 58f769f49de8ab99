"""Activation recomputation (checkpointing): keep every k-th layer's input, recompute the rest in backward.

Backpropagation needs every layer's input a_{l-1} (for dJ/dW_l = a_{l-1}.T @ delta_l and for the
sigmoid's a (1 - a)). Keeping them all costs L arrays of (N, n). Instead (Chen et al. 2016) keep only
the inputs of layers 0, k, 2k, ... (the checkpoints) and, going backward segment by segment, rerun
the forward pass of each segment from its checkpoint, then backpropagate through it:

    kept while backward runs:   ceil(L / k) checkpoints + the output a_L
    recomputed at the peak:     k - 1 activations of one segment
    extra forward work:         every layer whose input is not a checkpoint runs forward twice:
                                sum over those layers of 2 N n_in n_out multiply-adds' FLOPs

With k = 1 nothing is recomputed (every input is kept); k near sqrt(L) makes ceil(L / k) + k - 1, the
peak, smallest: about 2 sqrt(L) arrays instead of L, for about one more forward pass (any widths:
budget.activation_widths). The forward runs are lesson 02's ``forward_layers`` and the backward its
``backward_layers`` on each segment, so the gradients and the trained parameters are bit-identical.
"""

from __future__ import annotations

import math

from nnlib.lesson02_network.network import backward_layers, forward_layers

LESSON = 17


def checkpoint_layers(num_layers: int, every: int) -> list[int]:
    """The layers whose input a_l is kept: 0, k, 2k, ... below L (every = k >= 1, as MicroBatched checks)."""
    return list(range(0, num_layers, every))


def sqrt_every(num_layers: int) -> int:
    """The k that makes ceil(L / k) + k - 1, the arrays held at the peak, smallest (about sqrt(L))."""
    return min(range(1, num_layers + 1), key=lambda every: (math.ceil(num_layers / every) + every - 1, every))


def extra_forward_flops(rows: int, shapes, every: int) -> int:
    """The formula: every layer (n_in, n_out) of ``shapes`` whose input is not a checkpoint runs forward once
    more, its matrix product's 2 N n_in n_out FLOPs."""
    kept = set(checkpoint_layers(len(shapes), every))
    return sum(2 * rows * n_in * n_out for layer, (n_in, n_out) in enumerate(shapes) if layer not in kept)


def checkpointed_forward(layers, inputs, every: int):
    """Forward through ``layers``, keeping only the checkpoints: ({l: a_l for l in checkpoints}, a_L, z_L)."""
    kept, activation, logits = {}, inputs, None
    positions = set(checkpoint_layers(len(layers), every))
    for index, layer in enumerate(layers):
        if index in positions:
            kept[index] = activation
        logits, activation = layer.forward(activation)
    return kept, activation, logits


def recomputed_backward(layers, kept, delta, accumulate: bool, on_layer_done=None) -> None:
    """Backpropagation segment by segment, last first: recompute a_start .. a_{stop-1} from the checkpoint a_start,
    run ``backward_layers`` on the segment, and carry dJ/da_start down as the next delta. kept: the checkpoints of
    :func:`checkpointed_forward`; delta = dJ/dz_L (N, n_L); ``on_layer_done(l)``: backward_layers', l in the network.
    """
    starts = sorted(kept)
    for start, stop in reversed(list(zip(starts, starts[1:] + [len(layers)]))):
        segment, _ = forward_layers(layers[start:stop - 1], kept[start])  # [a_start, ..., a_{stop-1}]
        hook = None if on_layer_done is None else (lambda index, start=start: on_layer_done(start + index))
        gradient = backward_layers(layers[start:stop], segment, delta, accumulate, hook, input_gradient=start > 0)
        if start > 0:
            delta = layers[start - 1].logits_gradient(gradient, kept[start])
        segment = gradient = None  # freed before the next segment is recomputed
