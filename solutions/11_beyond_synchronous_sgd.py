"""Worked solutions to the exercises of lesson 11. Try them yourself first: check() tells you what is wrong."""

import numpy as np


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
