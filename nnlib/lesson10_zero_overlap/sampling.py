"""How the ranks pick the samples of each step: exactly the sequential batches, or each from its own shard.

``exact`` (train_parallel's default: lesson 06's ShardBatches)
    Every rank draws the sequential run's seeded permutation of all N samples, cuts it into the same global batches
    of b samples, and computes the part of batch k in its own shard. P ranks take exactly the sequential steps, but
    rank r gets a random n_r(k) samples, b/P on average, and every step lasts as long as the rank with the most,
    max_r n_r(k). The lost fraction is the *imbalance*

        imbalance = mean over steps of  max_r n_r(k) / (b / P)   - 1

``per_rank`` (even work per step, as PyTorch's DistributedSampler gives; :class:`PerRankBatches`)
    Rank r shuffles only its own shard, with a generator seeded by (seed, rank, epoch) (so a run resumed from a
    checkpoint draws the same batches), and takes its next b_r = split_evenly(b, P)[0][r] samples at every step: even
    work, every sample still seen once per epoch, but batches other than the sequential ones, so the run equals
    sequential training only statistically (lesson 10 compares accuracies). Both give ceil(N / b) steps per epoch
    (``per_rank`` a few more where b is not much larger than P and the shards do not fit ceil(N / b) local batches).

Each plan is a list, one entry per step, of (rows, divide_by): this rank's rows of the step (indices into its
shard, an int array) and the number of samples in the whole global batch (the gradient's divisor, the same on every
rank). ``train_parallel(..., batches=PerRankBatches)`` trains with the per-rank sampler.
"""

from __future__ import annotations

import numpy as np

from nnlib.lesson03_training.training import Batches, batches
from nnlib.lesson04_collectives.collectives import split_evenly

LESSON = 10


class PerRankBatches(Batches):
    """The ``per_rank`` sampler as the training loop's plan, made from (shard_sizes, rank, settings): ``epoch(e)`` ->
    :func:`per_rank_plan`. Full-batch training has one batch, as the ``exact`` sampler's: every rank all its rows."""

    name = "per_rank"

    def __init__(self, shard_sizes, rank: int, settings):
        super().__init__(int(sum(shard_sizes)), settings.batch_size, settings.seed)
        self.shard_sizes, self.rank, self.seed = shard_sizes, rank, settings.seed
        self.rng = None  # the batches depend only on (seed, rank, epoch): nothing to keep

    def epoch(self, epoch: int) -> list:
        if self.full_batch:
            return [(None, self.num_samples)]
        return per_rank_plan(self.shard_sizes, self.batch_size, self.rank, self.seed, epoch)


def per_rank_plan(shard_sizes, global_batch: int, rank: int, seed: int, epoch: int):
    """One epoch of the ``per_rank`` sampler for ``rank`` (shard_sizes: every rank's row count)."""
    num_samples, size = int(sum(shard_sizes)), len(shard_sizes)
    local_batches = split_evenly(global_batch, size)[0]
    steps = max(-(-num_samples // global_batch),
                max(-(-int(shard) // int(batch)) for shard, batch in zip(shard_sizes, local_batches)))
    order = np.random.default_rng([seed, rank, epoch]).permutation(int(shard_sizes[rank]))
    plan = []
    for step in range(steps):
        # every rank's count at this step, computed alike on every rank (no message needed)
        counts = [max(0, min(int(batch), int(shard) - step * int(batch)))
                  for batch, shard in zip(local_batches, shard_sizes)]
        begin = step * int(local_batches[rank])
        plan.append((order[begin:begin + counts[rank]], sum(counts)))
    return plan


def exact_imbalance(num_samples: int, global_batch: int, size: int, seed: int = 0, epochs: int = 1) -> float:
    """The ``exact`` sampler's imbalance (see the module docstring), counted over ``epochs`` epochs.

    0.05 means that each step waits, on average, for a rank with 5% more samples than an even share.
    """
    rng = np.random.default_rng(seed)
    shares, starts = split_evenly(num_samples, size)  # rank r's shard: rows [starts[r], starts[r] + shares[r])
    ratios = []
    for _ in range(epochs):
        for indices in batches(num_samples, global_batch, rng):
            counts = [np.count_nonzero((indices >= start) & (indices < start + share))
                      for share, start in zip(shares, starts)]
            ratios.append(max(counts) / (len(indices) / size))
    return float(np.mean(ratios) - 1.0)
