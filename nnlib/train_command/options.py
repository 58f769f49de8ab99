"""The batch job's options: each lesson's arguments, and the checks of them that every rank makes together.

:func:`check_settings` reads the arguments only (no I/O, no MPI): every rank reaches the same verdict from the
same arguments, before any collective, and rank 0 says it once.
"""

from __future__ import annotations

import argparse

LESSON = 13


JOB_STRATEGIES = ("parameter_server", "reduce_broadcast", "allreduce", "zero", "overlap", "fsdp")  # lessons 05, 08, 12


FAULTS = ("raise", "exit", "kill", "hang")


TRACE_STEPS = 20  # --trace: the data-parallel steps whose phases are written


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


def job_settings(args):
    """The training settings of the job (nnlib.lesson03_training.training.Settings), checked with its other options."""
    from nnlib.lesson03_training.training import Settings

    return Settings(epochs=args.epochs, learning_rate=args.learning_rate, batch_size=args.batch_size or None,
                    momentum=args.momentum, seed=args.seed)


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


def memory_options_used(args) -> bool:
    return args.strategy == "fsdp" or args.recompute > 0 or args.accumulate > 1 or args.precision != "float32"


def pipeline_chunks(args) -> int:
    """v, the model chunks per pipeline rank: --virtual-stages, 2 for interleaved by default, else 1."""
    if args.schedule != "interleaved":
        return 1
    return args.virtual_stages or 2
