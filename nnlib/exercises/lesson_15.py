"""Lesson 15's exercises (notebook 15_sending_less): bfloat16 rounding on the bits, top-k compression
with error feedback, one PowerSGD power iteration, and (homework) DiLoCo's outer step.
"""

import numpy as np

from nnlib.exercises import Exercise, case_generator

LESSON = 15


def bfloat16_bits(values):
    """float32 values (any shape) -> their bfloat16 bit patterns as uint16, rounded to nearest even
    (the top 16 of the 32 bits, after rounding away the low 16). NaN need not be handled."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    lowest_kept_bit = (bits >> 16) & 1
    return ((bits + 0x7FFF + lowest_kept_bit) >> 16).astype(np.uint16)


def top_k_step(gradient, residual, k):
    """Top-k compression with error feedback, for one rank and one step. gradient, residual (n,)
    -> (sent (n,): the k entries of largest magnitude of gradient + residual, zeros elsewhere;
    new_residual (n,): what was not sent)."""
    corrected = gradient + residual
    largest = np.argsort(np.abs(corrected))[-k:]
    sent = np.zeros_like(corrected)
    sent[largest] = corrected[largest]
    return sent, corrected - sent


def powersgd_approximation(gradients, q):
    """One PowerSGD power iteration with every rank's weight gradient side by side: gradients (ranks, a, b),
    q (b, r) -> the rank-r approximation (a, b) of their sum: S = sum_r M_r q, S^ = orthonormal columns
    spanning S (np.linalg.qr), Q = sum_r M_r^T S^, approximation S^ Q^T."""
    s = (gradients @ q).sum(axis=0)                               # the first Allreduce: (a, r)
    basis = np.linalg.qr(s)[0]                                    # S^ (a, r), orthonormal columns
    new_q = (gradients.transpose(0, 2, 1) @ basis).sum(axis=0)    # the second Allreduce: (b, r)
    return basis @ new_q.T


def diloco_outer_step(anchor, worker_params, velocity, learning_rate, momentum):
    """DiLoCo's outer step with every rank's parameters after its H inner steps side by side.
    anchor (n,): x, where the round began; worker_params (ranks, n): the x_r; velocity (n,): v.
    -> (new anchor, new velocity): D = mean_r (x - x_r), v <- momentum v + D,
    x <- x - learning_rate (D + momentum v)."""
    outer_gradient = (anchor - worker_params).mean(axis=0)
    new_velocity = momentum * velocity + outer_gradient
    return anchor - learning_rate * (outer_gradient + momentum * new_velocity), new_velocity


def bfloat16_cases():
    """Exact halfway cases (ties to even, both ways), then ordinary and huge values."""
    generator = case_generator("15.1")
    halfway = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0xBF807FFF], dtype=np.uint32).view(np.float32)
    return [(halfway,), (generator.normal(size=20).astype(np.float32),),
            ((generator.normal(size=(3, 4)) * 1e20).astype(np.float32),)]


def top_k_cases():
    generator = case_generator("15.2")
    return [(generator.normal(size=n), generator.normal(size=n) * 0.1, k) for n, k in [(10, 3), (7, 7), (25, 1)]]


def powersgd_cases():
    generator = case_generator("15.3")
    return [(generator.normal(size=(ranks, a, b)), generator.normal(size=(b, r)))
            for ranks, a, b, r in [(3, 7, 5, 2), (2, 6, 4, 1), (4, 9, 3, 3)]]


def diloco_cases():
    generator = case_generator("15.4")
    return [(generator.normal(size=n), generator.normal(size=(ranks, n)), generator.normal(size=n) * 0.1, rate, 0.9)
            for ranks, n, rate in [(3, 10, 0.7), (2, 7, 1.0), (5, 13, 0.3)]]


EXERCISES = [
    Exercise("15.1", bfloat16_bits, bfloat16_cases,
             "view the float32 array as uint32 to reach the bits; adding 0x7FFF rounds up whatever is above "
             "halfway, and the lowest kept bit decides the exact halfway case."),
    Exercise("15.2", top_k_step, top_k_cases,
             "add the residual first; np.argsort or np.argpartition of the magnitudes finds the k largest; "
             "what is sent plus the new residual must be the corrected gradient."),
    Exercise("15.3", powersgd_approximation, powersgd_cases,
             "gradients @ q multiplies every rank's matrix at once; sum over axis 0 is the Allreduce; "
             "np.linalg.qr(s)[0] gives the orthonormal columns; transpose the last two axes for M_r^T."),
    Exercise("15.4", diloco_outer_step, diloco_cases,
             "the outer gradient points from the workers back to the anchor: anchor - worker_params, averaged "
             "over the ranks (axis 0); update the velocity first, then step with it.", 1e-12),
]
