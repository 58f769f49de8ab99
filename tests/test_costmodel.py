"""The alpha-beta models of the Allreduce algorithms (nnlib.costmodel), against counting messages."""

import pytest


def test_the_allreduce_models_agree_with_counting_messages():
    from nnlib.costmodel import recursive_doubling_time, reduce_broadcast_time, ring_allreduce_time

    alpha, beta, n = 1e-6, 1e-9, 8e6
    assert recursive_doubling_time(n, 2, alpha, beta) == pytest.approx(alpha + n * beta)
    assert recursive_doubling_time(n, 8, alpha, beta) == pytest.approx(3 * (alpha + n * beta))
    assert recursive_doubling_time(n, 6, alpha, beta) == pytest.approx(4 * (alpha + n * beta))  # 2 rounds + fold
    assert reduce_broadcast_time(n, 4, alpha, beta) == pytest.approx(6 * (alpha + n * beta))
    assert ring_allreduce_time(n, 4, alpha, beta) == pytest.approx(6 * alpha + 1.5 * n * beta)
    assert recursive_doubling_time(n, 1, alpha, beta) == reduce_broadcast_time(n, 1, alpha, beta) == 0.0
    # large messages: the ring sends the fewest bytes; tiny ones: recursive doubling the fewest messages
    assert ring_allreduce_time(n, 8, alpha, beta) < recursive_doubling_time(n, 8, alpha, beta)
    assert recursive_doubling_time(8, 8, alpha, beta) < ring_allreduce_time(8, 8, alpha, beta)
