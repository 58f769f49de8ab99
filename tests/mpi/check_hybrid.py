"""Run under mpiexec with 2, 4 and 6 ranks: every (data x model) grid trains exactly as sequential.

For each model size M that divides P, up to the 4 weight layers (so 2 x 1, 1 x 2; 4 x 1, 2 x 2, 1 x 4; 6 x 1,
3 x 2, 2 x 3), tensor and pipeline
parallelism inside each replica, data parallelism across the replicas (nnlib.lesson12_pipeline.grid), full batch
and mini-batch with momentum or AdamW, float64: the gathered parameters equal sequential training's to
1e-10 on every rank. A model size that does not divide P fails on every rank at once.
"""

from functools import partial

import numpy as np
from harness import run_checks
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson12_pipeline.grid import grid, train_hybrid
from nnlib.lesson12_pipeline.pipeline import PipelineMLP
from nnlib.lesson11_tensor_parallel.tensor import TensorParallelMLP

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(0)
INPUTS, LABELS = rng.random((203, 12)), rng.integers(0, 4, 203)
SIZES = (12, 9, 8, 7, 4)


def test_every_grid_equals_sequential_training():
    for settings in (dict(epochs=3, learning_rate=0.5),
                     dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=5),
                     dict(epochs=2, learning_rate=0.01, batch_size=32, optimizer="adamw", weight_decay=0.1, seed=5)):
        sequential = Network(SIZES, dtype="float64", seed=3)
        train(sequential, INPUTS, LABELS, progress=False, **settings)
        for kind, build_piece in (("tensor", partial(TensorParallelMLP, layer_sizes=SIZES, seed=3)),
                                  ("pipeline", partial(PipelineMLP, layer_sizes=SIZES, seed=3, micro_batches=3))):
            for model_size in [m for m in range(1, size + 1) if size % m == 0 and m <= len(SIZES) - 1]:
                network, history = train_hybrid(comm, model_size, build_piece, INPUTS, LABELS, **settings)
                full = network.full_params()
                error = np.abs(full - sequential.params).max() / np.abs(sequential.params).max()
                assert error <= 1e-10, f"{kind} {size // model_size} x {model_size} {settings}: {error:.1e}"
                assert np.array_equal(full, comm.bcast(full)), f"{kind} {model_size}: ranks differ"


def test_the_grid_groups_ranks_as_documented():
    for model_size in [m for m in range(1, size + 1) if size % m == 0]:
        data_comm, model_comm = grid(comm, model_size)
        assert (model_comm.size, data_comm.size) == (model_size, size // model_size)
        assert (data_comm.rank, model_comm.rank) == divmod(rank, model_size)
        assert model_comm.allgather(rank) == [rank - rank % model_size + m for m in range(model_size)]


def test_a_model_size_that_does_not_divide_fails_everywhere():
    for bad in (0, size + 1, 3 if size == 4 else -1):
        try:
            grid(comm, bad)
        except ValueError as error:
            assert "model_size must divide" in str(error)
        else:
            raise AssertionError(f"no error for model_size {bad}")
    comm.Barrier()


if __name__ == "__main__":
    run_checks(globals())
