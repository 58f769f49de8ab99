"""benchmarks/steadiness.py: the verdict on how steady the machine is, from block times with known answers,
and one short probe end to end."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "steadiness.py"
spec = importlib.util.spec_from_file_location("steadiness", PATH)
steadiness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(steadiness)


def test_steady_times_are_steady():
    alone = list(np.linspace(200e-6, 204e-6, 100))
    found = steadiness.verdict(alone, [alone, alone])
    assert found["steady"] and found["spread"] == pytest.approx(np.percentile(alone, 90) / np.percentile(alone, 10))
    assert found["contention"] == pytest.approx(1.0) and found["median_us"] == pytest.approx(202.0)
    assert steadiness.line(found).endswith(": steady") and "DISTURBED" not in steadiness.line(found)


def test_two_speeds_of_the_same_work_are_disturbed():
    """Half the blocks at 200 us, half at 320 us (a neighbour on the same core, as measured here once)."""
    alone = [200e-6] * 50 + [320e-6] * 50
    found = steadiness.verdict(alone, [alone, alone])
    assert found["spread"] == pytest.approx(1.6) and not found["steady"]
    assert "DISTURBED" in steadiness.line(found) and not steadiness.line(found).endswith(": steady")


def test_cores_that_slow_each_other_are_disturbed():
    alone = [200e-6] * 100
    found = steadiness.verdict(alone, [[260e-6] * 100, [240e-6] * 100])
    assert found["spread"] == pytest.approx(1.0) and found["contention"] == pytest.approx(1.25)
    assert not found["steady"]


def test_the_probe_times_real_products_on_every_usable_core():
    found = steadiness.probe(seconds=0.3)
    assert found["cores"] == steadiness.usable_cores() >= 1
    # 25.7 MFLOP a product: faster than 1 us would be 25 TFLOP/s on one core, slower than 0.1 s under 0.3 GFLOP/s
    assert 1 < found["median_us"] < 1e5, found
    assert steadiness.line(found).startswith("steadiness: (128 x 784) @ (784 x 128) float32")


def test_a_failing_worker_is_an_error(monkeypatch):
    monkeypatch.setattr(steadiness, "__file__", str(PATH.parent / "no_such_probe.py"))
    with pytest.raises(RuntimeError, match="steadiness worker failed"):
        steadiness.run_workers(2, 0.1)
