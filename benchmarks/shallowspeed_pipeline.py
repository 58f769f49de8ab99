"""The closest NumPy + mpi4py peer's pipeline on this machine: ShallowSpeed's GPipe beside nnlib's, in one run.

Run:   .venv/bin/python benchmarks/shallowspeed_pipeline.py PATH [--rounds R]
       (PATH: a clone of https://github.com/siboehm/ShallowSpeed; not part of make benchmark, which needs no clone)

ShallowSpeed's train.py trains 784-128-127-126-125-124-123-10 (ReLU, softmax, MSE) with batch 128 in 4
micro-batches, 4 layers | 3 on 2 stages: the network and split of benchmarks/pipeline.py's speed comparison. Here its
own MLP, Worker, GPipeSchedule and SGD run as train.py runs them (data parallelism 1) for 200 steps of random float32
data held in memory (its Dataset reads parquet files; nothing else of it is replaced), in three ways: one process
with the whole batch (1 micro-batch), one process with 4 micro-batches (what train.py does with --pp 1: its default
naive schedule, each micro-batch forward, then back), and the 2-stage GPipe. Each round also runs nnlib's comparison
(pipeline.speed_round) and nnlib's one process in 4 micro-batches (a PipelineMLP of one stage, 1F1B: on one stage
the same order), so that both libraries are measured in the same interleaved rounds.
Prints the medians over R rounds (default 9), with their ranges, of the seconds and of each one's speed over the same
library's one process with the whole batch, and with 4 micro-batches. ShallowSpeed's weights are cast to float32
after it makes them: under NumPy 2, float32 / np.sqrt(n) is float64 (NumPy 1, which it was written for, kept float32).
"""

from __future__ import annotations

import argparse
import sys
import time
import types

from pipeline import (SPEED_BATCH, SPEED_MICRO_BATCHES, SPEED_SIZES, SPEED_STEPS, launch, quiet_wait, speed_round,
                      spread)


def shallowspeed_seconds(world, stages: int, micro_batches: int) -> float | None:
    """Seconds of SPEED_STEPS steps of ShallowSpeed on ``stages`` ranks (the slowest's), on rank 0: its GPipe on
    2 stages; on one, its train.py's default schedule (NaiveParallelSchedule: each micro-batch forward, then back)."""
    import numpy as np
    from mpi4py import MPI

    try:
        import pandas  # noqa: F401 (only ShallowSpeed's Dataset, not used here, needs it)
    except ImportError:
        sys.modules["pandas"] = types.ModuleType("pandas")
    from shallowspeed.layers import MLP
    from shallowspeed.optimizer import SGD
    from shallowspeed.pipe import GPipeSchedule, NaiveParallelSchedule, Worker

    pipe = world.Split(0 if world.rank < stages else MPI.UNDEFINED)
    if pipe == MPI.COMM_NULL:
        return None
    rng = np.random.default_rng(0)
    inputs = rng.random((SPEED_BATCH * SPEED_STEPS, SPEED_SIZES[0])).astype(np.float32)
    targets = np.eye(SPEED_SIZES[-1], dtype=np.float32)[rng.integers(0, SPEED_SIZES[-1], SPEED_BATCH * SPEED_STEPS)]
    rows = SPEED_BATCH // micro_batches

    class InMemory:  # the part of ShallowSpeed's Dataset that its Worker uses
        mubatch_size = rows

        def load_micro_batch_input(self, batch, k):
            return inputs[batch * SPEED_BATCH + k * rows:batch * SPEED_BATCH + (k + 1) * rows]

        def load_micro_batch_target(self, batch, k):
            return targets[batch * SPEED_BATCH + k * rows:batch * SPEED_BATCH + (k + 1) * rows]

    model = MLP(list(SPEED_SIZES), stage_idx=pipe.rank, n_stages=stages, batch_size=SPEED_BATCH)
    model.train()
    for parameter in model.parameters():
        parameter.data = parameter.data.astype(np.float32)
    replicas, schedule = pipe.Split(pipe.rank), GPipeSchedule if stages > 1 else NaiveParallelSchedule
    worker = Worker(replicas, pipe, model, InMemory(), SGD(model.parameters(), lr=0.006))
    began = time.perf_counter()
    for batch in range(SPEED_STEPS):
        worker.execute(schedule(num_micro_batches=micro_batches, num_stages=stages, stage_id=pipe.rank), batch)
    seconds = pipe.allreduce(time.perf_counter() - began, op=MPI.MAX)
    replicas.Free()
    pipe.Free()
    return seconds


def nnlib_micro_batched_seconds(comm) -> float | None:
    """Seconds of nnlib's one process stepping through the batch in micro-batches (a PipelineMLP of one stage, each
    micro-batch forward, then back), on rank 0; as speed_round's runs: the same data, settings and steps."""
    import numpy as np
    from mpi4py import MPI

    from nnlib import train
    from nnlib.lesson12_pipeline.pipeline import PipelineMLP

    quiet_wait(comm)
    if comm.rank != 0:
        quiet_wait(comm)
        return None
    rng = np.random.default_rng(0)
    inputs = rng.random((SPEED_BATCH * SPEED_STEPS, SPEED_SIZES[0])).astype(np.float32)
    labels = rng.integers(0, SPEED_SIZES[-1], SPEED_BATCH * SPEED_STEPS)
    network = PipelineMLP(MPI.COMM_SELF, SPEED_SIZES, dtype="float32", micro_batches=SPEED_MICRO_BATCHES,
                          schedule="1f1b")  # (on one stage: each micro-batch forward, then back, as ShallowSpeed's)
    began = time.perf_counter()
    train(network, inputs, labels, epochs=1, learning_rate=0.1, batch_size=SPEED_BATCH, momentum=0.9, progress=False)
    seconds = time.perf_counter() - began
    quiet_wait(comm)
    return seconds


def worker(rounds: int) -> None:
    """Both libraries' rounds on 2 ranks (ShallowSpeed's three cases in a rotating order); rank 0 prints."""
    import contextlib
    import io

    from mpi4py import MPI

    from nnlib.course.deadline import watch

    m, comm = SPEED_MICRO_BATCHES, watch(MPI.COMM_WORLD)
    cases = {"one process, 1 micro-batch": (1, 1), f"one process, {m} micro-batches": (1, m),
             f"2-stage GPipe, {m} micro-batches": (2, m)}
    seconds, ours, ours_micro = {name: [] for name in cases}, [], []
    for round_ in range(rounds):
        ours.append(speed_round(comm))
        ours_micro.append(nnlib_micro_batched_seconds(comm))
        names = list(cases)[round_ % 3:] + list(cases)[:round_ % 3]
        for name in names:
            stages, micro_batches = cases[name]
            quiet_wait(comm)
            with contextlib.redirect_stdout(io.StringIO()):  # (ShallowSpeed's MLP prints its layers)
                seconds[name].append(shallowspeed_seconds(MPI.COMM_WORLD, stages, micro_batches))
    quiet_wait(comm)
    if comm.rank != 0:
        return
    table = {"ShallowSpeed": list(seconds.values()),
             "nnlib": [[row["one"][0] for row in ours], ours_micro, [row["pipeline"][0] for row in ours]]}
    print(f"{'-'.join(map(str, SPEED_SIZES))}, batch {SPEED_BATCH}, {SPEED_STEPS} steps; medians of {rounds} "
          "interleaved rounds (range) of the seconds, and of the speed over the same library's one process with the "
          f"whole batch, and with {m} micro-batches:")
    for library, (whole, micro, pipelined) in table.items():
        for name, values in zip(cases, (whole, micro, pipelined)):
            over_whole, over_micro = [w / v for w, v in zip(whole, values)], [u / v for u, v in zip(micro, values)]
            print(f"  {library:12s} {name:30s} {spread(values)} s   {spread(over_whole, 3)}   {spread(over_micro, 3)}")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shallowspeed", nargs="?", help="a clone of github.com/siboehm/ShallowSpeed")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (medians)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds)
        return
    import os
    from pathlib import Path

    if not args.shallowspeed or not (Path(args.shallowspeed) / "shallowspeed" / "pipe.py").is_file():
        parser.error("give the folder of a ShallowSpeed clone (git clone https://github.com/siboehm/ShallowSpeed)")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(Path(args.shallowspeed).resolve()), str(Path(__file__).parent),
                                                os.environ.get("PYTHONPATH", "")])
    launch(__file__, args.rounds, f"ShallowSpeed's GPipe and nnlib's, float32; medians of {args.rounds} rounds",
           seconds_per_round=300)


if __name__ == "__main__":
    main()
