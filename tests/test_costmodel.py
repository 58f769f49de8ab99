"""nnlib.lesson04_collectives.costmodel, the one home of every prediction: the alpha-beta models against counting messages,
the FLOP count against the products a training step runs, the step time (the bubble is lesson 12's:
tests/test_model_parallel_parts.py)."""

import numpy as np
import pytest


def test_the_allreduce_models_agree_with_counting_messages():
    from nnlib.lesson04_collectives.costmodel import (recursive_doubling_time, reduce_broadcast_time,
                                                      ring_allreduce_time, tree_reduce_broadcast_time)

    alpha, beta, n = 1e-6, 1e-9, 8e6
    assert recursive_doubling_time(n, 2, alpha, beta) == pytest.approx(alpha + n * beta)
    assert recursive_doubling_time(n, 8, alpha, beta) == pytest.approx(3 * (alpha + n * beta))
    assert recursive_doubling_time(n, 6, alpha, beta) == pytest.approx(4 * (alpha + n * beta))  # 2 rounds + fold
    assert reduce_broadcast_time(n, 4, alpha, beta) == pytest.approx(6 * (alpha + n * beta))
    assert ring_allreduce_time(n, 4, alpha, beta) == pytest.approx(6 * alpha + 1.5 * n * beta)
    assert recursive_doubling_time(n, 1, alpha, beta) == reduce_broadcast_time(n, 1, alpha, beta) == 0.0
    # lesson 06's reduce_broadcast is MPI's Reduce and Bcast, two binomial trees: 2 ceil(log2 P) whole messages
    assert tree_reduce_broadcast_time(n, 5, alpha, beta) == pytest.approx(6 * (alpha + n * beta))
    assert tree_reduce_broadcast_time(n, 8, alpha, beta) == pytest.approx(6 * (alpha + n * beta))
    assert tree_reduce_broadcast_time(n, 1, alpha, beta) == 0.0
    # large messages: the ring sends the fewest bytes; tiny ones: recursive doubling the fewest messages
    assert ring_allreduce_time(n, 8, alpha, beta) < recursive_doubling_time(n, 8, alpha, beta)
    assert recursive_doubling_time(8, 8, alpha, beta) < ring_allreduce_time(8, 8, alpha, beta)


class CountedArray(np.ndarray):
    """An ndarray that writes down the (m, k, n) of every matrix product it takes part in, and the (k, n) of
    every vector-matrix product (the bias gradients 1^T delta: a sum over samples, not a counted FLOP)."""

    products: list = []
    sums: list = []

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [x.view(np.ndarray) if isinstance(x, CountedArray) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(x.view(np.ndarray) if isinstance(x, CountedArray) else x for x in kwargs["out"])
        if ufunc is np.matmul and method == "__call__" and plain[0].ndim == 1:
            CountedArray.sums.append(plain[1].shape)
        elif ufunc is np.matmul and method == "__call__":
            (m, k), (_, n) = plain[0].shape, plain[1].shape
            CountedArray.products.append((m, k, n))
        result = getattr(ufunc, method)(*plain, **kwargs)
        return result.view(CountedArray) if type(result) is np.ndarray else result


@pytest.mark.parametrize("layer_sizes", [(7, 5, 3), (6, 4), (9, 8, 7, 5, 2)])
def test_the_flop_count_is_the_products_a_training_step_runs(layer_sizes):
    """Count the matrix products of Network.loss_and_gradient itself: the first layer has no input gradient."""
    from nnlib import Network
    from nnlib.lesson04_collectives.costmodel import flops_per_sample, step_matmul_shapes

    batch = 11
    network = Network(layer_sizes, dtype="float64", seed=0)
    network.weights = [weights.view(CountedArray) for weights in network.weights]  # views: the same memory
    inputs = np.random.default_rng(0).random((batch, layer_sizes[0])).view(CountedArray)
    labels = np.arange(batch) % layer_sizes[-1]
    CountedArray.products, CountedArray.sums = [], []
    network.loss_and_gradient(inputs, labels)
    assert sorted(CountedArray.products) == sorted(step_matmul_shapes(layer_sizes, batch))
    assert sorted(CountedArray.sums) == sorted((batch, n_out) for n_out in layer_sizes[1:])  # one 1^T delta a layer
    counted = sum(2 * m * k * n for m, k, n in CountedArray.products)
    assert counted == batch * flops_per_sample(layer_sizes)
    products = [n_in * n_out for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:])]
    assert flops_per_sample(layer_sizes) == 2 * sum(products) + 2 * sum(products) + 2 * sum(products[1:])


def test_the_ring_time_by_hand_at_1_2_and_7_ranks():
    from nnlib.lesson04_collectives.costmodel import predicted_time, ring_allgather_time, ring_allreduce_time
    from nnlib.lesson04_collectives.collectives import split_evenly
    from nnlib.lesson09_ring_allreduce.allreduce import ring_schedule

    alpha, beta, n = 2e-6, 1e-9, 7e6
    assert ring_allreduce_time(n, 1, alpha, beta) == 0.0
    assert ring_allreduce_time(n, 2, alpha, beta) == pytest.approx(2 * alpha + n * beta)
    assert ring_allreduce_time(n, 7, alpha, beta) == pytest.approx(12 * alpha + 12 / 7 * n * beta)
    assert ring_allreduce_time(n, [1, 2, 7], alpha, beta).tolist() == pytest.approx(
        [0.0, 2 * alpha + n * beta, 12 * alpha + 12 / 7 * n * beta])
    # The schedule's steps, each one chunk of n/P bytes (7 divides n): the same sum.
    counts, _ = split_evenly(int(n), 7)
    steps = ring_schedule(7)
    assert len(steps) == 12 and len(set(counts)) == 1
    assert sum(predicted_time(counts[0], alpha, beta) for _ in steps) == pytest.approx(
        ring_allreduce_time(n, 7, alpha, beta))
    # Either half is a ring allgather of n / P bytes per rank.
    assert ring_allreduce_time(n, 7, alpha, beta) == pytest.approx(2 * ring_allgather_time(n / 7, 7, alpha, beta))
    assert ring_allgather_time(100, 1, alpha, beta) == 0.0


def test_step_time_and_communication_time():
    from nnlib.lesson04_collectives import costmodel

    alpha, beta, n = 1e-6, 1e-9, 4000
    assert costmodel.step_time(4, 8e-3) == pytest.approx(2e-3)
    assert costmodel.step_time(4, 8e-3, 1e-5, 1e-4, bubble=0.5) == pytest.approx(4e-3 + 1e-5 + 1e-4)
    for name, model in costmodel.COMMUNICATION_TIMES.items():
        assert costmodel.communication_time(name, n, 4, alpha, beta) == model(n, 4, alpha, beta)
        assert costmodel.communication_time(name, n, 1, alpha, beta) == 0.0
    # lesson 06's reduce_broadcast runs MPI's trees (2 log2 8 = 6 messages), not lesson 09's 2 (P - 1) = 14
    assert costmodel.communication_time("reduce_broadcast", n, 8, alpha, beta) == pytest.approx(6 * (alpha + n * beta))
    with pytest.raises(ValueError, match="strategy must be one of"):
        costmodel.communication_time("gossip", n, 4, alpha, beta)


def test_the_tradeoffs_predictions_are_the_cost_models():
    """tradeoffs.parallel_step_time computes nothing of its own: compute, rings and messages from costmodel, the
    bubble from lesson 12's bubbles."""
    from nnlib.lesson04_collectives import costmodel
    from nnlib.lesson12_pipeline import tradeoffs
    from nnlib.lesson12_pipeline.bubbles import bubble_fraction

    sizes, batch = (784, 512, 512, 10), 256
    machine = costmodel.Machine(alpha=20e-6, beta=1 / 1.25e9, flops_per_second=50e9)
    compute = costmodel.flops_per_sample(sizes) * batch / machine.flops_per_second
    assert tradeoffs.parallel_step_time("data", sizes, batch, 1, machine) == pytest.approx(compute)
    gradient = 4 * (784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10)
    assert tradeoffs.parallel_step_time("data", sizes, batch, 4, machine) == pytest.approx(
        compute / 4 + costmodel.ring_allreduce_time(gradient, 4, machine.alpha, machine.beta))
    messages = tradeoffs.allreduce_messages("tensor", sizes, batch, 4)
    assert sum(messages) == tradeoffs.handed_bytes("tensor", sizes, batch, 4)["collective"]
    assert tradeoffs.parallel_step_time("tensor", sizes, batch, 4, machine) == pytest.approx(
        compute / 4 + sum(costmodel.ring_allreduce_time(m, 4, machine.alpha, machine.beta) for m in messages))
    sent = tradeoffs.handed_bytes("pipeline", sizes, batch, 3)["point_to_point"]
    bubble = bubble_fraction(3, 4)
    assert tradeoffs.parallel_step_time("pipeline", sizes, batch, 3, machine, micro_batches=4) == pytest.approx(
        compute / 3 / (1 - bubble) + 8 * machine.alpha + sent * machine.beta)
