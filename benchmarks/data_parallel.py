"""Data-parallel speed: 1 rank versus 2 ranks (one BLAS thread each), and against PyTorch DDP.

Each strategy (allreduce, zero, overlap) and sampler (exact, per_rank) of lesson 10 gets a row.

Run:   make benchmark        (or: .venv/bin/python benchmarks/data_parallel.py)

In one run this script starts itself under mpiexec with 1 and with 2 ranks for each case and
prints epoch time, speedup and efficiency, and the communication per step, split into waiting
for the other rank and the transfer itself, against a bare Allreduce of the same buffer on the
same ranks in the same run, back to back (hot caches) and with the caches emptied first (cold). With PyTorch installed (make benchmark installs
torch==2.13.0) it also trains the same network with DistributedDataParallel (gloo backend,
2 processes, the same global batch) and prints both epoch times and their ratio.

Cases:
  784-128-10 on full MNIST, global batch 256, mini-batch SGD (momentum 0.9)
  400-25-10 full-batch gradient descent on 60,000 samples (the seed workload, 20x20 crops)
  784-1024-10 on full MNIST, global batch 4,096 (compute dominates: how close 2 ranks come to 100%), with
    the exact sampler (uneven shares of each batch) and per_rank (even shares), also
    with glibc's default allocator ("same, glibc default": NNLIB_KEEP_FREED_MEMORY=0, every process
    faulting fresh pages in for its 4 MB arrays at every step; see nnlib.course.environment.keep_freed_memory)

Then the cost of surviving faults, on 2 ranks, 784-128-10, global batch 256, one epoch per call,
the variants interleaved over several repeats (medians):
  blocking    MPI's own blocking collectives (train_parallel on MPI.COMM_WORLD itself)
  watched     every collective under the watchdog's deadline (nnlib.lesson13_faults.watchdog.train_watched, as the batch job)
  checkpoint  watched, plus a checkpoint written at the end of the epoch (the default interval)
and a bare in-place Allreduce of the gradient buffer, blocking against watched.
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

MODES = [("allreduce", "exact"), ("zero", "exact"), ("overlap", "exact"), ("allreduce", "per_rank"),
         ("zero", "per_rank")]  # (strategy, sampler) on 2 ranks
CASES = {
    "784-128-10, batch 256": dict(sizes=(784, 128, 10), batch=256, epochs=4, crop=False, learning_rate=0.1),
    "400-25-10, full batch": dict(sizes=(400, 25, 10), batch=None, epochs=40, crop=True, learning_rate=2.0),
    "784-1024-10, batch 4096": dict(sizes=(784, 1024, 10), batch=4096, epochs=3, crop=False, learning_rate=0.1),
}
FEW_MODES = {"400-25-10, full batch": [("allreduce", "exact"), ("zero", "exact")],
             # the compute-dominated case: its bound, with the exact sampler's uneven shares and with even ones
             "784-1024-10, batch 4096": [("allreduce", "exact"), ("allreduce", "per_rank")]}
# Cases also run with glibc's default allocator (NNLIB_KEEP_FREED_MEMORY=0: freed memory handed back and
# faulted in again at every step, see nnlib.course.environment.keep_freed_memory), interleaved with the others.
ALLOCATOR_DEFAULT_CASES = ("784-1024-10, batch 4096",)


def exact_imbalance(case: dict, ranks: int = 2) -> float:
    """The exact sampler's uneven shares: the mean over an epoch's steps of max_r n_r / (B / ranks), where n_r is
    the number of rows of global batch B that lie in rank r's shard (the sequential run's batches, cut by the
    shards, as nnlib.lesson06_data_parallel.data_parallel.ShardBatches does). The per_rank sampler gives every
    rank B / ranks rows exactly: 1.0. The busiest rank sets the pace of every step."""
    from nnlib.lesson03_training.training import Settings
    from nnlib.lesson04_collectives.collectives import split_evenly
    from nnlib.lesson06_data_parallel.data_parallel import ShardBatches

    settings = Settings(epochs=1, learning_rate=case["learning_rate"], batch_size=case["batch"])
    plans = [ShardBatches(split_evenly(60000, ranks)[0], rank, settings).epoch(0) for rank in range(ranks)]
    return float(np.mean([max(len(rows) for rows, _ in step) / (step[0][1] / ranks) for step in zip(*plans)]))


def matmul_ratio(case: dict, ranks: int = 2) -> float:
    """NumPy's matmul rate over PyTorch's (one thread each, each with its own BLAS) at the products of one
    rank's step, its share of the global batch (benchmarks/rates.py's numpy_over_torch_matmul:
    NumPy in nnlib's chunks, PyTorch whole, as DDP does not cut it)."""
    import torch

    from rates import numpy_over_torch_matmul

    torch.set_num_threads(1)
    return numpy_over_torch_matmul(case["sizes"], -(-(case["batch"] or 60000) // ranks), torch)


def load(crop: bool):
    from nnlib.lesson01_mnist import data

    mnist = data.load_mnist(progress=False)
    images = data.crop_center(mnist.train_images) if crop else mnist.train_images
    return data.scale_pixels(np.ascontiguousarray(images)), mnist.train_labels.astype(np.int64)


def worker(case_name: str, strategy: str, sampler: str = "exact") -> None:
    """Runs on every rank under mpiexec; rank 0 prints one JSON line of results."""
    from mpi4py import MPI

    from nnlib.lesson02_network.network import Network
    from nnlib.lesson04_collectives import timing
    from nnlib.lesson06_data_parallel import shard, train_parallel
    from nnlib.lesson10_zero_overlap.waiting import communication_split

    comm = MPI.COMM_WORLD
    case = CASES[case_name]
    inputs, labels = load(case["crop"]) if comm.rank == 0 else (None, None)
    local_inputs, local_labels, start = shard(comm, inputs, labels)
    network = Network(case["sizes"], seed=0)
    steps = case["epochs"] * -(-60000 // (case["batch"] or 60000))

    def bare_allreduces():  # 100 Allreduces of the gradient buffer, hot and cold (the machine drifts: before and after)
        hot = timing.time_allreduce(comm, [network.grads.nbytes], repeats=100, dtype=np.float32)[0]
        cold = timing.time_allreduce(comm, [network.grads.nbytes], repeats=100, dtype=np.float32, cold=True)[0]
        return hot, cold

    from nnlib.lesson10_zero_overlap.overlap import Overlap
    from nnlib.lesson10_zero_overlap.sampling import PerRankBatches
    from nnlib.lesson10_zero_overlap.zero import ZeRO

    if strategy == "none":
        no_communication(comm, network, case, local_inputs, local_labels)
        return
    before = bare_allreduces()
    history = train_parallel(comm, network, local_inputs, local_labels, num_samples=60000, start=start,
                             epochs=case["epochs"], learning_rate=case["learning_rate"], batch_size=case["batch"],
                             momentum=0.9 if case["batch"] else 0.0, timeline_steps=steps,
                             strategy={"zero": ZeRO, "overlap": Overlap}.get(strategy, strategy),
                             batches=PerRankBatches if sampler == "per_rank" else None)
    bare, cold = (float(value) for value in np.mean([before, bare_allreduces()], axis=0))
    epoch_seconds = float(np.median(history.seconds[1:]))  # the first epoch warms up
    communicate = comm.allreduce(history.phase_seconds["communicate"], op=MPI.MAX) / history.steps
    transfer, waiting = communication_split(comm, history)
    if comm.rank == 0:
        print(json.dumps(dict(epoch_seconds=epoch_seconds, communicate_per_step=communicate,
                              transfer_per_step=transfer, waiting_per_step=float(waiting.max()),
                              bare_allreduce=bare, cold_allreduce=cold, steps_per_epoch=history.steps // case["epochs"],
                              buffer_bytes=int(network.grads.nbytes))))


def no_communication(comm, network, case, local_inputs, local_labels) -> None:
    """The bound's run: every rank trains at once, each on its own shard at its share of the global batch, with
    no communication at all (lesson 03's train). Rank 0 prints the slowest rank's median epoch seconds."""
    from mpi4py import MPI

    from nnlib.lesson03_training.training import train

    comm.Barrier()
    history = train(network, local_inputs, local_labels, epochs=case["epochs"], learning_rate=case["learning_rate"],
                    batch_size=case["batch"] and case["batch"] // comm.size, momentum=0.9 if case["batch"] else 0.0,
                    progress=False)
    epoch_seconds = comm.allreduce(float(np.median(history.seconds[1:])), op=MPI.MAX)
    if comm.rank == 0:
        print(json.dumps(dict(epoch_seconds=epoch_seconds)))


def fault_costs(repeats: int = 7) -> None:
    """Runs on 2 ranks under mpiexec; rank 0 prints one JSON line: the watchdog's and checkpoints' costs."""
    import tempfile

    from mpi4py import MPI

    from nnlib.lesson02_network.network import Network
    from nnlib.lesson04_collectives import timing
    from nnlib.lesson06_data_parallel import shard, train_parallel
    from nnlib.lesson13_faults.checkpoint import CheckpointFolder, Checkpointing
    from nnlib.course.deadline import watch
    from nnlib.lesson13_faults.watchdog import train_watched

    comm = MPI.COMM_WORLD
    inputs, labels = load(False) if comm.rank == 0 else (None, None)
    local_inputs, local_labels, start = shard(comm, inputs, labels)
    network = Network((784, 128, 10), seed=0)
    folder = tempfile.mkdtemp(prefix="nnlib-checkpoints-") if comm.rank == 0 else None
    checkpoints = CheckpointFolder(folder if comm.rank == 0 else "unused-on-other-ranks")
    def one_epoch(variant):  # blocking: MPI's own collectives; watched: under the deadline; checkpoint: and one
        comm.Barrier()
        began = time.perf_counter()
        settings = dict(num_samples=60000, start=start, epochs=1, learning_rate=0.1, batch_size=256, momentum=0.9)
        if variant == "blocking":
            history = train_parallel(comm, network, local_inputs, local_labels, **settings)
        else:
            if comm.rank == 0:
                for old in checkpoints.files():  # each timed run starts a new run: an empty folder
                    old.unlink()
            hooks = [Checkpointing(checkpoints)] if variant == "checkpoint" else []
            history = train_watched(train_parallel, comm, network, local_inputs, local_labels, hooks=hooks, **settings)
        # The epoch's steps alone, and the whole call (set-up and the end-of-epoch checkpoint included).
        timings = np.array([history.seconds[0], time.perf_counter() - began])
        comm.Allreduce(MPI.IN_PLACE, timings, op=MPI.MAX)
        return timings

    variants = ("blocking", "watched", "checkpoint")
    one_epoch("watched")  # warm-up
    seconds = {variant: [] for variant in variants}
    for _ in range(repeats):
        for variant in variants:
            seconds[variant].append(one_epoch(variant))
    gradient = np.ones(network.num_params, dtype=np.float32)
    watched_comm = watch(comm)
    bare = {
        "blocking": timing.time_collective(comm, lambda: comm.Allreduce(MPI.IN_PLACE, gradient), 300),
        "watched": timing.time_collective(
            comm, lambda: watched_comm.Allreduce(MPI.IN_PLACE, gradient), 300),
    }
    if comm.rank == 0:
        import shutil

        shutil.rmtree(folder)
        print(json.dumps(dict(epoch={variant: float(np.median([steps for steps, _ in values]))
                                     for variant, values in seconds.items()},
                              call={variant: float(np.median([call for _, call in values]))
                                    for variant, values in seconds.items()},
                              allreduce=bare, gradient_bytes=int(gradient.nbytes),
                              checkpoint_bytes=int(np.median(checkpoints.sizes)),
                              checkpoint_write=float(np.median(checkpoints.seconds)),
                              steps=int(np.ceil(60000 / 256)), repeats=repeats)))


def run_ranks(ranks: int, case_name: str, strategy: str = "allreduce", sampler: str = "exact",
              keep_freed_memory: bool = True) -> dict:
    from nnlib.course.environment import mpiexec_path

    command = [mpiexec_path(), "-n", str(ranks), sys.executable, __file__, "--worker", case_name, strategy, sampler]
    env = dict(os.environ, NNLIB_KEEP_FREED_MEMORY="1" if keep_freed_memory else "0")
    run = subprocess.run(command, capture_output=True, text=True, check=True, timeout=900, env=env)
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

    from nnlib.lesson02_network.network import Network
    from rates import torch_copy

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


def spread(values) -> str:
    """'median% (lowest-highest%)' of fractions."""
    return f"{np.median(values):.0%} ({min(values):.0%}-{max(values):.0%})"


def measure_case(name: str, repeats: int, have_torch: bool) -> None:
    """Run one case's configurations in ``repeats`` interleaved rounds and print a line per 2-rank mode:
    medians over the rounds; efficiency and bound with their range over the rounds."""
    allocators = (True, False) if name in ALLOCATOR_DEFAULT_CASES else (True,)  # keep_freed_memory or not
    runs_of = {kept: ([], [], {mode: [] for mode in FEW_MODES.get(name, MODES)}) for kept in allocators}
    for _ in range(repeats):  # interleaved, so that a slow minute of the machine hits every mode alike
        for kept, (one, alone, two) in runs_of.items():
            one.append(run_ranks(1, name, keep_freed_memory=kept))
            alone.append(run_ranks(2, name, "none", keep_freed_memory=kept))
            for mode in two:
                two[mode].append(run_ranks(2, name, *mode, keep_freed_memory=kept))
    ddp = torch_ddp_epoch(name) if have_torch else None
    for kept, (one, alone, two) in runs_of.items():
        print_modes(name if kept else "  same, glibc default", one, alone, two, ddp if kept else None)


def print_modes(name: str, one: list, alone: list, two: dict, ddp) -> None:
    """One line per 2-rank mode of ``two`` ({mode: runs}), against the rounds' 1-rank runs ``one`` and their
    no-communication runs ``alone``; ``ddp``: PyTorch DDP's epoch seconds, or None."""
    one_epoch = float(np.median([run["epoch_seconds"] for run in one]))
    no_communication_epoch = float(np.median([run["epoch_seconds"] for run in alone]))
    for mode, runs in two.items():
        epoch, communicate, waiting, transfer, bare, cold = (
            float(np.median([run[key] for run in runs]))
            for key in ("epoch_seconds", "communicate_per_step", "waiting_per_step", "transfer_per_step",
                        "bare_allreduce", "cold_allreduce"))
        # Ratios run by run (each against its own bare Allreduce, or its own round's runs), then their median.
        comm_ratio, transfer_ratio, transfer_cold = (
            float(np.median([run[key] / run[reference] for run in runs]))
            for key, reference in (("communicate_per_step", "bare_allreduce"), ("transfer_per_step", "bare_allreduce"),
                                   ("transfer_per_step", "cold_allreduce")))
        efficiency = [first["epoch_seconds"] / 2 / run["epoch_seconds"] for first, run in zip(one, runs)]
        # the bound: both ranks computing with no communication (T0), plus the transfer alone, no waiting
        bound = [first["epoch_seconds"] / 2 / (none["epoch_seconds"] + run["steps_per_epoch"] * run["transfer_per_step"])
                 for first, none, run in zip(one, alone, runs)]
        line = (f"{name:24s} {mode[0] + ', ' + mode[1]:20s} {one_epoch:14.3f} {epoch:15.3f} {one_epoch / epoch:8.2f} "
                f"{spread(efficiency):>14s} {no_communication_epoch:10.3f} {spread(bound):>14s} {communicate * 1e6:12.1f} "
                f"{waiting * 1e6:10.1f} {transfer * 1e6:11.1f} {bare * 1e6:17.1f} {cold * 1e6:7.1f} {comm_ratio:9.2f} "
                f"{transfer_ratio:13.2f} {transfer_cold:13.2f}")
        if ddp is not None:
            line += f" {ddp:11.3f} {ddp / epoch:9.2f}"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=3, metavar=("CASE", "STRATEGY", "SAMPLER"), help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration (medians are quoted)")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch DDP comparison")
    parser.add_argument("--fault-costs", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--only-fault-costs", action="store_true",
                        help="measure only the watchdog's and checkpoints' costs")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    if args.fault_costs:
        fault_costs()
        return
    try:
        import torch  # noqa: F401
        have_torch = not args.no_torch
    except ImportError:
        have_torch = False
        print("(PyTorch not installed: no DDP comparison; `make benchmark` installs torch==2.13.0)")

    from nnlib.course.environment import describe

    machine = describe()
    print(f"machine: {machine['machine']}; {machine['BLAS']}, kernel {machine['BLAS kernel']}; {machine['MPI library']}; "
          f"1 BLAS thread per rank; memory: {machine['memory']}, in every rank and DDP process\n")
    header = (f"{'case':24s} {'mode':20s} {'1 rank s/epoch':>14s} {'2 ranks s/epoch':>15s} {'speedup':>8s} "
              f"{'efficiency':>14s} {'T0 s/epoch':>10s} {'bound':>14s} {'comm/step us':>12s} {'waiting us':>10s} {'transfer us':>11s} "
              f"{'bare Allreduce us':>17s} {'cold us':>7s} {'comm/bare':>9s} {'transfer/bare':>13s} {'transfer/cold':>13s}")
    if have_torch:
        header += f" {'DDP s/epoch':>11s} {'DDP/nnlib':>9s}"
    if args.only_fault_costs:
        print_fault_costs()
        return
    print(f"medians of {args.repeats} runs of each configuration, the runs interleaved\n")
    print(header)
    print("-" * len(header))
    for name in CASES:
        measure_case(name, args.repeats, have_torch)
    print("\nbound: the efficiency 2 ranks would reach with no waiting: T1 / (2 (T0 + steps transfer)), where T0 is an "
          "epoch of 2 ranks training at once, each on its half of the data at half the global batch, with no "
          "communication at all (measured in the same rounds: what each rank's own steps cost while the other "
          "computes too; a step's fixed costs do not halve with the batch).")
    shares = ", ".join(f"{name}: {exact_imbalance(case):.3f}" for name, case in CASES.items() if case["batch"])
    print(f"exact: every rank computes the rows of the sequential run's batch that lie in its shard, so the shares are "
          f"uneven; the busier rank's share against an even half, averaged over an epoch's steps: {shares} (per_rank: "
          f"1.000). The bound counts even halves: much of the exact sampler's extra waiting comes from this "
          f"unevenness (compare the per_rank rows' waiting).")
    if have_torch:
        ratios = ", ".join(f"{name}: {matmul_ratio(case):.2f}" for name, case in CASES.items())
        print(f"DDP/nnlib against the BLAS libraries: NumPy's matmul rate over PyTorch's at one rank's products "
              f"(one thread each; NumPy in nnlib's chunks of at most 1,024 rows, PyTorch on the whole share): {ratios}. "
              f"Below 1, PyTorch's BLAS multiplies these products faster here than NumPy's; DDP/nnlib also counts "
              f"each library's communication and its work around the products.")
    print("comm/step: the communicate phase per step of the rank with the most (zero: both ring halves), "
          "waiting included; waiting: that rank's time waiting for the other to arrive; transfer: the rest, "
          "what the rank that arrived last spent (nnlib.lesson06_data_parallel.data_parallel.communication_split); bare Allreduce: "
          "100 Allreduces of the same gradient buffer on the same 2 ranks before training and 100 after, the mean "
          "of the two medians; cold: the same after reading 64 MB and writing the buffer before each call, as a "
          "training step leaves the caches. The ratios are taken run by run, then their median.")
    print_fault_costs()


def print_fault_costs() -> None:
    from nnlib.course.environment import mpiexec_path

    command = [mpiexec_path(), "-n", "2", sys.executable, __file__, "--fault-costs"]
    costs = json.loads(subprocess.run(command, capture_output=True, text=True, check=True, timeout=600).stdout
                       .strip().splitlines()[-1])
    epoch, call, bare = costs["epoch"], costs["call"], costs["allreduce"]
    print(f"\nThe cost of surviving faults: 2 ranks, 784-128-10, global batch 256, {costs['steps']} steps per epoch, "
          f"medians of {costs['repeats']} interleaved repeats")
    print(f"  an epoch's steps: blocking collectives {epoch['blocking']:.3f} s, watched {epoch['watched']:.3f} s "
          f"(watchdog cost {epoch['watched'] / epoch['blocking'] - 1:+.1%})")
    print(f"  a one-epoch call: watched {call['watched']:.3f} s, watched + a checkpoint at its end "
          f"{call['checkpoint']:.3f} s (checkpoint cost {call['checkpoint'] / call['watched'] - 1:+.1%})")
    print(f"  bare Allreduce of the {costs['gradient_bytes'] / 1e3:.0f} kB gradient: blocking "
          f"{bare['blocking'] * 1e6:.0f} us, watched {bare['watched'] * 1e6:.0f} us "
          f"(ratio {bare['watched'] / bare['blocking']:.2f})")
    print(f"  checkpoint: {costs['checkpoint_bytes'] / 1e3:.0f} kB, written (and flushed to disk) in "
          f"{costs['checkpoint_write'] * 1e3:.1f} ms, {costs['checkpoint_write'] / epoch['watched']:.1%} of an epoch's steps")


if __name__ == "__main__":
    main()
