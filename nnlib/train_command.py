"""``mpiexec -n N python -m nnlib train ...``: data-parallel MNIST training as a batch job.

Rank 0 loads and verifies MNIST and scatters it; every rank trains its copy of the network on
its shard; rank 0 prints one progress line per epoch, each rank's time per phase, the test
accuracy, and writes the history and weights to ``--output`` (a .npz file, written to a
temporary file first and then renamed, so an interrupted job never leaves half a file).

When things go wrong:

* every collective has a deadline (``--timeout`` seconds, see nnlib.watchdog);
* a bad setting found by every rank together is said once, by rank 0, and the job exits 2;
* an error on some ranks only (a rank raising, a collective past its deadline) is printed by
  that rank with its traceback, and the rank ends the whole job with ``MPI_Abort`` (exit
  status 1), as ``python -m mpi4py`` does: never a hang;
* ``--checkpoint-dir DIR`` writes a checkpoint there (``--checkpoint-every N`` steps, else
  once per epoch); ``--resume`` continues from the newest one, exactly (nnlib.checkpoint);
* ``--fault RANK:STEP:KIND`` makes one rank fail after global step STEP (raise, exit, kill
  with SIGKILL, or hang), for lessons and tests.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from .files import atomic_write


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .parallel import STRATEGIES

    parser.add_argument("--strategy", choices=STRATEGIES, default="allreduce",
                        help="how gradients are combined (zero: ZeRO stages 1-2; overlap: sent during backward)")
    parser.add_argument("--sampler", choices=("exact", "per_rank"), default="exact",
                        help="exact: the sequential run's batches; per_rank: each rank samples its own shard")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch (0: full batch)")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128], help="hidden layer sizes")
    parser.add_argument("--output-layer", choices=("sigmoid", "softmax"), default="sigmoid")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--samples", type=int, default=60000, help="use the first N training samples")
    parser.add_argument("--data-dir", default=None, help="MNIST folder (default: $NNLIB_DATA, then the cache)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default=None, help="write history and weights here (.npz), from rank 0")
    parser.add_argument("--device", choices=("cpu", "gpu", "auto"), default="cpu",
                        help="where each rank trains: cpu, gpu (one GPU per rank of a node, shared round-robin "
                             "if there are more ranks than GPUs) or auto (the GPU if usable)")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS threads per rank (default 1: with more, the ranks fight over the cores)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds a rank waits in a collective before stopping the job with an error naming "
                             "the ranks that did not arrive (default: $NNLIB_TIMEOUT, else 120)")
    parser.add_argument("--checkpoint-dir", default=None, help="write checkpoints into this folder (rank 0)")
    parser.add_argument("--checkpoint-every", type=int, default=0,
                        help="steps between checkpoints (default 0: at the end of every epoch)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in --checkpoint-dir (same settings; any number "
                             "of ranks)")
    parser.add_argument("--model-parallel", choices=("none", "tensor", "pipeline"), default="none",
                        help="split the model too (lesson 09): tensor (hidden units) or pipeline (layers) inside "
                             "replicas of --model-size ranks; data parallelism across the replicas")
    parser.add_argument("--model-size", type=int, default=0,
                        help="ranks per model replica with --model-parallel (default 0: all ranks, one replica)")
    parser.add_argument("--micro-batches", type=int, default=4, help="micro-batches per step (pipeline)")
    parser.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b", help="pipeline schedule")
    parser.add_argument("--fault", default=None, metavar="RANK:STEP:KIND",
                        help="for lessons and tests: rank RANK fails after global step STEP; KIND is raise, exit, "
                             "kill (SIGKILL) or hang")


FAULTS = ("raise", "exit", "kill", "hang")
ABORT_GRACE = 10  # seconds MPI_Abort may take before the rank ends itself (SIGALRM)
RELAY_PAUSE = 1.0  # seconds for mpiexec to relay what a rank printed before MPI_Abort ends the job


def parse_fault(text):
    """'1:40:kill' -> (1, 40, 'kill'); None -> None; ValueError saying the format otherwise."""
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or parts[2] not in FAULTS:
        raise ValueError(f"--fault must be RANK:STEP:KIND with KIND one of {', '.join(FAULTS)} (e.g. 1:40:kill); "
                         f"got {text!r}")
    return int(parts[0]), int(parts[1]), parts[2]


def fault_injector(fault, rank):
    """An on_step hook for train_parallel making this rank fail as ``fault`` says (None: no hook)."""
    if fault is None or fault[0] != rank:
        return None
    _, at_step, kind = fault

    def inject(epoch, step, total_steps):
        if total_steps != at_step:
            return
        print(f"rank {rank}: injecting the fault '{kind}' after step {total_steps}", file=sys.stderr, flush=True)
        if kind == "raise":
            raise RuntimeError(f"injected fault: rank {rank} raised after step {total_steps}")
        if kind == "exit":
            os._exit(3)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        while True:  # hang
            time.sleep(1)

    return inject


def run(args) -> int:
    """The batch job; an error on some ranks only ends the whole job with MPI_Abort (never a hang)."""
    from mpi4py import MPI

    try:
        return train_job(args)
    except Exception as error:
        if getattr(error, "agreed", False):  # every rank has it: rank 0 says it once
            if MPI.COMM_WORLD.rank == 0:
                print(f"error: {error}", file=sys.stderr, flush=True)
            return 2
        abort_job(error)
    except KeyboardInterrupt as error:
        abort_job(error)


def abort_job(error: BaseException) -> None:
    """Print this rank's error (with its traceback, unless it is a watchdog's verdict), then MPI_Abort."""
    from mpi4py import MPI

    from .watchdog import CollectiveTimeout

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
    from mpi4py import MPI
    from threadpoolctl import threadpool_limits

    from . import data
    from .checkpoint import CheckpointFolder
    from .network import Network
    from .backend import cuda_aware_mpi, gpu_status, is_numpy, use_gpu_of_local_rank
    from .parallel import agree, fail_together, gather_phase_seconds, shard, train_parallel
    from .watchdog import agreed, watch

    threadpool_limits(args.threads)  # one BLAS thread per rank unless told otherwise
    try:  # every rank parses the same arguments: the same verdict everywhere, before any collective
        fault = parse_fault(args.fault)
        if args.resume and not args.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir (the folder of the run to continue)")
        if args.checkpoint_every < 0:
            raise ValueError(f"--checkpoint-every must be 0 (once per epoch) or a number of steps; "
                             f"got {args.checkpoint_every}")
        checkpoints = CheckpointFolder(args.checkpoint_dir, args.checkpoint_every or None) \
            if args.checkpoint_dir else None
        if args.model_parallel != "none":
            check_model_parallel(args)
        comm = watch(MPI.COMM_WORLD, args.timeout)  # the set-up's collectives have a deadline too
    except ValueError as problem:
        raise agreed(problem) from None
    rank = comm.rank
    error = None
    inputs = labels = test_inputs = test_labels = None
    if rank == 0:
        try:
            if args.output and not Path(args.output).expanduser().resolve().parent.is_dir():
                raise ValueError(f"--output {args.output}: its folder does not exist")
            mnist = data.load_mnist(args.data_dir, progress=False)
            if not 1 <= args.samples <= len(mnist.train_images):
                raise ValueError(f"--samples must be between 1 and {len(mnist.train_images)}; got {args.samples}")
            inputs = data.scale_pixels(mnist.train_images[:args.samples], args.dtype)
            labels = mnist.train_labels[:args.samples].astype(np.int64)
            test_inputs = data.scale_pixels(mnist.test_images, args.dtype)
            test_labels = mnist.test_labels.astype(np.int64)
        except (data.MNISTError, ValueError) as problem:
            error = str(problem)
    error = comm.bcast(error, root=0)
    if error:
        raise agreed(ValueError(error))

    if args.model_parallel != "none":
        return model_parallel_job(args, comm, inputs, labels, test_inputs, test_labels)
    gpu_index = use_gpu_of_local_rank(MPI.COMM_WORLD) if args.device != "cpu" else None
    try:
        network = Network((784, *args.hidden, 10), output=args.output_layer, dtype=args.dtype, seed=args.seed,
                          device=args.device)
        problem = None
    except RuntimeError as no_gpu:  # --device gpu without a usable GPU on this rank
        network, problem = None, str(no_gpu)
    fail_together(comm, problem)
    on_gpu = not is_numpy(network.xp)
    agree(comm, "the device (--device auto found a GPU on some ranks only)", on_gpu)
    local_inputs, local_labels, start = shard(comm, inputs, labels)
    if rank == 0:
        print(f"{comm.size} ranks, strategy {args.strategy}, network {'-'.join(map(str, network.layer_sizes))}, "
              f"{args.samples} samples, global batch {args.batch_size or 'full'}", flush=True)
    gpus = comm.gather(gpu_index if on_gpu else None, root=0)
    if rank == 0 and on_gpu:
        print(f"on the GPU ({gpu_status()[1]}); GPU of each rank: {gpus}; gradients "
              f"{'passed directly (CUDA-aware MPI)' if cuda_aware_mpi() else 'staged through host memory'}",
              flush=True)
    history = train_parallel(
        comm, network, local_inputs, local_labels, num_samples=args.samples, start=start,
        epochs=args.epochs, learning_rate=args.learning_rate, batch_size=args.batch_size or None,
        momentum=args.momentum, seed=args.seed, strategy=args.strategy, sampler=args.sampler, progress=True,
        timeout=comm.timeout, checkpoints=checkpoints, resume=args.resume,
        on_step=fault_injector(fault, rank))

    phases = gather_phase_seconds(comm, history)
    if rank == 0:
        report(args, comm.size, history, phases, network.accuracy(test_inputs, test_labels), network.get_params(),
               network.layer_sizes, args.strategy)
    return 0


def report(args, ranks, history, phases, test_accuracy, params, layer_sizes, strategy) -> None:
    """On rank 0: print the test accuracy and every rank's seconds per phase; write --output if given."""
    from .parallel import PHASES

    print(f"test accuracy {test_accuracy:.4f}; seconds per phase (summed over the run):")
    print("rank " + "".join(f"{phase:>12s}" for phase in PHASES))
    for rank_number, row in enumerate(phases):
        print(f"{rank_number:4d} " + "".join(f"{value:12.3f}" for value in row))
    if args.output:
        save_npz(args.output, params=params, layer_sizes=np.array(layer_sizes), loss=np.array(history.loss),
                 train_accuracy=np.array(history.train_accuracy), epoch_seconds=np.array(history.seconds),
                 phase_seconds=phases, phases=np.array(PHASES), test_accuracy=np.array(test_accuracy),
                 ranks=np.array(ranks), strategy=np.array(strategy))
        print(f"wrote {args.output}")


def check_model_parallel(args) -> None:
    """What --model-parallel cannot be combined with (the same verdict on every rank: same arguments)."""
    if args.device != "cpu":
        raise ValueError("--model-parallel runs on the CPU only; drop --device")
    if args.checkpoint_dir:
        raise ValueError("--model-parallel does not write checkpoints yet (each rank holds a different piece); "
                         "drop --checkpoint-dir")
    if args.strategy != "allreduce":
        raise ValueError(f"--model-parallel uses --strategy allreduce across the replicas; got {args.strategy}")
    if args.model_size < 0:
        raise ValueError(f"--model-size must be 0 (all ranks) or a positive number; got {args.model_size}")


def model_parallel_job(args, comm, inputs, labels, test_inputs, test_labels) -> int:
    """--model-parallel tensor|pipeline: nnlib.hybrid's grid; every rank gets the data from rank 0."""
    from .collectives import broadcast_new
    from .hybrid import train_hybrid
    from .parallel import gather_phase_seconds

    inputs, labels, test_inputs, test_labels = (broadcast_new(comm, array) for array in
                                                (inputs, labels, test_inputs, test_labels))
    model_size = args.model_size or comm.size
    sizes = (784, *args.hidden, 10)
    if comm.rank == 0:
        print(f"{comm.size} ranks: {comm.size // model_size if comm.size % model_size == 0 else '?'} replica(s) of "
              f"{model_size} ({args.model_parallel} parallelism inside), network {'-'.join(map(str, sizes))}, "
              f"{args.samples} samples, global batch {args.batch_size or 'full'}", flush=True)
    network, history = train_hybrid(
        comm.comm, args.model_parallel, model_size, sizes, inputs, labels, output=args.output_layer, dtype=args.dtype,
        init_seed=args.seed, micro_batches=args.micro_batches, schedule=args.schedule, epochs=args.epochs,
        learning_rate=args.learning_rate, batch_size=args.batch_size or None, momentum=args.momentum, seed=args.seed,
        sampler=args.sampler, progress=True, timeout=comm.timeout)
    test_accuracy = network.accuracy(test_inputs, test_labels)  # every piece of each replica takes part
    params = network.full_params()
    phases = gather_phase_seconds(comm, history)
    if comm.rank == 0:
        report(args, comm.size, history, phases, test_accuracy, params, sizes, f"{args.model_parallel} x {model_size}")
    return 0


def save_npz(path, **arrays) -> None:
    """Write arrays to ``path`` (.npz) atomically (see nnlib.files.atomic_write)."""
    with atomic_write(path) as stream:
        np.savez(stream, **arrays)
