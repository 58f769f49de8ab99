"""Worked solutions to the exercises of lesson 00. Try them yourself first: check() tells you what is wrong."""


def count_parameters(layer_sizes):
    """How many weights and biases a network with these layer sizes has, e.g. (784, 30, 10) -> an int."""
    return sum(n_in * n_out + n_out for n_in, n_out in zip(layer_sizes[:-1], layer_sizes[1:]))


def gradient_bytes(layer_sizes, itemsize):
    """The bytes of one gradient (what each step sends), with numbers of `itemsize` bytes each."""
    return count_parameters(layer_sizes) * itemsize
