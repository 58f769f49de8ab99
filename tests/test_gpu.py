"""nnlib.gpu: the timing helpers and the seed's one-sample-at-a-time forward pass, on NumPy
(and the strict array API); on a GPU the same functions run against CuPy."""

import math
import subprocess
import sys

import numpy as np
import pytest

from nnlib import Network, backend, gpu

gpu_usable, gpu_reason = backend.gpu_status()


def test_median_seconds_warms_up_then_times_each_call():
    calls = []
    seconds = gpu.median_seconds(lambda: calls.append(1), np, repeats=5, warmup=2)
    assert len(calls) == 7 and seconds >= 0


def test_matmul_sweep_on_the_cpu_only():
    records = gpu.matmul_sweep([(120, 30, 20), (64, 64, 64)], repeats=2)
    assert [(r["m"], r["k"], r["n"]) for r in records] == [(120, 30, 20), (64, 64, 64)]
    assert all(r["cpu_seconds"] > 0 and math.isnan(r["gpu_seconds"]) for r in records)


@pytest.mark.parametrize("device", ["cpu", "strict"])
def test_one_sample_at_a_time_computes_the_same_outputs_as_batched(device):
    namespace = pytest.importorskip("array_api_strict") if device == "strict" else "cpu"
    network = Network((12, 8, 5), dtype="float64", seed=0, device=namespace)
    inputs = np.random.default_rng(0).random((7, 12))
    np.testing.assert_allclose(gpu.forward_one_sample_at_a_time(network, inputs),
                               gpu.forward_batched(network, inputs), rtol=1e-12)


def test_forward_comparison_records(monkeypatch):
    records = gpu.forward_comparison(np.random.default_rng(0).random((5, 784)).astype(np.float32), hidden=16,
                                     repeats=1)
    assert [r["variant"] for r in records] == ["per_sample", "batched"]
    assert all(r["cpu_seconds"] > 0 and math.isnan(r["gpu_seconds"]) for r in records)


def test_csv_round_trip_and_bad_csv(tmp_path):
    records = gpu.matmul_sweep([(8, 8, 8)], repeats=1)
    records.append({"kind": "epoch", "hidden": 128, "samples": 100, "cpu_seconds": 1.5, "gpu_seconds": 0.05,
                    "gpu_with_copies_seconds": float("nan")})
    for record in records:
        record.update(device="Test GPU", date="2026-11-22")
    gpu.save_csv(records, tmp_path / "gpu.csv")
    loaded = gpu.load_csv(tmp_path / "gpu.csv")
    assert loaded[1]["hidden"] == 128 and loaded[1]["gpu_seconds"] == 0.05 and loaded[1]["m"] is None
    assert loaded[0]["device"] == "Test GPU" and math.isnan(loaded[0]["gpu_seconds"])
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a CSV of GPU benchmark records"):
        gpu.load_csv(tmp_path / "bad.csv")


@pytest.mark.skipif(gpu_usable, reason="checks the message given on machines without a GPU")
def test_recording_command_refuses_without_a_gpu():
    run = subprocess.run([sys.executable, "-m", "nnlib", "gpu-benchmark"], capture_output=True, text=True)
    assert run.returncode == 2 and "no usable GPU" in run.stdout


@pytest.mark.skipif(not gpu_usable, reason=f"no usable GPU here: {gpu_reason}")
def test_gpu_sweep_and_forward_on_a_real_gpu():
    import cupy

    records = gpu.matmul_sweep([(120, 30, 20), (1024, 1024, 1024)], gpu=cupy, repeats=3)
    assert all(r["gpu_seconds"] > 0 and r["gpu_with_copies_seconds"] >= r["gpu_seconds"] * 0.5 for r in records)
    network = Network((12, 8, 5), dtype="float64", seed=0, device="gpu")
    inputs = np.random.default_rng(0).random((7, 12))
    np.testing.assert_allclose(gpu.forward_one_sample_at_a_time(network, inputs),
                               gpu.forward_batched(network, inputs), rtol=1e-10)
