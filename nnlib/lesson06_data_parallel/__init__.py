"""Lesson 06 (notebooks/06_data_parallel_training.ipynb): every rank holds the whole network and a shard of the data.

    data_parallel  train_parallel: lesson 03's loop on every rank, the gradients combined by
                   ParameterServer, ReduceBroadcast or Allreduce; shard splits the samples
    plots          each rank's phases gathered, on a time line, and the time per step by phase (drawn
                   again in lessons 07 and 10)
"""

from nnlib.lesson06_data_parallel.data_parallel import (PHASES, STRATEGIES, Allreduce, ParameterServer, ReduceBroadcast,
                                                        shard, train_parallel)
from nnlib.lesson06_data_parallel.plots import gather_phase_seconds, gather_timeline

LESSON = 6
