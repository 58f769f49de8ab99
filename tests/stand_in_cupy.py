"""Stand-ins for the ``cupy`` module, backed by NumPy, for machines without a GPU.

They are not a GPU and prove nothing about CuPy itself (the real-GPU tests do that, where a GPU is
present). They let the tests run the code that nnlib and notebook 08 only run once CuPy has been
chosen: device selection, the loss kept on the device, the waits for the GPU, staging for MPI,
the ``gpu-benchmark`` recorder and the notebook's GPU cells.

- :class:`StandInCuPy`: its arrays are NumPy arrays, so the numbers must equal the CPU's.
- :class:`CountingCuPy`: its arrays (:class:`DeviceArray`) hold NumPy data but behave like CuPy's where it
  matters (no silent trip to the host: ``np.asarray`` on one raises), and it counts every kernel launch and
  every synchronisation, so that the kernels of a training step can be counted on the CPU.

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

    def fuse(self, *args, kernel_name=None):
        """cupy.fuse: here the function itself (this stand-in's arrays are NumPy's)."""
        if len(args) == 1 and callable(args[0]):
            return args[0]
        return lambda function: function

    def __getattr__(self, name):  # everything else: NumPy's function of the same name
        return getattr(np, name)


def write_cupy_shim(folder, counting=False, **settings):
    """Write ``folder/cupy.py``, which makes ``import cupy`` give a StandInCuPy(**settings) (``counting``: a
    CountingCuPy, whose arrays refuse silent trips to the host) in any process that has ``folder`` and this
    file's folder on its PYTHONPATH. Returns that PYTHONPATH."""
    import os
    import pathlib

    here = pathlib.Path(__file__).resolve().parent
    kind = "CountingCuPy" if counting else "StandInCuPy"
    (pathlib.Path(folder) / "cupy.py").write_text(
        f"import sys\nfrom stand_in_cupy import {kind}\n"
        f"sys.modules[__name__] = {kind}(**{settings!r})\n")
    return os.pathsep.join([str(folder), str(here)])


# -- a counting stand-in: arrays that live "on the device" ----------------------------------------------------------
#
# What CuPy 14 launches for each call, as this stand-in counts it (from CuPy's source; the kernels cuBLAS and CUB
# run inside one library call are not all visible to it, see kernels_of_reduction):
#   element-wise operators and ufuncs, in place or not         1 kernel each
#   matmul / @ / dot                                            1 (one cuBLAS call; cuBLAS may add a split-K
#                                                                  reduction kernel of its own, which is not counted)
#   take, fancy indexing, copies (astype, copy, a[...] = b)     1
#   zeros / zeros_like (a memset), ones / full / arange         1 each; eye 2 (a memset, then the diagonal)
#   asarray / array of host data (a copy to the device)         1
#   reductions                                                  see kernels_of_reduction
#   a cupy.fuse function called with device arrays              1, whatever it computes
#   views (basic slicing, .T, reshape of contiguous data)       0
# Synchronisations (the host waits for the device): .get(), cupy.asnumpy, float() / int() / bool() / item() /
# tolist() / repr() of an array, a boolean mask (its count of True), stream or device synchronize().

ROUTINE_REDUCTIONS = {"sum", "prod", "max", "min", "amax", "amin", "argmax", "argmin"}


def kernels_of_reduction(name: str, array: np.ndarray, axis) -> int:
    """Kernels CuPy 14 launches for a reduction of ``array`` (its default accelerator, CUB).

    Over an axis: 1. Over the whole array: the routine reductions (sum, max, argmax, ...) go to CUB's
    DeviceReduce, one kernel while the data fit one tile (256 threads x 16 items of 4 bytes), else two passes;
    the others (count_nonzero, any, mean, ...) go to CuPy's CUB block reduction, two passes from 128 items on
    (cupy/cuda/cub.pyx, cupy/_core/_cub_reduction.pyx)."""
    whole = axis is None or array.ndim <= 1
    if not whole:
        return 1
    if name in ROUTINE_REDUCTIONS:
        return 1 if array.size * array.itemsize <= 256 * 16 * 4 else 2
    return 2 if array.size >= 128 else 1


# Functions that only describe or view arrays: no kernel.
NO_KERNEL = {"isdtype", "result_type", "can_cast", "shape", "ndim", "size", "finfo", "iinfo", "empty", "empty_like",
             "reshape", "transpose", "permute_dims", "expand_dims", "squeeze", "broadcast_to", "broadcast_arrays",
             "get_array_module", "dtype"}
KERNELS_OF = {"eye": 2, "identity": 2}
REDUCTIONS = ROUTINE_REDUCTIONS | {"count_nonzero", "any", "all", "mean", "var", "std", "nansum", "cumsum"}


class DeviceArray:
    """A stand-in for ``cupy.ndarray``: NumPy data posing as GPU memory, every operation counted.

    Like CuPy's arrays it refuses a silent trip to the host: ``np.asarray(array)`` raises TypeError, and
    so does mixing it with a NumPy array in one operation; ``.get()`` (or ``cupy.asnumpy``) copies it to
    the host, and ``float(array)`` waits for the device. Reductions give 0-d arrays, as in CuPy.
    """

    __array_ufunc__ = None  # NumPy's operators hand over to ours (and fail on a NumPy operand, as CuPy does)

    def __init__(self, data: np.ndarray, device):
        self._data, self._device = data, device

    # -- what an array is (no kernel) --
    shape = property(lambda self: self._data.shape)
    dtype = property(lambda self: self._data.dtype)
    ndim = property(lambda self: self._data.ndim)
    size = property(lambda self: self._data.size)
    nbytes = property(lambda self: self._data.nbytes)
    itemsize = property(lambda self: self._data.itemsize)
    strides = property(lambda self: self._data.strides)
    flags = property(lambda self: self._data.flags)
    T = property(lambda self: DeviceArray(self._data.T, self._device))

    def __len__(self):
        return len(self._data)

    def __iter__(self):
        return (DeviceArray(self._data[index, ...], self._device) for index in range(len(self._data)))

    def transpose(self, *axes):
        return DeviceArray(self._data.transpose(*axes), self._device)

    def view(self, *args):
        return DeviceArray(self._data.view(*args), self._device)

    def reshape(self, *shape, **keywords):
        return self._device.reshape(self, shape[0] if len(shape) == 1 else shape, **keywords)

    def ravel(self):
        return self._device.reshape(self, (-1,))

    # -- to the host: a synchronisation --
    def __array__(self, *args, **keywords):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def get(self, stream=None, out=None):
        self._device.to_host("get")
        if out is not None:
            out[...] = self._data
            return out
        return self._data.copy()

    def item(self):
        self._device.to_host("item")
        return self._data.item()

    def tolist(self):
        self._device.to_host("tolist")
        return self._data.tolist()

    def __float__(self):
        self._device.to_host("float")
        return float(self._data)

    def __int__(self):
        self._device.to_host("int")
        return int(self._data)

    def __index__(self):
        self._device.to_host("index")
        return self._data.__index__()

    def __bool__(self):
        self._device.to_host("bool")
        return bool(self._data)

    def __complex__(self):
        self._device.to_host("complex")
        return complex(self._data)

    def __repr__(self):
        self._device.to_host("repr")
        return repr(self._data)

    __str__ = __repr__

    def __format__(self, spec):
        self._device.to_host("format")
        return format(self._data.item() if self._data.ndim == 0 else self._data, spec)

    # -- kernels --
    def __getitem__(self, index):
        if is_basic_index(index):
            return DeviceArray(self._data[with_ellipsis(index)], self._device)  # a view
        index = self._device.unwrap(index)
        if isinstance(index, np.ndarray) and index.dtype == bool:
            self._device.to_host("boolean mask")  # the result's size is the count of True
        self._device.launch("getitem")
        return self._device.wrap(self._data[index])

    def __setitem__(self, index, value):
        index = index if is_basic_index(index) else self._device.unwrap(index)
        self._data[index] = value._data if isinstance(value, DeviceArray) else value  # host values: a copy there
        self._device.launch("setitem")

    def copy(self, order="C"):
        self._device.launch("copy")
        return DeviceArray(self._data.copy(order), self._device)

    def astype(self, dtype, copy=True, **keywords):
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        self._device.launch("astype")
        return DeviceArray(self._data.astype(dtype, **keywords), self._device)

    def fill(self, value):
        self._device.launch("fill")
        self._data.fill(value)

    def set(self, host):
        self._device.launch("set")
        self._data[...] = host

    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        return self._device.sum(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims)

    def max(self, axis=None, out=None, keepdims=False):
        return self._device.max(self, axis=axis, out=out, keepdims=keepdims)

    def min(self, axis=None, out=None, keepdims=False):
        return self._device.min(self, axis=axis, out=out, keepdims=keepdims)

    def argmax(self, axis=None, out=None):
        return self._device.argmax(self, axis=axis, out=out)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False):
        return self._device.mean(self, axis=axis, dtype=dtype, out=out, keepdims=keepdims)


def is_basic_index(index) -> bool:
    """Whether ``array[index]`` is a view: integers, slices, None and ... only."""
    parts = index if isinstance(index, tuple) else (index,)
    return all(part is None or part is Ellipsis or isinstance(part, (slice, int, np.integer)) and not isinstance(part, bool)
               for part in parts)


def with_ellipsis(index):
    """``index`` with a trailing ``...``, so that NumPy gives a 0-d view where it would give a scalar."""
    parts = index if isinstance(index, tuple) else (index,)
    return parts if Ellipsis in parts else parts + (Ellipsis,)


def operator(name, reflected=False, in_place=False):
    """The DeviceArray method for a Python operator: NumPy's ufunc ``name``, as one kernel."""
    if in_place:
        def method(self, other):
            self._device.call(name, getattr(np, name), (self, other), {"out": self})
            return self
    elif reflected:
        def method(self, other):
            return self._device.call(name, getattr(np, name), (other, self), {})
    else:
        def method(self, other):
            return self._device.call(name, getattr(np, name), (self, other), {})
    return method


for _dunder, _ufunc in [("add", "add"), ("sub", "subtract"), ("mul", "multiply"), ("truediv", "true_divide"),
                        ("floordiv", "floor_divide"), ("mod", "remainder"), ("pow", "power"), ("matmul", "matmul"),
                        ("and", "bitwise_and"), ("or", "bitwise_or"), ("xor", "bitwise_xor")]:
    setattr(DeviceArray, f"__{_dunder}__", operator(_ufunc))
    setattr(DeviceArray, f"__r{_dunder}__", operator(_ufunc, reflected=True))
    setattr(DeviceArray, f"__i{_dunder}__", operator(_ufunc, in_place=True))
for _dunder, _ufunc in [("eq", "equal"), ("ne", "not_equal"), ("lt", "less"), ("le", "less_equal"), ("gt", "greater"),
                        ("ge", "greater_equal")]:
    setattr(DeviceArray, f"__{_dunder}__", operator(_ufunc))
for _dunder, _ufunc in [("neg", "negative"), ("pos", "positive"), ("abs", "absolute"), ("invert", "invert")]:
    setattr(DeviceArray, f"__{_dunder}__", lambda self, _name=_ufunc: self._device.call(_name, getattr(np, _name),
                                                                                          (self,), {}))
DeviceArray.__hash__ = None
DeviceArray.__name__ = DeviceArray.__qualname__ = "ndarray"
DeviceArray.__module__ = "cupy._core.core"  # how nnlib (nnlib.lesson02_network.arrays) recognises CuPy's arrays


class FusedFunction:
    """What ``cupy.fuse(function)`` gives: one kernel per call with device arrays, computing ``function``.

    Like CuPy's, it refuses NumPy arrays (TypeError) and runs ``function`` as it is when no argument is an
    array. The stand-in runs ``function`` on the arrays' NumPy data (in place where ``function`` writes in place).
    It cannot see what CuPy's fusion refuses inside ``function`` (``.shape``, calls that are not ufuncs or
    reductions): the real-GPU tests compare every fused piece with its NumPy form.
    """

    def __init__(self, device, function, name):
        self.device, self.function, self.__name__ = device, function, name

    def __call__(self, *args):
        for arg in args:
            if isinstance(arg, np.ndarray) or not (arg is None or isinstance(arg, (DeviceArray, bool, int, float, complex,
                                                                                    np.generic))):
                raise TypeError(f"Invalid argument type for '{self.__name__}': ({type(arg)!r}): Unsupported type")
        if not any(isinstance(arg, DeviceArray) for arg in args):
            return self.function(*args)
        result = self.function(*self.device.unwrap(args))
        self.device.launch(f"fused {self.__name__}")
        return self.device.wrap(result)


class CountingCuPy(StandInCuPy):
    """A stand-in ``cupy`` whose arrays are :class:`DeviceArray` s, counting kernel launches and synchronisations.

    ``launched``: the name of every kernel launched, in order (``launches`` counts them); ``synchronizations``:
    how many times the host waited for the device, ``waited_for``: what for. ``fuse`` behaves as cupy.fuse
    (``fusion=False``: there is none).
    """

    def __init__(self, fusion=True, **settings):
        super().__init__(**settings)
        if not fusion:
            self.fuse = None  # a CuPy without cupy.fuse: nnlib runs its element-wise pieces unfused
        self.launched, self.waited_for = [], []
        self.ndarray = DeviceArray
        self.cuda.runtime.getDevice = lambda: self.current_device
        self.cuda.Device = self._counting_device

    @property
    def launches(self) -> int:
        return len(self.launched)

    def counts(self) -> tuple[int, int]:
        """(kernel launches, synchronisations) so far."""
        return self.launches, self.synchronizations

    def launch(self, name: str, kernels: int = 1) -> None:
        self.launched += [name] * kernels

    def to_host(self, what: str) -> None:
        """A value comes to the host: the host waits for the device (and the copy is a launch too)."""
        self.synchronizations += 1
        self.waited_for.append(what)
        self.launch(f"copy to host ({what})")

    def _synchronize(self):
        super()._synchronize()
        self.waited_for.append("synchronize")

    def _counting_device(self, index=None):
        device = self._device(index)
        device.synchronize = self._synchronize
        return device

    # -- moving between NumPy and DeviceArray --
    def unwrap(self, value):
        if isinstance(value, DeviceArray):
            return value._data
        if isinstance(value, (list, tuple)):
            return type(value)(self.unwrap(part) for part in value)
        if isinstance(value, dict):
            return {key: self.unwrap(part) for key, part in value.items()}
        return value

    def wrap(self, value):
        if isinstance(value, np.ndarray):
            return DeviceArray(value, self)
        if isinstance(value, (np.generic, bool, int, float)) and not isinstance(value, np.dtype):
            return DeviceArray(np.asarray(value), self)
        if isinstance(value, tuple):
            return tuple(self.wrap(part) for part in value)
        return value

    def call(self, name, function, args, keywords, kernels=1):
        """``function(*args, **keywords)`` on the device: NumPy operands refused, as by CuPy; ``kernels`` counted."""
        for value in list(args) + list(keywords.values()):
            for part in value if isinstance(value, (list, tuple)) else (value,):
                if isinstance(part, np.ndarray):
                    raise TypeError(f"Unsupported type {type(part)}")
        out = keywords.get("out")
        result = function(*self.unwrap(args), **self.unwrap(keywords))
        self.launch(name, kernels)
        return out if isinstance(out, DeviceArray) else self.wrap(result)

    # -- the module's functions --
    def asarray(self, value, dtype=None, **keywords):
        if isinstance(value, DeviceArray):
            return value if dtype is None or np.dtype(dtype) == value.dtype else value.astype(dtype)
        self.launch("copy to device")
        return DeviceArray(np.array(value, dtype=dtype), self)

    def array(self, value, dtype=None, copy=True, **keywords):
        if isinstance(value, DeviceArray):
            return value.astype(dtype or value.dtype, copy=copy)
        return self.asarray(value, dtype)

    def asnumpy(self, value, stream=None, out=None):
        return value.get(out=out) if isinstance(value, DeviceArray) else np.asarray(value)

    def ones(self, shape, dtype=float):
        if self.smoke_test_fails:
            super().ones(shape, dtype)
        return self.call("ones", np.ones, (shape,), {"dtype": dtype})

    def take(self, array, indices, axis=None, out=None):
        if isinstance(indices, np.ndarray):  # CuPy copies host indices to the device first
            indices = self.asarray(indices)
        return self.call("take", np.take, (array, indices), {"axis": axis, "out": out})

    def reshape(self, array, shape, **keywords):
        result = np.reshape(array._data, shape, **keywords)
        if not np.shares_memory(result, array._data):
            self.launch("copy (reshape)")
        return DeviceArray(result, self)

    def fuse(self, *args, kernel_name=None):
        """cupy.fuse: as a decorator, with or without a kernel_name."""
        if len(args) == 1 and callable(args[0]):
            return FusedFunction(self, args[0], kernel_name or args[0].__name__)
        return lambda function: FusedFunction(self, function, kernel_name or function.__name__)

    def __getattr__(self, name):
        found = getattr(np, name)
        if not callable(found) or isinstance(found, type):  # dtypes (cupy.float32 is numpy's), constants
            return found
        if name in NO_KERNEL:
            return lambda *args, **keywords: self.wrap_views(found(*self.unwrap(args), **self.unwrap(keywords)))
        if name in REDUCTIONS:
            def reduction(array, *args, **keywords):
                axis = keywords.get("axis", args[0] if args else None)
                return self.call(name, found, (array, *args), keywords,
                                 kernels_of_reduction(name, array._data, axis))
            return reduction
        return lambda *args, **keywords: self.call(name, found, args, keywords, KERNELS_OF.get(name, 1))

    def wrap_views(self, value):
        if isinstance(value, np.ndarray):
            return DeviceArray(value, self)
        if isinstance(value, tuple):
            return tuple(self.wrap_views(part) for part in value)
        return value
