"""nnlib.lesson19_planning.roofline: the intensities against hand counts, the roof and ridge points, the cache sizes
from a fake sysfs tree, and the done-when check, which a planted wrong intensity fails. No timed assertions."""

import math

import numpy as np
import pytest

from nnlib.lesson02_network.network import sigmoid, softmax
from nnlib.lesson03_training.optimizers import adam_update, sgd_update
from nnlib.lesson04_collectives.costmodel import flops_per_sample
from nnlib.lesson19_planning import roofline

LAYERS = (4, 3, 2)  # products (N, 4) @ (4, 3), (N, 3) @ (3, 2), (4, N) @ (N, 3), (3, N) @ (N, 2), (N, 2) @ (2, 3)


def test_the_products_intensities_are_the_hand_counts():
    kernels = {kernel.name: kernel for kernel in roofline.step_kernels(LAYERS, batch=5, dtype="float64")}
    # (5, 4) @ (4, 3): 2 * 5 * 4 * 3 = 120 FLOPs; 20 + 12 + 15 = 47 numbers of 8 bytes, each moved once
    assert (kernels["5x4 @ 4x3"].flops, kernels["5x4 @ 4x3"].moved_bytes) == (120, 376)
    assert (kernels["4x5 @ 5x3"].flops, kernels["4x5 @ 5x3"].moved_bytes) == (120, 8 * (20 + 15 + 12))
    assert (kernels["5x2 @ 2x3"].flops, kernels["5x2 @ 2x3"].moved_bytes) == (60, 8 * (10 + 6 + 15))
    assert kernels["5x4 @ 4x3"].held_bytes == kernels["5x4 @ 4x3"].moved_bytes
    products = [kernel for kernel in kernels.values() if "@" in kernel.name]
    assert len(products) == 5 and sum(kernel.flops for kernel in products) == 5 * flops_per_sample(LAYERS)
    float32 = {kernel.name: kernel for kernel in roofline.step_kernels(LAYERS, batch=5, dtype="float32")}
    assert float32["5x4 @ 4x3"].moved_bytes == 188  # half the bytes: twice the intensity


def test_the_elementwise_kernels_are_the_hand_counts():
    kernels = {kernel.name: kernel for kernel in roofline.step_kernels(LAYERS, batch=5, dtype="float64")}
    sigmoid_kernel, softmax_kernel = kernels["sigmoid (5, 3)"], kernels["softmax (5, 2)"]
    assert (sigmoid_kernel.flops, sigmoid_kernel.moved_bytes, sigmoid_kernel.held_bytes) == (60, 240, 240)
    assert (softmax_kernel.flops, softmax_kernel.moved_bytes) == (50, 160)
    sgd, adam = roofline.update_kernels(LAYERS, "float64")
    parameters = 4 * 3 + 3 + 3 * 2 + 2
    assert (sgd.flops, sgd.moved_bytes, sgd.held_bytes) == (4 * parameters, 5 * 8 * parameters, 3 * 8 * parameters)
    assert (adam.flops, adam.moved_bytes, adam.held_bytes) == (12 * parameters, 7 * 8 * parameters, 4 * 8 * parameters)
    for kernel in [*kernels.values(), sgd, adam]:
        kernel.run()  # each runs


class Counted(np.ndarray):
    """An ndarray that counts the element operations done on it: each ufunc call adds its largest operand's size."""
    operations = 0

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        Counted.operations += max(np.size(operand) for operand in inputs)
        plain = tuple(x.view(np.ndarray) if isinstance(x, Counted) else x for x in inputs)
        if out is not None:
            getattr(ufunc, method)(*plain, out=tuple(o.view(np.ndarray) for o in out), **kwargs)
            return out[0]
        return getattr(ufunc, method)(*plain, **kwargs).view(Counted)


@pytest.mark.parametrize("name", list(roofline.ELEMENTWISE))
def test_the_flops_per_element_are_the_operations_the_lessons_code_does(name):
    rng = np.random.default_rng(0)
    p, g, m, v = (rng.random(6).view(Counted) for _ in range(4))
    z = rng.random((2, 3)).view(Counted)
    Counted.operations = 0
    {"sigmoid": lambda: sigmoid(z), "softmax": lambda: softmax(z, np),
     "SGD momentum": lambda: sgd_update(p, g, m, 0.1, 0.9),
     "Adam": lambda: adam_update(p, g, m, v, 0.9, 0.999, 1e-3, 1e-8)}[name]()
    assert Counted.operations == roofline.ELEMENTWISE[name][0] * 6


def test_the_roof_is_the_lower_of_compute_and_bandwidth_times_intensity_and_meets_at_the_ridge():
    compute, bandwidths = 100.0, {"L1": 50.0, "DRAM": 10.0}
    assert roofline.attainable(1.0, compute, 10.0) == 10.0  # memory-bound: B I
    assert roofline.attainable(1000.0, compute, 10.0) == 100.0  # compute-bound: P
    assert list(roofline.attainable([0.5, 20.0], compute, 10.0)) == [5.0, 100.0]
    ridges = roofline.ridge_points(compute, bandwidths)
    assert ridges == {"L1": 2.0, "DRAM": 10.0}
    for level, ridge in ridges.items():
        assert bandwidths[level] * ridge == pytest.approx(compute)  # both roofs meet there
        assert roofline.attainable(0.9 * ridge, compute, bandwidths[level]) < compute


def kernel(held_bytes, flops=1000.0, moved_bytes=100.0, dtype="float32"):
    return roofline.Kernel("k", 32, dtype, flops, moved_bytes, held_bytes, None)


def test_place_finds_the_level_the_arrays_fit_in_and_what_bounds_the_kernel():
    caches, computes = {"L1": 1000, "L2": 10_000}, {"float32": 100.0, "float64": 50.0}
    bandwidths = {"L1": 40.0, "L2": 20.0, "DRAM": 5.0}
    rows = [roofline.place(kernel(held), 30.0, computes, bandwidths, caches) for held in (1000, 1001, 20_000)]
    assert [row["level"] for row in rows] == ["L1", "L2", "DRAM"]
    assert [row["roof"] for row in rows] == [100.0, 100.0, 50.0]  # I = 10: min(100, 40 * 10), (100, 200), (100, 50)
    assert [row["bound"] for row in rows] == ["compute", "compute", "memory"]
    assert roofline.place(kernel(10, dtype="float64"), 1.0, computes, bandwidths, caches)["roof"] == 50.0
    assert rows[0]["intensity"] == 10.0
    assert set(roofline.CSV_FIELDS) - {"rate_low", "rate_high", "rounds"} <= set(rows[0])


def test_a_planted_wrong_intensity_puts_a_kernel_above_its_roof_and_the_check_fails():
    caches, computes, bandwidths = {"L1": 1000}, {"float32": 100.0}, {"L1": 4.0, "DRAM": 1.0}
    rate = 30.0  # measured: 1000 FLOPs moving 100 bytes (I = 10): roof min(100, 40) = 40
    right = roofline.place(kernel(500), rate, computes, bandwidths, caches)
    planted = roofline.place(kernel(500, moved_bytes=1000.0), rate, computes, bandwidths, caches)  # I = 1: roof 4
    assert roofline.over_roof([right]) == []
    assert roofline.over_roof([right, planted]) == [planted]
    assert roofline.over_roof([planted], margin=10) == []  # a margin that wide hides it: the margin is stated


def fake_cache(root, index, level, kind, size):
    folder = root / f"index{index}"
    folder.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size)):
        if value is not None:
            (folder / name).write_text(f"{value}\n")


def test_cache_sizes_are_read_from_sysfs_without_the_instruction_cache(tmp_path):
    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"),
                                                 (2, "Unified", "2048K"), (3, "Unified", "36M"), (4, None, "1G")]):
        fake_cache(tmp_path, index, level, kind, size)  # index4 has no type: skipped
    assert roofline.cache_sizes(str(tmp_path)) == {"L1": 48 << 10, "L2": 2 << 20, "L3": 36 << 20}
    footprints = roofline.copy_footprints({"L1": 48 << 10, "L2": 2 << 20, "L3": 32 << 20})
    assert footprints["L1"] == 24 << 10 and footprints["DRAM"] == 128 << 20
    assert footprints["L3"] == 8 << 20  # sqrt(2 MiB x 32 MiB): inside L3, outside L2
    assert (48 << 10) < footprints["L2"] < (2 << 20)


def test_no_cache_sizes_give_the_stated_default_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="no cache sizes under"):
        assert roofline.cache_sizes(str(tmp_path / "missing")) == roofline.DEFAULT_CACHES


def test_the_measurements_give_finite_positive_rates_on_small_sizes():
    calls = []
    assert roofline.seconds_per_call(lambda: calls.append(1), repeats=3) > 0 and len(calls) >= 4
    bandwidths = roofline.memory_roofs({"L1": 32 << 10, "L2": 256 << 10}, repeats=3)  # copies of 16 KiB, 90 KiB, 1 MiB
    assert list(bandwidths) == ["L1", "L2", "DRAM"] and all(math.isfinite(b) and b > 0 for b in bandwidths.values())
    computes = {"float32": roofline.compute_roof("float32", size=32, repeats=3)}
    rows = roofline.measured_rows(roofline.step_kernels(LAYERS, 4), computes, bandwidths, {"L1": 4096}, repeats=3)
    assert len(rows) == 7 and all(row["rate"] > 0 for row in rows)


def test_the_h200_figures_say_which_are_published_and_which_measured():
    figures = roofline.h200_roofs("notebooks/results/gpu-nvidia-h200.csv")
    assert {name: kind for name, (_, kind) in figures.items()} == {
        "HBM3e bandwidth": "published", "float32 peak": "published", "float64 tensor-core peak": "published",
        "float32 product": "measured"}
    assert 0 < figures["float32 product"][0] <= figures["float32 peak"][0]  # measured under the published peak


def test_the_csv_comes_back_and_the_plot_draws(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from nnlib.lesson01_mnist.files import write_csv

    row = dict(roofline.place(kernel(500), 30.0, {"float32": 100.0}, {"L1": 4.0, "DRAM": 1.0}, {"L1": 1000}),
               rate_low=29.0, rate_high=31.0, rounds=3)
    write_csv([row], tmp_path / "roofline.csv", roofline.CSV_FIELDS)
    loaded = roofline.load_rows(tmp_path / "roofline.csv")
    assert loaded[0]["rate"] == 30.0 and loaded[0]["batch"] == 32 and loaded[0]["level"] == "L1"
    figure = roofline.plot_roofline([row], {"float32": 100.0}, {"L1": 4.0}, recorded=loaded,
                                    h200=roofline.h200_roofs("notebooks/results/gpu-nvidia-h200.csv"))
    assert len(figure.axes) == 2


def test_the_benchmarks_check_catches_a_kernel_above_its_roof_beyond_the_rounds_noise():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "roofline.py"
    spec = importlib.util.spec_from_file_location("roofline_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    caches, computes, bandwidths = {"L1": 1000}, {"float32": 100.0, "float64": 50.0}, {"L1": 4.0, "DRAM": 1.0}
    kernels = [kernel(500), kernel(500, flops=10_000.0)]  # I = 10 (roof 40) and I = 100 (roof 100)
    rates = [(30.0, 105.0), (31.0, 125.0), (29.0, 118.0)]  # three rounds: the second kernel above its roof
    rounds = [[roofline.place(k, rate, computes, bandwidths, caches) for k, rate in zip(kernels, round_rates)]
              for round_rates in rates]
    _, _, rows, over = benchmark.summarize([computes] * 3, [bandwidths] * 3, rounds, caches)
    assert [row["rate"] for row in rows] == [30.0, 118.0] and rows[1]["rate_low"] == 105.0
    assert rows[1]["margin"] == pytest.approx(20 / 118)  # the rounds' range, above the 5% floor
    assert [row["flops"] for row in over] == [10_000.0]  # 118 > 100 x (1 + 0.17)
    noisier = [[dict(row, rate=rate) if row["flops"] == 10_000.0 else row for row in round_rows]
               for rate, round_rows in zip((90.0, 125.0, 118.0), rounds)]  # the same median, a range of 30%
    assert benchmark.summarize([computes] * 3, [bandwidths] * 3, noisier, caches)[3] == []  # within the noise
