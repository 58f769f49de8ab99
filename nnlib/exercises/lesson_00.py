"""Lesson 00's exercises (notebook 00_start_here): how big a network is, and what one step sends."""

from nnlib.exercises import Exercise

LESSON = 0

LAYER_SIZES = [(784, 30, 10), (784, 128, 64, 10), (3, 2)]


def count_parameters(layer_sizes):
    """How many weights and biases a network with these layer sizes has, e.g. (784, 30, 10) -> an int."""
    return sum(n_in * n_out + n_out for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:]))


def gradient_bytes(layer_sizes, itemsize):
    """The bytes of one gradient (what each step sends), with numbers of `itemsize` bytes each."""
    return count_parameters(layer_sizes) * itemsize


EXERCISES = [
    Exercise("00.1", count_parameters, lambda: [(sizes,) for sizes in LAYER_SIZES],
             "every layer but the first has a weight for each of its inputs and a bias, for each of its units."),
    Exercise("00.2", gradient_bytes, lambda: [(sizes, size) for sizes in LAYER_SIZES for size in (8, 4)],
             "the gradient has one number for each parameter; you may call your count_parameters."),
]
