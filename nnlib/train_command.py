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
and --recompute, --accumulate and --precision with ``--model-parallel tensor``, --precision with pipeline.
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

from nnlib.lesson01_mnist.files import atomic_write

LESSON = 13  # the batch job: it offers every lesson's options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strategy", choices=JOB_STRATEGIES, default="allreduce",
                        help="how gradients are combined (zero: ZeRO stages 1-2; overlap: sent during backward)")
    parser.add_argument("--sampler", choices=("exact", "per_rank"), default="exact",
                        help="exact: the sequential run's batches; per_rank: each rank samples its own shard")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch (0: full batch)")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--hidden", type=int, nargs="+", default=[128], help="hidden layer sizes")
    parser.add_argument("--output-layer", choices=("sigmoid", "softmax"), default="sigmoid")
    parser.add_argument("--dtype", default="float32",
                        help="float32 or float64 (checked by every rank together, said once)")
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
    parser.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"), default="1f1b",
                        help="pipeline schedule (lesson 09: gpipe, 1f1b; lesson 13: interleaved 1F1B, the zero-bubble "
                             "ZB-H1 and ZB-H2)")
    parser.add_argument("--compression", default="none",
                        help="gradients sent as none (float64/32), float16, bfloat16, topk (with --topk K and "
                             "error feedback) or powersgd (with --rank R); with --strategy allreduce (lesson 11)")
    parser.add_argument("--topk", type=int, default=None, help="K, the gradient entries each rank sends (topk)")
    parser.add_argument("--asynchronous", action="store_true",
                        help="rank 0 is a parameter server applying each worker's gradient as it arrives; the "
                             "workers (ranks 1..N-1) sample their own shards; plain SGD (no momentum)")
    parser.add_argument("--staleness", type=int, default=None,
                        help="with --asynchronous: no worker more than S steps ahead of the slowest (0: synchronous; "
                             "default: unbounded)")
    parser.add_argument("--slow", default=None, metavar="RANK:SECONDS",
                        help="make rank RANK a straggler: SECONDS more per step")
    add_talking_less_arguments(parser)
    add_memory_arguments(parser)
    parser.add_argument("--fault", default=None, metavar="RANK:STEP:KIND",
                        help="for lessons and tests: rank RANK fails after global step STEP; KIND is raise, exit, "
                             "kill (SIGKILL) or hang")
    add_schedule_arguments(parser)


def add_schedule_arguments(parser: argparse.ArgumentParser) -> None:
    """Lesson 13's options: the interleaved schedule's chunks per rank, and a trace of the run."""
    parser.add_argument("--virtual-stages", type=int, default=None,
                        help="with --schedule interleaved: model chunks per pipeline rank, v (default 2)")
    parser.add_argument("--trace", default=None, metavar="FILE",
                        help="write a Chrome trace-event JSON file (open it in ui.perfetto.dev): each rank's phases "
                             f"of the first {TRACE_STEPS} steps, the pipeline stages' last step, or the parameter "
                             "server's updates")


TRACE_STEPS = 20  # --trace: the data-parallel steps whose phases are written


def add_talking_less_arguments(parser: argparse.ArgumentParser) -> None:
    """Lesson 11's PowerSGD and local SGD / DiLoCo options."""
    parser.add_argument("--rank", type=int, default=None,
                        help="with --compression powersgd: R, the rank of each weight gradient's approximation")
    parser.add_argument("--local-steps", type=int, default=None, metavar="H",
                        help="local SGD / DiLoCo: each rank takes H steps alone, then the ranks average their "
                             "parameter changes (one Allreduce); needs --sampler per_rank")
    parser.add_argument("--outer-optimizer", choices=("average", "nesterov"), default="average",
                        help="with --local-steps: average (local SGD) or nesterov (DiLoCo, outer momentum 0.9)")
    parser.add_argument("--outer-learning-rate", type=float, default=None,
                        help="with --local-steps: the outer step's rate (default 1 for average, 0.7 for nesterov)")


JOB_STRATEGIES = ("parameter_server", "reduce_broadcast", "allreduce", "zero", "overlap", "fsdp")  # lessons 05, 08, 12
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


def parse_slow(text):
    """'1:0.05' -> {1: 0.05}; None -> {}; ValueError saying the format otherwise."""
    if text is None:
        return {}
    parts = text.split(":")
    try:
        rank, seconds = int(parts[0]), float(parts[1])
        if len(parts) != 2 or rank < 0 or not 0 <= seconds < 60:
            raise ValueError
    except (ValueError, IndexError):
        raise ValueError(f"--slow must be RANK:SECONDS with SECONDS from 0 to 60 (e.g. 1:0.05); got {text!r}") from None
    return {rank: seconds}


def check_compression_and_asynchrony(args, ranks: int) -> None:
    """--compression, --topk, --asynchronous, --staleness, --slow: what each needs (same verdict on every rank)."""
    from nnlib.lesson02_network.network import count_parameters
    from nnlib.lesson11_beyond_sync.compression import check_method

    if args.dtype not in ("float32", "float64"):
        raise ValueError(f"--dtype must be float32 or float64 (the network's numbers; 16-bit formats are "
                         f"--compression float16 or bfloat16); got {args.dtype!r}")
    problems = [] if args.compression == "powersgd" else check_method(args.compression, args.topk,
                                                                      count_parameters((784, *args.hidden, 10)))
    if problems:
        raise ValueError(problems[0].replace("compression=", "--compression ").replace("k=", "--topk ")
                         .replace("needs k", "needs --topk K"))
    slow = parse_slow(args.slow)
    if any(rank >= ranks for rank in slow):
        raise ValueError(f"--slow names rank {next(iter(slow))}, but the job has ranks 0 to {ranks - 1}")
    if args.staleness is not None and not args.asynchronous:
        raise ValueError("--staleness bounds the asynchronous parameter server: add --asynchronous")
    if args.staleness is not None and args.staleness < 0:
        raise ValueError(f"--staleness must be a whole number of steps, 0 or more; got {args.staleness}")
    if args.compression != "none" and args.strategy != "allreduce":
        raise ValueError(f"--compression goes with --strategy allreduce; got {args.strategy}")
    if not args.asynchronous:
        return
    if ranks < 2:
        raise ValueError("--asynchronous needs a server and at least one worker: run with mpiexec -n 2 or more")
    if 0 in slow:
        raise ValueError("--slow with --asynchronous must name a worker (rank 1 or more): rank 0 is the server")
    for given, name in [(args.compression != "none", "--compression"), (args.checkpoint_dir, "--checkpoint-dir"),
                        (args.model_parallel != "none", "--model-parallel"), (args.device != "cpu", "--device"),
                        (args.strategy != "allreduce", "--strategy"), (args.fault, "--fault")]:
        if given:
            raise ValueError(f"--asynchronous does not go with {name} (yet): drop one of them")
    if args.local_steps is not None:
        raise ValueError("--asynchronous does not go with --local-steps: the server applies every gradient as it "
                         "arrives, local SGD averages every H steps together; drop one of them")
    if not args.batch_size:
        raise ValueError("--asynchronous needs mini-batches: give --batch-size (the global batch, shared by the workers)")


def check_talking_less(args) -> None:
    """--compression powersgd --rank, --local-steps and the outer optimizer: what each needs and refuses (lesson 11)."""
    from nnlib.lesson11_beyond_sync.local_sgd import DILOCO_MOMENTUM, check_local_sgd
    from nnlib.lesson11_beyond_sync.powersgd import check_rank

    if args.compression == "powersgd" and check_rank(args.rank):
        raise ValueError(f"--compression powersgd needs --rank R, a whole number, 1 or more; got {args.rank}")
    if args.compression != "powersgd" and args.rank is not None:
        raise ValueError("--rank is PowerSGD's: add --compression powersgd, or drop --rank")
    if args.compression == "powersgd" and args.checkpoint_dir:
        raise ValueError("checkpoints do not keep PowerSGD's Q and residuals: drop --checkpoint-dir")
    if args.compression != "none" and args.model_parallel != "none":
        raise ValueError("--compression compresses data parallelism's gradients: it does not go with "
                         "--model-parallel; drop one of them")
    if args.local_steps is None:
        if args.outer_optimizer != "average" or args.outer_learning_rate is not None:
            raise ValueError("--outer-optimizer and --outer-learning-rate are local SGD's: add --local-steps H")
        return
    problems = check_local_sgd(args.local_steps, args.outer_optimizer, args.outer_learning_rate, DILOCO_MOMENTUM)
    if problems:
        raise ValueError("; ".join(problems).replace("the local steps H", "--local-steps H")
                         .replace("the outer learning rate", "--outer-learning-rate"))
    for given, name in [(args.compression != "none", "--compression (it sends parameter changes, not gradients)"),
                        (args.strategy != "allreduce", "--strategy"), (args.model_parallel != "none", "--model-parallel"),
                        (args.checkpoint_dir, "--checkpoint-dir")]:
        if given:
            raise ValueError(f"--local-steps does not go with {name}: drop one of them")
    if args.sampler != "per_rank" or not args.batch_size:
        raise ValueError("--local-steps needs --sampler per_rank and mini-batches (--batch-size): each rank steps "
                         "on batches of its own shard")


def straggler(slow: dict, rank: int):
    """A function (epoch, step, total_steps) making this rank ``slow[rank]`` seconds slower per step (None: not slowed)."""
    if rank not in slow:
        return None

    def wait(epoch, step, total_steps):
        time.sleep(slow[rank])

    return wait


def fault_injector(fault, rank):
    """A function (epoch, step, total_steps) making this rank fail as ``fault`` says after that step (None: none)."""
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

    from nnlib.lesson10_faults.watchdog import CollectiveTimeout

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


def check_settings(args, ranks: int) -> None:
    """ValueError for options that cannot go together on ``ranks`` ranks (no I/O, no MPI: every rank
    reaches the same verdict from the same arguments, before any collective)."""
    problems = job_settings(args).problems()  # epochs, rate, batch, momentum, seed: nnlib.lesson03_training.training.Settings
    if problems:
        raise ValueError("; ".join(problems))
    if args.resume and not args.checkpoint_dir:
        raise ValueError("--resume needs --checkpoint-dir (the folder of the run to continue)")
    if args.checkpoint_every < 0:
        raise ValueError(f"--checkpoint-every must be 0 (once per epoch) or a number of steps; "
                         f"got {args.checkpoint_every}")
    if args.model_parallel != "none":
        check_model_parallel(args)
    check_compression_and_asynchrony(args, ranks)
    check_schedule_and_trace(args)
    check_talking_less(args)
    check_memory_options(args)


def train_job(args) -> int:
    from mpi4py import MPI
    from threadpoolctl import threadpool_limits

    from nnlib.lesson04_collectives.collectives import raised_on_every_rank
    from nnlib.lesson10_faults.watchdog import watch

    threadpool_limits(args.threads)  # one BLAS thread per rank unless told otherwise
    try:  # every rank parses the same arguments: the same verdict everywhere, before any collective
        settings = job_settings(args)
        parse_fault(args.fault)
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


def job_settings(args):
    """The training settings of the job (nnlib.lesson03_training.training.Settings), checked with its other options."""
    from nnlib.lesson03_training.training import Settings

    return Settings(epochs=args.epochs, learning_rate=args.learning_rate, batch_size=args.batch_size or None,
                    momentum=args.momentum, seed=args.seed)


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


def job_network(args, comm):
    """This rank's network, on its GPU with --device gpu or auto (one GPU per rank of a node); (network, GPU index)."""
    from mpi4py import MPI

    from nnlib.lesson02_network.arrays import is_numpy
    from nnlib.lesson02_network.network import Network
    from nnlib.lesson04_collectives.collectives import fail_together, require_same_on_every_rank
    from nnlib.lesson07_gpu.backend import resolve_backend, use_gpu_of_local_rank

    gpu_index = use_gpu_of_local_rank(MPI.COMM_WORLD) if args.device != "cpu" else None
    try:
        network = Network((784, *args.hidden, 10), output=args.output_layer, dtype=args.dtype, seed=args.seed,
                          device=resolve_backend(args.device))
        problem = None
    except RuntimeError as no_gpu:  # --device gpu without a usable GPU on this rank
        network, problem = None, str(no_gpu)
    fail_together(comm, problem)
    require_same_on_every_rank(comm, "the device (--device auto found a GPU on some ranks only)",
                               not is_numpy(network.xp))
    return network, gpu_index


def job_strategy(args):
    """What train_parallel takes for --strategy, --compression and --local-steps."""
    if args.local_steps is not None:
        from nnlib.lesson11_beyond_sync.local_sgd import local_sgd

        return local_sgd(args.local_steps, args.outer_optimizer, args.outer_learning_rate)
    if args.compression == "powersgd":
        from nnlib.lesson11_beyond_sync.powersgd import powersgd

        return powersgd(args.rank, seed=args.seed)
    if args.compression != "none":
        from nnlib.lesson11_beyond_sync.compression import compressed

        return compressed(args.compression, args.topk)
    from nnlib.lesson05_data_parallel.data_parallel import Allreduce
    from nnlib.lesson08_inside_allreduce.overlap import Overlap
    from nnlib.lesson08_inside_allreduce.zero import ZeRO
    from nnlib.lesson12_memory.fsdp import FullySharded

    sync = {"zero": ZeRO, "overlap": Overlap, "fsdp": FullySharded, "allreduce": Allreduce}.get(args.strategy)
    if args.precision != "float32":  # (allreduce, zero or fsdp: check_precision)
        from nnlib.lesson12_memory.mixed_precision import loss_scaled

        return loss_scaled(sync)
    return sync if args.strategy in ("zero", "overlap", "fsdp") else args.strategy


def job_hooks(args, comm, network) -> list:
    """The training loop's hooks for the job's options: deadlines' notes, the GPU's waits, checkpoints, faults."""
    from nnlib.lesson02_network.arrays import is_numpy
    from nnlib.lesson03_training.training import EveryStep
    from nnlib.lesson07_gpu.backend import WaitForDevice
    from nnlib.lesson10_faults.checkpoint import CheckpointFolder, Checkpointing
    from nnlib.lesson10_faults.watchdog import RunNotes

    hooks = [RunNotes(comm)]
    for action in (fault_injector(parse_fault(args.fault), comm.rank), straggler(parse_slow(args.slow), comm.rank)):
        if action is not None:  # a fault after step S comes before the checkpoint after step S, as it would
            hooks.append(EveryStep(action))
    if not is_numpy(network.xp):
        hooks.append(WaitForDevice(network.xp))  # so each phase's time is its own
    if args.checkpoint_dir:
        folder = CheckpointFolder(args.checkpoint_dir, args.checkpoint_every or None)
        hooks.append(Checkpointing(folder, args.resume, progress=True))
    return hooks


def data_parallel_job(args, comm, settings, data, test) -> int:
    """The data-parallel job: shard, train (nnlib.lesson05_data_parallel.train_parallel), report."""
    from nnlib.lesson02_network.arrays import is_numpy
    from nnlib.lesson05_data_parallel import gather_phase_seconds, gather_timeline, shard, train_parallel
    from nnlib.lesson07_gpu.backend import HostStaging
    from nnlib.lesson08_inside_allreduce.sampling import PerRankBatches
    from nnlib.lesson11_beyond_sync.compression import CountingComm

    network, gpu_index = job_memory_network(args, comm) if memory_options_used(args) else job_network(args, comm)
    on_gpu = not is_numpy(network.xp)
    local_inputs, local_labels, start = shard(comm, *data)
    announce(args, comm, network, comm.gather(gpu_index if on_gpu else None, root=0))
    counting = CountingComm(comm)  # (what each rank hands to Allreduce and Allgather: lesson 11)
    with comm.guard():  # a rank that raises tells the others, which stop at once
        history = train_parallel(HostStaging(counting, network.xp) if on_gpu else counting, network, local_inputs,
                                 local_labels, num_samples=args.samples, start=start, settings=settings,
                                 strategy=job_strategy(args), progress=True, hooks=job_hooks(args, comm, network),
                                 batches=PerRankBatches if args.sampler == "per_rank" else None,
                                 timeline_steps=TRACE_STEPS if args.trace else 0)
    phases = gather_phase_seconds(comm, history)
    timelines = gather_timeline(comm, history) if args.trace else None
    if comm.rank == 0 and args.trace:
        from nnlib.lesson04_collectives.trace import phase_spans
        save_trace(args.trace, phase_spans(timelines))
    test_accuracy, params = job_results(args, comm, network, test)
    if comm.rank == 0:
        report(args, comm.size, history, phases, test_accuracy, params, network.layer_sizes,
               dict(strategy=np.array(args.strategy), **sent_arrays(args, counting, history)))
    return 0


def sent_arrays(args, counting, history) -> dict:
    """With compression or local steps, rank 0 says what it handed to Allreduce and Allgather; the arrays to save:
    sent_collectives (names), sent_message_bytes, sent_counts (one per kind of call), sent_bytes (the total)."""
    calls = sorted(counting.calls.items())
    if args.compression != "none" or args.local_steps is not None:
        print(f"sent by rank 0: {counting.bytes_sent:,} bytes in {sum(count for _, count in calls)} calls "
              f"({counting.bytes_sent / history.steps:,.0f} bytes per step on average)", flush=True)
    return dict(sent_collectives=np.array([name for (name, _), _ in calls]),
                sent_message_bytes=np.array([nbytes for (_, nbytes), _ in calls]),
                sent_counts=np.array([count for _, count in calls]), sent_bytes=np.array(counting.bytes_sent))


def announce(args, comm, network, gpus) -> None:
    """Rank 0 says what the job runs: ranks, strategy, network, samples, batch; compression and GPUs."""
    from nnlib.lesson07_gpu.backend import cuda_aware_mpi, gpu_status

    if comm.rank != 0:
        return
    print(f"{comm.size} ranks, strategy {args.strategy}, network {'-'.join(map(str, network.layer_sizes))}, "
          f"{args.samples} samples, global batch {args.batch_size or 'full'}", flush=True)
    if args.compression == "powersgd" or args.local_steps is not None:
        announce_talking_less(args, network)
    elif args.compression != "none":
        from nnlib.lesson11_beyond_sync.compression import message_bytes

        print(f"gradients compressed: {args.compression}{f' (k = {args.topk})' if args.topk else ''}, "
              f"{message_bytes(args.compression, network.num_params, args.topk, network.params.dtype.itemsize):,} "
              f"bytes per rank per step instead of {network.params.nbytes:,}", flush=True)
    announce_memory(args)
    if any(gpu is not None for gpu in gpus):
        print(f"on the GPU ({gpu_status()[1]}); GPU of each rank: {gpus}; gradients "
              f"{'passed directly (CUDA-aware MPI)' if cuda_aware_mpi() else 'staged through host memory'}",
              flush=True)


def announce_memory(args) -> None:
    """Rank 0 says lesson 12's options, if any are used."""
    if memory_options_used(args):
        print(f"memory: strategy {args.strategy}, recompute every {args.recompute or 'none'}, "
              f"{args.accumulate} micro-batch(es) per step, precision {args.precision}", flush=True)


def announce_talking_less(args, network) -> None:
    """Rank 0 says what PowerSGD sends per step, or how often local SGD talks."""
    if args.local_steps is not None:
        kind = "DiLoCo (Nesterov outer steps)" if args.outer_optimizer == "nesterov" else "local SGD (averaging)"
        print(f"{kind}: each rank takes {args.local_steps} steps alone, then one Allreduce of "
              f"{network.params.nbytes:,} bytes (and at the end of every epoch)", flush=True)
        return
    from nnlib.lesson11_beyond_sync.powersgd import message_bytes

    first, second = message_bytes(network.layer_sizes, args.rank, network.params.dtype.itemsize)
    print(f"gradients compressed: powersgd (rank {args.rank}), two Allreduces of {first:,} and {second:,} bytes "
          f"per rank per step instead of {network.params.nbytes:,}", flush=True)


def report(args, ranks, history, phases, test_accuracy, params, layer_sizes, more: dict) -> None:
    """On rank 0: print the test accuracy and every rank's seconds per phase; write --output if given, with the
    arrays of ``more`` (the strategy's name among them)."""
    from nnlib.lesson05_data_parallel import PHASES

    print(f"test accuracy {test_accuracy:.4f}; seconds per phase (summed over the run):")
    print("rank " + "".join(f"{phase:>12s}" for phase in PHASES))
    for rank_number, row in enumerate(phases):
        print(f"{rank_number:4d} " + "".join(f"{value:12.3f}" for value in row))
    if args.output:
        save_npz(args.output, params=params, layer_sizes=np.array(layer_sizes), loss=np.array(history.loss),
                 train_accuracy=np.array(history.train_accuracy), epoch_seconds=np.array(history.seconds),
                 phase_seconds=phases, phases=np.array(PHASES), test_accuracy=np.array(test_accuracy),
                 ranks=np.array(ranks), **more)
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


def model_parallel_job(args, comm, settings, data, test) -> int:
    """--model-parallel tensor|pipeline: nnlib.lesson09_model_parallel.grid's grid; every rank gets the data from rank 0."""
    from nnlib.lesson04_collectives.collectives import broadcast_new
    from nnlib.lesson05_data_parallel import gather_phase_seconds
    from nnlib.lesson08_inside_allreduce.sampling import PerRankBatches
    from nnlib.lesson09_model_parallel.grid import train_hybrid
    from nnlib.lesson09_model_parallel.tensor import TensorParallelMLP
    from nnlib.lesson13_pipeline_schedules.schedules import MixedScheduledPipeline, ScheduledPipeline

    (inputs, labels), (test_inputs, test_labels) = [(broadcast_new(comm, first), broadcast_new(comm, second))
                                                    for first, second in (data, test)]
    model_size = args.model_size or comm.size
    sizes = (784, *args.hidden, 10)
    if comm.rank == 0:
        print(f"{comm.size} ranks: {comm.size // model_size if comm.size % model_size == 0 else '?'} replica(s) of "
              f"{model_size} ({args.model_parallel} parallelism inside), network {'-'.join(map(str, sizes))}, "
              f"{args.samples} samples, global batch {args.batch_size or 'full'}", flush=True)
        announce_memory(args)
    model = dict(layer_sizes=sizes, output=args.output_layer, dtype=args.dtype, seed=args.seed)

    def build_piece(model_comm):  # this rank's piece of its replica (model_comm is watched, as comm)
        if args.model_parallel == "tensor":
            piece = TensorParallelMLP(model_comm, **model)
            return memory_wrapped(args, piece) if memory_options_used(args) else piece
        if args.precision != "float32":
            return MixedScheduledPipeline(model_comm, **model, micro_batches=args.micro_batches,
                                          schedule=args.schedule, chunks=pipeline_chunks(args),
                                          precision=args.precision)
        return ScheduledPipeline(model_comm, **model, micro_batches=args.micro_batches, schedule=args.schedule,
                                 chunks=pipeline_chunks(args))

    with comm.guard():  # the grid's communicators are split from the watched comm: every message has a deadline
        network, history = train_hybrid(
            comm, model_size, build_piece, inputs, labels, strategy=job_strategy(args),
            settings=settings, batches=PerRankBatches if args.sampler == "per_rank" else None,
            progress=comm.rank == 0)  # (each piece's data_comm has a rank 0: one line, from world rank 0)
    test_accuracy = network.accuracy(test_inputs, test_labels)  # every piece of each replica takes part
    params = network.full_params()
    phases = gather_phase_seconds(comm, history)
    timelines = comm.gather((network.timeline, network.timeline_chunks) if args.trace else ([], []), root=0)
    if comm.rank == 0:
        report(args, comm.size, history, phases, test_accuracy, params, sizes,
               dict(strategy=np.array(f"{args.model_parallel} x {model_size}")))
        if args.trace:
            from nnlib.lesson04_collectives.trace import pipeline_spans
            save_trace(args.trace, pipeline_spans(*zip(*timelines), stages=model_size))  # last step, chunks named
    return 0


def asynchronous_job(args, comm, settings, data, test) -> int:
    """--asynchronous: nnlib.lesson11_beyond_sync.asynchronous's parameter server on rank 0; every rank gets the data
    from rank 0."""
    from nnlib.lesson02_network.network import Network
    from nnlib.lesson04_collectives.collectives import broadcast_new
    from nnlib.lesson11_beyond_sync.asynchronous import train_async

    inputs, labels = broadcast_new(comm, data[0]), broadcast_new(comm, data[1])
    network = Network((784, *args.hidden, 10), output=args.output_layer, dtype=args.dtype, seed=args.seed)
    bound = "unbounded" if args.staleness is None else f"at most {args.staleness} steps ahead"
    if comm.rank == 0:
        print(f"{comm.size} ranks: a parameter server and {comm.size - 1} workers (staleness {bound}), network "
              f"{'-'.join(map(str, network.layer_sizes))}, {args.samples} samples, global batch {args.batch_size}"
              + ("; plain SGD, --momentum is not used" if args.momentum else ""), flush=True)
    history = train_async(comm, network, inputs, labels, settings, staleness=args.staleness, slow=parse_slow(args.slow))
    if comm.rank == 0:
        report_asynchronous(args, comm.size, history, network, test)
        if args.trace:
            from nnlib.lesson04_collectives.trace import update_instants
            save_trace(args.trace, [], update_instants(history.worker, history.seconds))
    return 0


def report_asynchronous(args, ranks: int, history, network, test) -> None:
    """On rank 0: every epoch's loss and accuracy, the test accuracy, the staleness; write --output if given."""
    for epoch, (loss, accuracy, seconds) in enumerate(zip(history.loss, history.train_accuracy,
                                                          history.epoch_seconds)):
        print(f"epoch {epoch + 1}/{args.epochs}: loss {loss:.4f}, training accuracy {accuracy:.4f}, "
              f"{seconds:.2f} s from the start")
    staleness = np.array(history.staleness)
    test_accuracy = network.accuracy(*test)
    print(f"test accuracy {test_accuracy:.4f}; staleness: mean {staleness.mean():.2f}, largest {staleness.max()} "
          f"updates; updates per worker: {np.bincount(history.worker, minlength=ranks)[1:].tolist()}")
    if args.output:
        save_npz(args.output, params=network.get_params(), layer_sizes=np.array(network.layer_sizes),
                 loss=np.array(history.loss), train_accuracy=np.array(history.train_accuracy),
                 epoch_seconds=np.array(history.epoch_seconds), staleness=staleness, worker=np.array(history.worker),
                 update_seconds=np.array(history.seconds), test_accuracy=np.array(test_accuracy),
                 epoch_params=np.array(history.params), ranks=np.array(ranks), strategy=np.array("asynchronous"))
        print(f"wrote {args.output}")


# -- lesson 13: pipeline schedules and traces ---------------------------------------------------------

def check_schedule_and_trace(args) -> None:
    """--virtual-stages only with --schedule interleaved (and --model-parallel pipeline); --trace not with tensor."""
    if args.virtual_stages is not None and args.schedule != "interleaved":
        raise ValueError(f"--virtual-stages goes with --schedule interleaved; got --schedule {args.schedule}")
    if args.virtual_stages is not None and args.virtual_stages < 1:
        raise ValueError(f"--virtual-stages must be a positive number; got {args.virtual_stages}")
    if args.schedule in ("interleaved", "zb-h1", "zb-h2") and args.model_parallel != "pipeline":
        raise ValueError(f"--schedule {args.schedule} needs --model-parallel pipeline")
    if args.trace and args.model_parallel == "tensor":
        raise ValueError("--trace records data-parallel phases, pipeline stages or asynchronous updates; "
                         "tensor parallelism keeps no timeline: drop --trace")


def pipeline_chunks(args) -> int:
    """v, the model chunks per pipeline rank: --virtual-stages, 2 for interleaved by default, else 1."""
    if args.schedule != "interleaved":
        return 1
    return args.virtual_stages or 2


def save_trace(path, spans, instants=()) -> None:
    """Write --trace (rank 0) and say so."""
    from nnlib.lesson04_collectives.trace import write_trace

    write_trace(path, spans, instants)
    print(f"wrote the trace {path} (open it in ui.perfetto.dev or chrome://tracing)")


def save_npz(path, **arrays) -> None:
    """Write arrays to ``path`` (.npz) atomically (see nnlib.lesson01_mnist.files.atomic_write)."""
    with atomic_write(path) as stream:
        np.savez(stream, **arrays)


# -- lesson 12's memory options ---------------------------------------------------------------------


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    """--recompute K, --accumulate K, --precision (--strategy fsdp is one of JOB_STRATEGIES)."""
    parser.add_argument("--recompute", type=int, default=0, metavar="K",
                        help="keep every K-th layer's activations, recompute the rest in backward (0: keep all)")
    parser.add_argument("--accumulate", type=int, default=1, metavar="K",
                        help="K micro-batches per step, nothing sent before the last (lesson 12)")
    parser.add_argument("--precision", choices=("float32", "float16", "bfloat16"), default="float32",
                        help="float16: weights, activations, gradients stored in float16, float32 master weights "
                             "and dynamic loss scaling; bfloat16: the same in bfloat16, unscaled (lesson 12; "
                             "with --strategy allreduce or fsdp)")


def memory_options_used(args) -> bool:
    return args.strategy == "fsdp" or args.recompute > 0 or args.accumulate > 1 or args.precision != "float32"


def check_memory_options(args) -> None:
    """What --strategy fsdp, --recompute and --accumulate need, and what they do not combine with."""
    if args.recompute < 0:
        raise ValueError(f"--recompute must be 0 (keep every activation) or K >= 1; got {args.recompute}")
    if args.accumulate < 1:
        raise ValueError(f"--accumulate must be at least 1 (micro-batches per step); got {args.accumulate}")
    if not memory_options_used(args):
        return
    used = ("--strategy fsdp" if args.strategy == "fsdp" else "--recompute/--accumulate"
            if args.recompute or args.accumulate > 1 else f"--precision {args.precision}")
    pipeline_refuses = args.model_parallel == "pipeline" and (args.recompute or args.accumulate > 1)
    for given, name in [(pipeline_refuses, "--model-parallel pipeline (its micro-batches are its accumulation; "
                         "it takes --precision; --model-parallel tensor takes all three)"),
                        (args.asynchronous, "--asynchronous"), (args.compression != "none", "--compression")]:
        if given:
            raise ValueError(f"{used} does not combine with {name} in the batch job")
    if args.strategy == "fsdp" and args.device != "cpu":
        raise ValueError("--strategy fsdp runs on --device cpu")
    check_precision(args)


def check_precision(args) -> None:
    """--precision float16 / bfloat16 go with --strategy allreduce, zero or fsdp, float32 master weights, on the CPU
    (with --recompute, --accumulate and --checkpoint-dir as they like)."""
    if args.precision == "float32":
        return
    if args.strategy not in ("allreduce", "zero", "fsdp"):
        raise ValueError(f"--precision {args.precision} goes with --strategy allreduce, zero or fsdp (every rank "
                         f"must reach the same overflow verdict: on the summed gradient, or one flag Allreduce over "
                         f"ZeRO's slices or FSDP's chunks); got --strategy {args.strategy}")
    if args.dtype != "float32" or args.device != "cpu":
        raise ValueError(f"--precision {args.precision} keeps float32 master weights (--dtype float32), "
                         f"on --device cpu")
    from nnlib.lesson12_memory.mixed_precision import low_precision

    low_precision(args.precision)  # bfloat16 without ml_dtypes: a clear error


def job_memory_network(args, comm):
    """The network for lesson 12's options: sharded (fsdp) or not, wrapped by memory_wrapped; (network, GPU index)."""
    from nnlib.lesson12_memory.fsdp import FullyShardedNetwork

    if args.strategy == "fsdp":
        network, gpu_index = FullyShardedNetwork(comm, (784, *args.hidden, 10), output=args.output_layer,
                                                 dtype=args.dtype, seed=args.seed), None
    else:
        network, gpu_index = job_network(args, comm)
    return memory_wrapped(args, network), gpu_index


def memory_wrapped(args, network):
    """``network`` (lesson 02's, FSDP's or a tensor-parallel piece) in MixedPrecision with --precision float16 or
    bfloat16, else in MicroBatched with --accumulate and --recompute."""
    from nnlib.lesson12_memory.accumulation import MicroBatched
    from nnlib.lesson12_memory.mixed_precision import MixedPrecision

    if args.precision != "float32":
        return MixedPrecision(network, precision=args.precision, micro_batches=args.accumulate,
                              recompute_every=args.recompute or None)
    return MicroBatched(network, args.accumulate, args.recompute or None)


def job_results(args, comm, network, test):
    """(test accuracy, the whole parameter vector) on rank 0 (None elsewhere); collective for fsdp."""
    if args.strategy == "fsdp":  # every rank scores its share of the test set: the forward pass is collective
        from nnlib.lesson05_data_parallel import shard

        local_inputs, local_labels, _ = shard(comm, *test)
        correct = comm.allreduce(round(network.accuracy(local_inputs, local_labels) * len(local_labels)))
        params = network.full_params()
        return correct / comm.allreduce(len(local_labels)), params
    if comm.rank != 0:
        return None, None
    return network.accuracy(*test), network.get_params()
