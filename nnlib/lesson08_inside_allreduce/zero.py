"""ZeRO, stage 1 with stage 2's communication: each rank updates, and keeps optimizer state for,
only 1/P of the parameters.

ZeRO (Rajbhandari et al., 2020) cuts p, g and v into P slices [s_r, e_r) (uneven when P does not
divide the number of parameters, as ``collectives.split_counts``) and, per step:

    1. reduce-scatter the gradients:   g_r = sum over ranks of g[s_r:e_r]        (e_r - s_r,)
       (stage 2's communication: the sum arrives only as rank r's slice; the whole
       local gradient g is still held by every rank, so gradient memory is not cut as
       in full stage 2)
    2. update only that slice:         v_r <- mu v_r - eta g_r;  p[s_r:e_r] += v_r   (momentum; any optimizer)
       (stage 1: rank r keeps only v_r, 1/P of the optimizer's state: Adam's m_r and v_r likewise)
    3. allgather the parameter slices: every rank has the whole new p again.

ZeRO sends the same bytes as the ``allreduce`` strategy: steps 1 and 3 are the two halves of the ring
(allreduce.py). Each slice is updated by the run's optimizer (nnlib.lesson03_training.optimizers), element-wise as
on the whole vector, so the result equals the ``allreduce`` strategy up to the order in which MPI adds the ranks'
gradients (within 1e-10 in float64; tests/mpi/check_parallel.py).

``train_parallel(..., strategy=ZeRO)`` trains this way.
"""

from __future__ import annotations

from nnlib.lesson02_network.arrays import through_host, to_numpy
from nnlib.lesson04_collectives.collectives import allgather_rows
from nnlib.lesson05_data_parallel.data_parallel import DataParallel
from nnlib.lesson08_inside_allreduce.allreduce import chunk_bounds, ring_allgather, ring_reduce_scatter

LESSON = 8


def rank_slice(num_params: int, size: int, rank: int) -> slice:
    """Rank ``rank``'s slice [s_r, e_r) of ``num_params`` cut into ``size`` (the ring's chunks, chunk_bounds)."""
    counts, starts = chunk_bounds(num_params, size)
    return slice(starts[rank], starts[rank] + counts[rank])


class ZeRO(DataParallel):
    """A step: reduce-scatter the gradients, update this rank's slice only, allgather the parameters. The optimizer
    is made for that slice only (``mine``), and steps on it."""

    name = "zero"

    def __init__(self, comm, network):
        super().__init__(comm, network)
        self.mine = rank_slice(network.num_params, self.size, self.rank)

    def optimizer(self, network, make):
        return make(network.params[self.mine], network.xp)

    def step(self, run) -> None:
        run.phase("communicate")
        through_host(self.network.grads, lambda grads: ring_reduce_scatter(self.comm, grads))  # my slice: its sum
        run.phase("update")
        run.update(self.network.params[self.mine], self.network.grads[self.mine], self.comm)  # this rank's slice
        run.phase("communicate")
        through_host(self.network.params, lambda params: ring_allgather(self.comm, params))  # every rank's slice

    def whole(self, part):
        """A vector of the optimizer's state (this rank's slice), whole on every rank: the slices gathered."""
        return allgather_rows(self.comm, to_numpy(part))

    def part(self, whole):
        """This rank's slice of a whole state vector (a checkpoint's, written by any number of ranks)."""
        return whole[self.mine]
