"""The batch job with --device gpu against --device cpu, for every mode: float64, the same weights within 1e-12.

    python3 scripts/gpu_job_equality.py                  on a machine with a GPU (mpiexec on PATH)
    python3 scripts/gpu_job_equality.py --stand-in       on the CPU: tests/stand_in_cupy.py's CountingCuPy poses as
                                                         CuPy (arrays that refuse silent trips to the host)

Each mode's job runs twice, on the CPU and on the GPU, with the same settings and --output; the two final
weight vectors must agree to a relative difference (largest |difference| / largest |weight|) of 1e-12. A mode
whose GPU run refuses --device gpu (exit 2, a one-line error) is listed as refused: it is not compared.
Exit 0 when every accepted mode agrees, 1 otherwise.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
SETTINGS = ["--samples", "1200", "--epochs", "2", "--batch-size", "64", "--hidden", "32", "--dtype", "float64"]
# (ranks, the mode's options): every --strategy, --compression, local SGD, model parallelism (1F1B, and ZB-H2's split
# backward; a 3-D grid, and ZeRO-1 on a grid's data axis), asynchronous SGD (one worker: a fixed order), and
# --precision bfloat16, which refuses --device gpu (CuPy has no bfloat16). --precision float16 runs on the GPU, but with float32 master weights no GPU run can agree with
# the CPU's to 1e-12: tests/test_train_command.py compares it on the stand-in only.
MODES = [(1, ["--strategy", "allreduce"]),
         (2, ["--strategy", "allreduce"]),
         (2, ["--strategy", "parameter_server"]),
         (2, ["--strategy", "reduce_broadcast"]),
         (2, ["--strategy", "zero"]),
         (2, ["--strategy", "overlap"]),
         (2, ["--strategy", "fsdp"]),
         (2, ["--compression", "float16"]),
         (2, ["--compression", "topk", "--topk", "2000"]),
         (2, ["--compression", "powersgd", "--rank", "2"]),
         (2, ["--local-steps", "2", "--sampler", "per_rank"]),
         (2, ["--grid", "1,2,1"]),
         (2, ["--grid", "1,1,2", "--schedule", "1f1b"]),
         (2, ["--grid", "1,1,2", "--schedule", "zb-h2"]),
         (4, ["--grid", "1,2,2", "--hidden", "32", "32", "32", "--schedule", "gpipe"]),
         (4, ["--grid", "2,2,1", "--strategy", "zero", "--optimizer", "adamw", "--learning-rate", "0.01"]),
         (2, ["--asynchronous"]),
         (2, ["--precision", "bfloat16", "--dtype", "float32"])]
TOLERANCE = 1e-12


def job(ranks: int, options, device: str, output: pathlib.Path, environment: dict) -> subprocess.Popen:
    mpiexec = shutil.which("mpiexec", path=environment.get("PATH"))
    if mpiexec is None:
        sys.exit("error: no mpiexec on PATH (the mpich wheel's bin/, see scripts/gpu-check.sh)")
    command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "nnlib", "train", *SETTINGS, *options,
               "--device", device, "--output", str(output)]
    return subprocess.Popen(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def compare(ranks, options, folder: pathlib.Path, cpu_environment, gpu_environment, timeout: float) -> tuple[str, str]:
    """Run one mode on both devices at once; (a line saying what happened, "agrees", "refuses" or "fails")."""
    name = f"{' '.join(options)}, {ranks} rank{'s' if ranks > 1 else ''}"
    outputs = {device: folder / f"{'_'.join(options).replace('-', '')}_{ranks}_{device}.npz" for device in ("cpu", "gpu")}
    runs = {device: job(ranks, options, device, outputs[device], environment)
            for device, environment in (("cpu", cpu_environment), ("gpu", gpu_environment))}
    results = {}
    for device, run in runs.items():
        try:
            results[device] = (*run.communicate(timeout=timeout), run.returncode)
        except subprocess.TimeoutExpired:
            run.kill()
            results[device] = ("", f"no result within {timeout:.0f} s", -9)
    gpu_out, gpu_err, gpu_code = results["gpu"]
    cpu_out, cpu_err, cpu_code = results["cpu"]
    if gpu_code == 2 and "--device" in gpu_err:
        return f"{name}: refuses --device gpu ({last_error(gpu_err)})", "refuses"
    if cpu_code != 0 or gpu_code != 0:
        failed = "cpu" if cpu_code != 0 else "gpu"
        return f"{name}: the {failed} run failed ({last_error(results[failed][1])})", "fails"
    with np.load(outputs["cpu"]) as cpu, np.load(outputs["gpu"]) as gpu:
        expected, got = cpu["params"], gpu["params"]
    difference = float(np.abs(got - expected).max() / np.abs(expected).max())
    if difference <= TOLERANCE:
        return f"{name}: relative difference {difference:.1e}, equal", "agrees"
    return f"{name}: relative difference {difference:.1e}, DIFFERS (more than {TOLERANCE:g})", "fails"


def last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["no message"])[-1][:200]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stand-in", action="store_true",
                        help="GPU runs with tests/stand_in_cupy.py's CountingCuPy as CuPy (no GPU needed)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds for one job (default 120)")
    parser.add_argument("--parallel", type=int, default=4, help="modes run at once (default 4)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    cpu_environment = dict(os.environ)
    cpu_environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory(prefix="nnlib-gpu-equality-") as folder:
        gpu_environment = dict(cpu_environment)
        if args.stand_in:
            sys.path.insert(0, str(ROOT / "tests"))
            from stand_in_cupy import write_cupy_shim

            shim = write_cupy_shim(folder, counting=True)
            gpu_environment["PYTHONPATH"] = os.pathsep.join([shim, cpu_environment["PYTHONPATH"]])
        verdicts = []
        with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
            runs = [pool.submit(compare, ranks, options, pathlib.Path(folder), cpu_environment, gpu_environment,
                                args.timeout) for ranks, options in MODES]
            for run in runs:  # in the order of MODES
                line, verdict = run.result()
                print(line, flush=True)
                verdicts.append(verdict)
    print(f"{len(MODES)} modes: {verdicts.count('agrees')} equal on the GPU, {verdicts.count('refuses')} refuse "
          f"--device gpu, {verdicts.count('fails')} fail ({time.perf_counter() - began:.0f} s)")
    return 1 if "fails" in verdicts else 0


if __name__ == "__main__":
    sys.exit(main())
