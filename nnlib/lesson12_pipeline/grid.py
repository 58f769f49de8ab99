"""Hybrid parallelism: a 2-D grid of ranks, data parallelism across model replicas.

P = D x M ranks. Each group of M consecutive ranks holds one *replica* of the model, split over
them by tensor parallelism (nnlib.lesson11_tensor_parallel.tensor) or pipeline parallelism
(nnlib.lesson12_pipeline.pipeline); the D replicas each train on their own shard of the data, as in
nnlib.lesson06_data_parallel.data_parallel:

    rank = d * M + m          d = rank // M: which replica (and data shard)
                              m = rank %  M: which piece of the model (hidden units, or stage)

    model_comm = comm.Split(color=d, key=m)   the M ranks of replica d: activations, partial sums
    data_comm  = comm.Split(color=m, key=d)   the D ranks holding piece m: its gradients' Allreduce

:func:`train_hybrid` is nnlib.lesson06_data_parallel.train_parallel run over data_comm with the piece the caller
builds over model_comm as the network: the same steps as sequential training (tests/mpi/check_hybrid.py).
"""

from __future__ import annotations

from nnlib.lesson04_collectives.collectives import raised_on_every_rank

LESSON = 12


def grid(comm, model_size: int):
    """Split ``comm`` into (data_comm, model_comm): D = size / model_size replicas of model_size ranks."""
    if not isinstance(model_size, int) or model_size < 1 or comm.size % model_size:
        raise raised_on_every_rank(ValueError(
            f"model_size must divide the number of ranks ({comm.size}) into whole replicas; got {model_size!r}. "
            f"Choose one of {[m for m in range(1, comm.size + 1) if comm.size % m == 0]}"))
    replica, piece = divmod(comm.rank, model_size)
    model_comm = comm.Split(color=replica, key=piece)
    data_comm = comm.Split(color=piece, key=replica)
    return data_comm, model_comm


def train_hybrid(comm, model_size: int, build_piece, inputs, labels, **training):
    """Train a network on a (data x model) grid; returns (network piece, history) on every rank.

    model_size: M. build_piece(model_comm): this rank's piece of the model over its replica's ranks, e.g.
    ``functools.partial(TensorParallelMLP, layer_sizes=(784, 64, 10), seed=0)`` or a PipelineMLP the same way (wrap
    model_comm in nnlib.course.deadline.watch for a deadline on its messages). inputs, labels: the whole training
    set, on every rank (a model's pieces all need their replica's samples); each replica keeps one shard.
    ``training``: train_parallel's arguments (epochs, learning_rate, batch_size, momentum, the shuffling's seed, ...).
    """
    from nnlib.lesson06_data_parallel.data_parallel import shard, train_parallel

    data_comm, model_comm = grid(comm, model_size)
    network = build_piece(model_comm)
    local_inputs, local_labels, start = shard(data_comm, inputs if data_comm.rank == 0 else None,
                                              labels if data_comm.rank == 0 else None)
    history = train_parallel(data_comm, network, local_inputs, local_labels, num_samples=len(labels), start=start,
                             **training)
    return network, history
