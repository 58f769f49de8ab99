"""Run under mpiexec with 1 to 4 ranks: tensor-parallel training equals sequential training.

Hidden units split over the ranks (nnlib.lesson11_tensor_parallel.tensor), trained by the sequential trainer:
one and several hidden layers (column/row pairs, a replicated last layer when the count is odd),
hidden sizes that the ranks do not divide (down to ranks holding no unit), sigmoid and softmax
outputs, full batch and mini-batch with momentum, float64: the gathered parameters equal the
sequential run's to 1e-10 and are the same on every rank. Also: the Allreduces per step (one per
pair forward, one per pair backward except the first), counted on a communicator that records its
calls (the network uses the communicator it is given), and a mismatched network fails everywhere.
"""

import numpy as np
from harness import run_checks
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson11_tensor_parallel.tensor import TensorParallelMLP, layer_kinds

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(0)
INPUTS, LABELS = rng.random((203, 12)), rng.integers(0, 4, 203)
SHAPES = [(12, 7, 4), (12, 9, 5, 4), (12, 9, 6, 5, 4), (12, 3, 4)]


class RecordingComm:
    """``comm`` with its Allreduce recorded: the receive buffer of every call, in ``buffers``."""

    def __init__(self, comm):
        self.comm, self.buffers = comm, []

    def __getattr__(self, name):
        return getattr(self.comm, name)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        self.buffers.append(recvbuf.copy())
        self.comm.Allreduce(sendbuf, recvbuf, op=op)


def test_equal_to_sequential_training():
    for sizes in SHAPES:
        for output in ("sigmoid", "softmax"):
            for settings in (dict(epochs=3, learning_rate=0.5),
                             dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=5),
                             dict(epochs=2, learning_rate=0.01, batch_size=32, optimizer="adamw", weight_decay=0.1,
                                  seed=5)):  # each rank's AdamW on its own columns and rows
                sequential = Network(sizes, output=output, dtype="float64", seed=3)
                expected = train(sequential, INPUTS, LABELS, progress=False, **settings)
                parallel = TensorParallelMLP(comm, sizes, output=output, dtype="float64", seed=3)
                history = train(parallel, INPUTS, LABELS, progress=False, **settings)
                full = parallel.full_params()
                error = np.abs(full - sequential.params).max() / np.abs(sequential.params).max()
                where = f"{sizes} {output} {settings}"
                assert error <= 1e-10, f"{where}: relative error {error:.1e}"
                assert np.array_equal(full, comm.bcast(full)), f"{where}: ranks differ"
                assert np.allclose(history.loss, expected.loss, rtol=1e-12), where
                assert parallel.accuracy(INPUTS, LABELS) == sequential.accuracy(INPUTS, LABELS), where


def test_each_rank_holds_its_share_of_the_hidden_units():
    parallel = TensorParallelMLP(comm, (12, 9, 6, 5, 4), dtype="float64")
    assert parallel.kinds == ["column", "row", "column", "row"] == layer_kinds(4)
    counts = comm.allgather(parallel.params.size)
    whole = Network((12, 9, 6, 5, 4)).num_params
    replicated = 6 + 4  # the row layers' biases
    assert sum(counts) == whole + (size - 1) * replicated
    units = [[9 // size + (r < 9 % size), 5 // size + (r < 5 % size)] for r in range(size)]
    # a pair's units each bring a column of W_col (n_in), its bias, and a row of W_row (n_out)
    assert counts == [first * (12 + 1 + 6) + 6 + second * (6 + 1 + 4) + 4 for first, second in units]


def test_allreduces_per_step():
    for sizes, expected in [((12, 7, 4), 1), ((12, 9, 5, 4), 1), ((12, 9, 6, 5, 4), 3)]:
        recording = RecordingComm(comm)
        parallel = TensorParallelMLP(recording, sizes, dtype="float64")
        parallel.loss_and_gradient(INPUTS[:50], LABELS[:50])
        calls = [buffer.shape for buffer in recording.buffers]
        assert len(calls) == expected, (sizes, calls)
        assert calls[0] == (50, sizes[2])  # the first pair's forward: (N, its output width)


def test_the_bytes_handed_to_mpi_are_what_the_model_counts():
    from nnlib.lesson12_pipeline.tradeoffs import handed_bytes

    for sizes in SHAPES:
        recording = RecordingComm(comm)
        parallel = TensorParallelMLP(recording, sizes, dtype="float64")
        parallel.loss_and_gradient(INPUTS[:50], LABELS[:50])
        assert sum(buffer.nbytes for buffer in recording.buffers) == handed_bytes("tensor", sizes, 50, size, itemsize=8)["collective"], sizes


def test_a_mismatched_network_fails_on_every_rank():
    sizes = (12, 7, 4) if rank == 0 else (12, 8, 4)
    try:
        TensorParallelMLP(comm, sizes)
    except ValueError as error:
        assert "the ranks disagree on the network" in str(error) or size == 1
    else:
        assert size == 1, "no error"
    comm.Barrier()


if __name__ == "__main__":
    run_checks(globals())
