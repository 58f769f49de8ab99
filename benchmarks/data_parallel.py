"""Data-parallel speed: 1 rank versus 2 ranks (one BLAS thread each), and against PyTorch DDP.

Run:   make benchmark-parallel        (or: .venv/bin/python benchmarks/data_parallel.py)

In one run this script starts itself under mpiexec with 1 and with 2 ranks for each case and
prints epoch time, speedup and efficiency, and the communication per step against a bare
Allreduce of the same buffer on the same ranks. With PyTorch installed (make benchmark installs
torch==2.13.0) it also trains the same network with DistributedDataParallel (gloo backend,
2 processes, the same global batch) and prints both epoch times and their ratio.

Cases:
  784-128-10 on full MNIST, global batch 256, mini-batch SGD (momentum 0.9)
  400-25-10 full-batch gradient descent on 60,000 samples (the seed workload, 20x20 crops)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# One BLAS thread per process, set before NumPy is imported (importing nnlib would import it).
os.environ.update({name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})

import numpy as np  # noqa: E402

CASES = {
    "784-128-10, batch 256": dict(sizes=(784, 128, 10), batch=256, epochs=4, crop=False, learning_rate=0.1),
    "400-25-10, full batch": dict(sizes=(400, 25, 10), batch=None, epochs=40, crop=True, learning_rate=2.0),
}


def load(crop: bool):
    from nnlib import data

    mnist = data.load_mnist(progress=False)
    images = data.crop_center(mnist.train_images) if crop else mnist.train_images
    return data.scale_pixels(np.ascontiguousarray(images)), mnist.train_labels.astype(np.int64)


def worker(case_name: str, strategy: str) -> None:
    """Runs on every rank under mpiexec; rank 0 prints one JSON line of results."""
    from mpi4py import MPI

    from nnlib import collectives
    from nnlib.network import Network
    from nnlib.parallel import shard, train_parallel

    comm = MPI.COMM_WORLD
    case = CASES[case_name]
    inputs, labels = load(case["crop"]) if comm.rank == 0 else (None, None)
    local_inputs, local_labels, start = shard(comm, inputs, labels)
    network = Network(case["sizes"], seed=0)
    history = train_parallel(comm, network, local_inputs, local_labels, num_samples=60000, start=start,
                             epochs=case["epochs"], learning_rate=case["learning_rate"], batch_size=case["batch"],
                             momentum=0.9 if case["batch"] else 0.0, strategy=strategy)
    epoch_seconds = float(np.median(history.seconds[1:]))  # the first epoch warms up
    communicate = comm.allreduce(history.phase_seconds["communicate"], op=MPI.MAX) / history.steps
    bare = float(collectives.time_allreduce(comm, [network.grads.nbytes], repeats=200, dtype=np.float32)[0])
    if comm.rank == 0:
        print(json.dumps(dict(epoch_seconds=epoch_seconds, communicate_per_step=communicate,
                              bare_allreduce=bare, steps_per_epoch=history.steps // case["epochs"],
                              buffer_bytes=int(network.grads.nbytes))))


def run_ranks(ranks: int, case_name: str, strategy: str = "allreduce") -> dict:
    from nnlib.environment import mpiexec_path

    command = [mpiexec_path(), "-n", str(ranks), sys.executable, __file__, "--worker", case_name, strategy]
    run = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def torch_ddp_epoch(case_name: str, processes: int = 2) -> float:
    """Median epoch seconds of the same training with PyTorch DDP (gloo), `processes` processes."""
    import torch.multiprocessing as multiprocessing

    inputs, labels = load(CASES[case_name]["crop"])
    context = multiprocessing.get_context("spawn")
    queue = context.SimpleQueue()
    port = 29500 + os.getpid() % 1000
    multiprocessing.start_processes(_torch_worker, args=(processes, port, case_name, inputs, labels, queue),
                                    nprocs=processes, join=True, start_method="spawn")
    return queue.get()


def _torch_worker(rank, world_size, port, case_name, inputs, labels, queue):
    import torch
    import torch.distributed as distributed

    from nnlib.benchmarks import torch_copy
    from nnlib.network import Network

    torch.set_num_threads(1)
    distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    case = CASES[case_name]
    model = torch.nn.parallel.DistributedDataParallel(torch_copy(Network(case["sizes"], seed=0), torch))
    optimizer = torch.optim.SGD(model.parameters(), lr=case["learning_rate"], momentum=0.9 if case["batch"] else 0.0)
    # Each process holds its half of the data; each global batch is split in two.
    shard = slice(rank * len(inputs) // world_size, (rank + 1) * len(inputs) // world_size)
    x_all, y_all = torch.from_numpy(inputs[shard]), torch.from_numpy(labels[shard])
    targets_all = torch.nn.functional.one_hot(y_all, case["sizes"][-1]).float()
    local_batch = (case["batch"] or len(inputs)) // world_size
    generator = np.random.default_rng(rank)
    seconds = []
    for _ in range(case["epochs"]):
        order = torch.from_numpy(generator.permutation(len(x_all)))
        distributed.barrier()
        start = time.perf_counter()
        for first in range(0, len(x_all), local_batch):
            index = order[first:first + local_batch]
            x, targets = x_all.index_select(0, index), targets_all.index_select(0, index)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), targets, reduction="sum")
            loss = loss / (x.shape[0] * world_size)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        distributed.barrier()
        seconds.append(time.perf_counter() - start)
    if rank == 0:
        queue.put(float(np.median(seconds[1:])))
    distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=2, metavar=("CASE", "STRATEGY"), help=argparse.SUPPRESS)
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch DDP comparison")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    try:
        import torch  # noqa: F401
        have_torch = not args.no_torch
    except ImportError:
        have_torch = False
        print("(PyTorch not installed: no DDP comparison; `make benchmark` installs torch==2.13.0)")

    from nnlib.environment import describe

    machine = describe()
    print(f"machine: {machine['machine']}; {machine['BLAS']}; {machine['MPI library']}; 1 BLAS thread per rank\n")
    header = (f"{'case':24s} {'1 rank s/epoch':>14s} {'2 ranks s/epoch':>15s} {'speedup':>8s} {'efficiency':>10s} "
              f"{'comm/step us':>12s} {'bare Allreduce us':>17s} {'comm/bare':>9s}")
    if have_torch:
        header += f" {'DDP s/epoch':>11s} {'DDP/nnlib':>9s}"
    print(header)
    print("-" * len(header))
    for name in CASES:
        one, two = run_ranks(1, name), run_ranks(2, name)
        speedup = one["epoch_seconds"] / two["epoch_seconds"]
        line = (f"{name:24s} {one['epoch_seconds']:14.3f} {two['epoch_seconds']:15.3f} {speedup:8.2f} "
                f"{speedup / 2:10.0%} {two['communicate_per_step'] * 1e6:12.1f} {two['bare_allreduce'] * 1e6:17.1f} "
                f"{two['communicate_per_step'] / two['bare_allreduce']:9.2f}")
        if have_torch:
            ddp = torch_ddp_epoch(name)
            line += f" {ddp:11.3f} {ddp / two['epoch_seconds']:9.2f}"
        print(line, flush=True)
    print("\ncomm/step: the slowest rank's Allreduce time per step, waiting included; bare Allreduce: "
          "the median of 200 Allreduces of the same gradient buffer on the same 2 ranks.")


if __name__ == "__main__":
    main()
