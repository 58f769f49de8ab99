"""What rank 0 says and writes: what the job runs, the seconds per phase, --output (.npz) and --trace."""

from __future__ import annotations

import numpy as np

from nnlib.lesson01_mnist.files import atomic_write
from nnlib.train_command.options import memory_options_used

LESSON = 19


def announce(args, comm, network, gpus) -> None:
    """Rank 0 says what the job runs: ranks, strategy, network, samples, batch; what compression sends or how often
    local SGD talks (lesson 15); lessons 16-17's options and the memory model's count for rank 0, if used; the GPUs."""
    from nnlib.lesson08_gpu.backend import cuda_aware_mpi, gpu_status
    from nnlib.lesson15_compression import compression, powersgd
    from nnlib.lesson17_activations.budget import predicted_bytes

    if comm.rank != 0:
        return
    memory, batch = memory_options_used(args), min(args.batch_size or args.samples, args.samples)
    lines = [f"{comm.size} ranks, strategy {args.strategy}, network {'-'.join(map(str, network.layer_sizes))}, "
             f"{args.samples} samples, global batch {args.batch_size or 'full'}"]
    instead, itemsize = f"per rank per step instead of {network.params.nbytes:,}", network.params.dtype.itemsize
    if args.local_steps is not None:
        kind = "DiLoCo (Nesterov outer steps)" if args.outer_optimizer == "nesterov" else "local SGD (averaging)"
        lines.append(f"{kind}: each rank takes {args.local_steps} steps alone, then one Allreduce of "
                     f"{network.params.nbytes:,} bytes (and at the end of every epoch)")
    elif args.compression == "powersgd":
        first, second = powersgd.message_bytes(network.layer_sizes, args.rank, itemsize)
        lines.append(f"gradients compressed: powersgd (rank {args.rank}), two Allreduces of {first:,} and "
                     f"{second:,} bytes {instead}")
    elif args.compression != "none":
        lines.append(f"gradients compressed: {args.compression}{f' (k = {args.topk})' if args.topk else ''}, "
                     f"{compression.message_bytes(args.compression, network.num_params, args.topk, itemsize):,} "
                     f"bytes {instead}")
    if memory:
        lines.append(f"memory: strategy {args.strategy}, recompute every {args.recompute or 'none'}, "
                     f"{args.accumulate} micro-batch(es) per step, precision {args.precision}")
    if memory and args.strategy in ("allreduce", "zero", "fsdp"):
        rows = -(-batch // comm.size)  # rank 0's rows, ceil(B / P): split_evenly gives the first ranks the extra rows
        held = predicted_bytes((784, *args.hidden, 10), rows, comm.size, 0, args.strategy, args.recompute or None,
                               args.accumulate, args.dtype if args.precision == "float32" else args.precision)
        lines.append(f"memory model (nnlib.lesson17_activations.budget): rank 0 holds "
                     f"{sum(held.values()) / 2 ** 20:.2f} MiB at a step's peak, NumPy's temporaries aside")
    if any(gpu is not None for gpu in gpus):
        lines.append(f"on the GPU ({gpu_status()[1]}); GPU of each rank: {gpus}; gradients "
                     f"{'passed directly (CUDA-aware MPI)' if cuda_aware_mpi() else 'staged through host memory'}")
    print("\n".join(lines), flush=True)


def sent_arrays(args, counting, history) -> dict:
    """With compression or local steps, rank 0 says what it handed to Allreduce and Allgather; the arrays to save:
    sent_collectives (names), sent_message_bytes, sent_counts (one per kind of call), sent_bytes (the total)."""
    calls = sorted(counting.messages().items())
    if args.compression != "none" or args.local_steps is not None:
        print(f"sent by rank 0: {counting.message_bytes():,} bytes in {sum(count for _, count in calls)} calls "
              f"({counting.message_bytes() / history.steps:,.0f} bytes per step on average)", flush=True)
    return dict(sent_collectives=[name for (name, _), _ in calls], sent_message_bytes=[size for (_, size), _ in calls],
                sent_counts=[count for _, count in calls], sent_bytes=counting.message_bytes())


def report(args, ranks, history, phases, test_accuracy, params, layer_sizes, more: dict) -> None:
    """On rank 0: print the test accuracy and every rank's seconds per phase; write --output (and ``more``'s arrays)."""
    from nnlib.lesson06_data_parallel import PHASES

    print(f"test accuracy {test_accuracy:.4f}; seconds per phase (summed over the run):")
    print("rank " + "".join(f"{phase:>12s}" for phase in PHASES))
    for rank_number, row in enumerate(phases):
        print(f"{rank_number:4d} " + "".join(f"{value:12.3f}" for value in row))
    save_output(args, params=params, layer_sizes=layer_sizes, loss=history.loss, train_accuracy=history.train_accuracy,
                epoch_seconds=history.seconds, phase_seconds=phases, phases=PHASES, test_accuracy=test_accuracy,
                ranks=ranks, **more)


def save_trace(path, spans, instants=()) -> None:
    """Write --trace (rank 0) and say so."""
    from nnlib.course.trace import write_trace

    write_trace(path, spans, instants)
    print(f"wrote the trace {path} (open it in ui.perfetto.dev or chrome://tracing)")


def save_output(args, **arrays) -> None:
    """Write ``arrays`` (or lists, numbers: np.savez makes arrays of them) to --output, if given, atomically."""
    if args.output:
        with atomic_write(args.output) as stream:
            np.savez(stream, **arrays)
        print(f"wrote {args.output}")
