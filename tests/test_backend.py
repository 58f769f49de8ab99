"""Backend-agnostic code on a strict array-API namespace, device selection, and (with a GPU) CuPy.

array_api_strict refuses anything outside the array API standard (NumPy-only functions, out=,
sums of booleans, ...), so the network and training running on it means no NumPy-only call has
slipped into the math, and that the CuPy path runs the same lines.
"""

import sys

import numpy as np
import pytest
from stand_in_cupy import StandInCuPy

from nnlib import Network, gradient_check, train
from nnlib.course import environment
from nnlib.lesson02_network import arrays
from nnlib.lesson02_network.arrays import to_numpy
from nnlib.lesson08_gpu import backend

xps = pytest.importorskip("array_api_strict", reason="array-api-strict is part of the test extra")
StrictArray = type(xps.asarray(0))


def batch(sizes, n=9, seed=1):
    rng = np.random.default_rng(seed)
    return rng.random((n, sizes[0])), rng.integers(0, sizes[-1], n)


@pytest.mark.parametrize("output", ["sigmoid", "softmax"])
def test_strict_namespace_gives_numpy_gradients_and_passes_the_gradient_check(output):
    sizes = (6, 5, 4, 3)
    inputs, labels = batch(sizes)
    reference = Network(sizes, output=output, dtype="float64", seed=2)
    strict = Network(sizes, output=output, dtype="float64", seed=2, device=xps)
    assert type(strict.params).__module__.startswith("array_api_strict")
    expected_loss = reference.loss_and_gradient(inputs, labels)
    loss = strict.loss_and_gradient(xps.asarray(inputs), xps.asarray(labels))
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    np.testing.assert_allclose(to_numpy(strict.grads), reference.grads, rtol=1e-10, atol=1e-14)
    assert strict.last_correct == reference.last_correct
    assert gradient_check(strict, xps.asarray(inputs), xps.asarray(labels)) < 1e-7


def test_strict_views_alias_the_flat_vector():
    strict = Network((4, 3, 2), dtype="float64", seed=0, device=xps)
    strict.weights[1][2, 1] = 7.0
    assert float(strict.params[4 * 3 + 3 + 2 * 2 + 1]) == 7.0
    strict.grads[-1] = 9.0
    assert float(strict.grad_biases[1][1]) == 9.0


def test_strict_training_matches_numpy_and_keeps_the_loss_on_the_device():
    """The non-NumPy path: data moved once, loss and accuracy summed on the device per epoch."""
    inputs, labels = batch((8, 6, 3), n=120)
    settings = dict(epochs=3, learning_rate=0.5, batch_size=16, momentum=0.9, seed=4, progress=False)
    reference = Network((8, 6, 3), dtype="float64", seed=0)
    expected = train(reference, inputs, labels, validation=(inputs[:30], labels[:30]), **settings)
    strict = Network((8, 6, 3), dtype="float64", seed=0, device=xps)
    history = train(strict, inputs, labels, validation=(inputs[:30], labels[:30]), **settings)
    np.testing.assert_allclose(history.loss, expected.loss, rtol=1e-12)
    assert history.train_accuracy == expected.train_accuracy
    assert history.validation_accuracy == expected.validation_accuracy
    np.testing.assert_allclose(to_numpy(strict.params), reference.params, rtol=1e-10, atol=1e-14)
    assert strict.accuracy(xps.asarray(inputs), xps.asarray(labels)) == reference.accuracy(inputs, labels)
    assert to_numpy(strict.predict(xps.asarray(inputs))).tolist() == reference.predict(inputs).tolist()


class CountingNamespace:
    """array_api_strict as a pretend device that counts host -> device copies (asarray of host data)."""

    def __init__(self):
        self.to_device = 0

    def __getattr__(self, name):
        return getattr(xps, name)

    def asarray(self, obj, **kwargs):
        if not isinstance(obj, StrictArray):
            self.to_device += 1
        return xps.asarray(obj, **kwargs)


def count_transfers(monkeypatch, batch_size, epochs=3):
    """(host -> device copies, device -> host reads) of one training run on the counting namespace."""
    reads = []
    for method in ("__float__", "__int__", "__bool__", "__index__", "__dlpack__"):
        original = getattr(StrictArray, method)
        monkeypatch.setattr(StrictArray, method, lambda self, *a, _f=original, **k: reads.append(1) or _f(self, *a, **k))
    inputs, labels = batch((8, 6, 3), n=120)
    device = CountingNamespace()
    network = Network((8, 6, 3), dtype="float64", seed=0, device=device)
    train(network, inputs, labels, validation=(inputs[:30], labels[:30]), epochs=epochs, learning_rate=0.5,
          batch_size=batch_size, momentum=0.9, seed=4, progress=False)
    monkeypatch.undo()
    return device.to_device, len(reads)


def test_training_copies_to_and_from_the_device_per_epoch_not_per_step(monkeypatch):
    """The data moves once; each epoch one copy of its shuffled order goes in, and the loss,
    accuracy and validation score come back. Nothing grows with the number of steps."""
    few_steps = count_transfers(monkeypatch, batch_size=60)   # 2 steps per epoch
    many_steps = count_transfers(monkeypatch, batch_size=8)   # 15 steps per epoch
    assert few_steps == many_steps
    one_epoch_more = count_transfers(monkeypatch, batch_size=8, epochs=4)
    assert one_epoch_more[0] - many_steps[0] == 1  # the epoch's order
    assert one_epoch_more[1] - many_steps[1] <= 5  # loss, accuracy; validation: labels checked, score


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_divergence_off_the_host_is_caught_once_per_epoch():
    rng = np.random.default_rng(0)
    strict = Network((8, 4, 3), seed=0, device=xps)
    with pytest.raises(FloatingPointError, match=r"in epoch 1 \(checked once per epoch on the GPU\)"):
        train(strict, rng.random((64, 8)).astype(np.float32), rng.integers(0, 3, 64), epochs=2,
              learning_rate=1e38, batch_size=16, progress=False)


def namespace_functions_nnlib_calls():
    """Every ``xp.<name>`` (and ``self.xp.<name>``, ``network.xp.<name>``) in nnlib's source, but ``cuda``."""
    import pathlib
    import re

    import nnlib

    source = "".join(path.read_text() for path in pathlib.Path(nnlib.__file__).parent.rglob("*.py"))
    return sorted(set(re.findall(r"\bxp\.([A-Za-z_][A-Za-z_0-9]*)", source)) - {"cuda"})


def test_every_namespace_function_nnlib_calls_is_in_the_array_api():
    names = namespace_functions_nnlib_calls()
    assert {"asarray", "take", "concat", "arange", "isdtype", "tanh"} <= set(names)
    assert [name for name in names if not hasattr(xps, name)] == []


def test_every_namespace_function_nnlib_calls_is_in_cupy():
    """Runs wherever CuPy is installed, GPU or not (import cupy needs no GPU)."""
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'nnlib[gpu]')")
    if int(cupy.__version__.split(".")[0]) < environment.MINIMUM_CUPY:
        pytest.skip(f"CuPy {cupy.__version__} is older than nnlib supports; gpu_status refuses it")
    assert [name for name in namespace_functions_nnlib_calls() if not hasattr(cupy, name)] == []


# -- device selection ------------------------------------------------------------------------

@pytest.fixture
def fresh_gpu_check():
    """The GPU check (cached once per process) made again in the test, and again after it."""
    environment.gpu_status.cache_clear()
    yield
    environment.gpu_status.cache_clear()


def test_cupy_absent(monkeypatch, fresh_gpu_check, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy now raises ImportError
    usable, reason = backend.gpu_status()
    assert not usable and "CuPy is not installed" in reason
    assert backend.resolve_backend("auto", verbose=True) is np
    assert "Using NumPy on the CPU: CuPy is not installed" in capsys.readouterr().out
    with pytest.raises(RuntimeError, match="device='gpu' was asked for, but CuPy is not installed"):
        backend.resolve_backend("gpu")


def test_cupy_present_without_a_gpu(monkeypatch, fresh_gpu_check):
    monkeypatch.setitem(sys.modules, "cupy", StandInCuPy(available=False))
    assert backend.gpu_status() == (False, "CuPy is installed but finds no CUDA GPU")
    assert backend.resolve_backend("auto") is np


def test_gpu_reported_available_but_failing_its_smoke_test(monkeypatch, fresh_gpu_check):
    monkeypatch.setitem(sys.modules, "cupy", StandInCuPy(smoke_test_fails=True))
    usable, reason = backend.gpu_status()
    assert not usable and "smoke test failed" in reason and "cudaErrorInsufficientDriver" in reason
    assert backend.resolve_backend("auto") is np


def test_usable_gpu_is_chosen_by_auto_and_gpu_but_not_cpu(monkeypatch, fresh_gpu_check, capsys):
    cupy = StandInCuPy(name="Fake GPU 9000")
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    assert backend.gpu_status() == (True, "GPU Fake GPU 9000 passed a smoke test")
    assert backend.resolve_backend("auto", verbose=True) is cupy
    assert "Using CuPy on the GPU: GPU Fake GPU 9000 passed a smoke test" in capsys.readouterr().out
    assert backend.resolve_backend("gpu") is cupy
    assert backend.resolve_backend("cpu") is np


def test_cupy_13_is_refused_with_what_to_install(monkeypatch, fresh_gpu_check):
    """CuPy 13's main namespace lacks astype, concat and isdtype, which the network uses."""
    monkeypatch.setitem(sys.modules, "cupy", StandInCuPy(version="13.6.0"))
    usable, reason = backend.gpu_status()
    assert not usable and "CuPy 13.6.0 is installed, but nnlib needs CuPy 14 or newer" in reason
    assert "pip install -U 'cupy-cuda12x>=14'" in reason
    assert backend.resolve_backend("auto") is np


def test_array_namespace_recognises_cupy_arrays_by_their_type(monkeypatch):
    """CuPy's ndarray has no __array_namespace__ method (CuPy 14.2), so its type tells."""
    cupy = StandInCuPy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    cupy_like_array = type("ndarray", (), {"__module__": "cupy._core.core"})()
    assert arrays.array_namespace(cupy_like_array) is cupy
    assert arrays.array_namespace(np.zeros(2)) is np
    assert arrays.array_namespace(xps.asarray([1.0])) is xps
    assert arrays.array_namespace(1.5) is np


def test_cuda_aware_mpi_detection(monkeypatch):
    monkeypatch.setenv("NNLIB_CUDA_AWARE_MPI", "1")
    assert backend.cuda_aware_mpi() is True
    monkeypatch.setenv("NNLIB_CUDA_AWARE_MPI", "0")
    assert backend.cuda_aware_mpi() is False
    monkeypatch.delenv("NNLIB_CUDA_AWARE_MPI")
    assert backend.cuda_aware_mpi() is False  # the mpich wheel is built without CUDA


# -- on a real GPU ---------------------------------------------------------------------------

gpu_usable, gpu_reason = backend.gpu_status()
needs_gpu = pytest.mark.skipif(not gpu_usable, reason=f"no usable GPU here: {gpu_reason}")


@needs_gpu
def test_gpu_network_matches_the_cpu_network():
    import cupy

    inputs, labels = batch((20, 16, 10), n=300)
    settings = dict(epochs=2, learning_rate=0.5, batch_size=32, momentum=0.9, seed=3, progress=False)
    cpu = Network((20, 16, 10), dtype="float64", seed=0)
    expected = train(cpu, inputs, labels, **settings)
    gpu = Network((20, 16, 10), dtype="float64", seed=0, device=backend.resolve_backend("gpu"))
    assert isinstance(gpu.params, cupy.ndarray) and arrays.array_namespace(gpu.params) is cupy
    np.testing.assert_array_equal(to_numpy(gpu.params), Network((20, 16, 10), dtype="float64", seed=0).params)
    history = train(gpu, inputs, labels, **settings)
    np.testing.assert_allclose(history.loss, expected.loss, rtol=1e-9)
    np.testing.assert_allclose(to_numpy(gpu.params), cpu.params, rtol=1e-8, atol=1e-12)
    assert gradient_check(gpu, cupy.asarray(inputs[:5]), cupy.asarray(labels[:5]), num_checks=40) < 1e-7


def test_a_staging_communicator_is_not_watched_from_outside():
    """watch(HostStaging(comm)) would watch a raw duplicate and lose the staging: it is refused, with the way."""
    from mpi4py import MPI

    from nnlib.lesson08_gpu.backend import HostStaging
    from nnlib.course.deadline import watch

    with pytest.raises(TypeError, match=r"wrap the watched one instead, e.g. HostStaging\(watch\(comm\), xp\)"):
        watch(HostStaging(MPI.COMM_WORLD, np))
