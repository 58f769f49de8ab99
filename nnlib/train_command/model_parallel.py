"""The model-parallel job (lessons 09 and 13): tensor or pipeline parallelism inside replicas, data parallelism
across them (nnlib.lesson09_model_parallel.grid). Lesson 12's memory options do not combine with it
(nnlib.train_command.options.COMBINES)."""

from __future__ import annotations

import numpy as np

from nnlib.train_command.reports import report, save_trace

LESSON = 13


def model_parallel_job(args, comm, settings, data, test) -> int:
    """--model-parallel tensor|pipeline: nnlib.lesson09_model_parallel.grid's grid; every rank gets the data from rank 0."""
    from nnlib.lesson04_collectives.collectives import broadcast_new
    from nnlib.lesson05_data_parallel import gather_phase_seconds
    from nnlib.lesson07_gpu.backend import HostStaging
    from nnlib.lesson08_inside_allreduce.sampling import PerRankBatches
    from nnlib.lesson09_model_parallel.grid import train_hybrid
    from nnlib.lesson09_model_parallel.tensor import TensorParallelMLP
    from nnlib.lesson13_pipeline_schedules.schedules import ScheduledPipeline
    from nnlib.train_command.data_parallel import job_device

    (inputs, labels), (test_inputs, test_labels) = [(broadcast_new(comm, first), broadcast_new(comm, second))
                                                    for first, second in (data, test)]
    model_size, (xp, gpus) = args.model_size or comm.size, job_device(args, comm)
    sizes = (784, *args.hidden, 10)
    if comm.rank == 0:
        print(f"{comm.size} ranks: {comm.size // model_size if comm.size % model_size == 0 else '?'} replica(s) of "
              f"{model_size} ({args.model_parallel} parallelism inside), network {'-'.join(map(str, sizes))}, "
              f"{args.samples} samples, global batch {args.batch_size or 'full'}"
              + (f"; GPU of each rank: {gpus}" if gpus[0] is not None else ""), flush=True)
    model = dict(layer_sizes=sizes, output=args.output_layer, dtype=args.dtype, seed=args.seed, device=xp)

    def build_piece(model_comm):  # this rank's piece of its replica (model_comm is watched and staged, as comm)
        if args.model_parallel == "tensor":
            return TensorParallelMLP(model_comm, **model)
        return ScheduledPipeline(model_comm, **model, micro_batches=args.micro_batches, schedule=args.schedule,
                                 chunks=(args.virtual_stages or 2) if args.schedule == "interleaved" else 1)

    with comm.guard():  # the grid's communicators are split from the watched comm: every message has a deadline
        network, history = train_hybrid(
            HostStaging(comm, xp), model_size, build_piece, inputs, labels, strategy=args.strategy,
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
            from nnlib.course.trace import pipeline_spans
            save_trace(args.trace, pipeline_spans(*zip(*timelines), stages=model_size))  # last step, chunks named
    return 0
