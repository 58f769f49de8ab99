"""Lesson 11's exercises (notebook 11_beyond_synchronous_sgd): bfloat16 rounding on the bits, and top-k
compression with error feedback.
"""

import numpy as np

from nnlib.exercises import Exercise, case_generator

LESSON = 11


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


def bfloat16_cases():
    """Exact halfway cases (ties to even, both ways), then ordinary and huge values."""
    generator = case_generator("11.1")
    halfway = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0xBF807FFF], dtype=np.uint32).view(np.float32)
    return [(halfway,), (generator.normal(size=20).astype(np.float32),),
            ((generator.normal(size=(3, 4)) * 1e20).astype(np.float32),)]


def top_k_cases():
    generator = case_generator("11.2")
    return [(generator.normal(size=n), generator.normal(size=n) * 0.1, k) for n, k in [(10, 3), (7, 7), (25, 1)]]


EXERCISES = [
    Exercise("11.1", bfloat16_bits, bfloat16_cases,
             "view the float32 array as uint32 to reach the bits; adding 0x7FFF rounds up whatever is above "
             "halfway, and the lowest kept bit decides the exact halfway case."),
    Exercise("11.2", top_k_step, top_k_cases,
             "add the residual first; np.argsort or np.argpartition of the magnitudes finds the k largest; "
             "what is sent plus the new residual must be the corrected gradient."),
]
