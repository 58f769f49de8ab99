"""`mpiexec -n N python -m nnlib train`: the batch job, its output file and its errors; atomic writes."""

import os
import subprocess
import sys

import numpy as np
import pytest

from stand_in_cupy import write_cupy_shim

from nnlib import backend
from nnlib.environment import mpiexec_path
from nnlib.files import atomic_write


def run_training(ranks, *arguments, timeout=180, pythonpath=None):
    environment = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    return subprocess.run([mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "nnlib", "train", *arguments],
                          capture_output=True, text=True, timeout=timeout, env=environment)


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


def test_batch_job_on_gpus_gives_each_rank_of_a_node_its_own_gpu(tmp_path):
    """With the stand-in CuPy (tests/stand_in_cupy.py) posing as 2 GPUs: 3 ranks on one node use
    GPUs 0, 1, 0, stage gradients through host memory, and learn as on the CPU."""
    pythonpath = write_cupy_shim(tmp_path, gpus=2)
    settings = ("--samples", "1500", "--epochs", "2", "--batch-size", "60", "--hidden", "16")
    run = run_training(3, "--device", "gpu", *settings, pythonpath=pythonpath)
    assert run.returncode == 0, run.stderr
    assert ("on the GPU (GPU Stand-in GPU (NumPy) passed a smoke test); GPU of each rank: [0, 1, 0]; "
            "gradients staged through host memory") in run.stdout
    on_cpu = run_training(3, "--device", "cpu", *settings)
    assert "on the GPU" not in on_cpu.stdout

    def results(stdout):
        return [line.split(", ")[:2] for line in stdout.splitlines() if line.startswith("epoch ")] + \
            [stdout.split("test accuracy ")[1].split(";")[0]]

    assert results(run.stdout) == results(on_cpu.stdout)


@pytest.mark.skipif(backend.gpu_status()[0], reason="checks the message given on machines without a GPU")
def test_batch_job_asked_for_a_gpu_without_one_fails_clearly():
    run = run_training(2, "--device", "gpu", "--samples", "500", "--epochs", "1")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "device='gpu' was asked for, but" in run.stderr and run.stderr.count("error:") == 1, run.stderr


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
