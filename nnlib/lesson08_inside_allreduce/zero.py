"""ZeRO, stage 1 with stage 2's communication: each rank updates, and keeps optimizer state for,
only 1/P of the parameters.

ZeRO (Rajbhandari et al., 2020) cuts p, g and v into P slices [s_r, e_r) (uneven when P does not
divide the number of parameters, as ``collectives.split_counts``) and, per step:

    1. reduce-scatter the gradients:   g_r = sum over ranks of g[s_r:e_r]        (e_r - s_r,)
       (stage 2's communication: the sum arrives only as rank r's slice; the whole
       local gradient g is still held by every rank, so gradient memory is not cut as
       in full stage 2)
    2. update only that slice:         v_r <- mu v_r - eta g_r;  p[s_r:e_r] += v_r
       (stage 1: rank r keeps only v_r, 1/P of the optimizer's state)
    3. allgather the parameter slices: every rank has the whole new p again.

ZeRO sends the same bytes as the ``allreduce`` strategy: steps 1 and 3 are the two halves of the ring
(allreduce.py). Each slice is updated with exactly the formula of
``nnlib.lesson03_training.training.SGD``, so the result equals the ``allreduce`` strategy up to the order in which
MPI adds the ranks' gradients (within 1e-10 in float64; tests/mpi/check_parallel.py).

``train_parallel(..., strategy=ZeRO)`` trains this way.
"""

from __future__ import annotations

import numpy as np

from nnlib.lesson02_network.arrays import through_host, to_numpy
from nnlib.lesson03_training.training import check_rate, sgd_update
from nnlib.lesson05_data_parallel.data_parallel import DataParallel
from nnlib.lesson08_inside_allreduce.allreduce import chunk_bounds, ring_allgather, ring_reduce_scatter

LESSON = 8


class ZeRO(DataParallel):
    """A step: reduce-scatter the gradients, update this rank's slice only, allgather the parameters."""

    name = "zero"

    def optimizer(self, network, learning_rate: float, momentum: float):
        return ShardedSGD(network, learning_rate, momentum, self.size, self.rank)

    def step(self, run) -> None:
        run.phase("communicate")
        through_host(self.network.grads, lambda grads: ring_reduce_scatter(self.comm, grads))  # my slice: its sum
        run.phase("update")
        run.optimizer.step()  # this rank's slice only
        run.phase("communicate")
        through_host(self.network.params, lambda params: ring_allgather(self.comm, params))  # every rank's slice


class ShardedSGD:
    """SGD with momentum on this rank's slice of the parameters only (ZeRO stage 1: sharded optimizer state).

    network:   the rank's full network replica; only params[start:stop] is updated here.
    size/rank: the number of ranks and this rank. Attributes: counts, starts (every rank's
    slice: the ring's chunks), start, stop, velocity (stop - start,) or None.
    """

    sharded = True  # a checkpoint gathers the velocity from every rank's slice

    def __init__(self, network, learning_rate: float, momentum: float, size: int, rank: int):
        check_rate(learning_rate, momentum)
        self.network = network
        self.learning_rate, self.momentum = float(learning_rate), float(momentum)
        self.counts, self.starts = chunk_bounds(network.num_params, size)  # the ring's chunks
        self.start, self.stop = self.starts[rank], self.starts[rank] + self.counts[rank]
        self.velocity = network.xp.zeros(self.stop - self.start, dtype=network.params.dtype) if momentum else None

    @property
    def state_bytes(self) -> int:
        """Bytes of optimizer state on this rank (the velocity slice; 0 without momentum)."""
        return 0 if self.velocity is None else int(self.velocity.nbytes)

    def step(self) -> None:
        """Update params[start:stop] from the summed grads[start:stop] (SGD's formula, on the slice)."""
        mine = slice(self.start, self.stop)
        sgd_update(self.network.params[mine], self.network.grads[mine], self.velocity, self.learning_rate,
                   self.momentum)

    def full_velocity(self, comm):
        """The whole velocity (num_params,) on every rank, gathered from the slices (for checkpoints)."""
        if self.velocity is None:
            return None
        whole = np.empty(self.network.num_params, dtype=to_numpy(self.velocity[:1]).dtype)
        comm.Allgatherv(to_numpy(self.velocity), [whole, (self.counts, self.starts)])
        return whole

    def load_velocity(self, whole) -> None:
        """Take this rank's slice of a whole velocity vector (from a checkpoint)."""
        if self.velocity is not None:
            self.velocity[...] = self.network.xp.asarray(whole[self.start:self.stop])


def replicated_state_bytes(network, momentum: float) -> int:
    """Bytes of optimizer state on every rank without ZeRO: a whole velocity vector (0 without momentum)."""
    return int(network.params.nbytes) if momentum else 0
