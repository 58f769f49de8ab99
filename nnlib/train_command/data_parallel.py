"""The data-parallel job (lessons 06, 08-10, 13-17): this rank's network, sync, hooks, and results.

Every rank trains its copy of the network on its shard with nnlib.lesson06_data_parallel.train_parallel; the
network may be on a GPU (lesson 08), sharded or wrapped by lessons 16 and 17's memory options; the hooks inject the
faults and stragglers of lessons 13 and 14 and write checkpoints.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from nnlib.train_command.options import TRACE_STEPS, kinds_of, memory_options_used, parse_fault, parse_slow
from nnlib.train_command.reports import announce, report, save_trace, sent_arrays

LESSON = 19


def data_parallel_job(args, comm, settings, data, test) -> int:
    """The data-parallel job: strategy and network, what rank 0 says, the hooks, shard, train
    (nnlib.lesson06_data_parallel.train_parallel), report."""
    from nnlib.lesson02_network.arrays import is_numpy
    from nnlib.lesson06_data_parallel.data_parallel import EveryStep
    from nnlib.lesson06_data_parallel import gather_phase_seconds, gather_timeline, shard, train_parallel
    from nnlib.lesson08_gpu.backend import HostStaging, WaitForDevice
    from nnlib.lesson09_ring_allreduce.counting import CountingComm
    from nnlib.lesson10_zero_overlap.sampling import PerRankBatches
    from nnlib.lesson13_faults.checkpoint import CheckpointFolder, Checkpointing
    from nnlib.lesson13_faults.watchdog import RunNotes

    slow = parse_slow(args.slow).get(comm.rank)  # a straggler's extra seconds per step
    straggle = (lambda epoch, step, total_steps: time.sleep(slow)) if slow else None
    actions = [action for action in (fault_injector(parse_fault(args.fault), comm.rank), straggle) if action]
    strategy, network, gpus = job_parts(args, comm)
    announce(args, comm, network, gpus)
    on_gpu = not is_numpy(network.xp)
    hooks = [RunNotes(comm), *map(EveryStep, actions)]  # a fault after step S comes before the checkpoint after S
    hooks += [WaitForDevice(network.xp)] if on_gpu else []  # so each phase's time is its own
    if args.checkpoint_dir:
        hooks.append(Checkpointing(CheckpointFolder(args.checkpoint_dir, args.checkpoint_every or None),
                                   args.resume, progress=True))
    local_inputs, local_labels, start = shard(comm, *data)
    counting = CountingComm(comm)  # (what each rank hands to its collectives: lessons 09 and 15)
    staged = HostStaging(counting, network.xp) if on_gpu else counting
    with comm.guard():  # a rank that raises tells the others, which stop at once
        history = train_parallel(staged, network, local_inputs, local_labels, num_samples=args.samples,
                                 start=start, settings=settings, strategy=strategy, progress=True, hooks=hooks,
                                 batches=PerRankBatches if args.sampler == "per_rank" else None,
                                 timeline_steps=TRACE_STEPS if args.trace else 0,
                                 scaler=network.scaler if args.precision != "float32" else None)
    phases = gather_phase_seconds(comm, history)
    timelines = gather_timeline(comm, history) if args.trace else None
    test_accuracy, params = job_results(args, comm, network, test)
    if comm.rank == 0:
        if args.trace:
            from nnlib.course.trace import phase_spans

            save_trace(args.trace, phase_spans(timelines))
        more = dict(strategy=args.strategy, **sent_arrays(args, counting, history))
        report(args, comm.size, history, phases, test_accuracy, params, network.layer_sizes, more)
    return 0


def job_parts(args, comm):
    """(strategy, network, every rank's GPU index on rank 0): job_strategy's; this rank's network (sharded for
    fsdp) on job_device's device, in lesson 17's MixedPrecision or MicroBatched if their options are used."""
    from nnlib.lesson02_network.network import Network
    from nnlib.lesson08_gpu.backend import HostStaging
    from nnlib.lesson10_zero_overlap.zero import GradientShardedNetwork
    from nnlib.lesson17_activations.accumulation import MicroBatched
    from nnlib.lesson16_sharding.fsdp import FullyShardedNetwork
    from nnlib.lesson17_activations.mixed_precision import MixedPrecision

    (strategy, layer_sizes), (xp, gpus) = (job_strategy(args), (784, *args.hidden, 10)), job_device(args, comm)
    model = dict(output=args.output_layer, dtype=args.dtype, seed=args.seed, device=xp)
    if args.strategy == "fsdp":  # its gathers and reduce-scatters staged, as the gradients of the others
        network = FullyShardedNetwork(HostStaging(comm, xp), layer_sizes, **model)
    elif args.strategy == "zero" and args.zero_stage == 2:  # (on the CPU: options.option_problems)
        network = GradientShardedNetwork(comm, layer_sizes, args.output_layer, args.dtype, args.seed)
    else:
        network = Network(layer_sizes, **model)
    if args.precision != "float32":
        network = MixedPrecision(network, precision=args.precision, micro_batches=args.accumulate,
                                 recompute_every=args.recompute or None)
    elif memory_options_used(args):
        network = MicroBatched(network, args.accumulate, args.recompute or None)
    return strategy, network, gpus


def job_device(args, comm):
    """(the array namespace, every rank's GPU index or None on rank 0) for --device: numpy, or CuPy on this rank's
    GPU of its node (lesson 08); every rank stops together if one has no usable GPU, or if --device auto differs."""
    from mpi4py import MPI

    from nnlib.lesson02_network.arrays import is_numpy
    from nnlib.lesson04_collectives.collectives import fail_together, require_same_on_every_rank
    from nnlib.lesson08_gpu.backend import resolve_backend, use_gpu_of_local_rank

    gpu_index = use_gpu_of_local_rank(MPI.COMM_WORLD) if args.device != "cpu" else None
    xp, problem = None, None
    try:
        xp = resolve_backend(args.device)
    except RuntimeError as no_gpu:  # --device gpu without a usable GPU on this rank
        problem = str(no_gpu)
    fail_together(comm, problem)
    require_same_on_every_rank(comm, "the device (--device auto found a GPU on some ranks only)", not is_numpy(xp))
    return xp, comm.gather(gpu_index if not is_numpy(xp) else None, root=0)


def job_strategy(args):
    """What train_parallel takes for the job's training (kinds_of): --strategy, --compression or --local-steps."""
    kind = kinds_of(args)[0]
    if kind == "--local-steps":
        from nnlib.lesson15_compression.local_sgd import local_sgd

        return local_sgd(args.local_steps, args.outer_optimizer, args.outer_learning_rate)
    if kind == "--compression powersgd":
        from nnlib.lesson15_compression.powersgd import powersgd

        return powersgd(args.rank, seed=args.seed)
    if kind.startswith("--compression"):
        from nnlib.lesson15_compression.compression import compressed

        return compressed(args.compression, args.topk)
    from nnlib.lesson06_data_parallel.data_parallel import STRATEGIES
    from nnlib.lesson10_zero_overlap.overlap import Overlap
    from nnlib.lesson10_zero_overlap.zero import ZeRO, ZeROStage2
    from nnlib.lesson16_sharding.fsdp import FullySharded

    zero = ZeROStage2 if args.zero_stage == 2 else ZeRO
    return {**STRATEGIES, "zero": zero, "overlap": Overlap, "fsdp": FullySharded}[args.strategy]


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


def job_results(args, comm, network, test):
    """(test accuracy, the whole parameter vector) on rank 0 (None elsewhere); collective for fsdp."""
    if args.strategy == "fsdp":  # every rank scores its share of the test set: the forward pass is collective
        from nnlib.lesson06_data_parallel import shard

        local_inputs, local_labels, _ = shard(comm, *test)
        correct = comm.allreduce(round(network.accuracy(local_inputs, local_labels) * len(local_labels)))
        params = network.full_params()
        return correct / comm.allreduce(len(local_labels)), params
    if comm.rank != 0:
        return None, None
    return network.accuracy(*test), network.state_dict()["params"]  # (a copy on the host)
