"""Lesson 19's roofline of one CPU core: the roofs, the ridge points, and every kernel of a training step on them.

Run:   .venv/bin/python benchmarks/roofline.py [--rounds R] [--output notebooks/results/roofline.csv]

Measures (nnlib.lesson19_planning.roofline, one thread, CPU time) in R interleaved rounds (default 5): the compute
roofs (a 2048 x 2048 product in float64 and float32), the memory roofs (a streaming copy inside each cache level and
in main memory), each the fastest of its repeats in a round, and each kernel of one step of the 784-128-64-10 network
(sigmoid hidden layers, softmax outputs) in float32 and float64, a median of 7 samples: the products at batch 32, 128
and 1024, the sigmoids, the softmax, and the SGD (momentum) and Adam updates. Every figure printed is the median over
the rounds, with its range (lowest-highest). Checks lesson 19's
done-when: every kernel at or under min(compute roof, bandwidth of the level its arrays fit in x intensity), within
the noise: a kernel passes if its median rate is at most its roof x (1 + margin), the margin being the larger of 5%
and the rounds' relative range (max - min) / median of its rate and of its roof. Prints the ridge points and which
kernels are compute-bound and which memory-bound at each batch; writes every kernel's row to the CSV (default
notebooks/results/roofline.csv, which notebook 19 plots). Exits 1 if a kernel is above its roof.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from statistics import median

from nnlib.course import environment
from nnlib.lesson01_mnist.files import write_csv
from nnlib.lesson19_planning import roofline

HERE = Path(__file__).resolve().parent
BATCHES, DTYPES = (32, 128, 1024), ("float32", "float64")


def spread(values) -> tuple:
    """(median, lowest, highest, relative range (max - min) / median)."""
    middle = median(values)
    return middle, min(values), max(values), (max(values) - min(values)) / middle


def measure(rounds: int, caches: dict):
    """R interleaved rounds: each measures the roofs, then every kernel. Returns ([computes], [bandwidths], [rows])."""
    kernels = [kernel for dtype in DTYPES for batch in BATCHES
               for kernel in roofline.step_kernels(roofline.LAYER_SIZES, batch, dtype)]
    kernels += [kernel for dtype in DTYPES for kernel in roofline.update_kernels(roofline.LAYER_SIZES, dtype)]
    computes, bandwidths, rows = [], [], []
    for number in range(rounds):
        bandwidths.append(roofline.memory_roofs(caches))
        computes.append({dtype: roofline.compute_roof(dtype, size=2048) for dtype in DTYPES})
        rows.append(roofline.measured_rows(kernels, computes[-1], bandwidths[-1], caches))
        print(f"round {number + 1}/{rounds}: float32 product {computes[-1]['float32'] / 1e9:.1f} GFLOP/s, "
              f"main memory {bandwidths[-1]['DRAM'] / 1e9:.1f} GB/s", flush=True)
    return computes, bandwidths, rows


def summarize(computes, bandwidths, rounds_rows, caches) -> tuple:
    """The medians' roofs and rows (rate_low, rate_high: the range; margin: the noise allowed) and the offenders."""
    compute = {dtype: spread([c[dtype] for c in computes]) for dtype in DTYPES}
    bandwidth = {level: spread([b[level] for b in bandwidths]) for level in bandwidths[0]}
    rows, over = [], []
    for index, first in enumerate(rounds_rows[0]):
        rate = spread([rows_of_round[index]["rate"] for rows_of_round in rounds_rows])
        kernel = roofline.Kernel(*(first[field] for field in roofline.Kernel._fields[:-1]), None)
        row = roofline.place(kernel, rate[0], {d: c[0] for d, c in compute.items()},
                             {level: b[0] for level, b in bandwidth.items()}, caches)
        roof_noise = compute[row["dtype"]][3] if row["bound"] == "compute" else bandwidth[row["level"]][3]
        margin = max(0.05, rate[3], roof_noise)
        rows.append({**row, "rate_low": rate[1], "rate_high": rate[2], "rounds": len(rounds_rows), "margin": margin})
        over += roofline.over_roof([row], margin)
    return compute, bandwidth, rows, over


def report(compute, bandwidth, rows, over, caches) -> None:
    print("\ncaches (sysfs): " + ", ".join(f"{level} {size >> 10} KiB" for level, size in caches.items()))
    print("copy footprints: " + ", ".join(f"{level} {size >> 10} KiB"
                                          for level, size in roofline.copy_footprints(caches).items()))
    for dtype, (middle, low, high, _) in compute.items():
        print(f"compute roof {dtype}: {middle / 1e9:.1f} GFLOP/s ({low / 1e9:.1f}-{high / 1e9:.1f})")
    for level, (middle, low, high, _) in bandwidth.items():
        print(f"memory roof {level:4s}: {middle / 1e9:.1f} GB/s ({low / 1e9:.1f}-{high / 1e9:.1f})")
    for dtype in DTYPES:
        ridges = roofline.ridge_points(compute[dtype][0], {level: b[0] for level, b in bandwidth.items()})
        print(f"ridge points {dtype} (FLOP/byte): " + ", ".join(f"{level} {at:.2f}" for level, at in ridges.items()))
    print(f"\n{'kernel':24s} {'dtype':7s} {'batch':>5s} {'FLOP/B':>7s} {'level':5s} {'GFLOP/s (range)':>22s} "
          f"{'roof':>7s} {'of roof':>7s} bound")
    for row in rows:
        print(f"{row['name']:24s} {row['dtype']:7s} {row['batch']:5d} {row['intensity']:7.2f} {row['level']:5s} "
              f"{row['rate'] / 1e9:8.2f} ({row['rate_low'] / 1e9:6.2f}-{row['rate_high'] / 1e9:6.2f}) "
              f"{row['roof'] / 1e9:7.1f} {row['rate'] / row['roof']:7.0%} {row['bound']}")
    print()
    for dtype in DTYPES:
        for batch in (*BATCHES, 0):
            chosen = [row for row in rows if row["dtype"] == dtype and row["batch"] == batch]
            memory = [row["name"] for row in chosen if row["bound"] == "memory"]
            print(f"{dtype}, {f'batch {batch}' if batch else 'the updates'}: {len(chosen) - len(memory)} compute-bound"
                  f" ({', '.join(row['name'] for row in chosen if row['bound'] == 'compute') or 'none'}); "
                  f"memory-bound: {', '.join(memory) or 'none'}")
    print(f"{len(rows) - len(over)} of {len(rows)} kernels at or under their roof within the noise "
          "(margin: the larger of 5% and the rounds' relative range of the rate and of the roof)")
    for row in over:
        print(f"ABOVE ITS ROOF: {row['name']} {row['dtype']} batch {row['batch']}: {row['rate'] / 1e9:.2f} GFLOP/s "
              f"against {row['roof'] / 1e9:.2f} (margin {row['margin']:.0%})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians over them (default 5)")
    parser.add_argument("--output", default=str(HERE.parent / "notebooks" / "results" / "roofline.csv"), help="the CSV of kernel rows")
    args = parser.parse_args(argv)
    described = environment.describe()
    print(f"machine: {described['machine']}; usable cores: {environment.usable_cores()}; "
          f"BLAS: {described['BLAS']}; BLAS kernel: {described['BLAS kernel']} (run in one thread)", flush=True)
    caches = roofline.cache_sizes()
    compute, bandwidth, rows, over = summarize(*measure(args.rounds, caches), caches)
    report(compute, bandwidth, rows, over, caches)
    write_csv(rows, args.output, roofline.CSV_FIELDS)
    print(f"wrote {len(rows)} rows to {args.output}")
    return 1 if over else 0


if __name__ == "__main__":
    if any(os.environ.get(name) for name in environment.FORCING_VARIABLES):  # the CPU's own BLAS kernel
        own = {name: value for name, value in os.environ.items() if name not in environment.FORCING_VARIABLES}
        os.execve(sys.executable, [sys.executable, *sys.argv], own)
    sys.exit(main())
