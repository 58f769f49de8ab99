"""``mpiexec -n N python -m nnlib train ...``: data-parallel MNIST training as a batch job.

Rank 0 loads and verifies MNIST and scatters it; every rank trains its copy of the network on
its shard; rank 0 prints one progress line per epoch, each rank's time per phase, the test
accuracy, and writes the history and weights to ``--output`` (a .npz file, written to a
temporary file first and then renamed, so an interrupted job never leaves half a file).

When things go wrong:

* every collective has a deadline (``--timeout`` seconds, see nnlib.lesson10_faults.watchdog);
* a bad setting found by every rank together is said once, by rank 0, and the job exits 2;
* an error on some ranks only (a rank raising, a collective past its deadline) is printed by
  that rank with its traceback, and the rank ends the whole job with ``MPI_Abort`` (exit
  status 1), as ``python -m mpi4py`` does: never a hang;
* ``--checkpoint-dir``, ``--resume`` (nnlib.lesson10_faults.checkpoint) and ``--fault`` as ``--help`` says.

Every lesson's options are in ``options``, with one table of what combines with what (``options.COMBINES``).
"""

from nnlib.train_command.job import abort_job, run
from nnlib.train_command.options import add_arguments, check_settings

LESSON = 13  # the batch job: it offers every lesson's options

__all__ = ["abort_job", "add_arguments", "check_settings", "run"]
