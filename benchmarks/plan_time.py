"""Lesson 19's time check: the planner's predicted step time of each layout on 2 ranks against its real step.

Run:   .venv/bin/python benchmarks/plan_time.py [--rounds R]     (starts itself under mpiexec -n 2)

On 2 ranks (one BLAS thread each), for SIZES and BATCH: the compute fit (runs.measure_compute) and alpha-beta
(runs.measure_link) of this machine, measured at the start; then every layout of LAYOUTS timed in R interleaved rounds
(runs.timed_steps, default 5), and a 2-stage pipeline cut by the planner's predicted costs. Prints, per layout, the predicted step (planner.step_seconds) beside the median
measured step with the rounds' range and the error (predicted - measured) / measured, and writes CSV_FILE. The issue's
bars: every error within 25%, and the layout predicted fastest among the two measured fastest.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from pipeline import launch  # noqa: E402 (benchmarks/pipeline.py's: the machine, then mpiexec -n 2)

SIZES, BATCH, OPTIMIZER = (784, 256, 128, 64, 10), 256, "momentum"
CSV_FILE = Path(__file__).parent.parent / "notebooks" / "results" / "plan_time.csv"
BOUND = 0.25


def layouts():
    from nnlib.lesson19_planning.layout import Layout

    return ([Layout(data=2, zero=zero) for zero in range(4)] + [Layout(data=2, micro_batches=4),
            Layout(data=2, recompute=2), Layout(tensor=2)]
            + [Layout(pipeline=2, micro_batches=m, schedule=s) for m in (2, 8) for s in ("gpipe", "1f1b")])


def worker(rounds: int) -> None:
    from mpi4py import MPI

    from nnlib.lesson19_planning.layout import Layout
    from nnlib.lesson19_planning.planner import Cluster, Job, cost_cut, step_seconds
    from nnlib.lesson19_planning.runs import measure_compute, measure_link, timed_steps

    comm = MPI.COMM_WORLD
    compute, link = comm.bcast(measure_compute(optimizer=OPTIMIZER)), measure_link(comm)
    machine = Cluster(comm.size, 2**40, comm.size, link, link, compute)
    job = Job(SIZES, BATCH, OPTIMIZER)
    by_cost = Layout(pipeline=2, micro_batches=8, cut=cost_cut(job, compute, BATCH // 8, 2))  # the planner's cut
    timed = timed_steps(comm, SIZES, BATCH, layouts() + [by_cost], rounds, optimizer=OPTIMIZER)
    if comm.rank:
        return
    print(f"compute: {compute.overhead * 1e6:.1f} us + FLOPs / {compute.flops_per_second / 1e9:.1f} GFLOP/s, "
          f"updates {compute.updates_per_second / 1e9:.2f} G/s; link: alpha {link.alpha * 1e6:.1f} us, "
          f"{1 / link.beta / 1e9:.2f} GB/s; {'-'.join(map(str, SIZES))}, batch {BATCH}, {rounds} rounds\n")
    rows = []
    for layout, seconds in timed.items():
        predicted, measured = step_seconds(job, machine, layout)["step"], sorted(seconds)[len(seconds) // 2]
        rows.append(dict(data=layout.data, tensor=layout.tensor, pipeline=layout.pipeline, zero=layout.zero,
                         cut="|".join(map(str, layout.cut)) if layout.cut else "",
                         recompute=layout.recompute or 0, micro_batches=layout.micro_batches, schedule=layout.schedule,
                         predicted_ms=predicted * 1e3, measured_ms=measured * 1e3, low_ms=min(seconds) * 1e3,
                         high_ms=max(seconds) * 1e3, error=(predicted - measured) / measured))
        print(f"{str(layout)[7:]:<104} predicted {rows[-1]['predicted_ms']:7.2f} ms, measured {rows[-1]['measured_ms']:7.2f}"
              f" [{rows[-1]['low_ms']:.2f}-{rows[-1]['high_ms']:.2f}] ms, error {rows[-1]['error']:+.0%}")
    with CSV_FILE.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    fastest = min(rows, key=lambda row: row["predicted_ms"])
    two = sorted(rows, key=lambda row: row["measured_ms"])[:2]
    print(f"\nwithin {BOUND:.0%}: {sum(abs(row['error']) <= BOUND for row in rows)} of {len(rows)}; "
          f"predicted fastest among the two measured fastest: {fastest in two}; wrote {CSV_FILE.name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="times every layout is measured (medians)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds)
        return
    launch(__file__, args.rounds, f"the planner's step times on 2 ranks; medians of {args.rounds} rounds",
           seconds_per_round=300)


if __name__ == "__main__":
    main()
