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
* ``--checkpoint-dir DIR`` writes a checkpoint there (``--checkpoint-every N`` steps, else
  once per epoch); ``--resume`` continues from the newest one, exactly (nnlib.lesson10_faults.checkpoint);
* ``--fault RANK:STEP:KIND`` makes one rank fail after global step STEP (raise, exit, kill
  with SIGKILL, or hang), for lessons and tests.

Beyond synchronous SGD (lesson 11): ``--compression float16|bfloat16|topk`` (``--topk K``) sends
compressed gradients (nnlib.lesson11_beyond_sync.compression); ``--asynchronous`` makes rank 0 a parameter server
applying each worker's gradient as it arrives, ``--staleness S`` bounds how far a worker may run
ahead (nnlib.lesson11_beyond_sync.asynchronous); ``--slow RANK:SECONDS`` makes one rank a straggler, in either mode.
Talking less (lesson 11): ``--compression powersgd --rank R`` sends each weight gradient as a rank-R
approximation (nnlib.lesson11_beyond_sync.powersgd); ``--local-steps H --outer-optimizer average|nesterov
--outer-learning-rate ETA`` is local SGD or DiLoCo (nnlib.lesson11_beyond_sync.local_sgd). With any
compression or local steps the job counts the bytes each rank hands to Allreduce and Allgather.

Memory (lesson 12): ``--strategy fsdp`` shards every layer's parameters, gradients and momentum over the
ranks (ZeRO-3); ``--recompute K`` keeps every K-th layer's activations and recomputes the rest;
``--accumulate K`` runs each step as K micro-batches; ``--precision float16`` stores the network in
float16 with float32 master weights and dynamic loss scaling, ``--precision bfloat16`` in bfloat16 (the
ml_dtypes package) without scaling; they combine with one another and with checkpoints (nnlib.lesson12_memory),
with data parallelism and FSDP. What combines with what is one table, ``options.COMBINES``: the job refuses
anything else with one message that lists what combines.

The job's parts, one file each: ``options`` (the arguments and their checks), ``job`` (run, abort, load the
data), ``data_parallel``, ``model_parallel`` and ``asynchronous`` (the three kinds of job), ``reports`` (what
rank 0 prints and writes, except the asynchronous job's own lines, which live in ``asynchronous``).
"""

from nnlib.train_command.job import abort_job, run
from nnlib.train_command.options import add_arguments, check_settings

LESSON = 13  # the batch job: it offers every lesson's options

__all__ = ["abort_job", "add_arguments", "check_settings", "run"]
