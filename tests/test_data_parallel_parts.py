"""The pieces of lessons 06 and 10 that need no MPI: the shard's batches, ZeRO's slices, the overlap's buckets,
the samplers."""

import time

import numpy as np
import pytest
from mpi4py import MPI

from nnlib import Network
from nnlib.lesson03_training.optimizers import SGD
from nnlib.lesson03_training.training import Settings
from nnlib.lesson04_collectives.collectives import split_evenly
from nnlib.lesson06_data_parallel.data_parallel import ShardBatches
from nnlib.lesson10_zero_overlap.overlap import bucket_ranges
from nnlib.lesson10_zero_overlap.sampling import exact_imbalance, per_rank_plan
from nnlib.lesson10_zero_overlap.simulated_link import Link, SimulatedLink, overlapped_finish
from nnlib.lesson10_zero_overlap.zero import rank_slice


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 7])
def test_the_slices_updated_one_by_one_equal_one_whole_sgd_step(ranks):
    rng = np.random.default_rng(1)
    whole = Network((12, 7, 4), dtype="float64", seed=3)
    whole.grads[...] = rng.normal(size=whole.num_params)
    sliced = [Network((12, 7, 4), dtype="float64", seed=3) for _ in range(ranks)]
    slices = [rank_slice(whole.num_params, ranks, rank) for rank in range(ranks)]
    optimizers = [SGD(network.params[mine], 0.3, 0.9) for network, mine in zip(sliced, slices)]  # as ZeRO makes them
    plain = SGD(whole.params, 0.3, 0.9)
    for _ in range(3):  # momentum carries over between steps
        plain.step(whole.params, whole.grads)
        for network, optimizer, mine in zip(sliced, optimizers, slices):
            network.grads[mine] = whole.grads[mine]
            optimizer.step(network.params[mine], network.grads[mine])
    result = np.concatenate([network.params[mine] for network, mine in zip(sliced, slices)])
    np.testing.assert_array_equal(result, whole.params)
    assert sum(o.state_bytes for o in optimizers) == plain.state_bytes == whole.params.nbytes
    assert max(o.state_bytes for o in optimizers) <= -(-whole.num_params // ranks) * 8


@pytest.mark.parametrize("bucket_bytes", [0, 100, 400, 1000, 10**9])
def test_buckets_tile_the_gradient_vector_from_the_last_layer_back(bucket_bytes):
    network = Network((12, 9, 8, 7, 4), dtype="float32")
    buckets = bucket_ranges(network, bucket_bytes)
    assert buckets[0][2] == network.num_params and buckets[-1][1] == 0 and buckets[-1][0] == 0
    for (_, start, _), (_, _, stop) in zip(buckets, buckets[1:]):
        assert stop == start  # contiguous, no gap, no overlap
    assert [layer for layer, _, _ in buckets] == sorted((layer for layer, _, _ in buckets), reverse=True)
    if bucket_bytes == 0:
        assert len(buckets) == network.num_layers
    if bucket_bytes == 10**9:
        assert len(buckets) == 1
    for layer, start, stop in buckets[:-1]:
        assert (stop - start) * 4 >= bucket_bytes  # only the first layer's bucket may be small


def test_a_negative_bucket_size_is_refused():
    with pytest.raises(ValueError, match="bucket_bytes"):
        bucket_ranges(Network((4, 3, 2)), -1)


@pytest.mark.parametrize("num_samples, batch, ranks", [(997, 64, 3), (997, 64, 2), (1000, 5, 4), (10, 3, 3)])
def test_the_per_rank_sampler_sees_every_sample_once_per_epoch(num_samples, batch, ranks):
    shard_sizes, starts = split_evenly(num_samples, ranks)
    plans = [per_rank_plan(shard_sizes, batch, rank, seed=4, epoch=2) for rank in range(ranks)]
    assert len({len(plan) for plan in plans}) == 1  # every rank takes the same number of steps
    seen = []
    for rank, plan in enumerate(plans):
        seen += [starts[rank] + int(row) for rows, _ in plan for row in rows]
    assert sorted(seen) == list(range(num_samples))
    for step in range(len(plans[0])):
        normalizers = {plan[step][1] for plan in plans}
        assert normalizers == {sum(len(plan[step][0]) for plan in plans)}
    assert np.array_equal(per_rank_plan(shard_sizes, batch, 0, 4, 2)[0][0], plans[0][0][0])  # reproducible
    assert not np.array_equal(per_rank_plan(shard_sizes, batch, 0, 4, 3)[0][0], plans[0][0][0])  # reshuffled


def test_the_exact_plan_is_the_sequential_batches_cut_by_shard():
    settings = Settings(epochs=1, learning_rate=0.1, batch_size=16, seed=5)
    plans = [ShardBatches([34, 33, 33], rank, settings).epoch(0) for rank in range(3)]
    order = np.random.default_rng(5).permutation(100)
    for step in range(len(plans[0])):
        expected = order[step * 16:(step + 1) * 16]
        got = [int(row) + split_evenly(100, 3)[1][rank] for rank, plan in enumerate(plans) for row in plan[step][0]]
        assert sorted(got) == sorted(expected.tolist())
        assert {plan[step][1] for plan in plans} == {len(expected)}


def test_the_exact_samplers_imbalance_is_what_counting_gives():
    assert exact_imbalance(1000, 1000, 4) == 0.0  # full batch: every rank has its whole shard
    imbalance = exact_imbalance(60000, 256, 2, epochs=1)
    # each rank's share of a batch is about binomial(256, 1/2): sd 8, E[max of two] = 128 + 8 / sqrt(pi)
    assert 0.02 < imbalance < 0.05
    assert exact_imbalance(60000, 256, 4) > imbalance  # more ranks, larger maximum


def test_an_unknown_keyword_is_refused_with_the_known_ones():
    from mpi4py import MPI

    from nnlib.lesson06_data_parallel import train_parallel

    inputs, labels = np.zeros((6, 4)), np.arange(6) % 3
    with pytest.raises(TypeError, match=r"unknown keywords \['epoch'\]; they are epochs, learning_rate"):
        train_parallel(MPI.COMM_WORLD, Network((4, 3)), inputs, labels, num_samples=6, start=0, epoch=1)


@pytest.mark.parametrize("layers", [1, 3, 5])
def test_the_overlap_diagram_ends_the_step_where_the_formula_says(layers):
    from nnlib.lesson10_zero_overlap.diagrams import overlap_spans

    backward, transfer = 1.0, 0.8  # a bucket's transfer shorter than a layer's backward pass
    for overlap, expected in [(False, layers * (backward + transfer)), (True, layers * backward + transfer)]:
        compute, communicate = overlap_spans(layers, backward, transfer, overlap)
        assert max(end for _, _, end in compute + communicate) == pytest.approx(expected)
        assert [label for label, _, _ in communicate] == [f"bucket {layer}" for layer in range(layers, 0, -1)]


def test_the_zero_diagram_leaves_each_rank_one_summed_chunk_and_everyone_all_updated():
    from nnlib.lesson10_zero_overlap.diagrams import zero_states

    phases = dict(zero_states(3))
    assert [[state == "summed gradient" for state in row] for row in phases["reduce-scatter"]] == \
        [[c == r for c in range(3)] for r in range(3)]
    assert all(state == "updated parameters" for row in phases["allgather"] for state in row)


def test_a_ranking_of_noisy_runs_says_which_runs_the_rounds_cannot_tell_apart():
    from nnlib.lesson10_zero_overlap.waiting import ranking

    samples = {"a": [0.70, 0.74, 0.72], "b": [0.80, 0.79, 0.83], "c": [0.75, 0.81, 0.77], "d": [0.60, 0.62, 0.61]}
    order, tied = ranking(samples)
    assert order == ["b", "c", "a", "d"]  # medians 0.80, 0.77, 0.72, 0.61
    assert tied == ["c"]  # c's best round (0.81) reaches b's worst (0.79); a's (0.74) does not
    assert ranking({"only": [1.0]}) == (["only"], [])


# -- lesson 10's simulated link ----------------------------------------------------------------------------------

class SelfAsTwoRanks:
    """MPI.COMM_SELF (its sums are the buffer itself) that says it has 2 ranks: a link of 2 ranks in one process."""

    size, rank = 2, 0

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        MPI.COMM_SELF.Allreduce(sendbuf, recvbuf, op=op)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        return MPI.COMM_SELF.Iallreduce(sendbuf, recvbuf, op=op)


def test_the_link_carries_one_message_at_a_time():
    link = Link()
    assert link.book(0.0, 0.006) == pytest.approx(0.006)
    assert link.book(0.0, 0.006) == pytest.approx(0.012)  # ready at once, but the link is busy until 6 ms
    assert link.book(1.0, 0.006) == pytest.approx(1.006)  # ready after the link is free
    # the model of overlap: the first bucket (ready at 1 ms) is done at 7 ms; the second waits for it
    assert overlapped_finish([0.001, 0.002], [0.006, 0.006]) == pytest.approx(0.013)
    assert overlapped_finish([0.001, 0.020], [0.006, 0.006]) == pytest.approx(0.026)


def test_the_simulated_link_takes_its_time_in_wall_time_and_leaves_the_core_free_meanwhile():
    n, seconds = 25_000, 0.1  # 2 alpha + n beta = 0.1 s on 2 ranks
    link = SimulatedLink(SelfAsTwoRanks(), alpha=0.0, beta=seconds / n)
    values = np.arange(n // 8, dtype=np.float64)  # n bytes
    began = time.perf_counter()
    link.Allreduce(MPI.IN_PLACE, values)
    assert time.perf_counter() - began >= seconds and values[-1] == n // 8 - 1  # summed (with itself only)
    began = time.perf_counter()
    requests = [link.Iallreduce(MPI.IN_PLACE, values)]
    time.sleep(seconds)  # a backward pass's worth of computing while the link carries the message
    link.wait_all(requests)
    elapsed = time.perf_counter() - began
    assert seconds <= elapsed < 1.5 * seconds  # overlapped: not the 0.2 s of one after the other
