"""Run under mpiexec with 2, 4 and 8 ranks: every data x tensor x pipeline grid trains exactly as sequential.

Each layout (D, T, S) of the ranks with every degree 1 or 2 (2 x 1 x 1, 1 x 2 x 1, 1 x 1 x 2 on 2 ranks; 2 x 2 x 1,
2 x 1 x 2, 1 x 2 x 2 on 4; 2 x 2 x 2 on 8; nnlib.lesson19_planning.grid), GPipe and 1F1B (3 micro-batches), full
batch and mini-batches of 23 of 97 samples (the last of 5: with D = 2 a data rank has fewer rows than micro-batches),
momentum, Adam, AdamW, the allreduce and lesson 10's ZeRO (stage 1) on the data axis, a 5-layer network of widths 9,
7, 6, 5 (stages of 3 and 2 layers: column, row, replicated; column, row; uneven splits everywhere), float64: the
gathered parameters equal sequential training's to 1e-10 on every rank, and so do the losses; each rank holds the
piece its place in the grid says. The ranks are grouped as documented; bad degrees (a product that is not the rank
count, a tensor degree wider than the narrowest split layer, more stages than layers, not three whole numbers) fail
with the same ValueError on every rank.
"""

from itertools import product

import numpy as np
from harness import assert_on_every_rank, expect_error_everywhere, run_checks
from mpi4py import MPI

from nnlib import Network, train
from nnlib.lesson10_zero_overlap.zero import ZeRO
from nnlib.lesson12_pipeline.pipeline import stage_layers
from nnlib.lesson19_planning.grid import grid_comms, train_grid

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
rng = np.random.default_rng(0)
INPUTS, LABELS = rng.random((97, 13)), rng.integers(0, 3, 97)
SIZES = (13, 9, 7, 6, 5, 3)
LAYOUTS = [degrees for degrees in product((1, 2), repeat=3) if np.prod(degrees) == size]
RUNS = [  # (schedule, output, strategy, settings)
    ("gpipe", "sigmoid", "allreduce", dict(epochs=2, learning_rate=0.5)),
    ("1f1b", "softmax", "allreduce", dict(epochs=2, learning_rate=0.5, batch_size=23, momentum=0.9, seed=5)),
    ("gpipe", "sigmoid", ZeRO, dict(epochs=2, learning_rate=0.01, batch_size=23, optimizer="adam", seed=5)),
    ("1f1b", "sigmoid", ZeRO, dict(epochs=2, learning_rate=0.01, batch_size=23, optimizer="adamw", weight_decay=0.1,
                                   seed=5)),
]


def test_every_grid_equals_sequential_training():
    failures = []
    for schedule, output, strategy, settings in RUNS:
        sequential = Network(SIZES, output=output, dtype="float64", seed=3)
        expected = train(sequential, INPUTS, LABELS, progress=False, **settings)
        for degrees in LAYOUTS:
            network = dict(layer_sizes=SIZES, output=output, dtype="float64", seed=3, micro_batches=3,
                           schedule=schedule)
            piece, history = train_grid(comm, degrees, INPUTS, LABELS, network, strategy=strategy, **settings)
            data, tensor, stages = degrees  # who holds what: rank (d S + s) T + t holds tensor piece t of stage s
            held = (piece.tensor_comm.size, piece.stages, piece.tensor_comm.rank, piece.stage, piece.first, piece.stop)
            stage = rank // tensor % stages
            if held != (tensor, stages, rank % tensor, stage, *stage_layers(len(SIZES) - 1, stages)[stage]):
                failures.append(f"{degrees}: rank {rank} holds (T, S, t, s, first, stop) = {held}")
            full = piece.full_params()
            error = np.abs(full - sequential.params).max() / np.abs(sequential.params).max()
            where = f"{degrees} {schedule} {output} {'ZeRO' if strategy is ZeRO else strategy} {settings}"
            if not error <= 1e-10:
                failures.append(f"{where}: relative error {error:.1e}")
            if not np.allclose(history.loss, expected.loss, rtol=1e-10):
                failures.append(f"{where}: losses {history.loss} against {expected.loss}")
            if not np.array_equal(full, comm.bcast(full)):
                failures.append(f"{where}: the ranks' gathered parameters differ")
    assert_on_every_rank(failures)


def test_the_grid_groups_ranks_as_documented():
    for data, tensor, stages in LAYOUTS:
        data_comm, tensor_comm, pipe_comm = grid_comms(comm, (data, tensor, stages), SIZES)
        assert (data_comm.size, tensor_comm.size, pipe_comm.size) == (data, tensor, stages)
        assert rank == (data_comm.rank * stages + pipe_comm.rank) * tensor + tensor_comm.rank  # (d S + s) T + t
        assert tensor_comm.allgather(rank) == [rank - rank % tensor + t for t in range(tensor)]  # neighbours
        assert data_comm.allgather(rank) == [rank % (tensor * stages) + d * tensor * stages for d in range(data)]
        for made in (data_comm, tensor_comm, pipe_comm):
            made.Free()


def test_a_tensor_degree_as_wide_as_the_narrowest_split_layer_trains():
    sizes, settings = (13, 2, 4, 3), dict(epochs=1, learning_rate=0.5, batch_size=23, seed=5)  # column 2, replicated
    sequential = Network(sizes, dtype="float64", seed=3)
    train(sequential, INPUTS, LABELS, progress=False, **settings)
    piece, _ = train_grid(comm, (size // 2, 2, 1), INPUTS, LABELS, dict(layer_sizes=sizes, dtype="float64", seed=3),
                          **settings)
    assert np.abs(piece.full_params() - sequential.params).max() <= 1e-10 * np.abs(sequential.params).max()


def test_a_pipeline_cut_by_cost_trains_as_sequential_training():
    """Every stage cut (layers per stage) of the pipeline axis, 1F1B and Adam: the same steps as one process."""
    if size % 2:
        return
    settings = dict(epochs=1, learning_rate=0.01, batch_size=23, optimizer="adam", seed=5)
    sequential = Network(SIZES, dtype="float64", seed=3)
    train(sequential, INPUTS, LABELS, progress=False, **settings)
    for cut in [(1, 4), (4, 1), (2, 3)]:
        network = dict(layer_sizes=SIZES, dtype="float64", seed=3, micro_batches=3, schedule="1f1b", cut=cut)
        piece, _ = train_grid(comm, (size // 4 or 1, 2 if size >= 4 else 1, 2), INPUTS, LABELS, network, **settings)
        assert (piece.first, piece.stop) == ((0, cut[0]) if piece.stage == 0 else (cut[0], 5)), (cut, piece.stage)
        error = np.abs(piece.full_params() - sequential.params).max() / np.abs(sequential.params).max()
        assert error <= 1e-10, (cut, error)


def test_bad_degrees_fail_on_every_rank():
    network = dict(layer_sizes=SIZES, dtype="float64", seed=3)
    for degrees, layer_sizes, words in [
            ((size, 1, 2), SIZES, f"= {2 * size}, but there are {size} ranks"),
            ((1, 1, 1), SIZES, f"= 1, but there are {size} ranks: choose degrees whose product is {size}"),
            ((size // 2, 2, 1), (13, 1, 7, 3), "tensor degree 2 is too wide: its narrowest layer split by columns "
                                               "has 1 hidden units. Use a tensor degree of at most 1"),
            ((1, size, 1), (13, 3), "no stage has two layers"),
            ((1, 1, size), (13, 3), f"{size} pipeline stages but the network has only 1 weight layers"),
            ((size, 1), SIZES, "three positive whole degrees"),
            ((size, 1, 0), SIZES, "three positive whole degrees")]:
        messages = []

        def refused():
            try:
                train_grid(comm, degrees, INPUTS, LABELS, dict(network, layer_sizes=layer_sizes), epochs=1,
                           learning_rate=0.5)
            except ValueError as error:
                messages.append(str(error))
                raise

        expect_error_everywhere(refused, words)
        assert len(set(comm.allgather(messages[0]))) == 1, "the ranks' messages differ"


if __name__ == "__main__":
    run_checks(globals())
