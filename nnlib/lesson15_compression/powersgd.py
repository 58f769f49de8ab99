"""PowerSGD (Vogels et al. 2019): each weight gradient sent as a low-rank approximation, summed by Allreduce.

A weight layer's gradient M_r on rank r is a matrix (a, b) (a = n_in, b = n_out). PowerSGD keeps a
matrix Q (b, q) from the step before (*warm start*; the first Q is random, the same on every rank, from
one seed) and makes one power iteration per step, with error feedback (E_r: what rank r did not send)::

    M_r <- M_r + E_r                     error feedback (E_r starts at 0)
    S   = sum_r M_r Q           (a, q)   Allreduce 1 (with every bias gradient, sent whole)
    S^  = S's orthonormal basis (a, q)   QR: the same S on every rank gives the same S^
    Q   = sum_r M_r^T S^        (b, q)   Allreduce 2; kept for the next step
    sum_r M_r  ~  S^ Q^T                 the step's weight gradient, the same on every rank
    E_r = M_r - S^ Q^T / ranks           rank r's share of what was not sent

(The paper calls S "P"; here P is the number of ranks.) A layer sends q (a + b) numbers instead of
a b: for 784-32-10 and q = 1, 900 numbers instead of 25,450. Both messages are dense and MPI adds them
up inside the Allreduce, unlike top-k's (index, value) pairs, which need an Allgather.

q is the rank asked for, at most min(a, b) per layer. At q = min(a, b), S^ spans every column of
sum_r M_r and S^ S^T M = M: the step equals the plain Allreduce's to rounding (tested; then the
messages are larger than the gradient, which only that test wants). Bytes per step:
:func:`message_bytes`. ``train_parallel(..., strategy=powersgd(2))`` trains this way.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from nnlib.lesson02_network.arrays import to_numpy
from nnlib.lesson02_network.network import layer_views
from nnlib.lesson03_training.training import is_whole
from nnlib.lesson15_compression.compression import CompressedAllreduce

LESSON = 15


def check_rank(rank) -> list[str]:
    """What is wrong with PowerSGD's rank (an empty list if nothing); the same verdict on every rank."""
    return [] if is_whole(rank) and rank >= 1 else [f"PowerSGD's rank must be a whole number, 1 or more; got {rank!r}"]


def layer_ranks(shapes, rank: int) -> list[int]:
    """The rank used for each weight layer (a, b): min(rank, a, b)."""
    return [min(int(rank), rows, columns) for rows, columns in shapes]


def message_bytes(layer_sizes, rank: int, itemsize: int = 8) -> tuple[int, int]:
    """The bytes of one step's two Allreduce messages: (S and the biases, Q) = (sum a q + sum b, sum b q) numbers."""
    shapes = list(zip(layer_sizes[:-1], layer_sizes[1:]))
    ranks = layer_ranks(shapes, rank)
    first = sum(rows * q + columns for (rows, columns), q in zip(shapes, ranks))
    second = sum(columns * q for (_, columns), q in zip(shapes, ranks))
    return first * itemsize, second * itemsize


def pieces(flat: np.ndarray, shapes) -> list[np.ndarray]:
    """Cut the start of ``flat`` into consecutive matrices of the given shapes (views), then what is left (1-D)."""
    parts = np.split(flat, np.cumsum([rows * columns for rows, columns in shapes]))
    return [part.reshape(shape) for part, shape in zip(parts, shapes)] + [parts[-1]]


class PowerSGDCompressor:
    """One rank's side of PowerSGD: ``allreduce(comm, grads)`` replaces the flat gradient (n,) (host memory) by
    the sum over ranks: each weight layer's low-rank approximation, the biases exactly. It keeps Q and E_r."""

    def __init__(self, shapes, rank: int, dtype, seed: int = 0):
        problems = check_rank(rank)
        if problems:
            raise ValueError(problems[0])
        self.shapes, self.rank = [tuple(shape) for shape in shapes], int(rank)
        self.ranks = layer_ranks(self.shapes, rank)
        generator = np.random.default_rng(seed)
        self.qs = [generator.standard_normal((columns, q)).astype(dtype) for (_, columns), q in zip(self.shapes,
                                                                                                     self.ranks)]
        self.residuals = [np.zeros(shape, dtype=dtype) for shape in self.shapes]
        self.name = f"powersgd (rank {self.rank})"
        self.kept_between_steps = "PowerSGD's Q and residuals"

    def allreduce(self, comm, grads) -> None:
        """grads (n,) = [W_1, b_1, W_2, b_2, ...] on every rank -> in place, the approximated sum over ranks."""
        weights, biases = layer_views(grads, self.shapes)
        corrected = [weight + residual for weight, residual in zip(weights, self.residuals)]  # M_r + E_r
        first = np.concatenate([(matrix @ q).ravel() for matrix, q in zip(corrected, self.qs)] + list(biases))
        comm.Allreduce(MPI.IN_PLACE, first, op=MPI.SUM)                              # S, and the biases' sum
        s_shapes = [(rows, q) for (rows, _), q in zip(self.shapes, self.ranks)]
        *s_matrices, bias_sums = pieces(first, s_shapes)
        bases = [np.linalg.qr(s, mode="reduced")[0] for s in s_matrices]             # S^: QR's orthonormal Q
        second = np.concatenate([(matrix.T @ basis).ravel() for matrix, basis in zip(corrected, bases)])
        comm.Allreduce(MPI.IN_PLACE, second, op=MPI.SUM)                             # Q = sum_r M_r^T S^
        self.qs = [q.copy() for q in pieces(second, [q.shape for q in self.qs])[:-1]]
        for layer, (basis, q) in enumerate(zip(bases, self.qs)):
            approximation = basis @ q.T                                              # ~ sum_r M_r
            self.residuals[layer][...] = corrected[layer] - approximation / comm.size
            weights[layer][...] = approximation
        for bias, summed in zip(biases, np.split(bias_sums, np.cumsum([b.size for b in biases])[:-1])):
            bias[...] = summed


def powersgd(rank: int, seed: int = 0):
    """The strategy ``train_parallel`` takes for PowerSGD of this rank: a function of (comm, network) giving
    lesson 15's CompressedAllreduce with a :class:`PowerSGDCompressor`."""
    return lambda comm, network: CompressedAllreduce(comm, network, "powersgd", compressor=PowerSGDCompressor(
        network.shapes, rank, to_numpy(network.params[:1]).dtype, seed))
