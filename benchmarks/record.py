"""``make benchmark``: every benchmark on the CPU's own BLAS kernel, its output recorded, dated, in RESULTS.md.

Run:   make benchmark        (or: .venv/bin/python benchmarks/record.py [--only data_parallel.py ...])

The benchmark commands alone run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset, so OpenBLAS
picks the kernel for this CPU (an environment may force an older one; nnlib.course.environment.kernel_note
says so and what it costs). Tests and CI keep the environment as it is. Each command's output is
shown as it runs, then appended to benchmarks/RESULTS.md under a dated heading with the machine,
the BLAS kernel, the versions, and how steady the machine was before and after (benchmarks/steadiness.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [["cpu_throughput.py", "--threads", "1"], ["data_parallel.py"], ["allreduce.py"], ["pipeline.py"],
              ["pipeline_schedules.py"], ["tensor_parallel.py"], ["memory.py"], ["classroom_deadline.py"],
              ["roofline.py"], ["plan_memory.py"], ["plan_time.py"]]
DESCRIBE = "from nnlib.course import environment as e; print('; '.join(f'{k}: {v}' for k, v in e.describe().items()))"


def own_kernel_environment() -> dict:
    from nnlib.course.environment import FORCING_VARIABLES

    return {name: value for name, value in os.environ.items() if name not in FORCING_VARIABLES}


def run(command, environment) -> str:
    """Run one benchmark, showing its output as it comes; return the output."""
    process = subprocess.Popen([sys.executable, str(HERE / command[0]), *command[1:]], env=environment,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    if process.wait() != 0:
        raise SystemExit(f"{command[0]} failed (exit {process.returncode}); nothing was recorded")
    return "".join(lines)


def steadiness(environment) -> str:
    """benchmarks/steadiness.py's line; if the probe itself fails, say so rather than lose the results."""
    try:
        return run(["steadiness.py"], environment).strip()
    except SystemExit as failure:
        return f"steadiness probe failed ({failure})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="run only these benchmark scripts")
    args = parser.parse_args()
    environment = own_kernel_environment()
    print("The benchmarks run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset: the CPU's own BLAS kernel "
          "(tests and CI keep the environment as it is).", flush=True)
    machine = subprocess.run([sys.executable, "-c", DESCRIBE], env=environment, capture_output=True, text=True,
                             check=True).stdout.strip()
    print(machine, flush=True)
    before = steadiness(environment)  # is the machine steady? (recorded with the results)
    outputs = [(" ".join(command), run(command, environment)) for command in BENCHMARKS
               if not args.only or command[0] in args.only]
    after = steadiness(environment)
    day = datetime.date.today().isoformat()
    section = [f"\n## `make benchmark`, {day}\n", f"{machine}\n", f"before: {before}  \nafter: {after}\n"]
    for command, output in outputs:
        section += [f"\n`benchmarks/{command}`:\n", "```", output.rstrip(), "```"]
    with open(HERE / "RESULTS.md", "a") as results:  # appended only once every benchmark has finished
        results.write("\n".join(section) + "\n")
    print(f"recorded in {HERE / 'RESULTS.md'}")


if __name__ == "__main__":
    main()
