"""Lesson 15's ways of talking less, in one process and as batch-job flags: PowerSGD's bytes and power iteration,
local SGD / DiLoCo's outer step and rounds, the byte counter and its alpha-beta time; the flags' refusals, where the
job's settings check decides them; the jobs' byte counts (one launch of 3 ranks). The equalities under mpiexec on 1
to 4 ranks are in tests/mpi/check_communication_light.py (run by test_mpi.py)."""

import numpy as np
import pytest
from mpi4py import MPI
from shared_runs import Job, jobs_run_once
from test_train_command import settings_refusal

from nnlib.lesson02_network.network import count_parameters
from nnlib.lesson04_collectives.costmodel import ETHERNET_1G, ring_allgather_time, ring_allreduce_time
from nnlib.lesson09_ring_allreduce.counting import CountingComm
from nnlib.lesson15_compression.compression import counted_seconds
from nnlib.lesson15_compression.local_sgd import check_local_sgd, outer_step
from nnlib.lesson15_compression.powersgd import PowerSGDCompressor, check_rank, message_bytes

SMALL = ("--samples", "1001", "--epochs", "2", "--batch-size", "64", "--hidden", "16")


class OneRank:
    """What the compressors need of a communicator, for one rank: its sum is its own."""

    size, rank = 1, 0

    def Allreduce(self, sendbuf, recvbuf, op=None):
        pass

    def Allgather(self, sendbuf, recvbuf):
        recvbuf[0] = sendbuf


class SecondOfThree(OneRank):
    """Rank 1 of 3, for the counts alone (the calls do nothing)."""

    size, rank = 3, 1

    def Allgatherv(self, mine, received):
        pass

    def Reduce_scatter(self, whole, mine, recvcounts=None, op=None):
        pass


def test_counting_comm_counts_what_a_ring_makes_this_rank_send():
    counting = CountingComm(SecondOfThree())  # 10 values in chunks of 4, 3, 3: rank 1 owns 3
    counting.Allreduce(MPI.IN_PLACE, np.zeros(10))
    assert counting.calls == [("Allreduce", 80, 2 * (10 - 3) * 8)]
    counting.Allgather(np.ones(3, dtype=np.float32), np.zeros((3, 3), dtype=np.float32))
    assert counting.calls[-1] == ("Allgather", 12, 2 * 12)
    counts = np.array([4, 3, 3])
    counting.Allgatherv(np.ones(3), (np.zeros(10), (counts, np.array([0, 4, 7]))))
    counting.Reduce_scatter(np.zeros(10, dtype=np.float32), np.zeros(3, dtype=np.float32), recvcounts=counts)
    assert counting.calls[-2:] == [("Allgatherv", 24, 7 * 8), ("Reduce_scatter", 40, 7 * 4)]
    assert counting.ring_bytes("Allreduce") == 112 and counting.ring_bytes() == 112 + 24 + 56 + 28


def test_powersgd_bytes_per_step():
    # 784-32-10, rank 1: S (784 + 32) and the biases (32 + 10), then Q (32 + 10)
    assert message_bytes((784, 32, 10), 1, itemsize=4) == (4 * (784 + 32 + 32 + 10), 4 * (32 + 10))
    # the rank is capped at each layer's min(a, b): 10 for the last layer
    assert message_bytes((784, 32, 10), 16, itemsize=8) == (8 * (784 * 16 + 32 * 10 + 42), 8 * (32 * 16 + 10 * 10))


def test_powersgd_on_one_rank_is_the_rank_r_projection_with_error_feedback():
    generator = np.random.default_rng(0)
    compressor = PowerSGDCompressor([(7, 5)], 2, np.float64, seed=1)
    q = compressor.qs[0].copy()
    gradient = np.concatenate([generator.normal(size=35), generator.normal(size=5)])
    matrix, biases = gradient[:35].reshape(7, 5).copy(), gradient[35:].copy()
    compressor.allreduce(OneRank(), gradient)
    basis = np.linalg.qr(matrix @ q, mode="reduced")[0]
    expected = basis @ (matrix.T @ basis).T
    assert np.allclose(gradient[:35].reshape(7, 5), expected, rtol=0, atol=1e-12)
    assert np.array_equal(gradient[35:], biases)  # the biases, sent whole
    assert np.allclose(compressor.residuals[0], matrix - expected, rtol=0, atol=1e-12)
    assert np.allclose(compressor.qs[0], matrix.T @ basis)  # the warm start of the next step
    assert np.linalg.matrix_rank(expected) == 2


def test_powersgd_at_full_rank_sends_the_gradient_itself():
    gradient = np.random.default_rng(1).normal(size=6 * 4 + 4)
    summed = gradient.copy()
    PowerSGDCompressor([(6, 4)], 9, np.float64).allreduce(OneRank(), summed)
    assert np.allclose(summed, gradient, rtol=0, atol=1e-12)


def test_outer_steps_average_and_nesterov():
    anchor, change = np.array([1.0, 2.0]), np.array([0.5, -1.0])
    plain = anchor.copy()
    outer_step(plain, change, None, 1.0, 0.9)
    assert plain.tolist() == [0.5, 3.0]  # the workers' mean
    velocity, nesterov = np.zeros(2), anchor.copy()
    outer_step(nesterov, change, velocity, 0.7, 0.9)  # v = D, x - 0.7 (D + 0.9 D)
    assert np.allclose(nesterov, anchor - 0.7 * 1.9 * change) and np.array_equal(velocity, change)


def test_bad_settings_are_named():
    assert check_local_sgd(4, "nesterov", None, 0.9) == [] and check_rank(3) == []
    assert "whole number, 1 or more" in check_local_sgd(0, "average", None, 0.9)[0]
    assert "must be one of average, nesterov" in check_local_sgd(2, "adam", None, 0.9)[0]
    assert "positive number" in check_local_sgd(2, "average", 0.0, 0.9)[0]
    assert "in [0, 1)" in check_local_sgd(2, "average", None, 1.0)[0]
    assert check_rank(0) and check_rank(1.5) and check_rank(True)


def test_counting_comm_counts_the_messages_and_their_alpha_beta_time():
    counting = CountingComm(OneRank())
    counting.Allreduce(np.ones(4), np.zeros(4))  # the send buffer's bytes
    gathered = np.zeros((1, 3), dtype=np.float32)
    counting.Allgather(np.ones(3, dtype=np.float32), gathered)
    counting.Allgather(np.ones(3, dtype=np.float32), gathered)
    assert counting.messages() == {("Allreduce", 32): 1, ("Allgather", 12): 2} and counting.size == 1
    assert counting.ring_bytes() == 0  # one rank sends nothing
    counting.calls.clear()
    counting.Allreduce(MPI.IN_PLACE, np.zeros(10))
    assert counting.messages() == {("Allreduce", 80): 1} and counting.message_bytes() == 80
    alpha, beta = ETHERNET_1G.alpha, ETHERNET_1G.beta
    calls = {("Allreduce", 80): 3, ("Allgather", 12): 2}
    expected = 3 * ring_allreduce_time(80, 8, alpha, beta) + 2 * ring_allgather_time(12, 8, alpha, beta)
    assert counted_seconds(calls, 8, alpha, beta) == pytest.approx(float(expected))
    assert counted_seconds(calls, 1, alpha, beta) == 0.0


#: What the new flags' checks refuse (in-process, where it is decided: tests/test_train_command.py's settings_refusal);
#: the pairs the table refuses (--local-steps with --asynchronous, --checkpoint-dir or --compression float16, and
#: --compression powersgd with --checkpoint-dir) are among test_train_command.py's REFUSED.
NEW_FLAGS_REFUSED = [
    (2, ["--compression", "powersgd"], "--compression powersgd needs --rank R, a whole number, 1 or more; got None"),
    (2, ["--compression", "powersgd", "--rank", "0"], "needs --rank R, a whole number, 1 or more; got 0"),
    (2, ["--rank", "2"], "--rank is PowerSGD's: add --compression powersgd"),
    (2, ["--outer-optimizer", "nesterov"], "are local SGD's: add --local-steps H"),
    (2, ["--local-steps", "4"], "--local-steps needs --sampler per_rank and mini-batches"),
    (2, ["--local-steps", "0", "--sampler", "per_rank"], "--local-steps H must be a whole number, 1 or more"),
    (2, ["--local-steps", "4", "--sampler", "per_rank", "--outer-learning-rate", "-1"],
     "--outer-learning-rate must be a positive number"),
    (3, ["--compression", "powersgd", "--rank", "2", "--asynchronous"],
     "--compression powersgd does not combine with --asynchronous in the batch job"),
    (2, ["--compression", "powersgd", "--rank", "2", "--grid", "1,2,1"],
     "--compression powersgd does not combine with --grid D,T,P in the batch job"),
]


@pytest.mark.parametrize("ranks, arguments, message", NEW_FLAGS_REFUSED)
def test_the_new_flags_are_refused_by_the_check_every_rank_makes_first(ranks, arguments, message):
    assert message in settings_refusal(ranks, *SMALL, *arguments)


def test_the_jobs_count_their_bytes_and_one_local_step_equals_the_synchronous_job():
    """The synchronous, local-SGD (H = 1) and PowerSGD jobs on 3 ranks: one launch, once per session."""
    settings = (*SMALL, "--dtype", "float64", "--sampler", "per_rank")
    runs = jobs_run_once("test_local_sgd_powersgd-3-ranks", 3, {
        "s": Job(settings), "l": Job((*settings, "--local-steps", "1")),
        "p": Job((*settings, "--compression", "powersgd", "--rank", "2"))})
    synchronous, local, power = runs["s"], runs["l"], runs["p"]
    assert synchronous.returncode == local.returncode == power.returncode == 0, local.stderr + power.stderr
    first, second = message_bytes((784, 16, 10), 2, itemsize=8)
    assert f"two Allreduces of {first:,} and {second:,} bytes per rank per step instead of 101,840" in power.stdout
    saved = {name: run.saved() for name, run in runs.items()}
    assert np.abs(saved["l"]["params"] - saved["s"]["params"]).max() / np.abs(saved["s"]["params"]).max() <= 1e-10
    steps = 2 * 16  # ceil(1001 / 64) steps in each of 2 epochs
    assert int(saved["s"]["sent_bytes"]) == int(saved["l"]["sent_bytes"]) == steps * 8 * count_parameters(
        (784, 16, 10)) + 2 * 16  # (and the loss's 16 bytes per epoch)
    assert int(saved["p"]["sent_bytes"]) == steps * (first + second) + 2 * 16
    assert "sent by rank 0:" in power.stdout and "sent by rank 0:" not in synchronous.stdout
