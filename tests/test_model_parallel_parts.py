"""The pieces of lessons 11 and 12 that need no MPI: how layers are split and scheduled, and the bubble."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from nnlib.lesson12_pipeline.bubbles import bubble_fraction, simulated_bubble
from nnlib.lesson12_pipeline.instructions import SCHEDULES
from nnlib.lesson12_pipeline.pipeline import stage_layers
from nnlib.lesson11_tensor_parallel.tensor import layer_kinds


def test_layers_pair_up_column_then_row_and_an_odd_last_layer_stays_whole():
    assert layer_kinds(1) == ["replicated"]
    assert layer_kinds(2) == ["column", "row"]
    assert layer_kinds(3) == ["column", "row", "replicated"]
    assert layer_kinds(4) == ["column", "row", "column", "row"]


def test_the_bubble_formula():
    assert bubble_fraction(1, 1) == 0.0 and bubble_fraction(2, 1) == pytest.approx(0.5)
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11) and bubble_fraction(3, 5) == pytest.approx(2 / 7)
    with pytest.raises(ValueError, match="at least 1 stage and 1 micro-batch"):
        bubble_fraction(2, 0)


def test_stages_take_consecutive_layers_as_evenly_as_possible():
    assert stage_layers(4, 2) == [(0, 2), (2, 4)]
    assert stage_layers(5, 3) == [(0, 2), (2, 4), (4, 5)]
    assert stage_layers(3, 3) == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("micro_batches", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_equal_stages_give_the_textbook_bubble(stages, micro_batches, schedule):
    simulated = simulated_bubble([1.0] * stages, [2.0] * stages, schedule, micro_batches)
    assert simulated == pytest.approx(bubble_fraction(stages, micro_batches), abs=1e-12)


def test_unequal_stages_waste_more_and_1f1b_keeps_fewer_micro_batches_alive():
    # stage 0 has no input gradient to compute (cheap backward), the last stage computes the loss
    forward, backward = [17.3, 9.8], [17.5, 24.0]
    gpipe, one_f_one_b = simulated_bubble(forward, backward, "gpipe", 8), simulated_bubble(forward, backward, "1f1b", 8)
    assert gpipe > bubble_fraction(2, 8) + 0.05 and one_f_one_b < gpipe
    for schedule in ("gpipe", "1f1b"):
        alive = peak = 0
        for instruction in SCHEDULES[schedule](4, 8)[0]:
            alive += {"forward": 1, "backward": -1}.get(instruction.kind, 0)
            peak = max(peak, alive)
        assert peak == (8 if schedule == "gpipe" else 4)


def test_the_pipeline_benchmarks_balanced_network_gives_each_stage_the_same_work():
    # the benchmark compares its measured bubble with the formula on this network, which assumes equal stages
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "pipeline.py"
    spec = importlib.util.spec_from_file_location("pipeline_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    (sizes, _), = [network for name, network in benchmark.NETWORKS.items() if "balanced" in name]
    products = [sizes[layer] * sizes[layer + 1] for layer in range(len(sizes) - 1)]  # multiply-adds per sample
    forward = [sum(products[first:stop]) for first, stop in stage_layers(len(products), 2)]
    # backward: the weight gradient of every layer, the input gradient of every layer but the first
    backward = [sum(products[first:stop]) * 2 - (products[0] if first == 0 else 0)
                for first, stop in stage_layers(len(products), 2)]
    assert max(forward) / min(forward) < 1.02 and max(backward) / min(backward) < 1.02
    for schedule in ("gpipe", "1f1b"):
        for micro_batches in benchmark.COUNTS:
            simulated = simulated_bubble(forward, backward, schedule, micro_batches)
            assert simulated == pytest.approx(bubble_fraction(2, micro_batches), abs=0.005)


def test_the_cost_model_counts_bytes_and_memory_per_rank():
    from nnlib.lesson12_pipeline import memory, tradeoffs

    sizes = (784, 512, 512, 10)
    weights = 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    assert tradeoffs.handed_bytes("data", sizes, 256, 4) == {"collective": 4 * weights, "point_to_point": 0}
    # tensor: the pair's (256, 512) output forward; the replicated output layer needs nothing
    assert tradeoffs.handed_bytes("tensor", sizes, 256, 4)["collective"] == 4 * 256 * 512
    # pipeline on 3 stages: the middle stage sends (256, 512) forward and (256, 512) back
    assert tradeoffs.handed_bytes("pipeline", sizes, 256, 3)["point_to_point"] == 4 * 2 * 256 * 512
    data, tensor = (memory.busiest_rank_bytes(kind, sizes, 256, 4, itemsize=4) for kind in ("data", "tensor"))
    assert data["parameters"] == data["gradients"] == data["optimizer state"] == 4 * weights
    assert tensor["parameters"] < data["parameters"] / 2  # split about 4 ways
    assert data["activations"] == 4 * 64 * (784 + 512 + 512 + 10)  # a quarter of the batch, a_0 .. a_L
    assert data["backward"] == 4 * 64 * 3 * 512  # going down to a_1: delta_2, delta_2 W_2.T and a_1 (1 - a_1)
    gpipe = memory.rank_bytes("pipeline", sizes, 256, 3, 0, micro_batches=8, schedule="gpipe")
    one_f_one_b = memory.rank_bytes("pipeline", sizes, 256, 3, 0, micro_batches=8, schedule="1f1b")
    assert one_f_one_b["activations"] * 8 == gpipe["activations"] * 3  # stage 0 keeps 3 of 8 micro-batches
    assert gpipe["activations"] == 8 * 256 * (784 + 512)  # stage 0: layer 784-512, all 8 micro-batches of 32
    assert memory.tensor_parallel_sizes((64, 127, 96, 121, 80, 113, 72, 10), 2, 1) == (64, 63, 96, 60, 80, 56, 72, 10)
    with pytest.raises(ValueError, match="needs at least 4 weight layers"):
        tradeoffs.handed_bytes("pipeline", sizes, 256, 4)


def test_which_kind_wins_follows_the_bytes():
    from nnlib.lesson12_pipeline import tradeoffs

    def deep(hidden):
        return (784,) + (hidden,) * 7 + (10,)

    choice, times = tradeoffs.fastest(deep, [128, 8192], [2, 64], 256, alpha=20e-6, beta=1 / 1.25e9,
                                      flops_per_second=50e9)
    assert np.isinf(times[:, 1, tradeoffs.KINDS.index("pipeline")]).all()  # 64 stages, 8 layers
    assert tradeoffs.KINDS[choice[1, 0]] == "tensor"  # wide layers: activations are far fewer bytes than weights
    assert tradeoffs.KINDS[choice[0, 1]] == "data"  # narrow layers, many ranks: one small gradient message
    sizes = [tradeoffs.largest_hidden_size("tensor", deep, ranks, 2e9, 256) for ranks in (1, 2, 4)]
    assert sizes[0] < sizes[1] < sizes[2]
    assert tradeoffs.largest_hidden_size("pipeline", deep, 16, 2e9, 256) == 0


def test_the_tensor_split_diagram_draws_the_split_the_code_makes():
    from nnlib import Network
    from nnlib.lesson04_collectives.collectives import split_evenly
    from nnlib.lesson11_tensor_parallel.tensor import split_pieces

    for hidden, size in [(5, 2), (7, 3), (4, 4), (3, 1)]:
        whole = Network((6, hidden, 3), dtype="float64", seed=0)
        counts, starts = split_evenly(hidden, size)
        drawn = [(start, start + count) for count, start in zip(counts, starts)]  # what diagrams.tensor_split draws
        # the drawn blocks tile the hidden units in rank order, as even as possible (earlier ranks larger)
        assert drawn[0][0] == 0 and drawn[-1][1] == hidden and all(a[1] == b[0] for a, b in zip(drawn, drawn[1:]))
        widths = [stop - start for start, stop in drawn]
        assert widths == sorted(widths, reverse=True) and widths[0] - widths[-1] <= 1
        for rank, (start, stop) in enumerate(drawn):  # and each rank holds exactly its drawn block of W1 and W2
            pieces, columns = split_pieces(whole, ["column", "row"], size, rank)
            assert columns[0] == (start, stop)
            assert np.array_equal(pieces[0], whole.weights[0][:, start:stop])
            assert np.array_equal(pieces[2], whole.weights[1][start:stop, :])
