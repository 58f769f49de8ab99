"""The pipeline on 2 stages: its speed against one process, and its idle time ("bubble").

Run:   make benchmark        (or: .venv/bin/python benchmarks/pipeline.py [--rounds R] [--speed-rounds S]
                                                                     [--speed-batch B ...] [--only speed|bubbles])

Speed: lesson 03's training loop at batches 128 and 512 (or --speed-batch B ...), on SPEED_SIZES
(784-128-127-126-125-124-123-10, 7 layers), SPEED_STEPS steps of a random float32 data set. First rank 0 measures
each layer's seconds on one micro-batch (nnlib.lesson12_pipeline.balance.layer_seconds) and cuts the layers by that
cost (balance.balanced_cut) and by FLOPs. Then S interleaved rounds (default 7): the whole network in one process
(rank 0; rank 1 waits without spinning), then 2-stage GPipes with 4 micro-batches: the even cut (4 layers | 3), the
cut by cost, and the cut by FLOPs where it differs, their order rotating. It prints the medians over the rounds,
with their ranges, of: each one's seconds, its speed over the one process's (samples per second) and over the 4 | 3
cut's, the seconds each stage spent computing (the stages' timelines, waits excluded), and each cut's step time
against balance.predicted_step_seconds from the measured layer seconds, plus what the one process spends a step
outside loss_and_gradient (the loop, the batch's rows, the update). Then :func:`stage_costs`: stage 0 of the
4 | 3 cut on micro-batches against the whole network, and :func:`second_core_busy`: whether the machine gives the
two ranks two independent cores.

Starts itself under ``mpiexec -n 2`` (one BLAS thread per rank) and, for GPipe and 1F1B and
m = 1, 2, 4, 8, 16 micro-batches, runs pipeline steps on a random float32 batch (a warm-up step,
then the median of 5 steps), in R rounds (default 3) that interleave every case. It prints the
medians over the rounds of: the measured idle fraction (with its range), the one
nnlib.lesson12_pipeline.bubbles.simulated_bubble predicts from each stage's measured forward and backward
times, and the step's time (first computation to last); beside them (P - 1) / (m + P - 1), which
assumes equal stages, and the most micro-batches each stage kept alive. Then, per network and m,
1F1B's step time over GPipe's (1F1B keeps fewer micro-batches alive; it should not be slower).
The third network gives both stages the same forward work and the same backward work, which is
what the formula assumes (1F1B needs only their sums equal; GPipe needs each).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from statistics import median

NETWORKS = {"2304-1024-1024 (one layer per stage)": ((2304, 1024, 1024), 1024),
            "1024 x 9 (four layers per stage)": ((1024,) * 9, 512),
            # balanced: 10 layers, 5 per stage, each stage with 4 layers of 1024 x 1024 (1 unit forward, 2
            # backward) and one narrow layer: stage 0's first (64 -> 1024, whose input gradient nobody computes),
            # stage 1's last (1024 -> 10, so the loss is cheap). Forward 4 units and backward 8 on each stage.
            "64-1024 x 9-10 (balanced stages)": ((64,) + (1024,) * 9 + (10,), 1024)}
COUNTS = (1, 2, 4, 8, 16)  # micro-batches per step (measure_bubbles' default)
SPEED_SIZES, SPEED_BATCH, SPEED_STEPS, SPEED_MICRO_BATCHES = (784, 128, 127, 126, 125, 124, 123, 10), 128, 200, 4
SPEED_BATCHES = (128, 512)  # the speed comparison's default batches


def speed_round(comm, batch: int = SPEED_BATCH, cuts=None, order: int = 0) -> dict | None:
    """One round: the whole network trained in one process (rank 0), then a 2-stage GPipe for each of ``cuts``
    ({name: layers per stage, None for the even 4 | 3}; default {"pipeline": None}), in the order rotated by
    ``order``; rank 0 gets {"one", name...: (seconds, seconds computing)} and {"stages " + name: each stage's seconds
    computing} (None elsewhere)."""
    cuts = cuts or {"pipeline": None}
    import time

    import numpy as np

    from nnlib import Network, train
    from nnlib.lesson12_pipeline.pipeline import PipelineMLP

    rng = np.random.default_rng(0)
    inputs = rng.random((batch * SPEED_STEPS, SPEED_SIZES[0])).astype(np.float32)
    labels = rng.integers(0, SPEED_SIZES[-1], batch * SPEED_STEPS)
    settings = dict(epochs=1, learning_rate=0.1, batch_size=batch, momentum=0.9, progress=False)
    names = list(cuts)[order % len(cuts):] + list(cuts)[:order % len(cuts)]
    result = {}
    for kind in ["one", *names]:
        comm.Barrier()
        if kind == "one" and comm.rank != 0:
            quiet_wait(comm)  # rank 1 waits without taking a core from rank 0
            continue
        network = (Network(SPEED_SIZES, dtype="float32") if kind == "one" else
                   PipelineMLP(comm, SPEED_SIZES, dtype="float32", micro_batches=SPEED_MICRO_BATCHES, schedule="gpipe",
                               cut=cuts[kind]))
        computing = timed_compute(network)
        began = time.perf_counter()
        train(network, inputs, labels, **settings)
        result[kind] = (time.perf_counter() - began, computing[0])
        if kind == "one":
            quiet_wait(comm)
        else:
            result["stages " + kind] = comm.gather(sum(computing[1:]), root=0)
    return result if comm.rank == 0 else None


def measured_cuts(comm, batch: int) -> tuple[dict, tuple]:
    """Rank 0 measures each layer's seconds on one micro-batch (rank 1 waits): the cuts to compare, {"4 | 3": None
    (stage_layers' even cut), "by cost": balanced_cut of forward + backward, "by FLOPs": balanced_cut of layer_flops
    (if it differs)}, and (forward, backward), every rank getting rank 0's."""
    from nnlib.lesson12_pipeline.balance import balanced_cut, layer_flops, layer_seconds

    measured = None
    if comm.rank == 0:
        forward, backward = layer_seconds(SPEED_SIZES, batch // SPEED_MICRO_BATCHES, SPEED_MICRO_BATCHES, repeats=25)
        cuts = {"4 | 3": None, "by cost": balanced_cut(forward + backward, 2)}
        if balanced_cut(layer_flops(SPEED_SIZES), 2) != cuts["by cost"]:
            cuts["by FLOPs"] = balanced_cut(layer_flops(SPEED_SIZES), 2)
        measured = cuts, (forward, backward)
    else:
        quiet_wait(comm)
    if comm.rank == 0:
        quiet_wait(comm)
    return comm.bcast(measured, root=0)


def timed_compute(network) -> list:
    """[seconds in loss_and_gradient, then for a pipeline each step's seconds in its timeline], kept up to date."""
    import time

    computing, step = [0.0], network.loss_and_gradient

    def timed(*args, **kwargs):
        began = time.perf_counter()
        loss = step(*args, **kwargs)
        computing[0] += time.perf_counter() - began
        if hasattr(network, "timeline"):
            computing.append(sum(end - start for _, _, start, end in network.timeline))
        return loss

    network.loss_and_gradient = timed
    return computing


def quiet_wait(comm) -> None:
    """A barrier that sleeps while it waits (MPI's own Barrier may spin on a core)."""
    import time

    request = getattr(comm, "comm", comm).Ibarrier()  # (the MPI communicator under a watched one)
    while not request.Test():
        time.sleep(0.001)


def spread(values, digits: int = 2) -> str:
    """'median (min-max)' of ``values``."""
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def speed_report(rounds: list, batch: int, cuts: dict, layer_times) -> None:
    """Medians over the rounds (ranges in brackets): seconds, speed-up, seconds computing; each cut's speed over the
    4 | 3 cut's, and its step time against balance.predicted_step_seconds from the measured layer seconds, plus what
    the one process spends a step outside loss_and_gradient (the loop, the batch's rows, the update)."""
    from nnlib.lesson12_pipeline.balance import predicted_step_seconds, stage_sums
    from nnlib.lesson12_pipeline.pipeline import stage_layers

    forward, backward = layer_times
    outside = median((row["one"][0] - row["one"][1]) / SPEED_STEPS for row in rounds)  # loop, batch rows, update
    print(f"speed, {'-'.join(map(str, SPEED_SIZES))}, batch {batch}, {SPEED_STEPS} steps, GPipe with "
          f"{SPEED_MICRO_BATCHES} micro-batches; medians of {len(rounds)} interleaved rounds (range):")
    print(f"  each layer's seconds on one micro-batch of {batch // SPEED_MICRO_BATCHES} rows (forward + backward, "
          f"one process): " + " ".join(f"{seconds * 1e6:.0f}" for seconds in forward + backward) + " us")
    print(f"  one process        {spread([row['one'][0] for row in rounds])} s, computing "
          f"{spread([row['one'][1] for row in rounds])} s")
    for name, cut in cuts.items():
        cut = cut or tuple(stop - first for first, stop in stage_layers(len(SPEED_SIZES) - 1, 2))
        predicted = predicted_step_seconds(forward, backward, cut, SPEED_MICRO_BATCHES, "gpipe")
        predicted += outside  # the simulated span, then what one process spends outside loss_and_gradient a step
        steps = [row[name][0] / SPEED_STEPS for row in rounds]
        print(f"  cut {name:8s} {cut}: {spread([row[name][0] for row in rounds])} s, speed / one process's "
              f"{spread([row['one'][0] / row[name][0] for row in rounds], 3)}; stages computing "
              + ", ".join(spread([row['stages ' + name][stage] for row in rounds]) for stage in range(2)) + " s")
        in_run = [median(row["stages " + name][stage] for row in rounds) / SPEED_STEPS / SPEED_MICRO_BATCHES
                  for stage in range(2)]
        print(f"      each stage's seconds per micro-batch: from the layers' " + ", ".join(
              f"{seconds * 1e6:.0f}" for seconds in stage_sums(forward + backward, cut)) + " us, in the run "
              + ", ".join(f"{seconds * 1e6:.0f}" for seconds in in_run) + " us; step "
              f"{spread([step * 1e3 for step in steps])} ms, predicted {(predicted - outside) * 1e3:.2f} + "
              f"{outside * 1e3:.2f} = {predicted * 1e3:.2f} ms, measured / predicted "
              f"{spread([step / predicted for step in steps], 3)}")
        if cuts[name] is not None:
            print(f"      speed / the 4 | 3 cut's: {spread([row['4 | 3'][0] / row[name][0] for row in rounds], 3)}")
    print(flush=True)


def stage_costs(batch: int = SPEED_BATCH, rounds: int = 12, steps: int = 40) -> None:
    """Where the speed's limit is, in this one process: medians over interleaved rounds of one step's seconds of the
    whole network on ``batch`` rows, and of stage 0's layers (forward, then backward, as GPipe runs them) on
    SPEED_MICRO_BATCHES micro-batches, on one batch, and on the micro-batches with each weight gradient taken once
    over the whole batch (lesson 18's B/W split: dJ/dW = sum_k a_k.T delta_k = A.T D, A and D the stacked rows)."""
    import time

    import numpy as np

    from nnlib import Network
    from nnlib.lesson02_network.network import backward_layers, forward_layers

    network, rng = Network(SPEED_SIZES, dtype="float32"), np.random.default_rng(0)
    inputs, labels = rng.random((batch, SPEED_SIZES[0])).astype(np.float32), rng.integers(0, 10, batch)
    stage, rows = network.layers[:4], batch // SPEED_MICRO_BATCHES
    received = np.full((batch, SPEED_SIZES[4]), 0.01, np.float32)  # a stand-in for stage 1's dJ/da

    def stage_zero(micro_batches: int, defer_weights: bool = False) -> None:
        parts = [slice(k * batch // micro_batches, (k + 1) * batch // micro_batches)
                 for k in range(micro_batches)]
        kept = [forward_layers(stage, inputs[part])[0] for part in parts]
        deltas = [[] for _ in stage]
        for k, part in enumerate(parts):
            delta = stage[-1].logits_gradient(received[part].copy(), kept[k][-1])
            if not defer_weights:
                backward_layers(stage, kept[k], delta, k > 0)
                continue
            for index in range(len(stage) - 1, -1, -1):  # input gradients now, weight gradients below
                deltas[index].append(delta)
                if index:
                    delta = stage[index - 1].logits_gradient(stage[index].input_gradient(delta), kept[k][index])
        for index, layer in enumerate(stage if defer_weights else []):
            layer.weight_gradient(np.concatenate([a[index] for a in kept]), np.concatenate(deltas[index]))

    cases = {"whole network, 1 batch": lambda: network.loss_and_gradient(inputs, labels, check=False),
             f"stage 0, {SPEED_MICRO_BATCHES} micro-batches of {rows}": lambda: stage_zero(SPEED_MICRO_BATCHES),
             f"stage 0, 1 batch of {batch}": lambda: stage_zero(1),
             f"stage 0, {SPEED_MICRO_BATCHES} micro-batches, dJ/dW once": lambda: stage_zero(SPEED_MICRO_BATCHES, True)}
    seconds = {name: [] for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            run()
            began = time.perf_counter()
            for _ in range(steps):
                run()
            seconds[name].append((time.perf_counter() - began) / steps)
    whole = median(seconds["whole network, 1 batch"])
    print(f"one step in one process, medians of {rounds} interleaved rounds of {steps} steps (range), and / the whole:")
    for name, values in seconds.items():
        print(f"  {name:38s} {median(values) * 1e3:6.2f} ms ({min(values) * 1e3:.2f}-{max(values) * 1e3:.2f})"
              f"  {median(values) / whole:5.2f}")
    print(flush=True)


def second_core_busy(comm, rounds: int = 15, steps: int = 60) -> None:
    """Whether the two ranks' cores are independent (a pipeline needs both): rank 0 times ``steps`` steps of the
    whole network while rank 1 sleeps, and while rank 1 computes the same steps without pause, in interleaved
    rounds (the two in turn first); prints the median (range) of the paired ratios busy / sleeping (1.00: the
    cores do not slow each other)."""
    import time

    import numpy as np

    from nnlib import Network

    network, rng = Network(SPEED_SIZES, dtype="float32"), np.random.default_rng(0)
    inputs, labels = rng.random((SPEED_BATCH, SPEED_SIZES[0])).astype(np.float32), rng.integers(0, 10, SPEED_BATCH)
    seconds, raw = {"sleeping": [], "busy": []}, getattr(comm, "comm", comm)  # (the MPI communicator)
    network.loss_and_gradient(inputs, labels, check=False)  # (a first step, untimed)
    for round_ in range(rounds):
        for neighbour in sorted(seconds, reverse=round_ % 2 == 1):  # the two orders in turn
            quiet_wait(comm)
            if comm.rank == 0:
                began = time.perf_counter()
                for _ in range(steps):
                    network.loss_and_gradient(inputs, labels, check=False)
                seconds[neighbour].append(time.perf_counter() - began)
                raw.send(None, dest=1)
                continue
            done = raw.irecv(source=0)
            while not done.test()[0]:  # rank 1: the same work until rank 0 is done, or sleep
                if neighbour == "busy":
                    network.loss_and_gradient(inputs, labels, check=False)
                else:
                    time.sleep(0.001)
    if comm.rank == 0:
        ratios = [busy / alone for busy, alone in zip(seconds["busy"], seconds["sleeping"])]
        print(f"the second core: rank 0's {steps} steps with rank 1 computing / with rank 1 sleeping, medians of "
              f"{rounds} interleaved rounds: {median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}); "
              f"rank 0 alone {median(seconds['sleeping']) / steps * 1e3:.2f} ms a step "
              f"({min(seconds['sleeping']) / steps * 1e3:.2f}-{max(seconds['sleeping']) / steps * 1e3:.2f})\n",
              flush=True)


def worker(rounds: int, speed_rounds: int, only: str | None = None, batches=(SPEED_BATCH,)) -> None:
    from mpi4py import MPI

    from nnlib.course.deadline import watch
    from nnlib.lesson12_pipeline.bubbles import measure_bubbles

    comm = watch(MPI.COMM_WORLD)  # every message under the default deadline, as in a batch job
    if only != "bubbles":
        for batch in batches:
            cuts, layer_times = measured_cuts(comm, batch)
            speeds = [speed_round(comm, batch, cuts, order) for order in range(speed_rounds)]
            if comm.rank == 0:
                speed_report(speeds, batch, cuts, layer_times)
                stage_costs(batch)
        second_core_busy(comm)
    if only == "speed":
        return
    results = {}  # (network, schedule, m) -> that case's row from each round
    for _ in range(rounds):  # rounds interleaved, so that a slow spell of the machine hits every case alike
        for name, (sizes, batch) in NETWORKS.items():
            for schedule in ("gpipe", "1f1b"):
                rows = measure_bubbles(comm, sizes, batch, COUNTS, schedule=schedule, repeats=5)
                for row in rows or []:
                    results.setdefault((name, schedule, row["micro_batches"]), []).append(row)
    if comm.rank == 0:
        report(results, rounds)


def report(results: dict, rounds: int) -> None:
    """Medians over the rounds (the measured bubble's range beside it), then 1F1B's step time over GPipe's."""
    print(f"{'network (batch)':38s} {'sched':6s} {'m':>3s} {'measured (range)':>22s} {'simulated':>10s} "
          f"{'formula':>8s} {'step ms':>8s}   micro-batches alive per stage")
    for (name, schedule, m), rows in results.items():
        measured = [row["measured"] for row in rows]
        print(f"{name:38s} {schedule:6s} {m:3d} {median(measured):9.3f} ({min(measured):.3f}-{max(measured):.3f}) "
              f"{median(row['simulated'] for row in rows):10.3f} {rows[0]['formula']:8.3f} "
              f"{median(row['step_seconds'] for row in rows) * 1e3:8.1f}   {rows[0]['peak_alive']}")
    print(f"\nstep time, 1F1B / GPipe (median of the {rounds} rounds' ratios), for m = " + ", ".join(map(str, COUNTS)))
    for name in NETWORKS:
        ratios = [median(one["step_seconds"] / other["step_seconds"]
                         for one, other in zip(results[name, "1f1b", m], results[name, "gpipe", m])) for m in COUNTS]
        print(f"{name:38s} " + "  ".join(f"{ratio:5.2f}" for ratio in ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="times every bubble case is measured (medians)")
    parser.add_argument("--speed-rounds", type=int, default=7, help="rounds of the speed comparison (medians)")
    parser.add_argument("--speed-batch", type=int, nargs="+", default=list(SPEED_BATCHES),
                        help="the speed comparison's batches (default 128 512); 4 micro-batches are a quarter of each")
    parser.add_argument("--only", choices=("speed", "bubbles"), default=None, help="one of the two measurements")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.speed_batch) < SPEED_MICRO_BATCHES:
        parser.error(f"--speed-batch {min(args.speed_batch)}: give at least {SPEED_MICRO_BATCHES} rows, one per "
                     "micro-batch")
    if args.worker:
        worker(args.rounds, args.speed_rounds, args.only, args.speed_batch)
        return
    launch(__file__, args.rounds, f"2 stages, float32; medians of {args.rounds} rounds", seconds_per_round=900,
           extra=["--speed-rounds", str(args.speed_rounds), "--speed-batch", *map(str, args.speed_batch)]
           + (["--only", args.only] if args.only else []))


def launch(script: str, rounds: int, what: str, seconds_per_round: int, extra=()) -> None:
    """Print the machine and ``what``, then run ``script --worker --rounds R`` on 2 ranks under mpiexec, one BLAS
    thread per rank (set here, before the ranks import NumPy; they inherit it). benchmarks/pipeline_schedules.py
    starts itself through this too."""
    os.environ.update({name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):  # the CPU's own BLAS kernel, as `make benchmark` runs it
        os.environ.pop(name, None)
    from nnlib.course.environment import describe, mpiexec_path

    machine = describe()
    print(f"machine: {machine['machine']}; {machine['BLAS']}, kernel {machine['BLAS kernel']}; "
          f"{machine['MPI library']}; {what}\n", flush=True)
    subprocess.run([mpiexec_path(), "-n", "2", sys.executable, script, "--worker", "--rounds", str(rounds), *extra],
                   check=True, timeout=seconds_per_round * rounds)


if __name__ == "__main__":
    main()
