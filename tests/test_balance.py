"""Pipeline stages cut by cost (nnlib.lesson12_pipeline.balance): the exact min-max cut against every cut,
layers' FLOPs against lesson 04's count, the simulated step of an uneven cut worked by hand, and the measurement."""

import itertools

import numpy as np
import pytest

from nnlib.lesson04_collectives.costmodel import flops_per_sample
from nnlib.lesson12_pipeline.balance import (balanced_cut, layer_flops, layer_seconds, predicted_step_seconds,
                                             stage_sums)


def every_cut(layers: int, stages: int):
    """Every way to cut ``layers`` layers into ``stages`` contiguous non-empty stages, as layers per stage."""
    for stops in itertools.combinations(range(1, layers), stages - 1):
        bounds = (0, *stops, layers)
        yield tuple(stop - start for start, stop in zip(bounds, bounds[1:]))


def test_known_small_cuts():
    assert balanced_cut([1, 1, 1, 1], 2) == (2, 2)
    assert balanced_cut([5, 1, 1, 1, 1, 1], 2) == (1, 5)
    assert balanced_cut([1, 2, 3, 4, 5], 3) == (3, 1, 1)  # sums 6, 4, 5: no cut keeps every stage under 6
    assert balanced_cut([3, 1, 4, 1, 5], 1) == (5,)
    assert balanced_cut([3, 1, 4, 1, 5], 5) == (1, 1, 1, 1, 1)
    assert balanced_cut([0, 0, 7], 3) == (1, 1, 1)  # every stage still gets a layer


def test_the_cut_is_the_best_of_every_cut():
    rng = np.random.default_rng(0)
    for _ in range(150):
        layers = int(rng.integers(1, 9))
        stages = int(rng.integers(1, layers + 1))
        costs = rng.integers(0, 20, layers) if rng.random() < 0.5 else rng.random(layers)
        cut = balanced_cut(costs, stages)
        assert len(cut) == stages and sum(cut) == layers and min(cut) >= 1, (costs, stages, cut)
        best = min(max(stage_sums(costs, other)) for other in every_cut(layers, stages))
        assert max(stage_sums(costs, cut)) == pytest.approx(best, rel=1e-12), (costs, stages, cut)


def test_stage_sums():
    assert stage_sums(np.array([1.0, 2.0, 3.0, 4.0]), (1, 3)) == [1.0, 9.0]
    assert stage_sums(np.array([1.0, 2.0, 3.0, 4.0]), [2, 1, 1]) == [3.0, 3.0, 4.0]


@pytest.mark.parametrize("costs, stages", [([1, 2], 3), ([1, 2], 0), ([1, -2, 3], 2), ([1, np.nan], 1),
                                           ([[1, 2], [3, 4]], 2), ([], 1)])
def test_impossible_cuts_are_refused(costs, stages):
    with pytest.raises(ValueError, match="one finite cost >= 0 per layer and 1 to that many stages"):
        balanced_cut(costs, stages)


def test_layer_flops_add_up_to_lesson_04s_count():
    sizes = (784, 128, 127, 126, 125, 124, 123, 10)
    flops = layer_flops(sizes)
    assert len(flops) == 7 and sum(flops) == flops_per_sample(sizes)
    assert flops[0] == 2 * 2 * 784 * 128  # the first layer: forward and dJ/dW, no input gradient
    assert flops[1] == 3 * 2 * 128 * 127  # the others: forward, dJ/dW and dJ/da_in
    assert balanced_cut(flops, 2) == (1, 6)  # by FLOPs, the wide first layer alone


def test_the_simulated_step_of_an_uneven_cut():
    # Three layers, forward 1 and backward 2 each; stages (2, 1): stage 0 F = 2, B = 4, stage 1 F = 1, B = 2. GPipe,
    # m = 4: stage 0 forwards until 8; stage 1 forwards 2-3, 4-5, 6-7, 8-9, backwards 9-17; stage 0's backwards
    # start at 11 (stage 1's first ends), then follow each other: 11-15, 15-19, 19-23, 23-27.
    assert predicted_step_seconds([1.0] * 3, [2.0] * 3, (2, 1), 4) == pytest.approx(27.0)
    assert predicted_step_seconds([1.0] * 2, [2.0] * 2, (1, 1), 4) == pytest.approx(15.0)  # (m + P - 1) (F + B)
    assert predicted_step_seconds([1.0] * 2, [2.0] * 2, (2,), 4) == pytest.approx(24.0)  # one stage: m (F + B)


def test_layer_seconds_measures_each_layer():
    forward, backward = layer_seconds((300, 300, 3), rows=64, micro_batches=2, repeats=3)
    assert forward.shape == backward.shape == (2,)
    assert np.all(forward > 0) and np.all(backward > 0)
    assert forward[0] > forward[1] and backward[0] > backward[1]  # 300 x 300 against 300 x 3 (and the loss)
