"""`mpiexec -n N python -m nnlib train`: the batch job, its output file and its errors; atomic writes."""

import os
import subprocess
import sys

import numpy as np
import pytest

from nnlib.environment import mpiexec_path
from nnlib.files import atomic_write


def run_training(ranks, *arguments, timeout=180):
    return subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "nnlib", "train", *arguments],
                          capture_output=True, text=True, timeout=timeout)


def test_batch_job_trains_reports_on_rank_0_only_and_writes_its_output(tmp_path):
    output = tmp_path / "run.npz"
    run = run_training(2, "--samples", "3001", "--epochs", "2", "--batch-size", "64", "--hidden", "32",
                       "--strategy", "parameter_server", "--output", str(output))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert sum(line.startswith("epoch 1/2") for line in lines) == 1  # one progress line, from rank 0
    assert "2 ranks, strategy parameter_server, network 784-32-10, 3001 samples, global batch 64" in lines
    with np.load(output) as saved:
        assert saved["params"].shape == (784 * 32 + 32 + 32 * 10 + 10,)
        assert saved["layer_sizes"].tolist() == [784, 32, 10]
        assert saved["loss"].shape == (2,) and saved["loss"][1] < saved["loss"][0]
        assert saved["phase_seconds"].shape == (2, 4)
        assert 0.8 < float(saved["test_accuracy"]) <= 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["run.npz"]  # no temporary file left


@pytest.mark.parametrize("arguments, message", [
    (["--batch-size", "1"], "the global batch (1) is smaller than the number of ranks (2)"),
    (["--samples", "0"], "--samples must be between 1 and 60000"),
    (["--output", "/nonexistent/folder/run.npz"], "its folder does not exist"),
])
def test_bad_batch_job_settings_fail_clearly_on_every_rank(arguments, message):
    run = run_training(2, "--epochs", "1", "--samples", "500", *arguments)
    assert run.returncode == 2
    assert run.stderr.count(message) == 1, run.stderr  # said once (by rank 0), no hang, no traceback
    assert "Traceback" not in run.stderr


def test_atomic_write_renames_on_success_and_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "file.bin"
    with atomic_write(target) as stream:
        stream.write(b"complete")
        assert not target.exists()  # nothing visible until the block ends
    assert target.read_bytes() == b"complete"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(RuntimeError):
        with atomic_write(target) as stream:
            stream.write(b"half")
            raise RuntimeError("interrupted")
    assert target.read_bytes() == b"complete" and [p.name for p in tmp_path.iterdir()] == ["file.bin"]
