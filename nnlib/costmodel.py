"""How long communication takes: the latency-bandwidth (alpha-beta) model.

Sending or reducing a message of n bytes takes about

    T(n) = alpha + beta * n

alpha (seconds) is the fixed cost of any message: software overhead and network
latency; beta (seconds per byte) is the inverse bandwidth. Small messages cost
alpha, large ones beta * n; the crossover is at n = alpha / beta bytes.
"""

from __future__ import annotations

import numpy as np

LESSON = 4



def fit_latency_bandwidth(sizes_in_bytes, seconds):
    """Least-squares fit of T(n) = alpha + beta n, weighted so that every size counts alike.

    Plain least squares would let the largest messages decide everything; dividing
    each equation by its measured time fits the *relative* error instead.
    Returns (alpha seconds, beta seconds per byte).
    """
    sizes = np.asarray(sizes_in_bytes, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    if sizes.shape != seconds.shape or sizes.size < 2:
        raise ValueError("need at least two (size, time) pairs of equal length")
    design = np.stack([np.ones_like(sizes), sizes], axis=1) / seconds[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones_like(sizes), rcond=None)
    return float(alpha), float(beta)


def predicted_time(sizes_in_bytes, alpha: float, beta: float):
    """T(n) = alpha + beta n for each size."""
    return alpha + beta * np.asarray(sizes_in_bytes, dtype=np.float64)


def ring_allreduce_time(n_bytes, ranks, alpha: float, beta: float):
    """Ring Allreduce of n bytes on P ranks: 2(P-1) steps, each sending n/P bytes.

    T = 2 (P - 1) alpha + 2 (P - 1) / P * n * beta   (0 for one rank). The bytes each rank
    sends stay below 2n however many ranks there are: bandwidth-optimal.
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    return np.where(ranks > 1, 2 * (ranks - 1) * alpha + 2 * (ranks - 1) / ranks * n_bytes * beta, 0.0)


def recursive_doubling_time(n_bytes, ranks, alpha: float, beta: float):
    """Recursive-doubling Allreduce: log2 P rounds, each swapping the whole n bytes.

    T = log2(P) (alpha + n beta) for P a power of two; otherwise two more whole-buffer messages
    (the extra ranks fold in first and get the result last): (floor(log2 P) + 2)(alpha + n beta).
    Fewest messages (best for small n), but every round sends all n bytes.
    """
    ranks = np.asarray(ranks, dtype=np.int64)
    rounds = np.floor(np.log2(np.maximum(ranks, 1))) + np.where(ranks & (ranks - 1), 2, 0)
    return np.where(ranks > 1, rounds * (alpha + n_bytes * beta), 0.0)


def reduce_broadcast_time(n_bytes, ranks, alpha: float, beta: float):
    """Reduce to rank 0 and send back, one message at a time: T = 2 (P - 1)(alpha + n beta)."""
    ranks = np.asarray(ranks, dtype=np.float64)
    return np.where(ranks > 1, 2 * (ranks - 1) * (alpha + n_bytes * beta), 0.0)


def parameter_server_time(n_bytes, ranks, alpha: float, beta: float):
    """Gather P-1 gradients into rank 0, then broadcast the parameters back (a binary tree).

    T = (P - 1)(alpha + n beta) + ceil(log2 P)(alpha + n beta): every gradient passes through
    rank 0's one link, so the gather grows linearly with P.
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    message = alpha + n_bytes * beta
    return np.where(ranks > 1, (ranks - 1) * message + np.ceil(np.log2(np.maximum(ranks, 1))) * message, 0.0)


def step_time(ranks, strategy: str, compute_seconds: float, update_seconds: float, n_bytes: float,
              alpha: float, beta: float):
    """Predicted seconds per step on P ranks: compute / P + communication + update.

    compute_seconds: one rank's forward and backward on the whole global batch (it divides);
    update_seconds: the optimizer step on the full parameter vector (it does not divide: with
    allreduce every rank repeats it, with a parameter server rank 0 does it while others wait).
    """
    ranks = np.asarray(ranks, dtype=np.float64)
    if strategy == "allreduce":
        communication = ring_allreduce_time(n_bytes, ranks, alpha, beta)
    elif strategy == "parameter_server":
        communication = parameter_server_time(n_bytes, ranks, alpha, beta)
    else:
        raise ValueError(f"strategy must be 'allreduce' or 'parameter_server'; got {strategy!r}")
    return compute_seconds / ranks + communication + update_seconds
