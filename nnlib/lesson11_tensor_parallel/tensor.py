"""Tensor (intra-layer) parallelism: the hidden units are split over the ranks (Megatron-LM's MLP).

Every rank has *all* of the data and part of every large layer, in pairs (cols_r: rank r's hidden units):

column-split   a_r = sigmoid(a @ W[:, cols_r] + b[cols_r])   (N, h_r), no communication
row-split      z = sum_r a_r @ W[cols_r, :] + b             one Allreduce of the partial products, then b once
backward       every gradient but the pair's input gradient is local; that one, sum_r delta_r @ W[:, cols_r].T,
               takes one Allreduce, needed only if a layer comes before the pair.

A network with an odd number of weight layers keeps its last layer whole on every rank ("replicated").
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from nnlib.lesson02_network.arrays import namespace_of_device, to_numpy
from nnlib.lesson02_network.network import Layer, LayerStack, Network, dense_layers
from nnlib.lesson04_collectives.collectives import allgather_rows, require_same_on_every_rank, split_evenly

LESSON = 11


def layer_kinds(num_layers: int) -> list[str]:
    """How each weight layer is split: column, row, column, row, ..., and a replicated last one if odd."""
    return ["column", "row"] * (num_layers // 2) + ["replicated"] * (num_layers % 2)


class SplitLayer(Layer):
    """A layer of which each rank of ``comm`` holds a slice (the views are this rank's); see Layer."""

    def __init__(self, comm, weights, biases, grad_weights, grad_biases, activation: str = "sigmoid"):
        super().__init__(weights, biases, grad_weights, grad_biases, activation)
        self.comm = comm


class ColumnLayer(SplitLayer):
    """The columns C_r of W (n_in, h) and of b, this rank's h_r hidden units: the module's column-split layer,
    whose input gradient one Allreduce completes."""

    def input_gradient(self, delta):
        partial = super().input_gradient(delta)  # this rank's hidden units' share
        self.comm.Allreduce(MPI.IN_PLACE, partial, op=MPI.SUM)
        return partial


class RowLayer(SplitLayer):
    """The rows C_r of W (h, n_out) that match the column layer before it, b whole: the module's row-split layer,
    whose logits one Allreduce of the partial products completes (the bias added once, after the sum)."""

    plain_logits = False  # (its own logits, below)

    def logits(self, inputs):
        logits = inputs @ self.weights
        self.comm.Allreduce(MPI.IN_PLACE, logits, op=MPI.SUM)  # complete the partial sums
        logits += self.biases
        return logits


SPLIT_LAYERS = {"column": ColumnLayer, "row": RowLayer, "replicated": SplitLayer}  # (replicated: whole everywhere)


def split_pieces(whole: Network, kinds, size: int, rank: int):
    """This rank's blocks of ``whole``'s weights and biases, [W_0, b_0, W_1, b_1, ...], and its units.

    Returns (pieces, columns): columns[l] is the (start, stop) of the hidden units of layer l held
    here ((0, n_out) for a row or replicated layer, whose outputs every rank has).
    """
    pieces, columns = [], []
    for layer, kind in enumerate(kinds):
        weights, biases = whole.weights[layer], whole.biases[layer]
        n_out = whole.shapes[layer][1]
        if kind == "column":
            counts, starts = split_evenly(n_out, size)
            start, stop = starts[rank], starts[rank] + counts[rank]
            columns.append((start, stop))
            pieces += [weights[:, start:stop], biases[start:stop]]
        elif kind == "row":
            start, stop = columns[layer - 1]
            columns.append((0, n_out))
            pieces += [weights[start:stop, :], biases]
        else:
            columns.append((0, n_out))
            pieces += [weights, biases]
    return pieces, columns


class TensorParallelMLP(LayerStack):
    """This rank's part of a fully connected sigmoid network, split by hidden units.

    comm: the ranks that share the network, each with all of the data, used as given (for a deadline on its
    Allreduces, pass nnlib.course.deadline.watch(comm, timeout)). layer_sizes, output, dtype, seed, device: as for
    Network (the same initial weights; on a GPU, a comm staging its buffers: lesson 08's HostStaging). kinds (per
    layer: "column", "row" or "replicated") and columns: split_pieces'; layers: ColumnLayer, RowLayer, SplitLayer;
    params, grads: this rank's flat vectors, with per-layer views weights, biases, grad_weights, grad_biases.
    """

    def __init__(self, comm, layer_sizes=(784, 128, 10), output: str = "sigmoid", dtype="float64", seed: int = 0,
                 device="cpu"):
        whole = Network(layer_sizes, output, dtype, seed=seed)  # checks the settings, gives the start
        self.comm = comm
        require_same_on_every_rank(comm, "the network (layer sizes, output, dtype, seed)",
                                   (whole.layer_sizes, output, str(np.dtype(dtype)), seed))
        self.kinds = layer_kinds(whole.num_layers)
        pieces, self.columns = split_pieces(whole, self.kinds, comm.size, comm.rank)
        local_shapes = [tuple(piece.shape) for piece in pieces[0::2]]
        xp = namespace_of_device(device)
        params = xp.asarray(np.concatenate([piece.reshape(-1) for piece in pieces]).astype(whole.dtype))
        grads = xp.zeros_like(params)
        layers = [SPLIT_LAYERS[kind](comm, layer.weights, layer.biases, layer.grad_weights, layer.grad_biases,
                                     layer.activation)  # lesson 02's layers over the views, each made a split one
                  for kind, layer in zip(self.kinds, dense_layers(params, grads, local_shapes, output, xp))]
        super().__init__(whole.layer_sizes, output, layers, params, grads, xp)
        del whole, pieces  # no rank keeps the whole network

    def loss_and_gradient(self, inputs, labels, normalizer=None, check: bool = True, on_device: bool = False,
                          on_layer_done=None):
        """LayerStack's (every rank passes the same rows), refusing ``on_layer_done``: no whole layers here."""
        if on_layer_done is not None:
            raise ValueError("the overlap strategy sends whole layers' gradients; a tensor-parallel rank holds "
                             "pieces of layers: use strategy 'allreduce' or nnlib.lesson10_zero_overlap.zero.ZeRO")
        return super().loss_and_gradient(inputs, labels, normalizer, check, on_device)

    def full_params(self) -> np.ndarray:
        """The whole network's flat parameter vector (Network's layout), on every rank."""
        pieces = []
        for layer, kind in enumerate(self.kinds):
            weights, biases = to_numpy(self.weights[layer]), to_numpy(self.biases[layer])
            if kind == "column":  # gather the column blocks as rows of W.T
                pieces += [allgather_rows(self.comm, np.ascontiguousarray(weights.T)).T,
                           allgather_rows(self.comm, biases)]
            elif kind == "row":
                pieces += [allgather_rows(self.comm, weights), biases]
            else:
                pieces += [weights, biases]
        return np.concatenate([np.ascontiguousarray(piece).reshape(-1) for piece in pieces])

    def __repr__(self):
        return (f"TensorParallelMLP({'-'.join(map(str, self.layer_sizes))}, rank {self.comm.rank} of "
                f"{self.comm.size}, {self.params.size} of the parameters here)")
