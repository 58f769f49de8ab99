"""Worked solutions to the exercises of lesson 06. Try them yourself first: check() tells you what is wrong."""


def amdahl_speedup(ranks, serial_fraction):
    """Amdahl's speedup on each number of ranks (an array) when a fraction of the work is serial."""
    return 1 / (serial_fraction + (1 - serial_fraction) / ranks)


def gustafson_speedup(ranks, serial_fraction):
    """Gustafson's scaled speedup on each number of ranks (an array): the work grows with the ranks."""
    return serial_fraction + (1 - serial_fraction) * ranks


def parallel_efficiency(one_rank_seconds, seconds, ranks):
    """The parallel efficiency of runs taking `seconds` on `ranks` ranks (arrays), against one rank."""
    return one_rank_seconds / seconds / ranks
