"""``mpiexec -n N python -m nnlib train ...``: data-parallel MNIST training as a batch job.

Rank 0 loads and verifies MNIST and scatters it; every rank trains its copy of the network on
its shard; rank 0 prints one progress line per epoch, each rank's time per phase, the test
accuracy, and writes the history and weights to ``--output`` (a .npz file, written to a
temporary file first and then renamed, so an interrupted job never leaves half a file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .files import atomic_write


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .parallel import STRATEGIES

    parser.add_argument("--strategy", choices=STRATEGIES, default="allreduce", help="how gradients are combined")
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


def run(args) -> int:
    from mpi4py import MPI
    from threadpoolctl import threadpool_limits

    from . import data
    from .network import Network
    from .backend import cuda_aware_mpi, gpu_status, is_numpy, use_gpu_of_local_rank
    from .parallel import PHASES, agree, fail_together, gather_phase_seconds, shard, train_parallel

    threadpool_limits(args.threads)  # one BLAS thread per rank unless told otherwise
    comm = MPI.COMM_WORLD
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
        if rank == 0:
            print(f"error: {error}", file=sys.stderr)
        return 2

    try:
        gpu_index = use_gpu_of_local_rank(comm) if args.device != "cpu" else None
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
            momentum=args.momentum, seed=args.seed, strategy=args.strategy, progress=True)
    except (ValueError, FloatingPointError) as problem:
        if rank == 0:
            print(f"error: {problem}", file=sys.stderr)
        return 2

    phases = gather_phase_seconds(comm, history)
    if rank == 0:
        test_accuracy = network.accuracy(test_inputs, test_labels)
        print(f"test accuracy {test_accuracy:.4f}; seconds per phase (summed over the run):")
        print("rank " + "".join(f"{phase:>12s}" for phase in PHASES))
        for rank_number, row in enumerate(phases):
            print(f"{rank_number:4d} " + "".join(f"{value:12.3f}" for value in row))
        if args.output:
            save_npz(args.output, params=network.get_params(), layer_sizes=np.array(network.layer_sizes),
                     loss=np.array(history.loss), train_accuracy=np.array(history.train_accuracy),
                     epoch_seconds=np.array(history.seconds), phase_seconds=phases,
                     phases=np.array(PHASES), test_accuracy=np.array(test_accuracy),
                     ranks=np.array(comm.size), strategy=np.array(args.strategy))
            print(f"wrote {args.output}")
    return 0


def save_npz(path, **arrays) -> None:
    """Write arrays to ``path`` (.npz) atomically (see nnlib.files.atomic_write)."""
    with atomic_write(path) as stream:
        np.savez(stream, **arrays)
