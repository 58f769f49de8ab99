"""Worked solutions to the exercises of lesson 10. Try them yourself first: check() tells you what is wrong."""

import math


def missing_ranks(arrived, size):
    """The ranks of 0..size-1 that are not in `arrived` (a list, any order), as a sorted list."""
    return sorted(set(range(size)) - set(arrived))


def young_interval(write_seconds, node_mtbf_seconds, nodes):
    """Young's checkpoint interval in seconds for a job on `nodes` nodes, each failing on average
    once every node_mtbf_seconds, when one checkpoint takes write_seconds."""
    job_mtbf = node_mtbf_seconds / nodes
    return math.sqrt(2 * write_seconds * job_mtbf)
