"""The ways to train one network on many ranks: one module per kind of parallelism.

Data parallelism: every rank holds the whole network and a shard of the data (lessons 05, 08, 11).

    data          train_parallel: a step's gradient summed over the ranks, five strategies
    zero          ZeRO: each rank updates and keeps the optimizer state of one slice only
    overlap       gradients sent by layer buckets while backpropagation goes on (PyTorch DDP)
    sampling      which samples each rank computes: the exact sequential batch, or its own
    asynchronous  a parameter server applying each worker's gradient as it arrives

Model parallelism: the network itself is split over the ranks (lesson 09).

    tensor        the hidden units of each layer split over the ranks (Megatron's MLP)
    pipeline      consecutive layers on consecutive ranks, micro-batches, GPipe and 1F1B

Both at once (lesson 09):

    grid          a data x tensor or data x pipeline grid of ranks made with Comm.Split

Every mode takes exactly the steps of sequential training (nnlib.training.train); the checkers
in tests/mpi/ compare each one with it. The names lessons 05, 06 and 10 use are importable from
here: ``from nnlib.parallel import shard, train_parallel``.
"""

from .data import PHASES, STRATEGIES, gather_phase_seconds, gather_timeline, shard, train_parallel

LESSON = 5


__all__ = ["PHASES", "STRATEGIES", "gather_phase_seconds", "gather_timeline", "shard", "train_parallel"]
