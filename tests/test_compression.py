"""nnlib.lesson15_compression.compression in one process: bfloat16 by hand, top-k, bytes and the alpha-beta times."""

import numpy as np
import pytest

from nnlib.lesson04_collectives.costmodel import ring_allreduce_time
from nnlib.lesson15_compression.compression import (METHODS, Compressor, check_method, exchange_time, from_bfloat16,
                                                    message_bytes, to_bfloat16, top_k)


def float32_from_bits(bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


@pytest.mark.parametrize("bits, expected", [
    (0x3F800000, 0x3F80),  # 1.0
    (0x3F808000, 0x3F80),  # exactly halfway, to the even neighbour (down)
    (0x3F818000, 0x3F82),  # exactly halfway, to the even neighbour (up)
    (0x3F808001, 0x3F81),  # just above halfway: up
    (0x3F807FFF, 0x3F80),  # just below halfway: down
    (0xBF800000, 0xBF80),  # -1.0
    (0x80000000, 0x8000),  # -0.0 keeps its sign
    (0x7F800000, 0x7F80),  # infinity
    (0x7F7FFFFF, 0x7F80),  # the largest float32 rounds up to infinity, as round-to-nearest-even does
    (0x00000001, 0x0000),  # the smallest subnormal rounds to zero
])
def test_bfloat16_rounds_to_nearest_even_on_the_bits(bits, expected):
    assert int(to_bfloat16(float32_from_bits([bits]))[0]) == expected
    assert from_bfloat16(np.array([expected], dtype=np.uint16)).view(np.uint32)[0] == expected << 16


def test_bfloat16_keeps_nan_and_has_8_bits_of_precision():
    assert np.isnan(from_bfloat16(to_bfloat16(np.array([np.nan, -np.nan])))).all()
    values = np.random.default_rng(0).normal(size=100_000) * 10.0 ** np.random.default_rng(1).integers(-30, 30, 100_000)
    back = from_bfloat16(to_bfloat16(values)).astype(np.float64)
    relative = np.abs(back - values) / np.abs(values)
    assert relative.max() <= 2.0 ** -8 * (1 + 1e-6)  # half a unit in the 8th bit (float32's own rounding too)
    assert relative.max() > 2.0 ** -10  # and it really is that coarse


def test_top_k_picks_the_largest_magnitudes_in_index_order():
    values = np.array([0.5, -3.0, 2.0, 0.1, -2.5, 1.0])
    assert top_k(values, 3).tolist() == [1, 2, 4]
    assert top_k(values, 6).tolist() == list(range(6)) and top_k(values, 6).dtype == np.int32


def test_one_rank_compressor_with_top_k_keeps_the_residual():
    class OneRank:  # what Compressor needs of a communicator, for one rank
        size = 1

        def Allgather(self, sendbuf, recvbuf):
            recvbuf[0] = sendbuf

    compressor = Compressor("topk", 6, np.float64, k=2)
    grads = np.array([0.5, -3.0, 2.0, 0.1, -2.5, 1.0])
    compressor.allreduce(OneRank(), grads)
    assert grads.tolist() == [0, -3.0, 0, 0, -2.5, 0]
    assert compressor.residual.tolist() == [0.5, 0, 2.0, 0.1, 0, 1.0]
    second = np.zeros(6)
    compressor.allreduce(OneRank(), second)  # the residual's largest two go next
    assert second.tolist() == [0, 0, 2.0, 0, 0, 1.0]


@pytest.mark.parametrize("method, k, words", [
    ("topk", 0, "needs k"), ("topk", 11, "from 1 to the number of parameters (10)"), ("topk", 2.5, "needs k"),
    ("topk", True, "needs k"), ("zip", None, "compression must be one of"), ("float16", 3, "k is only for top-k"),
])
def test_bad_settings_are_named(method, k, words):
    assert words in check_method(method, k, 10)[0]
    with pytest.raises(ValueError, match="compression|k"):
        Compressor(method, 10, np.float64, k)


def test_bytes_and_alpha_beta_times():
    n = 25_450
    assert message_bytes("none", n) == 8 * n and message_bytes("float16", n) == 2 * n
    assert message_bytes("bfloat16", n) == 2 * n and message_bytes("topk", n, k=100) == 1200
    alpha, beta = 50e-6, 8 / 1e9  # 1 Gbit/s
    assert exchange_time("none", n, 4, alpha, beta) == pytest.approx(float(ring_allreduce_time(8 * n, 4, alpha, beta)))
    assert exchange_time("float16", n, 4, alpha, beta) == pytest.approx(3 * (alpha + 2 * n * beta))
    assert exchange_time("topk", n, 4, alpha, beta, k=100) == pytest.approx(3 * (2 * alpha + 1200 * beta))
    assert exchange_time("topk", n, 1, alpha, beta, k=100) == 0.0
    assert set(METHODS) == {"none", "float16", "bfloat16", "topk"}
