"""A stand-in for the ``cupy`` module, backed by NumPy, for machines without a GPU.

It is not a GPU and proves nothing about CuPy itself (the real-GPU tests do that, where a GPU is
present). It lets the tests run the code that nnlib and notebook 07 only run once CuPy has been
chosen: device selection, the loss kept on the device, the waits for the GPU, staging for MPI,
the ``gpu-benchmark`` recorder and the notebook's GPU cells. Its arrays are NumPy arrays, so the
numbers must equal the CPU's.

Install it with ``sys.modules["cupy"] = StandInCuPy()`` (pytest: ``monkeypatch.setitem``), or, for
another process, put a file ``cupy.py`` first on its PYTHONPATH that does
``sys.modules[__name__] = StandInCuPy()`` (see :func:`write_cupy_shim`).
"""

import types

import numpy as np


class StandInCuPy(types.ModuleType):
    """``cupy`` as nnlib uses it: NumPy's functions, plus ``cuda`` (availability, streams, device name).

    version:          what ``cupy.__version__`` says (nnlib needs 14 or newer).
    available:        what ``cupy.cuda.is_available()`` answers.
    smoke_test_fails: the first allocation raises, as on a machine whose CUDA driver is too old.
    ``synchronizations`` counts the waits for the (pretend) GPU.
    """

    def __init__(self, version="14.2.0", available=True, smoke_test_fails=False, name="Stand-in GPU (NumPy)",
                 gpus=1):
        super().__init__("cupy")
        self.__version__ = version
        self.synchronizations = 0
        self.current_device = 0
        self.smoke_test_fails = smoke_test_fails
        stream = types.SimpleNamespace(synchronize=self._synchronize)
        self.cuda = types.SimpleNamespace(
            is_available=lambda: available,
            get_current_stream=lambda: stream,
            Device=self._device,
            runtime=types.SimpleNamespace(getDeviceProperties=lambda device: {"name": name.encode()},
                                          getDeviceCount=lambda: gpus),
        )

    def _synchronize(self):
        self.synchronizations += 1

    def _device(self, index=None):
        """cupy.cuda.Device(index): ``.id``, and ``.use()`` to make it the current device."""
        index = self.current_device if index is None else index

        def use():
            self.current_device = index

        return types.SimpleNamespace(id=index, use=use)

    def ones(self, shape, dtype=float):
        if self.smoke_test_fails:
            raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version")
        return np.ones(shape, dtype)

    def __getattr__(self, name):  # everything else: NumPy's function of the same name
        return getattr(np, name)


def write_cupy_shim(folder, **settings):
    """Write ``folder/cupy.py``, which makes ``import cupy`` give a StandInCuPy(**settings) in any
    process that has ``folder`` and this file's folder on its PYTHONPATH. Returns that PYTHONPATH."""
    import os
    import pathlib

    here = pathlib.Path(__file__).resolve().parent
    (pathlib.Path(folder) / "cupy.py").write_text(
        "import sys\nfrom stand_in_cupy import StandInCuPy\n"
        f"sys.modules[__name__] = StandInCuPy(**{settings!r})\n")
    return os.pathsep.join([str(folder), str(here)])
