"""The pieces of lesson 09 that need no MPI: how layers are split and scheduled, and the bubble."""

import pytest

from nnlib.pipeline import bubble_fraction, schedule_order, simulated_bubble, stage_layers
from nnlib.tensor_parallel import layer_kinds


def test_layers_pair_up_column_then_row_and_an_odd_last_layer_stays_whole():
    assert layer_kinds(1) == ["replicated"]
    assert layer_kinds(2) == ["column", "row"]
    assert layer_kinds(3) == ["column", "row", "replicated"]
    assert layer_kinds(4) == ["column", "row", "column", "row"]


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
        order = schedule_order(schedule, 0, 4, 8)
        alive = peak = 0
        for kind, _ in order:
            alive += 1 if kind == "F" else -1
            peak = max(peak, alive)
        assert peak == (8 if schedule == "gpipe" else 4)
