"""``mpiexec -n N python -m nnlib train ...``: MNIST training as a batch job, with every lesson's options.

Rank 0 loads and verifies MNIST; every rank trains (by default its copy of the network on its shard); rank 0 prints
a line per epoch, each rank's seconds per phase and the test accuracy, and writes the history and weights to
``--output`` atomically. Every collective has a deadline (``--timeout``); a bad setting, found by every rank
together, is said once by rank 0 and the job exits 2; an error on some ranks only is printed by that rank with its
traceback, and it ends the whole job with ``MPI_Abort`` (exit status 1): never a hang.

``options``: every lesson's options and one table of what combines (``options.COMBINES``); ``job``: the job, its
grid (model-parallel) and asynchronous forms; ``data_parallel``: the data-parallel job; ``reports``: what rank 0 says.
"""

from nnlib.train_command.job import run
from nnlib.train_command.options import add_arguments, check_settings

LESSON = 19  # the batch job: it offers every lesson's options

__all__ = ["add_arguments", "check_settings", "run"]
