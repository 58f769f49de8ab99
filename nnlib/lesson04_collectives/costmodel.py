"""Every prediction of the series, in one place: what a message, an Allreduce and a training step cost.

Lesson 05 introduces the latency-bandwidth (alpha-beta) model of one message of n bytes, T(n) = alpha + beta n:
alpha (seconds) is the fixed cost of any message (software overhead, network latency), beta (seconds per byte)
the inverse bandwidth; the crossover is at n = alpha / beta. Later lessons add to this module, and every notebook
and module that predicts a time calls it (nothing else retypes a formula): the parameter server (lesson 06), the
assumed cluster networks, a step's FLOPs and its time on P ranks (07), the Allreduce algorithms (09).
Lesson 12's tradeoffs, its bubbles and lesson 15's compression build on these functions.

The time functions take ``n_bytes`` and ``ranks`` as numbers or NumPy arrays (one prediction each)
and return 0 for one rank: nothing is sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LESSON = 4


# -- lesson 05: one message (fitted once, nnlib.lesson05_messages.alpha_beta) ---------------------

def predicted_time(sizes_in_bytes, alpha: float, beta: float):
    """One point-to-point message of n bytes: T(n) = alpha + beta n, for each size."""
    return alpha + beta * np.asarray(sizes_in_bytes, dtype=np.float64)


def fit_latency_bandwidth(sizes_in_bytes, seconds):
    """Least-squares fit of T(n) = alpha + beta n, weighted so that every size counts alike.

    ``seconds``: the measured times of one point-to-point message of each size (n,), e.g. from
    timing.time_messages, so that alpha is one message's latency (not a whole Allreduce's time: that holds the
    algorithm's several latencies, which a model built on it would count twice). Plain least squares would
    let the largest messages decide everything; dividing each equation by its measured time fits
    the *relative* error instead. Returns (alpha seconds, beta seconds per byte).
    """
    sizes = np.asarray(sizes_in_bytes, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    if sizes.shape != seconds.shape or sizes.size < 2:
        raise ValueError("need at least two (size, time) pairs of equal length")
    design = np.stack([np.ones_like(sizes), sizes], axis=1) / seconds[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(sizes), rcond=None)
    return float(alpha), float(beta)


@dataclass(frozen=True)
class Machine:
    """What the predictions assume of the hardware: one link's alpha (s) and beta (s/byte), one rank's FLOP/s."""

    alpha: float
    beta: float
    flops_per_second: float = float("nan")


# Assumed figures of cluster networks for the lessons' predictions (lessons 07, 12 and 15), stated,
# not measured here: MPI over TCP on Ethernet pays tens of microseconds per message; 100 Gbit/s
# InfiniBand (EDR) a few. beta is the inverse of the link's bandwidth.
ETHERNET_1G = Machine(alpha=50e-6, beta=1 / 125e6)
ETHERNET_10G = Machine(alpha=30e-6, beta=1 / 1.25e9)
INFINIBAND_100G = Machine(alpha=2e-6, beta=1 / 12.5e9)


# -- lesson 06: the parameter server -----------------------------------------------------------

def parameter_server_time(n_bytes, ranks, alpha: float, beta: float):
    """Gather P-1 gradients into rank 0, then broadcast the parameters back (a binary tree).

    T = (P - 1)(alpha + n beta) + ceil(log2 P)(alpha + n beta): every gradient passes through
    rank 0's one link, so the gather grows linearly with P.
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    messages = (ranks - 1) + np.ceil(np.log2(np.maximum(ranks, 1)))
    return np.where(ranks > 1, messages * predicted_time(n_bytes, alpha, beta), 0.0)


def tree_reduce_broadcast_time(n_bytes, ranks, alpha: float, beta: float):
    """MPI's Reduce to rank 0, then its Bcast (lesson 06's reduce_broadcast), each a binomial tree of ceil(log2 P)
    rounds of the whole n bytes: T = 2 ceil(log2 P)(alpha + n beta)."""
    rounds = 2 * np.ceil(np.log2(np.maximum(np.asarray(ranks, dtype=np.float64), 1)))
    return rounds * predicted_time(n_bytes, alpha, beta)


# -- lesson 07: a training step ----------------------------------------------------------------

def step_matmul_shapes(layer_sizes, batch_size: int):
    """The (m, k, n) shapes of every matrix product nnlib's training step runs on ``batch_size`` samples.

    For layers (n_0, ..., n_L), as Network.forward and Network.loss_and_gradient compute them:

        forward       z_l = a_{l-1} @ W_l              (N, n_{l-1}) @ (n_{l-1}, n_l)   every layer
        weight grads  dW_l = a_{l-1}.T @ delta_l       (n_{l-1}, N) @ (N, n_l)         every layer
        input grads   delta_{l-1} <- delta_l @ W_l.T   (N, n_l) @ (n_l, n_{l-1})       layers 2..L only
                      (the first layer's input gradient, with respect to the pixels, is never needed)
    """
    pairs = list(zip(layer_sizes[:-1], layer_sizes[1:]))
    shapes = [(batch_size, n_in, n_out) for n_in, n_out in pairs]
    for layer, (n_in, n_out) in enumerate(pairs):
        shapes.append((n_in, batch_size, n_out))
        if layer > 0:
            shapes.append((batch_size, n_out, n_in))
    return shapes


def flops_per_sample(layer_sizes) -> int:
    """Matrix-product FLOPs of one training step, per sample (a multiply-add is 2 FLOPs).

    The products of :func:`step_matmul_shapes`, each (m, k) @ (k, n) costing 2 m k n:

        F = 2 sum_l n_{l-1} n_l  (forward)  +  2 sum_l n_{l-1} n_l  (weight grads)
            + 2 sum_{l >= 2} n_{l-1} n_l  (input grads; none for the first layer)

    Element-wise work (sigmoid, biases, the loss) is not counted.
    """
    return sum(2 * m * k * n for m, k, n in step_matmul_shapes(layer_sizes, 1))


def communication_time(strategy: str, n_bytes, ranks, alpha: float, beta: float):
    """Seconds to combine n bytes of gradient on P ranks with ``strategy`` (see COMMUNICATION_TIMES)."""
    if strategy not in COMMUNICATION_TIMES:
        raise ValueError(f"strategy must be one of {', '.join(COMMUNICATION_TIMES)}; got {strategy!r}")
    return COMMUNICATION_TIMES[strategy](n_bytes, ranks, alpha, beta)


def step_time(ranks, compute_seconds, communication_seconds=0.0, update_seconds=0.0, bubble=0.0):
    """Predicted seconds per step on P ranks:

        T(P) = compute / (P (1 - bubble)) + communication + update

    compute_seconds: one rank's forward and backward on the whole global batch (it divides over the ranks; e.g.
    flops_per_sample * batch / FLOP/s); communication_seconds: what the ranks exchange per step (e.g.
    :func:`communication_time`); update_seconds: the optimizer step on the full parameter vector (it does not divide:
    with allreduce every rank repeats it, with a parameter server rank 0 does it while the others wait); bubble: the
    idle fraction of a pipeline (nnlib.lesson12_pipeline.bubbles.bubble_fraction), 0 otherwise.
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    return compute_seconds / (ranks * (1 - bubble)) + communication_seconds + update_seconds


# -- lesson 09: Allreduce algorithms -----------------------------------------------------------

def ring_allgather_time(n_bytes_per_rank, ranks, alpha: float, beta: float):
    """Ring Allgather of every rank's b bytes: P - 1 steps, each passing one block on.

    T = (P - 1)(alpha + b beta). It is also either half of a ring Allreduce (b = n / P).
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    return np.where(ranks > 1, (ranks - 1) * predicted_time(n_bytes_per_rank, alpha, beta), 0.0)


def ring_allreduce_time(n_bytes, ranks, alpha: float, beta: float):
    """Ring Allreduce of n bytes on P ranks: reduce-scatter then allgather, 2(P-1) steps of n/P bytes.

    T = 2 (P - 1) alpha + 2 (P - 1) / P * n * beta   (0 for one rank). The bytes each rank
    sends stay below 2n however many ranks there are: bandwidth-optimal.
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    return 2 * ring_allgather_time(np.asarray(n_bytes, dtype=np.float64) / ranks, ranks, alpha, beta)


def recursive_doubling_time(n_bytes, ranks, alpha: float, beta: float):
    """Recursive-doubling Allreduce: log2 P rounds, each swapping the whole n bytes.

    T = log2(P) (alpha + n beta) for P a power of two; otherwise two more whole-buffer messages
    (the extra ranks fold in first and get the result last): (floor(log2 P) + 2)(alpha + n beta).
    Fewest messages (best for small n), but every round sends all n bytes.
    """
    ranks = np.asarray(ranks, dtype=np.int64)
    rounds = np.floor(np.log2(np.maximum(ranks, 1))) + np.where(ranks & (ranks - 1), 2, 0)
    return np.where(ranks > 1, rounds * predicted_time(n_bytes, alpha, beta), 0.0)


def reduce_broadcast_time(n_bytes, ranks, alpha: float, beta: float):
    """Reduce to rank 0 and send back one message at a time (lesson 09's, by hand): T = 2 (P - 1)(alpha + n beta)."""
    ranks = np.asarray(ranks, dtype=np.float64)
    return np.where(ranks > 1, 2 * (ranks - 1) * predicted_time(n_bytes, alpha, beta), 0.0)


COMMUNICATION_TIMES = {"allreduce": ring_allreduce_time, "parameter_server": parameter_server_time,
                       "reduce_broadcast": tree_reduce_broadcast_time}  # train_parallel's strategies (lessons 06, 07)
