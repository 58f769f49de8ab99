"""nnlib.lesson07_scaling.scaling and nnlib.lesson04_collectives.costmodel: fits and tables on synthetic timings with known answers,
the cost model against hand-computed step times, and the harness end to end on 1 and 2 ranks."""

import sys
from pathlib import Path

import numpy as np
import pytest

from nnlib.lesson01_mnist.files import write_csv
from nnlib.lesson04_collectives import costmodel
from nnlib.lesson07_scaling import scaling

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))  # benchmarks/rates.py


def test_amdahl_fit_recovers_the_serial_fraction_of_exact_data():
    ranks = np.array([1, 2, 4, 8, 16])
    assert scaling.fit_amdahl(ranks, scaling.amdahl_speedup(ranks, 0.1)) == pytest.approx(0.1, abs=1e-12)
    assert scaling.fit_amdahl(ranks, ranks) == pytest.approx(0.0, abs=1e-12)  # perfect scaling
    assert scaling.amdahl_speedup([1, 1e9], 0.25).tolist() == pytest.approx([1.0, 4.0], rel=1e-6)  # limit 1/s


def test_gustafson_fit_recovers_the_serial_fraction_of_exact_data():
    ranks = np.array([1, 2, 4, 8])
    assert scaling.fit_gustafson(ranks, scaling.gustafson_speedup(ranks, 0.3)) == pytest.approx(0.3, abs=1e-12)
    assert scaling.gustafson_speedup([4], 0.5).tolist() == [2.5]
    with pytest.raises(ValueError, match="more than one rank"):
        scaling.fit_amdahl([1, 1], [1, 1])


def synthetic_record(kind, ranks, seconds, repeat=0, cores=2):
    return {"kind": kind, "ranks": ranks, "samples": 100 * (ranks if kind == "weak" else 1), "strategy": "allreduce",
            "repeat": repeat, "epoch_seconds": seconds, "load_seconds": 0.1, "data_seconds": 0.0,
            "compute_seconds": seconds * 0.8, "communicate_seconds": seconds * 0.2, "update_seconds": 0.0,
            "accuracy": 0.9, "oversubscribed": ranks > cores, "physical_cores": cores, "blas": "b",
            "mpi_library": "m", "machine": "x", "where": "live"}


def test_summary_medians_speedup_efficiency_and_oversubscription():
    records = [synthetic_record("strong", 1, t, i) for i, t in enumerate([1.0, 1.2, 0.9])]
    records += [synthetic_record("strong", 2, t, i) for i, t in enumerate([0.5, 0.6, 0.55])]
    records += [synthetic_record("strong", 4, 0.4)]
    records += [synthetic_record("weak", 1, 1.0), synthetic_record("weak", 4, 1.25)]
    rows = {(row["kind"], row["ranks"]): row for row in scaling.summarize(records)}
    assert rows["strong", 1]["epoch_seconds"] == 1.0 and rows["strong", 1]["spread"] == pytest.approx(0.3)
    assert rows["strong", 2]["speedup"] == pytest.approx(1.0 / 0.55)
    assert rows["strong", 4]["efficiency"] == pytest.approx(2.5 / 4)
    assert rows["weak", 4]["efficiency"] == pytest.approx(0.8) and rows["weak", 4]["speedup"] == pytest.approx(3.2)
    assert rows["strong", 4]["oversubscribed"] and not rows["strong", 2]["oversubscribed"]
    table = scaling.format_table(scaling.summarize(records), "strong")
    assert "   4* " in table and "oversubscribed" in table and "   2  " in table


def test_cost_model_reproduces_hand_computed_times():
    alpha, beta, n = 1e-6, 1e-9, 1000
    # Ring: 2(P-1) alpha + 2(P-1)/P n beta = 6e-6 + 1.5e-6 on 4 ranks; nothing on 1 rank.
    assert costmodel.ring_allreduce_time(n, [1, 4], alpha, beta).tolist() == pytest.approx([0.0, 7.5e-6])
    # Parameter server on 4 ranks: 3 messages in, then ceil(log2 4) = 2 out, each alpha + n beta = 2e-6.
    assert costmodel.parameter_server_time(n, [4], alpha, beta).tolist() == pytest.approx([10e-6])
    ranks = np.array([1, 4])
    communication = costmodel.communication_time("allreduce", n, ranks, alpha, beta)
    step = costmodel.step_time(ranks, compute_seconds=8e-3, communication_seconds=communication, update_seconds=1e-4)
    assert step.tolist() == pytest.approx([8e-3 + 1e-4, 2e-3 + 7.5e-6 + 1e-4])
    with pytest.raises(ValueError, match="strategy must be one of allreduce, parameter_server"):
        costmodel.communication_time("gossip", 1, 2, 1, 1)


def test_latency_bandwidth_fit_of_exact_data():
    sizes = np.array([8, 1e3, 1e5, 1e7])
    alpha, beta = costmodel.fit_latency_bandwidth(sizes, 3e-6 + 5e-10 * sizes)
    assert alpha == pytest.approx(3e-6, rel=1e-9) and beta == pytest.approx(5e-10, rel=1e-9)


def test_warmup_schedule():
    schedule = scaling.warmup_schedule(0.1, 0.8, warmup_epochs=2.0)
    assert [schedule(p) for p in (0.0, 1.0, 2.0, 5.0)] == pytest.approx([0.1, 0.45, 0.8, 0.8])
    assert scaling.warmup_schedule(0.1, 0.8, 0.0)(0.0) == 0.8


def test_csv_round_trip_and_bad_csv(tmp_path):
    records = [dict(synthetic_record("strong", 1, 1.0), where="recorded on a test machine"),
               synthetic_record("weak", 4, 1.25)]
    path = tmp_path / "scaling.csv"
    write_csv(records, path, scaling.RECORD_FIELDS)
    loaded = scaling.load_csv(path)
    assert [r["epoch_seconds"] for r in loaded] == [1.0, 1.25] and loaded[1]["oversubscribed"] is True
    assert loaded[0]["where"] == "recorded on a test machine" and loaded[0]["ranks"] == 1
    (tmp_path / "bad.csv").write_text("ranks,seconds\n1,2\n")
    with pytest.raises(ValueError, match="not a CSV of scaling records"):
        scaling.load_csv(tmp_path / "bad.csv")


def test_harness_end_to_end_on_one_and_two_ranks():
    records = scaling.measure([1, 2], kind="strong", samples=2000, repeats=1, hidden=(16,), epochs=2, batch_size=100)
    records += scaling.measure([1, 2], kind="weak", samples=1000, repeats=1, hidden=(16,), epochs=2, batch_size=100)
    assert [(r["kind"], r["ranks"], r["samples"]) for r in records] == [
        ("strong", 1, 2000), ("strong", 2, 2000), ("weak", 1, 1000), ("weak", 2, 2000)]
    for record in records:
        assert record["epoch_seconds"] > 0 and 0.1 < record["accuracy"] <= 1
        assert record["compute_seconds"] > 0 and record["physical_cores"] >= 1 and record["mpi_library"]
    # Same global batches and seed: 1 and 2 ranks end with the same network, hence the same accuracy.
    assert records[0]["accuracy"] == records[1]["accuracy"]
    rows = scaling.summarize(records)
    assert [row["speedup"] for row in rows if row["ranks"] == 1] == [1.0, 1.0]
    seconds = scaling.measure_messages(2, [8, 65536], repeats=5)  # one Sendrecv of each size
    assert seconds.shape == (2,) and np.all(seconds > 0)


def test_matmul_rate_multiplies_the_steps_shapes_in_the_library_it_is_given():
    """benchmarks/cpu_throughput.py's matmul ratio: the same products, turned into another library's arrays."""
    from rates import matmul_rate, step_matmul_shapes

    shapes = []

    class Operand(np.ndarray):  # a NumPy array that records the shapes multiplied, as another library would run them
        def __matmul__(self, other):
            shapes.append((self.shape[0], self.shape[1], other.shape[1]))
            return np.asarray(self) @ np.asarray(other)

    rate = matmul_rate((20, 7, 3), 5, min_seconds=0.01, convert=lambda array: array.view(Operand))
    expected = step_matmul_shapes((20, 7, 3), 5)
    assert rate > 0 and len(shapes) >= 2 * len(expected) and len(shapes) % len(expected) == 0
    assert shapes[:len(expected)] == [tuple(shape) for shape in expected]


def test_numpy_over_torch_times_numpy_in_nnlibs_chunks_and_the_other_library_whole(monkeypatch):
    """The matmul ratio of the benchmarks: NumPy at nnlib's chunk of at most chunk_size rows, the other library
    (here a stand-in for torch that records its products' shapes) on the whole batch."""
    import types

    from nnlib import Network
    import rates as benchmarks

    shapes, rows_timed = [], []

    class Operand(np.ndarray):
        def __matmul__(self, other):
            shapes.append((self.shape[0], self.shape[1], other.shape[1]))
            return np.asarray(self) @ np.asarray(other)

    real_rate = benchmarks.matmul_rate

    def quick_rate(layer_sizes, rows, convert=None):
        rows_timed.append(rows)
        return real_rate(layer_sizes, rows, min_seconds=0.01, convert=convert)

    monkeypatch.setattr(benchmarks, "matmul_rate", quick_rate)
    fake_torch = types.SimpleNamespace(from_numpy=lambda array: array.view(Operand))
    ratio = benchmarks.numpy_over_torch_matmul((6, 3, 2), 3000, fake_torch)
    assert ratio > 0 and rows_timed == [Network((2, 1)).chunk_size, 3000], rows_timed
    expected = [tuple(shape) for shape in benchmarks.step_matmul_shapes((6, 3, 2), 3000)]
    assert shapes[:len(expected)] == expected  # the stand-in multiplied the whole batch's products
