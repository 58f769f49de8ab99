"""Talking less (issue 27, lesson 15): every way of sending fewer bytes, on the same network and the same steps.

One batch job per method (``mpiexec -n 4 python -m nnlib train``, 784-256-10 on MNIST, 4 workers,
per-rank sampler, global batch 100, momentum 0.9, float32):

  synchronous               the plain Allreduce of the gradient at every step
  float16, bfloat16         16-bit gradients (Allgather)
  top-k 1%                  k = 1% of the parameters, with error feedback (two Allgathers)
  PowerSGD r = 1, 2, 4      two dense Allreduces per step
  local SGD H = 4, 16, 64   one Allreduce of the parameters every H steps (plain averaging)
  DiLoCo H = 4, 16, 64      the same with Nesterov outer steps (outer rate 0.7, momentum 0.9)

For each: the test accuracy, the bytes rank 0 handed to Allreduce and Allgather (counted on the real
calls by the job), their ratio to synchronous training's, and the alpha-beta model's communication
time per step from those calls (ring Allreduce / ring Allgather per call) on 8 and 64 workers over
1 Gbit/s Ethernet and 100 Gbit/s InfiniBand (nnlib.lesson04_collectives.costmodel's assumed networks).

Run:   .venv/bin/python benchmarks/communication_light.py            (the full grid: minutes)
       .venv/bin/python benchmarks/communication_light.py --samples 2000 --epochs 1 --hidden 16   (a smoke run)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from nnlib.course.environment import blas_kernel, mpiexec_path
from nnlib.lesson04_collectives.costmodel import ETHERNET_1G, INFINIBAND_100G
from nnlib.lesson15_compression.compression import counted_seconds

NETWORKS = {"1 Gbit/s": ETHERNET_1G, "100 Gbit/s": INFINIBAND_100G}
WORKERS = (8, 64)


def grid(num_params: int) -> dict:
    """{label: the batch job's extra arguments} of every method compared."""
    methods = {"synchronous": [], "float16": ["--compression", "float16"], "bfloat16": ["--compression", "bfloat16"],
               "top-k 1%": ["--compression", "topk", "--topk", str(max(1, num_params // 100))]}
    methods.update({f"PowerSGD r = {rank}": ["--compression", "powersgd", "--rank", str(rank)] for rank in (1, 2, 4)})
    for outer, name in (("average", "local SGD"), ("nesterov", "DiLoCo")):
        methods.update({f"{name} H = {steps}": ["--local-steps", str(steps), "--outer-optimizer", outer]
                        for steps in (4, 16, 64)})
    return methods


def run_job(ranks: int, common: list, extra: list, output: Path) -> dict:
    """One batch job; what it saved (test accuracy, the counted calls, the steps)."""
    command = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "nnlib", "train", *common, *extra,
               "--output", str(output)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{run.stderr}")
    with np.load(output) as saved:
        calls = {(str(name), int(nbytes)): int(count) for name, nbytes, count in
                 zip(saved["sent_collectives"], saved["sent_message_bytes"], saved["sent_counts"])}
        return dict(accuracy=float(saved["test_accuracy"]), calls=calls, sent=int(saved["sent_bytes"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--samples", type=int, default=60000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=100)
    args = parser.parse_args()
    common = ["--samples", str(args.samples), "--epochs", str(args.epochs), "--hidden", str(args.hidden),
              "--batch-size", str(args.batch_size), "--sampler", "per_rank", "--learning-rate", "0.1"]
    num_params = 784 * args.hidden + args.hidden + args.hidden * 10 + 10
    steps = args.epochs * -(-args.samples // args.batch_size)
    print(f"784-{args.hidden}-10 ({num_params:,} parameters), {args.samples} samples, {args.epochs} epochs of "
          f"batches of {args.batch_size} ({steps} steps), {args.ranks} workers, float32; BLAS kernel {blas_kernel()} "
          "(accuracy and bytes do not depend on it; the times are the alpha-beta model's)", flush=True)
    header = "".join(f"{f'{name}, {workers}':>16s}" for name in NETWORKS for workers in WORKERS)
    print(f"{'method':18s}{'test acc.':>10s}{'bytes/step':>12s}{'fewer':>8s}   model ms/step:{header}", flush=True)
    reference = None
    with tempfile.TemporaryDirectory(prefix="communication-light-") as folder:
        for label, extra in grid(num_params).items():
            result = run_job(args.ranks, common, extra, Path(folder) / "run.npz")
            reference = reference or result["sent"]
            times = "".join(f"{counted_seconds(result['calls'], workers, net.alpha, net.beta) / steps * 1e3:16.3f}"
                            for net in NETWORKS.values() for workers in WORKERS)
            print(f"{label:18s}{result['accuracy']:10.4f}{result['sent'] / steps:12,.0f}"
                  f"{reference / result['sent']:7.1f}x                {times}", flush=True)


if __name__ == "__main__":
    main()
