"""The batch job itself: :func:`run` it, end it with MPI_Abort on an error some ranks only have, load MNIST on rank 0."""

from __future__ import annotations

import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from nnlib.train_command.asynchronous import asynchronous_job
from nnlib.train_command.data_parallel import data_parallel_job
from nnlib.train_command.model_parallel import model_parallel_job
from nnlib.train_command.options import check_settings, job_settings

LESSON = 13


ABORT_GRACE = 10  # seconds MPI_Abort may take before the rank ends itself (SIGALRM)


RELAY_PAUSE = 1.0  # seconds for mpiexec to relay what a rank printed before MPI_Abort ends the job


def run(args) -> int:
    """The batch job; an error on some ranks only ends the whole job with MPI_Abort (never a hang)."""
    from mpi4py import MPI

    try:
        return train_job(args)
    except Exception as error:
        if getattr(error, "on_every_rank", False):  # every rank has it: rank 0 says it once
            if MPI.COMM_WORLD.rank == 0:
                print(f"error: {error}", file=sys.stderr, flush=True)
            return 2
        abort_job(error)
    except KeyboardInterrupt as error:
        abort_job(error)


def abort_job(error: BaseException) -> None:
    """Print this rank's error (with its traceback, unless it is a watchdog's verdict), then MPI_Abort."""
    from mpi4py import MPI

    from nnlib.course.deadline import CollectiveTimeout

    rank = MPI.COMM_WORLD.rank
    if isinstance(error, CollectiveTimeout):
        text = f"rank {rank}: error: {error}\n"
    else:
        text = f"rank {rank}: error:\n" + "".join(traceback.format_exception(type(error), error, error.__traceback__))
    sys.stdout.flush()
    sys.stderr.write(text + f"rank {rank}: ending the whole job (MPI_Abort)\n")
    sys.stderr.flush()
    # The printed lines travel rank -> proxy -> mpiexec through pipes, the abort through PMI:
    # without a pause, mpiexec can end every process before it has relayed the message
    # (seen in about 1 run in 8 with MPICH's Hydra).
    time.sleep(RELAY_PAUSE)
    # MPI_Abort asks the process manager to end the job. If that manager is gone (an mpiexec
    # that died, a host cut off), the call can wait for its answer for ever: the alarm's default
    # action ends this process after ABORT_GRACE seconds instead, whatever the call is doing.
    signal.alarm(ABORT_GRACE)
    MPI.COMM_WORLD.Abort(1)


def train_job(args) -> int:
    """Check the options on every rank, put a deadline on every collective, run the data-parallel,
    model-parallel or asynchronous job."""
    from mpi4py import MPI
    from threadpoolctl import threadpool_limits

    from nnlib.lesson04_collectives.collectives import raised_on_every_rank
    from nnlib.course.deadline import watch

    threadpool_limits(args.threads)  # one BLAS thread per rank unless told otherwise
    try:  # every rank parses the same arguments: the same verdict everywhere, before any collective
        settings = job_settings(args)
        check_settings(args, MPI.COMM_WORLD.size)
        comm = watch(MPI.COMM_WORLD, args.timeout)  # every collective of the job has a deadline
    except ValueError as problem:
        raise raised_on_every_rank(problem) from None
    data, test = load_data(args, comm)
    if args.model_parallel != "none":
        return model_parallel_job(args, comm, settings, data, test)
    if args.asynchronous:
        return asynchronous_job(args, comm, settings, data, test)
    return data_parallel_job(args, comm, settings, data, test)


def load_data(args, comm):
    """Rank 0 loads and checks MNIST: ((inputs, labels), (test inputs, test labels)), None elsewhere."""
    from nnlib.lesson01_mnist import data
    from nnlib.lesson04_collectives.collectives import raised_on_every_rank

    error, loaded = None, ((None, None), (None, None))
    if comm.rank == 0:
        try:
            if args.output and not Path(args.output).expanduser().resolve().parent.is_dir():
                raise ValueError(f"--output {args.output}: its folder does not exist")
            mnist = data.load_mnist(args.data_dir, progress=False)
            if not 1 <= args.samples <= len(mnist.train_images):
                raise ValueError(f"--samples must be between 1 and {len(mnist.train_images)}; got {args.samples}")
            loaded = ((data.scale_pixels(mnist.train_images[:args.samples], args.dtype),
                       mnist.train_labels[:args.samples].astype(np.int64)),
                      (data.scale_pixels(mnist.test_images, args.dtype), mnist.test_labels.astype(np.int64)))
        except (data.MNISTError, ValueError) as problem:
            error = str(problem)
    error = comm.bcast(error, root=0)
    if error:
        raise raised_on_every_rank(ValueError(error))
    return loaded
