"""nnlib.course.environment.keep_freed_memory: a training step's freed memory is reused, not faulted in afresh.

Each check runs in a fresh interpreter (the allocator's settings are per process and cannot be undone),
counts the minor page faults of a loop that allocates and frees what a wide layer's step does (three
4 MiB arrays), and compares ``import nnlib`` with NNLIB_KEEP_FREED_MEMORY=0 (glibc's defaults).
"""

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                reason="keep_freed_memory sets glibc's malloc; this C library is not glibc")

STEPS = 40
LOOP = f"""
import json, resource
import numpy as np
import nnlib
from nnlib.course import environment
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({STEPS}):
    activations = np.ones((1024, 1024), np.float32)   # 4 MiB each, like 784-1024-10's on 1,024 rows
    delta = activations * 2
    product = delta + activations
    del activations, delta, product
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps(dict(faults=faults, kept=environment._freed_memory_kept, memory=environment.describe()["memory"])))
"""


def faults_per_step(keep: bool) -> dict:
    env = dict(os.environ, NNLIB_KEEP_FREED_MEMORY="1" if keep else "0")
    reply = subprocess.run([sys.executable, "-c", LOOP], capture_output=True, text=True, env=env, timeout=120)
    assert reply.returncode == 0, reply.stderr
    result = json.loads(reply.stdout.strip().splitlines()[-1])
    return dict(result, per_step=result["faults"] / STEPS)


def test_import_nnlib_keeps_the_memory_a_step_frees():
    kept, default = faults_per_step(keep=True), faults_per_step(keep=False)
    # Three 4 MiB arrays are 3,072 pages of 4 KiB: handed back and faulted in again at every step by default
    # (fewer with transparent huge pages), faulted in once, at the first step, with the setting.
    assert kept["kept"] and not default["kept"], (kept, default)
    assert kept["faults"] < 3 * 1024 + 1000, kept
    assert default["faults"] > 10 * max(kept["faults"], 1) and default["per_step"] > 200, (kept, default)
    assert "kept for reuse" in kept["memory"] and "handed back" in default["memory"], (kept, default)


def test_keep_freed_memory_sets_both_thresholds_and_says_so():
    from nnlib.course import environment

    assert environment.keep_freed_memory() is True  # (idempotent: this process already imported nnlib)
    assert environment.KEEP_FREED_BYTES > environment.MAPPED_FROM_BYTES >= 4 << 20  # a wide layer's array fits
