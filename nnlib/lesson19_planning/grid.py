"""A 3-D grid: data x tensor x pipeline parallelism on one communicator split three ways.

P = D x T x S ranks (S pipeline stages). Rank (d, s, t) = d (S T) + s T + t: the T ranks of a tensor group are
neighbours (on one node, where the links are fastest), as in Megatron-LM.

    tensor_comm  same (d, s): stage s of replica d, its layers split by hidden units (lesson 11)
    pipe_comm    same (d, t): replica d's stages, rank t of each stage talking to rank t of the next (lesson 12)
    data_comm    same (s, t): the D copies of one piece, each on its own shard of the data (lessons 06, 10)

Stage s holds layers [first, stop) and splits them over tensor_comm as lesson 11 splits a whole network
(layer_kinds(stop - first): column, row, ..., replicated last if odd), so every stage's output a (N, n_stop) and
input gradient g (N, n_first) are whole on each of its T ranks: the pipeline's messages are lesson 12's. The
piece's gradient, divided by the global batch, is this rank's part of the sequential one; :func:`train_grid` sums
it over data_comm with lesson 12's train_hybrid (any strategy: ``allreduce``, lesson 10's ZeRO (stage 1), ...),
so every step is sequential training's (tests/mpi/check_grid.py).
"""

from __future__ import annotations

import numpy as np

from nnlib.lesson02_network.network import Network, parameter_offsets
from nnlib.lesson04_collectives.collectives import allgather_rows, raised_on_every_rank, require_same_on_every_rank
from nnlib.lesson11_tensor_parallel.tensor import TensorParallelMLP, layer_kinds, split_pieces
from nnlib.lesson12_pipeline.grid import grid, train_hybrid
from nnlib.lesson12_pipeline.pipeline import PipelineMLP, Stage, stage_layers

LESSON = 19


def split_widths(layer_sizes, stages: int, cut=None) -> list[int]:
    """The widths n_out of the layers split by columns when ``stages`` stages (stage_layers' cut: even, or ``cut``)
    each split their own layers over the tensor ranks; the tensor degree may be at most the smallest."""
    return [layer_sizes[first + index + 1] for first, stop in stage_layers(len(layer_sizes) - 1, stages, cut)
            for index, kind in enumerate(layer_kinds(stop - first)) if kind == "column"]


def grid_problem(ranks: int, degrees, layer_sizes, cut=None) -> str | None:
    """Why (D, T, S) degrees (and the pipeline's ``cut``, layers per stage) cannot lay ``layer_sizes`` out on
    ``ranks`` ranks, or None if they can."""
    degrees = tuple(degrees) if isinstance(degrees, (tuple, list)) else (degrees,)
    if len(degrees) != 3 or not all(isinstance(degree, int) and degree >= 1 for degree in degrees):
        return f"the grid needs three positive whole degrees (data, tensor, pipeline), e.g. (2, 2, 1); got {degrees!r}"
    (data, tensor, stages), num_layers = degrees, len(layer_sizes) - 1
    if data * tensor * stages != ranks:
        return (f"data x tensor x pipeline = {data} x {tensor} x {stages} = {data * tensor * stages}, but there are "
                f"{ranks} ranks: choose degrees whose product is {ranks}")
    if stages > num_layers:
        return (f"{stages} pipeline stages but the network has only {num_layers} weight layers: every stage needs "
                "at least one. Use fewer stages")
    if cut is not None and (len(cut) != stages or sum(cut) != num_layers or min(cut) < 1):
        return f"cut {cut!r} must give each of the {stages} stages at least one layer, {num_layers} in all"
    widths = split_widths(layer_sizes, stages, cut)
    if tensor > min(widths, default=1):
        splits = (f"its narrowest layer split by columns has {min(widths)} hidden units" if widths else
                  "no stage has two layers, so no layer is split")
        return f"tensor degree {tensor} is too wide: {splits}. Use a tensor degree of at most {min(widths, default=1)}"
    return None


def replica_comms(model_comm, tensor: int):
    """(tensor_comm, pipe_comm) of one replica's T x S ranks (lesson 12's model_comm): rank s T + t of it is tensor
    rank t of stage s."""
    stage, piece = divmod(model_comm.rank, tensor)
    return model_comm.Split(color=stage, key=piece), model_comm.Split(color=piece, key=stage)


def check_grid(comm, degrees, layer_sizes) -> None:
    """Raise the same ValueError on every rank of ``comm`` unless (D, T, S) can lay ``layer_sizes`` out on it."""
    require_same_on_every_rank(comm, "the grid's degrees and layer sizes", (tuple(degrees), tuple(layer_sizes)))
    problem = grid_problem(comm.size, degrees, layer_sizes)
    if problem:
        raise raised_on_every_rank(ValueError(problem))


def grid_comms(comm, degrees, layer_sizes):
    """(data_comm, tensor_comm, pipe_comm) of the (D, T, S) grid on ``comm``, after :func:`check_grid`."""
    check_grid(comm, degrees, layer_sizes)
    data_comm, model_comm = grid(comm, degrees[1] * degrees[2])
    tensor_comm, pipe_comm = replica_comms(model_comm, degrees[1])
    model_comm.Free()
    return data_comm, tensor_comm, pipe_comm


class GridPipelineMLP(PipelineMLP):
    """A pipeline stage whose layers are split over ``tensor_comm``: lesson 12's PipelineMLP over ``pipe_comm``
    (the same keywords: layer_sizes, output, dtype, seed, micro_batches, schedule, device), each stage a lesson 11
    TensorParallelMLP (``piece``) of its layers. ``params``, ``grads``: this rank's piece of the stage's."""

    def __init__(self, tensor_comm, pipe_comm, layer_sizes=(784, 128, 10), device="cpu", **pipeline):
        self.tensor_comm, self.device = tensor_comm, device
        for comm in (tensor_comm, pipe_comm):  # (together they join a replica's ranks: one verdict for all)
            require_same_on_every_rank(comm, "the layer sizes", tuple(layer_sizes))
        problem = grid_problem(tensor_comm.size * pipe_comm.size, (1, tensor_comm.size, pipe_comm.size), layer_sizes,
                               pipeline.get("cut"))
        if problem:
            raise raised_on_every_rank(ValueError(problem))
        super().__init__(pipe_comm, layer_sizes, device=device, **pipeline)

    def stage_range(self, num_layers: int) -> tuple[int, int]:
        """This stage's layers [first, stop): stage_layers' cut (even, or PipelineMLP's ``cut``)."""
        return stage_layers(num_layers, self.stages, self.cut)[self.stage]

    def hold_layers(self, whole: Network) -> list[Stage]:
        """Layers [first, stop) of ``whole`` as one network, split over tensor_comm by lesson 11's TensorParallelMLP
        (made with these layers' starting weights): a Stage over its layers."""
        (self.first, self.stop), last = self.stage_range(whole.num_layers), self.stage == self.stages - 1
        starts = parameter_offsets(whole.shapes)
        stage = Network(whole.layer_sizes[self.first:self.stop + 1], self.output if last else "sigmoid", whole.dtype)
        stage.set_params(whole.params[starts[self.first]:starts[self.stop]])
        self.piece = TensorParallelMLP(self.tensor_comm, stage.layer_sizes, stage.output, whole.dtype,
                                       device=self.device)
        pieces, _ = split_pieces(stage, self.piece.kinds, self.tensor_comm.size, self.tensor_comm.rank)
        self.piece.load_state_dict({"params": np.concatenate([piece.reshape(-1) for piece in pieces])})
        self.params, self.grads, self.num_params = self.piece.params, self.piece.grads, self.piece.num_params
        return [Stage(self.comm, self.piece.layers, self.stage, self.stage - 1 if self.stage else None,
                      None if last else self.stage + 1)]

    def full_params(self) -> np.ndarray:
        """The whole network's flat vector (Network's layout), on every rank: each stage's gathered over
        tensor_comm, then the stages in order over pipe_comm."""
        return allgather_rows(self.comm, self.piece.full_params())


def train_grid(comm, degrees, inputs, labels, network: dict, **training):
    """Train on the (D, T, S) grid of ``comm``; returns (this rank's GridPipelineMLP, history) on every rank.

    degrees: (D, T, S), product comm.size. network: GridPipelineMLP's keywords (layer_sizes, output, dtype, seed,
    micro_batches, schedule, device). inputs (N, n_0), labels (N,): the whole set, on every rank; training:
    train_parallel's keywords, e.g. strategy=ZeRO from lesson 10 (ZeRO-1 over data_comm), optimizer="adam"."""
    check_grid(comm, degrees, network["layer_sizes"])
    return train_hybrid(comm, degrees[1] * degrees[2],
                        lambda model_comm: GridPipelineMLP(*replica_comms(model_comm, degrees[1]), **network),
                        inputs, labels, **training)
