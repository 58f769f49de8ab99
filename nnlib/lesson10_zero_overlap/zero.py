"""ZeRO, stages 1 and 2: each rank updates, and keeps optimizer state for, only 1/P of the parameters; at stage 2
it never holds more than 1/P of the gradient either.

ZeRO (Rajbhandari et al., 2020) cuts p, g and v into P slices [s_r, e_r) (uneven when P does not
divide the number of parameters, as ``collectives.split_evenly``) and, per step:

    1. reduce-scatter the gradients:   g_r = sum over ranks of g[s_r:e_r]        (e_r - s_r,)
    2. update only that slice:         v_r <- mu v_r - eta g_r;  p[s_r:e_r] += v_r   (momentum; any optimizer)
       (stage 1: rank r keeps only v_r, 1/P of the optimizer's state: Adam's m_r and v_r likewise)
    3. allgather the parameter slices: every rank has the whole new p again.

:class:`ZeRO` (stage 1) computes the whole local gradient g, then reduce-scatters it: the same bytes as the
``allreduce`` strategy, steps 1 and 3 being the two halves of the ring (lesson 09). :class:`ZeROStage2` trains a
:class:`GradientShardedNetwork`, whose backpropagation reduce-scatters g a bucket at a time (at most Psi / (4P)
values, or a row of W_l) to the ranks whose slices it covers, then drops it: a rank holds g_r and one bucket. With
gradient accumulation every micro-batch's buckets are sent and added into g_r (stage 1 sends once per step, after the
last micro-batch; stage 2 has no whole gradient to add into). Each slice is updated by the run's optimizer,
element-wise as on the whole vector, so both equal the ``allreduce`` strategy up to the order in which MPI adds the
ranks' gradients (within 1e-10 in float64; tests/mpi/check_parallel.py).

``train_parallel(..., strategy=ZeRO)`` trains this way; ``train_parallel(GradientShardedNetwork(comm, ...), ...,
strategy=ZeROStage2)`` at stage 2.
"""

from __future__ import annotations

from mpi4py import MPI

from nnlib.lesson02_network.arrays import constant_vector, through_host, to_numpy
from nnlib.lesson02_network.network import Layer, LayerStack, Network, parameter_offsets
from nnlib.lesson04_collectives.collectives import allgather_rows, split_evenly
from nnlib.lesson06_data_parallel.data_parallel import DataParallel
from nnlib.lesson09_ring_allreduce.allreduce import ring_allgather, ring_reduce_scatter

LESSON = 10


def rank_slice(num_params: int, size: int, rank: int) -> slice:
    """Rank ``rank``'s slice [s_r, e_r) of ``num_params`` cut into ``size`` (the ring's chunks, lesson 04's split)."""
    counts, starts = split_evenly(num_params, size)
    return slice(starts[rank], starts[rank] + counts[rank])


class ZeRO(DataParallel):
    """A step: reduce-scatter the gradients, update this rank's slice only, allgather the parameters. The optimizer
    is made for that slice only (``mine``), and steps on it."""

    name = "zero"

    def __init__(self, comm, network):
        super().__init__(comm, network)
        self.mine = rank_slice(network.num_params, self.size, self.rank)

    def optimizer(self, network, make):
        return make(network.params[self.mine], network.xp)

    def step(self, run) -> None:
        run.phase("communicate")
        through_host(self.network.grads, lambda grads: ring_reduce_scatter(self.comm, grads))  # my slice: its sum
        run.phase("update")
        run.update(self.network.params[self.mine], self.network.grads[self.mine], self.comm)  # this rank's slice
        run.phase("communicate")
        through_host(self.network.params, lambda params: ring_allgather(self.comm, params))  # every rank's slice

    def whole(self, part):
        """A vector of the optimizer's state (this rank's slice), whole on every rank: the slices gathered."""
        return allgather_rows(self.comm, to_numpy(part))

    def part(self, whole):
        """This rank's slice of a whole state vector (a checkpoint's, written by any number of ranks)."""
        return whole[self.mine]


class BucketLayer(Layer):
    """Lesson 02's Layer whose gradient this rank never holds whole: :meth:`weight_gradient` computes it a bucket at a
    time and hands each to ``network.reduce_to_owners``. ``offset``: where its [W, b] begins in the flat vector."""

    def __init__(self, network, weights, biases, activation: str, offset: int):
        super().__init__(weights, biases, None, None, activation)
        self.network, self.offset = network, offset

    def weight_gradient(self, inputs, delta, accumulate: bool = False) -> None:
        """dJ/dW = a_in.T @ delta a block of rows (a bucket of at most ``network.bucket`` values) at a time, then
        dJ/db = 1^T delta: each reduced to its owners, summed (or added, with ``accumulate``) into their slices."""
        n_in, n_out = self.shape
        rows = max(1, self.network.bucket // n_out)
        for first in range(0, n_in, rows):  # rows [first, first + rows) of W: flat [offset + first n_out, ...)
            self.network.reduce_to_owners(self.offset + first * n_out, inputs[:, first:first + rows].T @ delta,
                                          accumulate)  # (the block is dropped as the call returns)
        ones = constant_vector("ones", delta.shape[0], self.xp, delta.dtype)
        self.network.reduce_to_owners(self.offset + n_in * n_out, ones @ delta, accumulate)


class GradientShardedNetwork(LayerStack):
    """Lesson 02's network for ZeRO stage 2 on ``comm``'s ranks: the whole parameters (as at stage 1), but ``grads``
    is this rank's slice [s_r, e_r) of the gradient only (rank_slice), filled during backpropagation by
    :class:`BucketLayer`. layer_sizes, output, dtype, seed: as lesson 02's Network (the same starting weights). Its
    backward is collective: every rank makes it at once, in one piece."""

    def __init__(self, comm, layer_sizes, output: str = "sigmoid", dtype="float64", seed: int = 0):
        whole = Network(layer_sizes, output, dtype, seed)  # (its checks and weights; its whole gradient is dropped)
        self.comm, self.slices = comm, [rank_slice(whole.num_params, comm.size, r) for r in range(comm.size)]
        self.bucket = max(1, whole.num_params // (4 * comm.size))
        layers = [BucketLayer(self, layer.weights, layer.biases, layer.activation, offset)
                  for layer, offset in zip(whole.layers, parameter_offsets(whole.shapes))]  # over whole.params
        mine = self.slices[comm.rank]
        grads = whole.xp.zeros(mine.stop - mine.start, whole.dtype)  # g_r only
        super().__init__(whole.layer_sizes, output, layers, whole.params, grads, whole.xp)
        self.chunk_size = None  # one piece, whatever the rows: every rank makes the same collective calls

    def reduce_to_owners(self, start: int, values, accumulate: bool) -> None:
        """The sum over ranks of ``values`` (a bucket: the flat gradient's [start, start + values.size)), each rank
        receiving the part in its slice (MPI's Reduce_scatter, uneven counts), into ``grads`` (or added to it)."""
        stop, mine = start + values.size, self.slices[self.comm.rank]
        counts = [max(0, min(stop, owned.stop) - max(start, owned.start)) for owned in self.slices]
        here = max(start, mine.start) - mine.start
        summed = self.grads[here:here + counts[self.comm.rank]]
        received = self.xp.empty_like(summed) if accumulate else summed
        self.comm.Reduce_scatter(values.reshape(-1), received, recvcounts=counts, op=MPI.SUM)
        if accumulate:
            summed += received


class ZeROStage2(ZeRO):
    """ZeRO stage 2 on a :class:`GradientShardedNetwork`: the gradient's slice arrives summed during backpropagation,
    so a step updates this rank's slice and allgathers the parameters."""

    name = "zero-2"

    def __init__(self, comm, network):
        if not all(isinstance(layer, BucketLayer) for layer in network.layers):  # (maybe wrapped: MicroBatched)
            raise TypeError(f"ZeRO stage 2 trains a GradientShardedNetwork; got {type(network).__name__}")
        super().__init__(comm, network)

    def step(self, run) -> None:
        run.phase("update")
        run.update(self.network.params[self.mine], self.network.grads, self.comm)  # the slice's sum, from backward
        run.phase("communicate")
        through_host(self.network.params, lambda params: ring_allgather(self.comm, params))  # every rank's slice
