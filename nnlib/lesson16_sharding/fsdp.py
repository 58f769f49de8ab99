"""ZeRO stage 3, or fully sharded data parallelism (FSDP): every rank holds 1/P of the parameters, of
their gradients and of the optimizer state; a layer's whole parameters exist only while it computes.

Here (Rajbhandari et al. 2020, stage 3; PyTorch's FullyShardedDataParallel) each layer's flat parameters
[W_l, b_l] (n_l = n_in n_out + n_out values) are cut into P chunks (lesson 04's ``split_evenly``: uneven
where P does not divide n_l), and rank r keeps chunk r of every layer, its gradient and its momentum:

    forward, layer l:   allgather W_l, b_l from the chunks  ->  z_l, a_l = Layer.forward  ->  free them
    backward, layer l:  allgather W_l, b_l again  ->  dJ/dW_l, dJ/db_l (whole, this rank's rows)
                        ->  reduce-scatter: chunk r of sum over ranks  ->  dJ/da_{l-1}  ->  free them
    update:             the optimizer (lesson 03's) on this rank's chunks only, layer by layer (no communication)

At any moment a rank holds its chunks plus one layer's whole parameters and gradient. :class:`ShardedLayer` is
lesson 02's ``Layer`` over the gathered weights, so ``forward_layers`` and ``backward_layers`` run unchanged.
Equal to sequential training within 1e-10 in float64 (tests/mpi/check_memory.py).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from nnlib.lesson02_network.arrays import array_namespace, namespace_of_device, to_numpy
from nnlib.lesson02_network.network import Layer, LayerStack, initial_layers, layer_views, parameter_offsets
from nnlib.lesson03_training.training import LocalUpdate
from nnlib.lesson04_collectives.collectives import raised_on_every_rank, split_evenly

LESSON = 16


def as_message(array):
    """``array`` as MPI may send it: a 2-byte float (float16, bfloat16: MPI has no type for them) as its bits
    (uint16), which is enough for gathers (they only move values); others unchanged."""
    return array.view(np.uint16) if array.dtype.itemsize == 2 else array


class GatherLog:
    """What a rank holds beyond its chunks: ``held`` whole-layer bytes now, and (while ``recording``) ``events``
    [(event, layer, whole bytes held after)], event "gather forward", "gather backward", "free" or "reduce-scatter"."""

    def __init__(self):
        self.events, self.held, self.recording = [], 0, False

    def note(self, event: str, layer: int, change: int) -> None:
        self.held += change
        if self.recording:
            self.events.append((event, layer, self.held))


class ShardedLayer(Layer):
    """Layer ``index`` of a fully sharded network: this rank holds chunk r of its flat [W, b] (``shard``) and of
    its gradient (``grad_shard``). ``whole``: a ``compute`` (lesson 02's Layer, or lesson 17's HalfLayer) over views
    of the gathered [W, b], from a gather to its free (None otherwise).
    shape (n_in, n_out); counts, starts: the chunks of n_in n_out + n_out.
    """

    shape = None  # the whole layer's (n_in, n_out), set on each (Layer's reads W, which this rank holds only in whole)
    weights = biases = grad_weights = grad_biases = None  # (the same: whole's, while gathered)

    def __init__(self, comm, index: int, shape, views, activation: str, log: GatherLog, compute=Layer):
        self.comm, self.index, self.shape, self.log = comm, index, tuple(shape), log
        self.shard, self.grad_shard = views
        self.activation, self.xp, self.compute = activation, array_namespace(self.shard), compute
        self.size = self.shape[0] * self.shape[1] + self.shape[1]
        self.counts, self.starts = split_evenly(self.size, comm.size)
        self.whole = None

    def gather(self, why: str) -> None:
        """Allgather the whole [W, b] (n_l,) from every rank's chunk; ``whole`` computes with views of it."""
        params = self.xp.empty(self.size, dtype=self.shard.dtype)
        self.comm.Allgatherv(as_message(self.shard), [as_message(params), (self.counts, self.starts)])
        (weights,), (biases,) = layer_views(params, [self.shape], self.xp)
        self.whole = self.compute(weights, biases, None, None, self.activation)
        self.log.note(f"gather {why}", self.index, params.nbytes)

    def free(self) -> None:
        """Drop the whole [W, b]: only this rank's chunk stays."""
        if self.whole is not None:
            self.whole = None
            self.log.note("free", self.index, -self.size * self.shard.itemsize)

    def forward(self, inputs):
        """Gather, lesson 02's forward (z, a), free."""
        self.gather("forward")
        try:
            return self.whole.forward(inputs)
        finally:
            self.free()

    def weight_gradient(self, inputs, delta, accumulate: bool = False) -> None:
        """Gather W, b again; dJ/dW, dJ/db of this rank's rows into a whole buffer (n_l,); reduce-scatter chunk r of
        its sum over ranks into ``grad_shard`` (or add it), summed in grad_shard's dtype (mixed precision: float32,
        where an inf stays inf). W stays for :meth:`input_gradient` (layer 0, whose input gradient nobody needs, frees
        it here)."""
        self.gather("backward")
        gradient = self.xp.empty(self.size, dtype=self.shard.dtype)
        (grad_weights,), (grad_biases,) = layer_views(gradient, [self.shape], self.xp)
        self.compute(self.whole.weights, self.whole.biases, grad_weights, grad_biases, self.activation) \
            .weight_gradient(inputs, delta)
        summed = self.xp.empty_like(self.grad_shard) if accumulate else self.grad_shard
        self.comm.Reduce_scatter(gradient.astype(summed.dtype, copy=False), summed, recvcounts=self.counts, op=MPI.SUM)
        if accumulate:
            self.grad_shard += summed
        self.log.note("reduce-scatter", self.index, 0)
        if self.index == 0:
            self.free()

    def input_gradient(self, delta):
        """dJ/da_in = delta @ W.T with the gathered W, then free it."""
        try:
            return self.whole.input_gradient(delta)
        finally:
            self.free()


class FullyShardedNetwork(LayerStack):
    """Lesson 02's network with every layer sharded over ``comm``'s ranks (ZeRO-3 / FSDP).

    layer_sizes, output, dtype, seed, device: as :class:`nnlib.Network` (the same starting weights: every rank
    draws them and keeps its chunks; on a GPU, a comm staging its buffers: nnlib.lesson08_gpu.backend.HostStaging).
    ``params``, ``grads``: this rank's chunks, layer after layer (sum over layers of c_{l,r} values); ``layers``:
    :class:`ShardedLayer`; ``log``: a :class:`GatherLog`. forward, loss_and_gradient, accuracy are collective.
    """

    def __init__(self, comm, layer_sizes, output: str = "sigmoid", dtype="float64", seed: int = 0, device="cpu"):
        layer_sizes = tuple(int(size) for size in layer_sizes)
        if len(layer_sizes) < 2 or min(layer_sizes) < 1 or output not in ("sigmoid", "softmax"):
            raise ValueError(f"need at least two positive layer sizes and output 'sigmoid' or 'softmax'; "
                             f"got {layer_sizes}, {output!r}")
        shapes = list(zip(layer_sizes[:-1], layer_sizes[1:]))
        pieces = []
        for whole in initial_layers(shapes, seed):  # one whole layer at a time: keep this rank's chunk
            counts, starts = split_evenly(whole.size, comm.size)
            pieces.append(whole[starts[comm.rank]:starts[comm.rank] + counts[comm.rank]].astype(np.dtype(dtype)))
        xp = namespace_of_device(device)
        params = xp.asarray(np.concatenate(pieces))
        grads = xp.zeros_like(params)
        bounds = np.cumsum([0] + [piece.size for piece in pieces])
        self.comm, self.log = comm, GatherLog()
        activations = ["sigmoid"] * (len(shapes) - 1) + [output]
        layers = [ShardedLayer(comm, index, shape, (params[start:stop], grads[start:stop]), kind, self.log)
                  for index, (shape, kind, start, stop) in enumerate(zip(shapes, activations, bounds, bounds[1:]))]
        super().__init__(layer_sizes, output, layers, params, grads, xp)
        self.total_params = parameter_offsets(shapes)[-1]
        self.chunk_size = None  # one piece, whatever the rows: every rank makes the same collective calls

    def full_params(self) -> np.ndarray:
        """The whole flat vector [W_1, b_1, ...] (num_params of the unsharded network), on every rank (collective)."""
        return self.full_vector(self.params)

    def full_vector(self, chunks) -> np.ndarray:
        """The whole vector (total_params,) laid out [W_1, b_1, ...] from every rank's ``chunks`` (laid out as
        ``params``: chunk r of each layer, layer after layer), on every rank (collective: one Allgatherv a layer)."""
        wholes, offset = [], 0
        for layer in self.layers:
            whole = np.empty(layer.size, dtype=chunks.dtype)
            mine = to_numpy(chunks[offset:offset + layer.counts[self.comm.rank]])  # (a GPU's: a host copy)
            self.comm.Allgatherv(as_message(mine), [as_message(whole), (layer.counts, layer.starts)])
            wholes.append(whole)
            offset += mine.size
        return np.concatenate(wholes)

    def own_chunks(self, whole) -> np.ndarray:
        """This rank's chunks (laid out as ``params``) of a whole vector (total_params,): the inverse of full_vector."""
        offsets, rank = parameter_offsets([layer.shape for layer in self.layers]), self.comm.rank
        return np.concatenate([whole[start + layer.starts[rank]:start + layer.starts[rank] + layer.counts[rank]]
                               for start, layer in zip(offsets, self.layers)])

    def state_dict(self) -> dict:
        """{"params": the whole flat vector (total_params,)}, gathered from every rank's chunks (collective)."""
        return {"params": self.full_params()}

    def load_state_dict(self, state: dict) -> None:
        """Keep this rank's chunks of the whole vector ``state["params"]`` (written by any number of ranks)."""
        self.params[...] = self.xp.asarray(self.own_chunks(np.asarray(state["params"])))


class FullySharded(LocalUpdate):
    """The sync of a :class:`FullyShardedNetwork` under lesson 06's ``train_parallel(..., strategy=FullySharded)``:
    the gradients arrive reduce-scattered during backpropagation, so a step is one process's (lesson 03's LocalUpdate:
    its optimizer on this rank's chunks, its score on every rank: the forward pass is collective); only the epoch's
    loss is summed over the ranks."""

    name = "fsdp"

    def __init__(self, comm, network):
        if not all(isinstance(layer, ShardedLayer) for layer in network.layers):  # (maybe wrapped: MicroBatched)
            raise TypeError(f"strategy fsdp trains a FullyShardedNetwork; got {type(network).__name__}")
        if network.comm.size != comm.size:
            raise ValueError(f"the network is sharded over {network.comm.size} ranks but the run has {comm.size}")
        self.comm, self.network, self.size, self.rank = comm, network, comm.size, comm.rank

    def optimizer(self, network, make):
        """The optimizer of this rank's chunks, stepped one layer's chunk after another (temporaries: one chunk)."""
        bounds = np.cumsum([0] + [layer.shard.size for layer in network.layers]).tolist()
        return make(network.params, network.xp, [slice(a, b) for a, b in zip(bounds, bounds[1:])])

    def step(self, run) -> None:
        run.phase("update")
        run.update(self.network.params, self.network.grads, self.comm)  # (the other ranks hold the other chunks)

    def whole(self, part):
        """A vector of the optimizer's state (laid out as ``params``: this rank's chunks), whole (collective)."""
        return self.network.full_vector(part)

    def part(self, whole):
        """This rank's chunks of a whole state vector (a checkpoint's, written by any number of ranks)."""
        return self.network.own_chunks(np.asarray(whole))

    def sum_over_ranks(self, values: np.ndarray) -> np.ndarray:
        self.comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
        return values

    def raised_on_every_rank(self, error: BaseException) -> BaseException:
        return raised_on_every_rank(error)
