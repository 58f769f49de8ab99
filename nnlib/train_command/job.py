"""The batch job itself: :func:`run` it, end it with MPI_Abort on an error some ranks only have, load MNIST on rank 0;
its grid job (model and data parallelism: lessons 11, 12, 18 and 19) and its asynchronous job (lesson 14). The
data-parallel job, the default, is in :mod:`nnlib.train_command.data_parallel`."""

from __future__ import annotations

import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from nnlib.train_command.data_parallel import data_parallel_job, job_device, job_strategy
from nnlib.train_command.options import check_settings, kinds_of, parse_grid, parse_slow
from nnlib.train_command.reports import report, save_output, save_trace

LESSON = 19

ABORT_GRACE = 10  # seconds MPI_Abort may take before the rank ends itself (SIGALRM)
RELAY_PAUSE = 1.0  # seconds for mpiexec to relay what a rank printed before MPI_Abort ends the job


def run(args) -> int:
    """The batch job; an error on some ranks only ends the whole job with MPI_Abort (never a hang)."""
    from mpi4py import MPI

    from nnlib.lesson04_collectives.collectives import on_every_rank

    try:
        return train_job(args)
    except Exception as error:
        if on_every_rank(error):  # every rank has it: rank 0 says it once
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
    # The printed lines travel rank -> proxy -> mpiexec through pipes, the abort through PMI: without a pause,
    # mpiexec can end every process before it has relayed them (seen in about 1 run in 8 with MPICH's Hydra).
    time.sleep(RELAY_PAUSE)
    # MPI_Abort asks the process manager to end the job; if it is gone (mpiexec died, a host cut off), the call can
    # wait for ever: the alarm's default action ends this process after ABORT_GRACE seconds, whatever the call does.
    signal.alarm(ABORT_GRACE)
    MPI.COMM_WORLD.Abort(1)


def train_job(args) -> int:
    """Check the options on every rank, put a deadline on every collective, run the job of the kind asked for."""
    from mpi4py import MPI
    from threadpoolctl import threadpool_limits

    from nnlib.lesson04_collectives.collectives import raised_on_every_rank
    from nnlib.course.deadline import watch

    threadpool_limits(args.threads)  # one BLAS thread per rank unless told otherwise
    try:  # every rank parses the same arguments: the same verdict everywhere, before any collective
        settings = check_settings(args, MPI.COMM_WORLD.size)
        comm = watch(MPI.COMM_WORLD, args.timeout)  # every collective of the job has a deadline
    except ValueError as problem:
        raise raised_on_every_rank(problem) from None
    data, test = load_data(args, comm)
    kind = kinds_of(args)[0]
    if kind.startswith("--grid"):
        return grid_job(args, comm, settings, data, test)
    if kind == "--asynchronous":
        return asynchronous_job(args, comm, settings, data, test)
    return data_parallel_job(args, comm, settings, data, test)


def load_data(args, comm):
    """Rank 0 loads and checks MNIST: ((inputs, labels), (test inputs, test labels)), None elsewhere."""
    from nnlib.lesson01_mnist import data
    from nnlib.lesson04_collectives.collectives import fail_together

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
    fail_together(comm, error)  # rank 0's problem, raised on every rank
    return loaded


def grid_job(args, comm, settings, data, test) -> int:
    """--grid D,T,P with T or P above 1: lesson 12's train_hybrid over replicas of T P ranks, each a
    TensorParallelMLP (P = 1), lesson 18's ScheduledPipeline (T = 1) or lesson 19's GridPipelineMLP; --strategy
    allreduce or zero (stage 1) on the data axis. Every rank gets the data from rank 0."""
    from nnlib.lesson04_collectives.collectives import broadcast_new
    from nnlib.lesson06_data_parallel import gather_phase_seconds
    from nnlib.lesson08_gpu.backend import HostStaging
    from nnlib.lesson10_zero_overlap.sampling import PerRankBatches
    from nnlib.lesson11_tensor_parallel.tensor import TensorParallelMLP
    from nnlib.lesson12_pipeline.grid import train_hybrid
    from nnlib.lesson18_pipeline_schedules.schedules import ScheduledPipeline
    from nnlib.lesson19_planning.grid import GridPipelineMLP, replica_comms

    (inputs, labels), (test_inputs, test_labels) = [(broadcast_new(comm, first), broadcast_new(comm, second))
                                                    for first, second in (data, test)]
    (replicas, tensor, stages), (xp, gpus) = parse_grid(args.grid), job_device(args, comm)
    sizes, layout = (784, *args.hidden, 10), f"{replicas} x {tensor} x {stages}"
    if comm.rank == 0:
        print(f"{comm.size} ranks as a grid of {layout} (data x tensor x pipeline), strategy {args.strategy} on the "
              f"data axis, network {'-'.join(map(str, sizes))}, {args.samples} samples, global batch "
              f"{args.batch_size or 'full'}" + (f"; GPU of each rank: {gpus}" if gpus[0] is not None else ""),
              flush=True)
    model = dict(layer_sizes=sizes, output=args.output_layer, dtype=args.dtype, seed=args.seed, device=xp)
    pipeline = dict(micro_batches=args.micro_batches, schedule=args.schedule)

    def build_piece(model_comm):  # this rank's piece of its replica (model_comm is watched and staged, as comm)
        if stages == 1:
            return TensorParallelMLP(model_comm, **model)
        if tensor == 1:
            return ScheduledPipeline(model_comm, **model, **pipeline,
                                     chunks=(args.virtual_stages or 2) if args.schedule == "interleaved" else 1)
        return GridPipelineMLP(*replica_comms(model_comm, tensor), **model, **pipeline)

    with comm.guard():  # the grid's communicators are split from the watched comm: every message has a deadline
        network, history = train_hybrid(
            HostStaging(comm, xp), tensor * stages, build_piece, inputs, labels, strategy=job_strategy(args),
            settings=settings, batches=PerRankBatches if args.sampler == "per_rank" else None,
            progress=comm.rank == 0)  # (each piece's data_comm has a rank 0: one line, from world rank 0)
    test_accuracy = network.accuracy(test_inputs, test_labels)  # every piece of each replica takes part
    params = network.full_params()
    phases = gather_phase_seconds(comm, history)
    timelines = comm.gather((network.timeline, network.timeline_chunks) if args.trace else ([], []), root=0)
    if comm.rank == 0:
        report(args, comm.size, history, phases, test_accuracy, params, sizes, dict(strategy=f"{args.strategy}, grid "
                                                                                              f"{layout}"))
        if args.trace:
            from nnlib.course.trace import pipeline_spans
            save_trace(args.trace, pipeline_spans(*zip(*timelines), stages=stages))  # last step, chunks named
    return 0


def asynchronous_job(args, comm, settings, data, test) -> int:
    """--asynchronous: nnlib.lesson14_asynchronous.asynchronous's parameter server on rank 0; every rank gets the data
    from rank 0."""
    from nnlib.lesson02_network.network import Network
    from nnlib.lesson04_collectives.collectives import broadcast_new
    from nnlib.lesson14_asynchronous.asynchronous import train_async

    inputs, labels = broadcast_new(comm, data[0]), broadcast_new(comm, data[1])
    xp, gpus = job_device(args, comm)
    network = Network((784, *args.hidden, 10), output=args.output_layer, dtype=args.dtype, seed=args.seed, device=xp)
    bound = "unbounded" if args.staleness is None else f"at most {args.staleness} steps ahead"
    if comm.rank == 0:
        print(f"{comm.size} ranks: a parameter server and {comm.size - 1} workers (staleness {bound}), network "
              f"{'-'.join(map(str, network.layer_sizes))}, {args.samples} samples, global batch {args.batch_size}"
              + ("; plain SGD, --momentum is not used" if settings.momentum else "")
              + (f"; GPU of each rank: {gpus}" if gpus[0] is not None else ""), flush=True)
    history = train_async(comm, network, inputs, labels, settings, staleness=args.staleness, slow=parse_slow(args.slow))
    if comm.rank == 0:
        report_asynchronous(args, comm.size, history, network, test)
        if args.trace:
            from nnlib.course.trace import update_instants
            save_trace(args.trace, [], update_instants(history.worker, history.seconds))
    return 0


def report_asynchronous(args, ranks: int, history, network, test) -> None:
    """On rank 0: every epoch's loss and accuracy, the test accuracy, the staleness; write --output if given."""
    for epoch, (loss, accuracy, seconds) in enumerate(zip(history.loss, history.train_accuracy, history.epoch_seconds)):
        print(f"epoch {epoch + 1}/{args.epochs}: loss {loss:.4f}, training accuracy {accuracy:.4f}, "
              f"{seconds:.2f} s from the start")
    staleness = np.array(history.staleness)
    test_accuracy = network.accuracy(*test)
    print(f"test accuracy {test_accuracy:.4f}; staleness: mean {staleness.mean():.2f}, largest {staleness.max()} "
          f"updates; updates per worker: {np.bincount(history.worker, minlength=ranks)[1:].tolist()}")
    save_output(args, params=network.state_dict()["params"], layer_sizes=network.layer_sizes, loss=history.loss,
                train_accuracy=history.train_accuracy, epoch_seconds=history.epoch_seconds, staleness=staleness,
                worker=history.worker, update_seconds=history.seconds, test_accuracy=test_accuracy,
                epoch_params=history.params, largest_lead=history.largest_lead, ranks=ranks, strategy="asynchronous")
