"""The ways to train one network on many ranks: one module per kind of parallelism.

Data parallelism: every rank holds the whole network and a shard of the data (lessons 05, 08, 11).

    data          lesson 05: train_parallel, the training loop on every rank; the gradients combined
                  by ParameterServer, ReduceBroadcast or Allreduce
    zero          lesson 08: ZeRO, each rank updates and keeps the optimizer state of one slice only
    overlap       lesson 08: gradients sent by layer buckets while backpropagation goes on (PyTorch DDP)
    sampling      lesson 08: which samples each rank computes: the exact sequential batch, or its own
    asynchronous  lesson 11: a parameter server applying each worker's gradient as it arrives

Model parallelism: the network itself is split over the ranks (lesson 09).

    tensor        the hidden units of each layer split over the ranks (Megatron's MLP)
    pipeline      consecutive layers on consecutive ranks, micro-batches, GPipe and 1F1B

Both at once (lesson 09):

    grid          a data x tensor or data x pipeline grid of ranks made with Comm.Split

Every synchronous mode with the sequential run's batches takes exactly its steps (nnlib.training.train);
the checkers in tests/mpi/ compare each one with it (the per-rank sampler, compressed gradients and the
asynchronous server are compared in distribution, or with their own reference). Lesson 05's names are importable from here:
``from nnlib.parallel import shard, train_parallel``.
"""

from .data import (PHASES, STRATEGIES, Allreduce, ParameterServer, ReduceBroadcast, gather_phase_seconds,
                   gather_timeline, shard, train_parallel)

LESSON = 5


__all__ = ["PHASES", "STRATEGIES", "Allreduce", "ParameterServer", "ReduceBroadcast", "gather_phase_seconds",
           "gather_timeline", "shard", "train_parallel"]
