"""nnlib.lesson08_gpu.gpu: the timing helpers and the seed's one-sample-at-a-time forward pass, on NumPy
(and the strict array API); on a GPU the same functions run against CuPy."""

import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from stand_in_cupy import StandInCuPy

from nnlib import Network, train
from nnlib.course import environment
from nnlib.lesson01_mnist.files import write_csv
from nnlib.lesson02_network.arrays import to_numpy
from nnlib.lesson03_training.training import Batches, Hook, ProgressLines, Run, Settings, train_loop
from nnlib.lesson08_gpu import backend, gpu

gpu_usable, gpu_reason = backend.gpu_status()


def test_device_seconds_warms_up_then_times_each_call():
    calls = []
    seconds = gpu.device_seconds(lambda: calls.append(1), np, repeats=5)
    assert len(calls) == 7 and seconds >= 0  # 2 warm-up calls (timing.median_seconds'), then 5 timed


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


RECORDED_H200 = pathlib.Path(__file__).parents[1] / "notebooks" / "results" / "gpu-nvidia-h200.csv"


def test_the_launch_cost_model_predicts_the_recorded_h200_epochs():
    """Lesson 08's model (launch cost and kernel count measured, product rate the fastest recorded product; nothing
    fitted to epochs) against the H200's recorded epochs of the code before fusion: each within 30%, and the GPU
    slower than one CPU core at hidden size 128, faster at 1024, as recorded."""
    records = gpu.load_csv(RECORDED_H200)
    rate = gpu.product_rate(records)
    assert 40e12 < rate < 67e12  # the 4096^3 product: 50 TFLOP/s, below the card's float32 peak
    epochs = {r["hidden"]: r for r in records if r["kind"] == "epoch"}
    assert sorted(epochs) == [128, 1024, 4096]
    predicted = {h: gpu.predicted_epoch_seconds(h, r["samples"], rate) for h, r in epochs.items()}
    for hidden, r in epochs.items():
        assert abs(predicted[hidden] / r["gpu_seconds"] - 1) < 0.30, (hidden, predicted[hidden], r["gpu_seconds"])
    assert epochs[128]["gpu_seconds"] > epochs[128]["cpu_seconds"] and predicted[128] > epochs[128]["cpu_seconds"]
    assert epochs[1024]["gpu_seconds"] < epochs[1024]["cpu_seconds"] and predicted[1024] < epochs[1024]["cpu_seconds"]
    # The launches are the explanation: without them (or with the fused step's 16) the model misses every epoch.
    for kernels in (0, 16):
        assert all(gpu.predicted_epoch_seconds(h, r["samples"], rate, kernels=kernels) < 0.7 * r["gpu_seconds"]
                   for h, r in epochs.items())


def test_predicted_epoch_seconds_counts_launches_and_flops():
    """steps * kernels * launch + samples * (4 * 784 H + 6 * 10 H) / rate, by hand: 2 steps of 512 for 1,000 samples
    (the first layer computes no input gradient: 4 FLOPs per weight and sample, the second 6)."""
    assert gpu.predicted_epoch_seconds(100, 1000, 1e9, batch_size=512, kernels=10, launch_seconds=1e-3) == \
        pytest.approx(2 * 10 * 1e-3 + 1000 * (4 * 78400 + 6 * 1000) / 1e9)
    records = [{"kind": "matmul", "m": 2, "k": 3, "n": 4, "gpu_seconds": 1e-6},
               {"kind": "matmul", "m": 4, "k": 4, "n": 4, "gpu_seconds": 1e-6}, {"kind": "epoch"}]
    assert gpu.product_rate(records) == pytest.approx(128e6)


def test_csv_round_trip_and_bad_csv(tmp_path):
    records = gpu.matmul_sweep([(8, 8, 8)], repeats=1)
    records.append({"kind": "epoch", "hidden": 128, "samples": 100, "cpu_seconds": 1.5, "gpu_seconds": 0.05,
                    "gpu_with_copies_seconds": float("nan")})
    for record in records:
        record.update(device="Test GPU", date="2026-11-22")
    write_csv(records, tmp_path / "gpu.csv", gpu.CSV_FIELDS)
    loaded = gpu.load_csv(tmp_path / "gpu.csv")
    assert loaded[1]["hidden"] == 128 and loaded[1]["gpu_seconds"] == 0.05 and loaded[1]["m"] is None
    assert loaded[0]["device"] == "Test GPU" and math.isnan(loaded[0]["gpu_seconds"])
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a CSV of GPU benchmark records"):
        gpu.load_csv(tmp_path / "bad.csv")


@pytest.fixture
def fresh_gpu_check():
    """The GPU check (cached once per process) made again in the test, and again after it."""
    environment.gpu_status.cache_clear()
    yield
    environment.gpu_status.cache_clear()


@pytest.fixture
def stand_in_gpu(monkeypatch, fresh_gpu_check):
    """NumPy posing as CuPy on a usable GPU (see tests/stand_in_cupy.py)."""
    cupy = StandInCuPy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)  # restored afterwards, and the GPU check made again
    return cupy


def test_recording_command_end_to_end_with_a_stand_in_gpu(stand_in_gpu, mnist, tmp_path, capsys):
    """The recorder's whole path (which otherwise runs only on a GPU machine): sweep, epochs,
    forward comparison, the table, and a CSV in a folder that does not exist yet."""
    output = tmp_path / "results" / "gpu-stand-in-gpu-numpy.csv"
    assert gpu.main(["--hidden", "16", "32", "--samples", "512", "--largest", "128", "--repeats", "1",
                     "--results-dir", str(output.parent)]) == 0
    printed = capsys.readouterr().out
    assert "epoch, 784-32-10, 512 samples" in printed and f"wrote 7 records to {output}" in printed
    records = gpu.load_csv(output)
    assert [(r["kind"], r["m"] or r["hidden"]) for r in records] == [
        ("matmul", 120), ("matmul", 64), ("matmul", 128), ("epoch", 16), ("epoch", 32), ("forward", 1024), ("forward", 1024)]
    assert {r["device"] for r in records} == {"Stand-in GPU (NumPy)"}
    assert all(r["gpu_seconds"] > 0 for r in records)
    assert all(r["gpu_with_copies_seconds"] > 0 for r in records if r["kind"] == "matmul")
    assert stand_in_gpu.synchronizations > 0  # the GPU timings waited for the device
    assert gpu.main(["--hidden", "16", "--samples", "64", "--largest", "30", "--repeats", "1",
                     "--results-dir", str(tmp_path / "named")]) == 0
    assert [path.name for path in (tmp_path / "named").iterdir()] == ["gpu-stand-in-gpu-numpy.csv"]


def test_device_slug():
    assert gpu.device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert gpu.device_slug("  /?  ") == "gpu"


def test_epoch_seconds_on_the_stand_in_gpu_trains_on_the_device(stand_in_gpu, mnist):
    inputs, labels = mnist.train_images[:300].reshape(300, -1) / 255.0, mnist.train_labels[:300].astype(np.int64)
    assert gpu.epoch_seconds(16, inputs, labels, "gpu", batch_size=64) > 0
    with pytest.raises(RuntimeError, match="device='gpu' was asked for, but CuPy 13.0.0 is installed"):
        sys.modules["cupy"] = StandInCuPy(version="13.0.0")
        environment.gpu_status.cache_clear()
        gpu.epoch_seconds(16, inputs, labels, "gpu")


NOTEBOOK = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "08_gpu.ipynb"


def test_notebook_08_gpu_cells_run_with_a_stand_in_gpu_and_a_recorded_csv(tmp_path, mnist):
    """Notebook 08's cells for a machine with a GPU (not run by nbval here) and for recorded figures.

    The notebook runs in a fresh kernel whose first cell installs the stand-in CuPy, next to a
    results/ CSV of records, so that every branch that only a GPU machine or a recorded CSV would
    take runs once."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    records = gpu.matmul_sweep([(120, 30, 20), (256, 256, 256)], repeats=1)
    records[0].update(gpu_seconds=1.0, gpu_with_copies_seconds=1.0)      # slower than the CPU: tiny
    records[1].update(gpu_seconds=1e-9, gpu_with_copies_seconds=1.0)     # faster, but not with copies
    records += [{"kind": "epoch", "hidden": 1024, "samples": 60000, "cpu_seconds": 2.0, "gpu_seconds": 0.1},
                {"kind": "forward", "variant": "per_sample", "hidden": 1024, "samples": 200, "cpu_seconds": 0.03,
                 "gpu_seconds": 0.2}]
    for record in records:
        record.update(device="Recorded Test GPU", date="2026-11-22")
    write_csv(records, tmp_path / "results" / "gpu-test.csv", gpu.CSV_FIELDS)

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    setup = ("import sys\n"
             f"sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})\n"
             "from stand_in_cupy import StandInCuPy\n"
             "sys.modules['cupy'] = StandInCuPy()\n"
             "import nnlib.lesson08_gpu.gpu\n"
             "nnlib.lesson08_gpu.gpu.MATMUL_SHAPES = nnlib.lesson08_gpu.gpu.MATMUL_SHAPES[:3]  # keep the test short\n")
    notebook.cells.insert(0, nbformat.v4.new_code_cell(setup))
    for cell in notebook.cells:  # smaller epochs: the test checks that the cells run, not the timings
        if cell.cell_type == "code":
            cell.source = cell.source.replace("hidden_sizes = [128, 512, 1024, 2048, 4096]", "hidden_sizes = [16, 64]")
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(output.get("text", "") + json.dumps(output.get("data", {}).get("text/plain", ""))
                     for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs)
    assert "Using CuPy on the GPU: GPU Stand-in GPU (NumPy) passed a smoke test" in text
    assert "Recorded GPU figures: Recorded Test GPU (2026-11-22)" in text
    assert "GPU + copies" in text and "slower on the GPU" in text  # the live GPU columns
    assert "speedup" in text and "recorded on Recorded Test GPU (2026-11-22), 60000 samples: H=1024" in text
    assert "recorded on Recorded Test GPU (2026-11-22): per_sample: GPU 200.0 ms" in text
    assert "Recorded Test GPU: product rate 33554.4 TFLOP/s; per step 55 launches of 25" in text  # 2 * 256^3 / 1e-9
    assert "  1024       0.323 s       0.100 s  +223%     2.000 s" in text  # the model's row for the recorded epoch
    assert not [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
                if output.output_type == "error" or output.get("name") == "stderr"]


@pytest.mark.skipif(gpu_usable, reason="checks the message given on machines without a GPU")
def test_recording_command_refuses_without_a_gpu():
    run = subprocess.run([sys.executable, "-m", "nnlib", "gpu-benchmark"], capture_output=True, text=True)
    assert run.returncode == 2 and "no usable GPU" in run.stdout


@pytest.mark.skipif(not gpu_usable, reason=f"no usable GPU here: {gpu_reason}")
def test_gpu_sweep_and_forward_on_a_real_gpu():
    import cupy

    records = gpu.matmul_sweep([(120, 30, 20), (1024, 1024, 1024)], gpu=cupy, repeats=3)
    assert all(r["gpu_seconds"] > 0 and r["gpu_with_copies_seconds"] >= r["gpu_seconds"] * 0.5 for r in records)
    network = Network((12, 8, 5), dtype="float64", seed=0, device=backend.resolve_backend("gpu"))
    inputs = np.random.default_rng(0).random((7, 12))
    np.testing.assert_allclose(gpu.forward_one_sample_at_a_time(network, inputs),
                               gpu.forward_batched(network, inputs), rtol=1e-10)


# -- counting kernels and synchronisations on the CPU (tests/stand_in_cupy.py's CountingCuPy) ----------------

@pytest.fixture
def counting_gpu(monkeypatch, fresh_gpu_check):
    """NumPy posing as CuPy, with CuPy's array rules, counting every kernel launch and synchronisation."""
    from stand_in_cupy import CountingCuPy

    cupy = CountingCuPy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    return cupy


def test_counting_stand_in_refuses_silent_trips_to_the_host_as_cupy_does(counting_gpu):
    cupy = counting_gpu
    array = cupy.asarray(np.arange(6.0).reshape(2, 3))
    with pytest.raises(TypeError, match="Implicit conversion to a NumPy array is not allowed"):
        np.asarray(array)
    with pytest.raises(TypeError, match="Unsupported type"):
        array + np.ones(3)  # a NumPy operand
    with pytest.raises(TypeError, match="Unsupported type"):
        cupy.tanh(np.ones(3))
    assert cupy.counts() == (1, 0)  # the copy to the device; the refusals launched nothing
    assert isinstance(array, cupy.ndarray) and type(array).__module__.startswith("cupy")


def test_counting_stand_in_counts_kernels_views_and_synchronisations(counting_gpu):
    cupy = counting_gpu
    a = cupy.asarray(np.ones((256, 3), np.float32))                  # copy to the device: 1
    view = a[10:20, ...].T                                           # views: 0
    b = cupy.tanh(a * 0.5)                                           # 2
    b += 1                                                           # 1
    total = cupy.count_nonzero(b)                                    # whole-array block reduction, 768 items: 2
    assert cupy.counts() == (6, 0) and view.shape == (3, 10) and total.shape == ()
    assert int(total) == 768 and b[0, 0].get() == pytest.approx(np.tanh(0.5) + 1)  # two trips to the host
    assert cupy.synchronizations == 2 and cupy.waited_for == ["int", "get"]
    cupy.cuda.get_current_stream().synchronize()
    assert cupy.synchronizations == 3


def test_counting_stand_in_fuse_is_one_kernel_computing_the_function(counting_gpu):
    cupy = counting_gpu

    def scaled_add(x, y, scale):
        x += y * scale
        return x * 2

    fused = cupy.fuse(kernel_name="scaled_add")(scaled_add)
    x, y = cupy.asarray(np.arange(4.0)), cupy.asarray(np.ones(4))
    before = cupy.launches
    result = fused(x, y, 0.5)
    assert cupy.launches - before == 1 and cupy.launched[-1] == "fused scaled_add"
    assert x.get().tolist() == [0.5, 1.5, 2.5, 3.5] and result.get().tolist() == [1.0, 3.0, 5.0, 7.0]
    with pytest.raises(TypeError, match="Unsupported type"):
        fused(np.arange(4.0), y, 0.5)  # cupy.fuse has no CPU fallback for NumPy arrays
    assert fused(1.0, 2.0, 0.5) == 4.0  # scalars only: the Python function as it is, no kernel


class StepMarks(Hook):
    """Notes the stand-in's (launches, synchronisations) as each epoch begins and after every step."""

    def __init__(self, cupy):
        self.cupy, self.epochs, self.steps = cupy, [], []

    def begin_epoch(self, run):
        self.epochs.append(self.cupy.counts())

    def after_step(self, run):
        self.steps.append(self.cupy.counts())


def count_training(cupy, sizes=(784, 128, 10), batch_size=128, batches=4, momentum=0.0, dtype="float32"):
    """Train one epoch on the counting stand-in; (kernels of each step after the first, the names of the
    last step's kernels, synchronisations from the epoch's start to its last step)."""
    rng = np.random.default_rng(0)
    inputs = rng.random((batch_size * batches, sizes[0])).astype(dtype)
    labels = rng.integers(0, sizes[-1], batch_size * batches)
    network = Network(sizes, dtype=dtype, seed=0, device=backend.resolve_backend("gpu"))
    marks = StepMarks(cupy)
    settings = Settings(epochs=1, learning_rate=0.1, batch_size=batch_size, momentum=momentum)
    run = Run(network, settings, Batches(inputs.shape[0], batch_size, 0), hooks=[ProgressLines(False), marks])
    train_loop(run, inputs, labels)  # what train does, with the marks among its hooks
    per_step = [after[0] - before[0] for before, after in zip(marks.steps, marks.steps[1:])]
    last = cupy.launched[marks.steps[-2][0]:marks.steps[-1][0]]
    return per_step, last, marks.steps[-1][1] - marks.epochs[0][1]


def test_a_training_step_launches_16_kernels_and_an_epoch_never_waits(counting_gpu):
    """784-128-10, batch 128, SGD (and momentum): 16 kernels a step, no synchronisation inside the epoch.

    forward 4 (per layer: a_in @ W, fused bias + sigmoid); the output 4 (fused loss, argmax, fused count,
    fused delta); backward 6 (per layer: 1^T delta into the bias gradient, a_in.T @ delta into the weight
    gradient; between them delta @ W.T and the fused sigmoid backward); the epoch's sums 1 (fused); the update
    1 (fused). The batch is a view of the epoch's rows, gathered once per epoch.

    Before (commit afda03c), CuPy launched 52 (54 with momentum): gather 2; forward 12 (per layer: @, + b,
    and the sigmoid's * 0.5, tanh, * 0.5, + 0.5); the output 19 (one-hot: eye 2, take; cross-entropy 10:
    maximum, abs, negative, exp, log1p, add, y * z, subtract, sum, * scale; accuracy 4: argmax, ==,
    count_nonzero in CUB's two passes; delta 2); adding the chunk's loss and count 2; backward 12 (per layer:
    ones, 1^T delta, a.T @ delta, the bias copy; between them delta @ W.T, 1 - a, a (1 - a), *=); the epoch's
    sums 3; the update 2 (momentum 4). The H200's profiler counted 55 there: it also sees kernels that
    cuBLAS launches inside a product (split-K), which no stand-in sees."""
    per_step, last, synchronizations = count_training(counting_gpu)
    assert set(per_step) == {16} and synchronizations == 0, (per_step, last)
    assert last == ["matmul", "fused bias_sigmoid", "matmul", "fused bias_sigmoid", "fused sigmoid_cross_entropy",
                    "argmax", "fused count_equal", "fused output_delta", "matmul", "matmul", "matmul",
                    "fused sigmoid_backward", "matmul", "matmul", "fused add_to_sums", "fused sgd_update"]
    per_step, last, synchronizations = count_training(counting_gpu, momentum=0.9)
    assert set(per_step) == {16} and synchronizations == 0 and last[-1] == "fused sgd_update"


def test_without_fusion_the_same_step_launches_45_kernels(monkeypatch, fresh_gpu_check):
    """What fusion saves, counted on a CuPy without cupy.fuse: nnlib runs its plain pieces on the device."""
    from stand_in_cupy import CountingCuPy

    cupy = CountingCuPy(fusion=False)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    per_step, last, synchronizations = count_training(cupy)
    assert set(per_step) == {45} and synchronizations == 0, (per_step, last)
    assert "fused" not in " ".join(last) and last.count("matmul") == 7


def test_no_chunks_on_the_gpu(counting_gpu):
    """The CPU's 1,024-row chunks keep its arrays in cache; a GPU takes a batch of 3,000 rows whole."""
    per_step, last, _ = count_training(counting_gpu, sizes=(20, 16, 10), batch_size=3000, batches=2)
    assert set(per_step) == {16} and last.count("matmul") == 7
    assert Network((4, 2), device=backend.resolve_backend("gpu")).chunk_size is None
    assert Network((4, 2)).chunk_size == 1024


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_the_gpu_path_on_the_counting_stand_in_trains_as_the_cpu(counting_gpu, momentum):
    """float64: the fused pieces, the epoch's gathered rows and the sums kept on the device give the CPU's run."""
    rng = np.random.default_rng(1)
    inputs, labels = rng.random((300, 12)), rng.integers(0, 4, 300)
    settings = dict(epochs=3, learning_rate=0.5, batch_size=32, momentum=momentum, seed=2, progress=False)
    cpu = Network((12, 9, 7, 4), dtype="float64", seed=0)
    expected = train(cpu, inputs, labels, validation=(inputs[:50], labels[:50]), **settings)
    gpu = Network((12, 9, 7, 4), dtype="float64", seed=0, device=backend.resolve_backend("gpu"))
    history = train(gpu, inputs, labels, validation=(inputs[:50], labels[:50]), **settings)
    np.testing.assert_allclose(to_numpy(gpu.params), cpu.params, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(history.loss, expected.loss, rtol=1e-12)
    assert history.train_accuracy == expected.train_accuracy
    assert history.validation_accuracy == expected.validation_accuracy
    assert counting_gpu.launched.count("fused sgd_update") == history.steps


def fused_pieces():
    """(piece, arguments) of every element-wise piece nnlib fuses on a GPU, on host arrays (float64)."""
    from nnlib.lesson02_network import loss, network
    from nnlib.lesson03_training import optimizers, training

    rng = np.random.default_rng(3)
    z, a, g = rng.normal(0, 3, (6, 4)), rng.random((6, 4)), rng.normal(size=(6, 4))
    labels = rng.integers(0, 4, 6)
    return [(network.bias_sigmoid, (z, rng.normal(size=4))), (network.sigmoid, (z,)),
            (network.sigmoid_backward, (g, a)), (loss.sigmoid_cross_entropy, (z, labels[:, None], np.arange(4), 0.25)),
            (loss.output_delta, (a, labels[:, None], np.arange(4), 0.25)),
            (loss.count_equal, (rng.integers(0, 4, 6), labels)),
            (optimizers.sgd_update, (a.ravel().copy(), g.ravel(), None, 0.1, 0.0)),
            (optimizers.sgd_update, (a.ravel().copy(), g.ravel(), z.ravel().copy(), 0.1, 0.9)),
            (optimizers.adam_update, (a.ravel().copy(), g.ravel(), z.ravel().copy(), a.ravel() ** 2, 0.9, 0.999,
                                      1e-3, 1e-8)),
            (training.add_to_sums, (np.asarray(1.5), np.asarray(3), np.asarray(0.25), np.asarray(2), 4))]


def fused_equals_plain(cupy, piece, arguments, rtol):
    """Run ``piece`` fused by ``cupy`` on device copies and plain on the host: the results and every argument
    it changes in place must agree."""
    from nnlib.lesson02_network.arrays import fused

    host = [argument.copy() if isinstance(argument, np.ndarray) else argument for argument in arguments]
    device = [cupy.asarray(argument) if isinstance(argument, np.ndarray) else argument for argument in arguments]
    expected, got = piece(*host), fused(piece, cupy)(*device)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    for want, have in zip(expected + tuple(host), got + tuple(device)):
        if isinstance(want, (np.ndarray, np.generic)) or want is not None and hasattr(have, "get"):
            np.testing.assert_allclose(to_numpy(have), want, rtol=rtol, atol=1e-15)


@pytest.mark.parametrize("index", range(9))
def test_each_fused_piece_equals_its_numpy_form_on_the_stand_in(counting_gpu, index):
    piece, arguments = fused_pieces()[index]
    before = counting_gpu.launches
    fused_equals_plain(counting_gpu, piece, arguments, rtol=0)
    assert counting_gpu.launched[before:].count(f"fused {piece.__name__}") == 1


@pytest.mark.skipif(not gpu_usable, reason=f"no usable GPU here: {gpu_reason}")
@pytest.mark.parametrize("index", range(9))
def test_each_fused_piece_equals_its_numpy_form_on_a_real_gpu(index):
    import cupy

    piece, arguments = fused_pieces()[index]
    fused_equals_plain(cupy, piece, arguments, rtol=1e-12)


def test_the_gpus_output_pieces_equal_the_cpus_lines():
    """output_loss: the CPU's plain lines against the GPU's pieces (run here on NumPy, as the stand-in does). The
    GPU's loss scales each term before the sum (a fused kernel cannot scale after its reduction): equal within
    rounding; the count and delta_L exactly."""
    from nnlib.lesson02_network.loss import count_equal, output_delta, output_loss, sigmoid_cross_entropy

    rng = np.random.default_rng(4)
    for dtype, rtol in ((np.float64, 1e-14), (np.float32, 1e-6)):
        z, labels = rng.normal(0, 5, (300, 10)).astype(dtype), rng.integers(0, 10, 300)
        a = 1 / (1 + np.exp(-z))
        loss, correct, delta = output_loss(z, a, labels, 1 / 300, "sigmoid")
        assert sigmoid_cross_entropy(z, labels[:, None], np.arange(10), 1 / 300) == pytest.approx(loss, rel=rtol)
        assert count_equal(np.argmax(a, axis=1), labels) == correct
        np.testing.assert_array_equal(output_delta(a, labels[:, None], np.arange(10), 1 / 300), delta)


# -- benchmarks/gpu_throughput.py ------------------------------------------------------------------------------

THROUGHPUT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_throughput.py"


def run_throughput(*arguments, timeout=300):
    environment = dict(os.environ, PYTHONPATH=str(THROUGHPUT.parents[1]))
    return subprocess.run([sys.executable, str(THROUGHPUT), *arguments], capture_output=True, text=True,
                          timeout=timeout, env=environment)


def test_gpu_throughput_dry_run_on_the_cpu(mnist):
    """The benchmark's whole path on the CPU: nnlib on NumPy (and PyTorch on the CPU where installed), the five
    networks scaled down, interleaved rounds, medians with ranges, the ratio, TFLOP/s."""
    run = run_throughput("--dry-run", "--rounds", "2", "--epochs", "1", "--samples", "512")
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if not line.startswith("PyTorch is not installed")]
    assert lines[0].startswith("device: none (a dry run on the CPU") and "medians of 2 interleaved rounds" in lines[1]
    rows = [line for line in lines if line.startswith("784-")]
    assert [row.split(",")[0] for row in rows] == ["784-16-10", "784-32-10", "784-64-10", "784-32-32-10", "784-64-64-10"]
    for row in rows:
        samples = row.split("batch")[1].split()[1]  # nnlib's median samples/s
        assert float(samples.replace(",", "")) > 0, row
    if importlib.util.find_spec("torch") is None:
        assert "PyTorch is not installed: nnlib only" in run.stdout and all("nan (nan-nan)" in row for row in rows)
    else:
        assert not any("nan" in row for row in rows)


@pytest.mark.skipif(gpu_usable, reason="checks the message given on machines without a GPU")
def test_gpu_throughput_refuses_without_a_gpu():
    run = run_throughput("--no-torch", timeout=60)
    assert run.returncode == 1 and "error: no usable GPU (" in run.stderr and "--dry-run" in run.stderr


def test_gpu_throughput_finds_the_cards_float32_peak():
    """SMs x FP32 lanes x 2 x clock where the runtime gives a clock; else NVIDIA's figure by name; else none."""
    import importlib.util as loader
    import types

    spec = loader.spec_from_file_location("gpu_throughput", THROUGHPUT)
    module = loader.module_from_spec(spec)
    sys.path.insert(0, str(THROUGHPUT.parent))  # as when run: its folder first (benchmarks/rates.py)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(THROUGHPUT.parent))

    def fake_cupy(properties, attribute=None):
        def get_attribute(number, device):
            if attribute is None:
                raise RuntimeError("cudaErrorInvalidValue")
            return attribute
        runtime = types.SimpleNamespace(getDeviceProperties=lambda index: properties, deviceGetAttribute=get_attribute)
        return types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda: types.SimpleNamespace(id=0),
                                                                runtime=runtime))

    h200 = {"name": b"NVIDIA H200", "major": 9, "minor": 0, "multiProcessorCount": 132, "clockRate": 1980000}
    name, peak, how = module.device_and_peak(fake_cupy(h200))
    assert name == "NVIDIA H200" and peak == pytest.approx(66.9, rel=1e-3) and "132 SMs x 128 FP32 lanes" in how
    no_clock = dict(h200, clockRate=0)
    assert module.device_and_peak(fake_cupy(no_clock, attribute=1755000))[1] == pytest.approx(59.3, rel=1e-3)
    assert module.device_and_peak(fake_cupy(no_clock))[1:] == (66.9, "NVIDIA's figure for the H200 (no clock rate "
                                                                    "from the runtime)")
    unknown = dict(no_clock, name="Some GPU")
    assert module.device_and_peak(fake_cupy(unknown))[1] is None
    assert module.device_and_peak(fake_cupy(unknown), override=12.5)[1] == 12.5
