"""How long communication takes: the latency-bandwidth (alpha-beta) model.

Sending or reducing a message of n bytes takes about

    T(n) = alpha + beta * n

alpha (seconds) is the fixed cost of any message: software overhead and network
latency; beta (seconds per byte) is the inverse bandwidth. Small messages cost
alpha, large ones beta * n; the crossover is at n = alpha / beta bytes.
"""

from __future__ import annotations

import numpy as np


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
