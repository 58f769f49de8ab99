"""The batch job's options: each lesson's arguments, one table of what combines with what (:data:`COMBINES`), and
the checks that every rank makes together (:func:`check_settings`)."""

from __future__ import annotations

import argparse

LESSON = 19


JOB_STRATEGIES = ("parameter_server", "reduce_broadcast", "allreduce", "zero", "overlap", "fsdp")  # lessons 06, 10, 16

FAULTS = ("raise", "exit", "kill", "hang")

TRACE_STEPS = 20  # --trace: the data-parallel steps whose phases are written


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every lesson's options: those of lessons 03-10 and 13 here, the later lessons' in add_later_arguments."""
    parser.add_argument("--strategy", choices=JOB_STRATEGIES, default="allreduce",
                        help="how gradients are combined (zero: ZeRO stages 1-2; overlap: sent during backward)")
    parser.add_argument("--zero-stage", type=int, choices=(1, 2), default=1,
                        help="with --strategy zero: 1 shards the optimizer's state; 2 the gradient too, "
                             "reduce-scattered bucket by bucket during backward")
    parser.add_argument("--sampler", choices=("exact", "per_rank"), default="exact",
                        help="exact: the sequential run's batches; per_rank: each rank samples its own shard")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch (0: full batch)")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--optimizer", choices=("sgd", "momentum", "adam", "adamw"), default="momentum",
                        help="sgd (plain), momentum (SGD with --momentum), adam, or adamw (Adam with --weight-decay)")
    parser.add_argument("--momentum", type=float, default=None, help="--optimizer momentum's mu (default 0.9)")
    parser.add_argument("--beta1", type=float, default=None, help="adam's and adamw's (default 0.9)")
    parser.add_argument("--beta2", type=float, default=None, help="adam's and adamw's (default 0.999)")
    parser.add_argument("--eps", type=float, default=None, help="adam's and adamw's (default 1e-8)")
    parser.add_argument("--weight-decay", type=float, default=None, help="adamw's decoupled decay (default 0.01)")
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
    parser.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint-dir "
                        "(same settings; any number of ranks)")
    parser.add_argument("--fault", default=None, metavar="RANK:STEP:KIND", help="for lessons and tests: rank RANK "
                        "fails after global step STEP; KIND is raise, exit, kill (SIGKILL) or hang")
    add_later_arguments(parser)


def add_later_arguments(parser: argparse.ArgumentParser) -> None:
    """Lessons 11, 12 and 19's grid of model and data parallelism, lesson 18's schedules and --trace, lesson 14's
    asynchrony, lesson 15's compression and local SGD, lessons 16 and 17's memory options (--strategy fsdp is one of
    JOB_STRATEGIES)."""
    parser.add_argument("--grid", default=None, metavar="D,T,P",
                        help="the layout of the ranks: D data-parallel replicas x T tensor ranks (hidden units "
                             "split, lesson 11) x P pipeline stages (layers split, lesson 12), D T P = the ranks "
                             "(lesson 19); default: every rank a replica. With T or P above 1, --strategy allreduce "
                             "or zero (stage 1) on the data axis")
    parser.add_argument("--micro-batches", type=int, default=4, help="micro-batches per step (pipeline)")
    parser.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"), default="1f1b",
                        help="pipeline schedule (lesson 12: gpipe, 1f1b; lesson 18: interleaved 1F1B, the zero-bubble "
                             "ZB-H1 and ZB-H2; ZB-H2 needs 2P - 1 micro-batches, with fewer it runs ZB-H1)")
    parser.add_argument("--virtual-stages", type=int, default=None,
                        help="with --schedule interleaved: model chunks per pipeline rank, v (default 2)")
    parser.add_argument("--trace", default=None, metavar="FILE", help="write a Chrome trace-event JSON file (open it "
                        f"in ui.perfetto.dev): each rank's phases of the first {TRACE_STEPS} steps, the pipeline "
                        "stages' last step, or the parameter server's updates")
    parser.add_argument("--compression", default="none",
                        help="gradients sent as none (float64/32), float16, bfloat16, topk (with --topk K and "
                             "error feedback) or powersgd (with --rank R); with --strategy allreduce (lesson 15)")
    parser.add_argument("--topk", type=int, default=None, help="K, the gradient entries each rank sends (topk)")
    parser.add_argument("--rank", type=int, default=None,
                        help="with --compression powersgd: R, the rank of each weight gradient's approximation")
    parser.add_argument("--local-steps", type=int, default=None, metavar="H",
                        help="local SGD / DiLoCo: each rank takes H steps alone, then the ranks average their "
                             "parameter changes (one Allreduce); needs --sampler per_rank")
    parser.add_argument("--outer-optimizer", choices=("average", "nesterov"), default="average",
                        help="with --local-steps: average (local SGD) or nesterov (DiLoCo, outer momentum 0.9)")
    parser.add_argument("--outer-learning-rate", type=float, default=None,
                        help="with --local-steps: the outer step's rate (default 1 for average, 0.7 for nesterov)")
    parser.add_argument("--asynchronous", action="store_true",
                        help="rank 0 is a parameter server applying each worker's gradient as it arrives; the "
                             "workers (ranks 1..N-1) sample their own shards; plain SGD (no momentum)")
    parser.add_argument("--staleness", type=int, default=None, help="with --asynchronous: no worker more than S "
                        "steps ahead of the slowest (0: synchronous; default: unbounded)")
    parser.add_argument("--slow", default=None, metavar="RANK:SECONDS",
                        help="make rank RANK a straggler: SECONDS more per step")
    parser.add_argument("--recompute", type=int, default=0, metavar="K",
                        help="keep every K-th layer's activations, recompute the rest in backward (0: keep all)")
    parser.add_argument("--accumulate", type=int, default=1, metavar="K",
                        help="K micro-batches per step, nothing sent before the last (lesson 17)")
    parser.add_argument("--precision", choices=("float32", "float16", "bfloat16"), default="float32",
                        help="float16: weights, activations, gradients stored in float16, float32 master weights "
                             "and dynamic loss scaling; bfloat16: the same in bfloat16, unscaled (lesson 17; "
                             "with --strategy allreduce, zero or fsdp)")


def parse_fault(text):
    """'1:40:kill' -> (1, 40, 'kill'); None -> None; ValueError saying the format otherwise."""
    if text is None:
        return None
    parts = text.split(":")
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or parts[2] not in FAULTS:
        raise ValueError(f"--fault must be RANK:STEP:KIND with KIND one of {', '.join(FAULTS)} (e.g. 1:40:kill); "
                         f"got {text!r}")
    return int(parts[0]), int(parts[1]), parts[2]


def parse_grid(text):
    """'2,2,1' -> (2, 2, 1), the data, tensor and pipeline degrees; None -> None; ValueError saying the format."""
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 3 or not all(part.strip().isdigit() for part in parts):
        raise ValueError(f"--grid must be D,T,P, three whole numbers (data x tensor x pipeline ranks, e.g. 2,2,1 "
                         f"on 4 ranks); got {text!r}")
    return tuple(int(part) for part in parts)


def model_split(args) -> tuple[int, int]:
    """(T, P) of --grid: (1, 1) without it (a malformed --grid: ValueError, raised first by option_problems)."""
    return parse_grid(args.grid)[1:] if args.grid is not None else (1, 1)


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


# -- what combines with what ---------------------------------------------------------------------------------

#: The options a kind of training may take, each with how the arguments show that it is used.
OPTIONS = {"--recompute": lambda args: args.recompute > 0, "--accumulate": lambda args: args.accumulate > 1,
           "--precision": lambda args: args.precision != "float32", "--device": lambda args: args.device != "cpu",
           "--checkpoint-dir": lambda args: bool(args.checkpoint_dir), "--fault": lambda args: args.fault is not None,
           "--slow": lambda args: args.slow is not None, "--trace": lambda args: bool(args.trace),
           "--zero-stage": lambda args: args.zero_stage == 2}
MEMORY, RUN = ("--recompute", "--accumulate", "--precision"), ("--checkpoint-dir", "--fault", "--slow", "--trace")

#: THE table: the kinds of training the job runs (one at a time), how the arguments show each, and the options
#: each combines with. A --grid that splits the model (T or P above 1: a pipeline of whole layers, or layers split by
#: hidden units) sums its pieces' gradients over the data axis with --strategy allreduce or zero (stage 1). Lessons 16
#: and 17's savers (MEMORY) go with data parallelism and FSDP, not with the model split nor lessons 14 and 15's
#: asynchrony and compression; mixed precision with the strategies whose ranks agree on the overflow verdict (the
#: summed gradient, or one flag Allreduce over ZeRO's slices or FSDP's chunks).
COMBINES = {
    "--strategy allreduce": (lambda args: False, {*MEMORY, "--device", *RUN}),  # (the default: no other kind)
    "--strategy zero": (lambda args: args.strategy == "zero" and model_split(args) == (1, 1),
                        {*MEMORY, "--device", *RUN, "--zero-stage"}),
    "--strategy fsdp": (lambda args: args.strategy == "fsdp", {*MEMORY, "--device", *RUN}),
    "--strategy overlap": (lambda args: args.strategy == "overlap", {*MEMORY[:2], "--device", *RUN}),
    "--strategy parameter_server": (lambda args: args.strategy == "parameter_server", {*MEMORY[:2], "--device", *RUN}),
    "--strategy reduce_broadcast": (lambda args: args.strategy == "reduce_broadcast", {*MEMORY[:2], "--device", *RUN}),
    "--compression float16/bfloat16/topk": (lambda args: args.compression not in ("none", "powersgd"),
                                            {"--device", *RUN}),
    "--compression powersgd": (lambda args: args.compression == "powersgd", {"--device", *RUN[1:]}),
    "--local-steps": (lambda args: args.local_steps is not None, {*MEMORY[:2], "--device", *RUN[1:]}),
    "--asynchronous": (lambda args: args.asynchronous, {"--device", "--slow", "--trace"}),
    "--grid D,1,P": (lambda args: model_split(args)[0] == 1 < model_split(args)[1], {"--device", "--trace"}),
    "--grid D,T,P": (lambda args: model_split(args)[0] > 1, {"--device"}),
}


def kinds_of(args) -> list[str]:
    """The kinds of training the arguments ask for, in COMBINES's order (none: the default, --strategy allreduce): the
    one place the job decides what it runs (the first; check_settings refuses a second)."""
    return [kind for kind, (used, _) in COMBINES.items() if used(args)] or ["--strategy allreduce"]


def combination_problem(args) -> str | None:
    """The one message for a combination COMBINES does not hold (None if it holds them all): which two options,
    and what combines: one kind of training at a time, and the options that kind takes."""
    kinds = kinds_of(args)
    takes = COMBINES[kinds[0]][1]
    refused = kinds[1:] + [option for option, used in OPTIONS.items() if used(args) and option not in takes]
    if not refused:
        return None
    values = {}  # "--strategy": ["allreduce", "zero", ...], "--asynchronous": [], ...
    for kind in COMBINES:
        flag, *value = kind.split()
        values.setdefault(flag, []).extend(value)
    one_of = "; ".join(f"{flag} {' or '.join(value)}".strip() for flag, value in values.items())
    options = f"takes {', '.join(sorted(takes))}" if takes else f"takes none of {', '.join(OPTIONS)}"
    return (f"{kinds[0]} does not combine with {refused[0]} in the batch job. What combines: one kind of training "
            f"at a time ({one_of}), and {kinds[0]} {options}.")


# -- the checks ------------------------------------------------------------------------------------------------

#: lesson 14's checks, in the job's words: its flags
FLAGS = dict(asynchronous="--asynchronous", batch_size="--batch-size", staleness="--staleness",
             unbounded="leave it out", slow="--slow's rank", delay="--slow's delay for rank")


def check_settings(args, ranks: int):
    """The job's training settings (lesson 03's Settings), or ValueError for options that are wrong or cannot go
    together on ``ranks`` ranks (no I/O, no MPI: every rank reaches the same verdict from the same arguments, before
    any collective): each option's own values and what it needs first (lesson 14's and 15's checks of --asynchronous's
    and --local-steps' values, naming the flags), then the table of what combines."""
    from nnlib.lesson03_training.training import Settings
    from nnlib.lesson14_asynchronous.asynchronous import asynchronous_problems
    from nnlib.lesson15_compression.local_sgd import DILOCO_MOMENTUM, check_local_sgd

    adam = {name: getattr(args, name) for name in ("beta1", "beta2", "eps", "weight_decay")
            if getattr(args, name) is not None}  # (the flags given; Settings' defaults for the rest)
    settings = Settings(epochs=args.epochs, learning_rate=args.learning_rate, batch_size=args.batch_size or None,
                        momentum=args.momentum if args.momentum is not None else 0.9 * (args.optimizer == "momentum"),
                        seed=args.seed, optimizer="sgd" if args.optimizer == "momentum" else args.optimizer,
                        **dict(dict(weight_decay=0.01) if args.optimizer == "adamw" else {}, **adam))
    problems = settings.problems()  # (lesson 03's: an optimizer's number that another optimizer's flag set, too)
    problems += [message for wrong, message in option_problems(args, ranks) if wrong]
    if args.asynchronous:
        problems += asynchronous_problems(ranks, settings, args.staleness, parse_slow(args.slow), FLAGS)
    if args.local_steps is not None:
        problems += check_local_sgd(args.local_steps, args.outer_optimizer, args.outer_learning_rate, DILOCO_MOMENTUM,
                                    ("--local-steps H", "--outer-learning-rate"))
    problem = problems[0] if problems else combination_problem(args)
    if problem:
        raise ValueError(problem)
    return settings


def option_problems(args, ranks: int) -> list[tuple[bool, str]]:
    """(wrong?, what to do) for each option's own value, then for the options that belong to another (--staleness
    to --asynchronous, ...)."""
    from nnlib.lesson02_network.network import count_parameters
    from nnlib.lesson15_compression.compression import check_method
    from nnlib.lesson15_compression.powersgd import check_rank
    from nnlib.lesson19_planning.grid import grid_problem

    compression = [] if args.compression == "powersgd" else check_method(args.compression, args.topk,
                                                                          count_parameters((784, *args.hidden, 10)))
    slow, _, grid = parse_slow(args.slow), parse_fault(args.fault), parse_grid(args.grid)
    (tensor, stages), layout = model_split(args), grid and grid_problem(ranks, grid, (784, *args.hidden, 10))
    return [
        (bool(layout), f"--grid {args.grid}: {layout}"),
        (args.checkpoint_every < 0, f"--checkpoint-every must be 0 (once per epoch) or a number of steps; "
                                    f"got {args.checkpoint_every}"),
        (args.dtype not in ("float32", "float64"), f"--dtype must be float32 or float64 (the network's numbers; "
                                                   f"16-bit formats are --compression float16 or bfloat16); got "
                                                   f"{args.dtype!r}"),
        (bool(compression), "; ".join(compression).replace("compression=", "--compression ").replace("k=", "--topk ")
         .replace("needs k", "needs --topk K")),
        (any(rank >= ranks for rank in slow), f"--slow names rank {next(iter(slow), 0)}, but the job has ranks 0 "
                                              f"to {ranks - 1}"),
        (args.compression == "powersgd" and bool(check_rank(args.rank)),
         f"--compression powersgd needs --rank R, a whole number, 1 or more; got {args.rank}"),
        (args.virtual_stages is not None and args.virtual_stages < 1,
         f"--virtual-stages must be a positive number; got {args.virtual_stages}"),
        (args.recompute < 0, f"--recompute must be 0 (keep every activation) or K >= 1; got {args.recompute}"),
        (args.accumulate < 1, f"--accumulate must be at least 1 (micro-batches per step); got {args.accumulate}"),
        (args.resume and not args.checkpoint_dir,
         "--resume needs --checkpoint-dir (the folder of the run to continue)"),
        (args.staleness is not None and not args.asynchronous,
         "--staleness bounds the asynchronous parameter server: add --asynchronous"),
        (args.rank is not None and args.compression != "powersgd",
         "--rank is PowerSGD's: add --compression powersgd, or drop --rank"),
        (args.local_steps is None and (args.outer_optimizer != "average" or args.outer_learning_rate is not None),
         "--outer-optimizer and --outer-learning-rate are local SGD's: add --local-steps H"),
        (args.local_steps is not None and (args.sampler != "per_rank" or not args.batch_size),
         "--local-steps needs --sampler per_rank and mini-batches (--batch-size): each rank steps on batches of its "
         "own shard"),
        (args.virtual_stages is not None and args.schedule != "interleaved",
         f"--virtual-stages goes with --schedule interleaved; got --schedule {args.schedule}"),
        (args.schedule not in ("gpipe", "1f1b") and not tensor == 1 < stages,
         f"--schedule {args.schedule} needs a pipeline of whole layers: --grid D,1,P with P above 1"),
        (args.precision != "float32" and args.dtype != "float32",
         f"--precision {args.precision} keeps float32 master weights (--dtype float32)"),
        (args.zero_stage == 2 and (args.precision != "float32" or args.device != "cpu"),
         "--zero-stage 2 keeps float32 or float64 gradients on the CPU (lesson 10's buckets); with --precision or "
         "--device gpu use --zero-stage 1"),
        (args.precision == "bfloat16" and args.device != "cpu",
         "--precision bfloat16 needs --device cpu (CuPy has no bfloat16 arrays); on a GPU use --precision float16"),
    ]


def memory_options_used(args) -> bool:
    return args.strategy == "fsdp" or args.recompute > 0 or args.accumulate > 1 or args.precision != "float32"

