"""Tensor (intra-layer) parallelism: the hidden units are split over the ranks (Megatron-LM's MLP).

Data parallelism gives every rank the whole network and part of the data. Tensor parallelism gives
every rank *all* of the data and part of every large layer. Layers go in pairs:

column-split layer (W: n_in x h, split by columns into h_r columns per rank)
    a_r = sigmoid(a @ W[:, cols_r] + b[cols_r])              (N, h_r): rank r's hidden units,
    from the full input a, with no communication.
row-split layer (W: h x n_out, split by rows, the same rows as the columns above)
    z = sum over ranks of a_r @ W[cols_r, :]   + b          (N, n_out): one Allreduce of the
    partial products completes it (the bias, replicated, is added once after the sum).

Backward, with the full delta (N, n_out) of the row layer on every rank:

    dJ/dW[cols_r, :] = a_r.T @ delta                         local
    delta_r = (delta @ W[cols_r, :].T) * a_r (1 - a_r)       local: rank r's hidden units only
    dJ/dW[:, cols_r] = a.T @ delta_r,  dJ/db[cols_r] = sum delta_r      local
    delta of the pair's input = sum over ranks of delta_r @ W[:, cols_r].T    one Allreduce

The last Allreduce is needed only if a layer comes before the pair: with one hidden layer
(784-128-10) the backward pass communicates nothing at all, and the forward pass one
(N, 10) array. A network with an odd number of weight layers keeps its last layer (the output
layer) whole on every rank ("replicated": the same small product computed everywhere).

Any hidden size works, also one the number of ranks does not divide (``split_counts``). The
parameters start as :class:`nnlib.network.Network`'s (the same seed), and :meth:`full_params`
gathers them back into its flat layout, so runs compare with sequential training directly.

A :class:`TensorParallelMLP` has the methods that :func:`nnlib.training.train` uses (``params``,
``grads``, ``loss_and_gradient``...), so the sequential trainer drives it unchanged: every rank
runs the same steps on the same batches. Its Allreduces run under the watchdog's deadline.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..collectives import allgather_rows, offsets, split_counts
from ..network import (Network, cross_entropy_from_logits, layer_activation, layer_views, one_hot_targets,
                       sigmoid_prime_from_activation, store_gradient)
from ..watchdog import watch
from ..collectives import require_same_on_every_rank

LESSON = 9



def layer_kinds(num_layers: int) -> list[str]:
    """How each weight layer is split: column, row, column, row, ..., and a replicated last one if odd."""
    kinds = []
    while len(kinds) + 2 <= num_layers:
        kinds += ["column", "row"]
    if len(kinds) < num_layers:
        kinds.append("replicated")
    return kinds


class TensorParallelMLP:
    """This rank's part of a fully connected sigmoid network, split by hidden units.

    comm:   the ranks that share the network (each holds all of the data); its collectives are
            watched (``timeout``, see nnlib.watchdog).
    layer_sizes, output, dtype, seed: as for nnlib.network.Network (the same initial weights).
    Attributes: kinds (per layer: "column", "row" or "replicated"), columns (per layer: the
    (start, stop) of the hidden units this rank holds), params and grads (this rank's flat vector),
    weights, biases, grad_weights, grad_biases (views into them, per layer).
    """

    def __init__(self, comm, layer_sizes=(784, 128, 10), output: str = "sigmoid", dtype="float64",
                 seed: int = 0, timeout=None):
        reference = Network(layer_sizes, output, dtype, seed=seed)  # checks the settings, gives the start
        self.comm = watch(comm, timeout)
        require_same_on_every_rank(self.comm, "the network (layer sizes, output, dtype, seed)",
              (reference.layer_sizes, output, str(np.dtype(dtype)), seed))
        self.layer_sizes, self.output = reference.layer_sizes, output
        self.xp, self.dtype = np, reference.dtype
        self.shapes = reference.shapes
        self.kinds = layer_kinds(len(self.shapes))
        size, rank = self.comm.size, self.comm.rank
        self.columns = []
        pieces = []
        full_weights, full_biases = reference.weights, reference.biases
        for layer, kind in enumerate(self.kinds):
            n_in, n_out = self.shapes[layer]
            if kind == "column":
                start = int(offsets(split_counts(n_out, size))[rank])
                stop = start + int(split_counts(n_out, size)[rank])
                self.columns.append((start, stop))
                pieces += [full_weights[layer][:, start:stop], full_biases[layer][start:stop]]
            elif kind == "row":
                start, stop = self.columns[layer - 1]
                self.columns.append((0, n_out))
                pieces += [full_weights[layer][start:stop, :], full_biases[layer]]
            else:
                self.columns.append((0, n_out))
                pieces += [full_weights[layer], full_biases[layer]]
        self.local_shapes = [piece.shape for piece in pieces[0::2]]
        self.params = np.concatenate([piece.reshape(-1) for piece in pieces]).astype(self.dtype)
        self.grads = np.zeros_like(self.params)
        self.weights, self.biases = layer_views(self.params, self.local_shapes)
        self.grad_weights, self.grad_biases = layer_views(self.grads, self.local_shapes)
        self.num_layers = len(self.shapes)
        self.num_params = self.params.size  # this rank's share
        self.chunk_size = reference.chunk_size
        self.last_correct = 0
        del reference, full_weights, full_biases  # no rank keeps the whole network

    # Network's own code where nothing differs: the input checks, cutting a large batch into chunks,
    # adding up the chunks' losses and gradients, and evaluation (all through forward() below)
    check_inputs = Network.check_inputs
    check_labels = Network.check_labels
    chunks = Network.chunks
    loss_and_gradient = Network.loss_and_gradient
    predict_probabilities = Network.predict_probabilities
    predict = Network.predict
    accuracy = Network.accuracy

    # -- forward and backward -------------------------------------------------------------
    def forward(self, inputs):
        """[a_0, a_1, ..., a_L]: after a column layer this rank's hidden units only, else whole."""
        activations = [inputs]
        for layer, kind in enumerate(self.kinds):
            logits = activations[-1] @ self.weights[layer]
            if kind == "row":
                self.comm.Allreduce(MPI.IN_PLACE, logits, op=MPI.SUM)  # complete the partial sums
            logits += self.biases[layer]
            activations.append(layer_activation(logits, layer == self.num_layers - 1, self.output, np))
        self.output_logits = logits
        return activations

    def _chunk_loss_and_gradient(self, inputs, labels, scale, accumulate, on_layer_done=None):
        """Backpropagation on one chunk (every rank passes the same rows): this rank's gradient.

        As Network's, with one Allreduce of the input gradient for each column-split layer after the first.
        """
        if on_layer_done is not None:
            raise ValueError("the overlap strategy sends whole layers' gradients; a tensor-parallel rank holds "
                             "pieces of layers: use strategy 'allreduce' or 'zero'")
        activations = self.forward(inputs)
        targets = one_hot_targets(labels, self.layer_sizes[-1], self.dtype, np)
        loss = cross_entropy_from_logits(self.output_logits, targets, self.output, np) * scale
        self.last_correct += np.count_nonzero(np.argmax(activations[-1], axis=1) == labels)
        delta = (activations[-1] - targets) * scale                      # delta_L: whole on every rank
        for layer in range(self.num_layers - 1, -1, -1):
            store_gradient(activations[layer].T @ delta, np.sum(delta, axis=0), self.grad_weights[layer],
                           self.grad_biases[layer], accumulate)
            if layer > 0:
                delta = delta @ self.weights[layer].T
                if self.kinds[layer] == "column":  # partial sums over this rank's hidden units
                    self.comm.Allreduce(MPI.IN_PLACE, delta, op=MPI.SUM)
                delta *= sigmoid_prime_from_activation(activations[layer])
        return loss

    # -- comparison ------------------------------------------------------------------------
    def full_params(self) -> np.ndarray:
        """The whole network's flat parameter vector (Network's layout), on every rank."""
        pieces = []
        for layer, kind in enumerate(self.kinds):
            weights, biases = self.weights[layer], self.biases[layer]
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
