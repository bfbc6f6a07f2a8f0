"""Devices a GPU model runs on: an NVIDIA GPU through the CUDA driver, or the loop-IR
interpreter standing in for one.

A :class:`Device` holds one memory allocation per model (the static memory plan lives in
it), copies arrays in and out at byte offsets, loads a model's kernels and launches them
with pointers into that memory. The executor (:class:`opfusion.compiler.gpu.GPUExecutor`)
sees only this interface, so everything it does (the plan, the arguments of each launch,
the order of the launches, the copies) is tested on machines without a GPU, with
:class:`InterpretedDevice`.

:class:`CUDADevice` is the driver API through ``cuda-python`` (``cuda.bindings.driver``):
``cuInit``, the device's primary context, ``cuModuleLoadData`` of an NVRTC cubin for the
device's own architecture, ``cuMemAlloc``, ``cuMemcpyHtoD``/``DtoH``, ``cuLaunchKernel``
and events for profiles. It needs a GPU and its driver (``libcuda``): without them,
:func:`cuda_device` raises :class:`~opfusion.errors.DeviceError` saying what is missing.
Loading the kernels runs native code on the GPU, as loading any compiled model does."""

from __future__ import annotations

import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import DeviceError
from ...tir.interp import run_launch
from ...tir.stmt import PrimFunc


@dataclass(frozen=True)
class Arg:
    """One buffer argument of a launch: where it lives in the model's memory, and what it
    holds."""

    offset: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


class Device(ABC):
    """Memory, kernels and launches of one model on one device (see the module docstring)."""

    @abstractmethod
    def allocate(self, nbytes: int) -> None:
        """Take ``nbytes`` of device memory: the model's one allocation."""

    @abstractmethod
    def upload(self, offset: int, array: np.ndarray) -> None:
        """Copy ``array`` (C-contiguous) to byte ``offset`` of the allocation."""

    def copy_from_device(self, offset: int, address: int, nbytes: int) -> None:
        """Copy ``nbytes`` at GPU address ``address`` (another framework's array already on
        the GPU) to byte ``offset`` of the allocation."""
        raise DeviceError(f"{type(self).__name__} cannot read arrays in GPU memory: pass a "
                          "NumPy array")

    @abstractmethod
    def download(self, offset: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        """A new array with the elements at byte ``offset`` of the allocation."""

    @abstractmethod
    def load(self, source: Any, funcs: dict[str, PrimFunc]) -> None:
        """Load the model's kernels: ``source`` (a :class:`~.emitter.CUDASource`) and the
        PrimFunc of each group by name."""

    @abstractmethod
    def launch(self, group: str, number: int, symbol: str, grid: tuple[int, int, int],
               block: tuple[int, int, int], args: Sequence[Arg]) -> None:
        """Launch kernel ``symbol`` (launch ``number`` of ``group``) on ``args``."""

    def prepare(self, group: str, number: int, symbol: str, grid: tuple[int, int, int],
                block: tuple[int, int, int], args: Sequence[Arg]) -> Callable[[], None]:
        """A call that makes :meth:`launch`'s launch, with everything about it worked out
        once (a model runs the same launches every time); valid until the memory is
        released."""
        return functools.partial(self.launch, group, number, symbol, grid, block,
                                 tuple(args))

    def capture(self, calls: Sequence[Callable[[], None]]) -> Callable[[], None] | None:
        """One call that replays ``calls`` (prepared launches, in order) as a whole, or None
        where the device has no such thing (the interpreter)."""
        return None

    @abstractmethod
    def synchronize(self) -> None:
        """Wait until every launch so far is done."""

    def timer(self) -> Any:
        """Something :meth:`elapsed_ms` can measure launches from (wall time here)."""
        self.synchronize()
        return time.perf_counter()

    def elapsed_ms(self, start: Any) -> float:
        self.synchronize()
        return (time.perf_counter() - start) * 1e3

    @abstractmethod
    def release(self) -> None:
        """Give the memory back (the executor's last use)."""


class InterpretedDevice(Device):
    """A GPU stood in for by the loop-IR interpreter: memory is host bytes, and a launch runs
    the PrimFunc's launch block by block and thread by thread, with data races checked
    (:mod:`opfusion.tir.interp`). Slow: small models only."""

    name = "loop-IR interpreter (no GPU)"

    def __init__(self) -> None:
        self.memory = np.zeros(0, np.uint8)
        self.funcs: dict[str, PrimFunc] = {}
        self.launches = 0

    def allocate(self, nbytes: int) -> None:
        self.memory = np.zeros(nbytes, np.uint8)

    def upload(self, offset: int, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        self.memory[offset:offset + data.size] = data

    def download(self, offset: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return self._view(Arg(offset, shape, dtype)).copy()

    def load(self, source: Any, funcs: dict[str, PrimFunc]) -> None:
        self.funcs = dict(funcs)

    def launch(self, group: str, number: int, symbol: str, grid: tuple[int, int, int],
               block: tuple[int, int, int], args: Sequence[Arg]) -> None:
        arrays = [self._view(a).copy() for a in args]
        run_launch(self.funcs[group], number, *arrays)
        for arg, array in zip(args, arrays):
            self._view(arg)[...] = array
        self.launches += 1

    def synchronize(self) -> None:
        pass

    def release(self) -> None:
        self.memory = np.zeros(0, np.uint8)

    def _view(self, arg: Arg) -> np.ndarray:
        raw = self.memory[arg.offset:arg.offset + arg.nbytes]
        return raw.view(np.dtype(arg.dtype)).reshape(arg.shape)


class CUDADevice(Device):
    """An NVIDIA GPU through the CUDA driver API (see the module docstring)."""

    def __init__(self, ordinal: int = 0) -> None:
        self.cu = _driver()
        cu = self.cu
        _check(cu, cu.cuInit(0)[0], "cuInit")
        err, self.device = cu.cuDeviceGet(ordinal)
        _check(cu, err, f"cuDeviceGet({ordinal})")
        err, self.context = cu.cuDevicePrimaryCtxRetain(self.device)
        _check(cu, err, "cuDevicePrimaryCtxRetain")
        _check(cu, cu.cuCtxSetCurrent(self.context)[0], "cuCtxSetCurrent")
        attr = cu.CUdevice_attribute
        err, major = cu.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device)
        _check(cu, err, "cuDeviceGetAttribute")
        err, minor = cu.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device)
        _check(cu, err, "cuDeviceGetAttribute")
        self.arch = f"sm_{major}{minor}"
        err, name = cu.cuDeviceGetName(128, self.device)
        self.name = name.split(b"\0", 1)[0].decode(errors="replace") if not err else "GPU"
        self.pointer = None
        self.module = None
        self.functions: dict[str, Any] = {}
        self.shared_bytes: dict[str, int] = {}  # a launch's dynamic shared memory, by symbol
        # Each launch's kernelParams (an array of pointers, each to one argument's value),
        # built once per distinct argument list: a model launches the same lists every run.
        self._params: dict[tuple[Arg, ...], tuple[np.ndarray, np.ndarray]] = {}
        # Counts allocations and releases: a prepared launch of an earlier one refuses to run.
        self._generation = 0
        # The stream prepared launches go to: the legacy default stream (0), or the capture
        # stream while capture() records a graph.
        self._stream: Any = 0
        self._graphs: list[tuple[Any, Any]] = []  # (graph, executable graph) to destroy

    def allocate(self, nbytes: int) -> None:
        self._params.clear()
        self._generation += 1
        if self.pointer is not None:  # a second model on this device: the first's is done
            self.cu.cuMemFree(self.pointer)
            self.pointer = None
        err, self.pointer = self.cu.cuMemAlloc(max(nbytes, 1))
        _check(self.cu, err, f"cuMemAlloc({nbytes})")

    def _address(self, offset: int) -> Any:
        return self.cu.CUdeviceptr(int(self.pointer) + offset)

    def upload(self, offset: int, array: np.ndarray) -> None:
        data = np.ascontiguousarray(array)
        (err,) = self.cu.cuMemcpyHtoD(self._address(offset), data.ctypes.data, data.nbytes)
        _check(self.cu, err, "cuMemcpyHtoD")

    def copy_from_device(self, offset: int, address: int, nbytes: int) -> None:
        # The array's producer may have queued its work on a stream of its own (PyTorch's
        # are non-blocking): wait for every stream of the context before reading it.
        self.synchronize()
        (err,) = self.cu.cuMemcpyDtoD(self._address(offset), self.cu.CUdeviceptr(address),
                                      nbytes)
        _check(self.cu, err, "cuMemcpyDtoD")

    def download(self, offset: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        out = np.empty(shape, dtype)
        (err,) = self.cu.cuMemcpyDtoH(out.ctypes.data, self._address(offset), out.nbytes)
        _check(self.cu, err, "cuMemcpyDtoH")
        return out

    def load(self, source: Any, funcs: dict[str, PrimFunc]) -> None:
        from .nvrtc import compile_cuda_cached

        image = compile_cuda_cached(str(source), self.arch)
        err, self.module = self.cu.cuModuleLoadData(image)
        _check(self.cu, err, "cuModuleLoadData")
        for group in source.groups:
            for launch in group.launches:
                err, fn = self.cu.cuModuleGetFunction(self.module, launch.symbol.encode())
                _check(self.cu, err, f"cuModuleGetFunction({launch.symbol})")
                self.functions[launch.symbol] = fn
                self.shared_bytes[launch.symbol] = launch.shared_bytes
                if launch.shared_bytes:  # more than 48 KiB: the function opts in
                    attribute = self.cu.CUfunction_attribute
                    (err,) = self.cu.cuFuncSetAttribute(
                        fn, attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        launch.shared_bytes)
                    _check(self.cu, err, f"cuFuncSetAttribute({launch.symbol}, "
                                         f"{launch.shared_bytes} bytes of shared memory)")

    def launch(self, group: str, number: int, symbol: str, grid: tuple[int, int, int],
               block: tuple[int, int, int], args: Sequence[Arg]) -> None:
        self.prepare(group, number, symbol, grid, block, args)()

    def prepare(self, group: str, number: int, symbol: str, grid: tuple[int, int, int],
                block: tuple[int, int, int], args: Sequence[Arg]) -> Callable[[], None]:
        key = tuple(args)
        if key not in self._params:
            values = np.array([int(self.pointer) + a.offset for a in args], dtype=np.uint64)
            pointers = values.ctypes.data + 8 * np.arange(len(args), dtype=np.uint64)
            self._params[key] = (values, pointers)  # values stay alive while pointed to
        arrays = self._params[key]
        params = int(arrays[1].ctypes.data)
        function, launch_kernel, cu = self.functions[symbol], self.cu.cuLaunchKernel, self.cu
        shared = self.shared_bytes.get(symbol, 0)  # dynamic shared memory, bytes
        generation = self._generation

        # kernelParams: pointers, each to one argument's value; the call holds both arrays.
        def call(_arrays: tuple[np.ndarray, np.ndarray] = arrays) -> None:
            if self._generation != generation:
                raise DeviceError(f"kernel {symbol}: the device memory it was prepared for "
                                  "was released or given to another model")
            (err,) = launch_kernel(function, *grid, *block, shared, self._stream, params, 0)
            if err != cu.CUresult.CUDA_SUCCESS:
                _check(cu, err, f"cuLaunchKernel({symbol})")

        return call

    def capture(self, calls: Sequence[Callable[[], None]]) -> Callable[[], None] | None:
        """A CUDA graph of ``calls``: recorded once on a stream of its own
        (``cuStreamBeginCapture``), instantiated, then each call is one ``cuGraphLaunch`` on
        the default stream instead of a launch per kernel. None when the driver refuses
        (the launches then run one by one, as before)."""
        cu = self.cu
        if not hasattr(cu, "cuStreamBeginCapture"):
            return None
        err, stream = cu.cuStreamCreate(0)  # blocking: ordered with the default stream
        if err != cu.CUresult.CUDA_SUCCESS:
            return None
        try:
            mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            if cu.cuStreamBeginCapture(stream, mode)[0] != cu.CUresult.CUDA_SUCCESS:
                return None
            self._stream = stream
            refused = False
            try:
                for call in calls:
                    call()
            except DeviceError:  # a launch the capture refused: run them one by one instead
                refused = True
            finally:
                self._stream = 0
                err, graph = cu.cuStreamEndCapture(stream)
            if err != cu.CUresult.CUDA_SUCCESS:
                return None
            if refused:
                cu.cuGraphDestroy(graph)
                return None
            err, executable = cu.cuGraphInstantiate(graph, 0)
            if err != cu.CUresult.CUDA_SUCCESS:
                cu.cuGraphDestroy(graph)
                return None
        finally:
            cu.cuStreamDestroy(stream)
        self._graphs.append((graph, executable))
        generation, graph_launch = self._generation, cu.cuGraphLaunch

        def replay() -> None:
            if self._generation != generation:
                raise DeviceError("a CUDA graph of this device's launches outlived its memory")
            (err,) = graph_launch(executable, 0)
            _check(cu, err, "cuGraphLaunch")

        return replay

    def synchronize(self) -> None:
        _check(self.cu, self.cu.cuCtxSynchronize()[0], "cuCtxSynchronize")

    def timer(self) -> Any:
        err, start = self.cu.cuEventCreate(0)
        _check(self.cu, err, "cuEventCreate")
        _check(self.cu, self.cu.cuEventRecord(start, 0)[0], "cuEventRecord")
        return start

    def elapsed_ms(self, start: Any) -> float:
        err, stop = self.cu.cuEventCreate(0)
        _check(self.cu, err, "cuEventCreate")
        _check(self.cu, self.cu.cuEventRecord(stop, 0)[0], "cuEventRecord")
        _check(self.cu, self.cu.cuEventSynchronize(stop)[0], "cuEventSynchronize")
        err, ms = self.cu.cuEventElapsedTime(start, stop)
        _check(self.cu, err, "cuEventElapsedTime")
        self.cu.cuEventDestroy(start)
        self.cu.cuEventDestroy(stop)
        return float(ms)

    def release(self) -> None:
        self._params.clear()
        self._generation += 1
        for graph, executable in self._graphs:
            self.cu.cuGraphExecDestroy(executable)
            self.cu.cuGraphDestroy(graph)
        self._graphs.clear()
        if self.pointer is not None:
            self.cu.cuMemFree(self.pointer)
            self.pointer = None
        if self.module is not None:
            self.cu.cuModuleUnload(self.module)
            self.module = None
            self.functions.clear()
            self.shared_bytes.clear()


def cuda_device(ordinal: int = 0) -> CUDADevice:
    """The GPU ``ordinal`` through the CUDA driver, or a DeviceError saying why not."""
    try:
        return CUDADevice(ordinal)
    except DeviceError:
        raise
    except Exception as err:  # the bindings load libcuda on first use
        raise DeviceError(f"no CUDA driver to run on: {err}") from None


def gpu_unavailable() -> str | None:
    """None when :func:`cuda_device` opens a GPU here, else why not (for a skip or a
    message)."""
    try:
        device = cuda_device()
    except DeviceError as err:
        return f"no NVIDIA GPU: {err}"
    device.release()
    return None


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:
        raise DeviceError("running on a GPU needs cuda-python: pip install 'opfusion[cuda]'"
                          ) from None
    return driver


def _check(cu: Any, err: Any, what: str) -> None:
    if err != cu.CUresult.CUDA_SUCCESS:
        raise DeviceError(f"{what} failed: {err}; is there an NVIDIA GPU with its driver "
                          "(libcuda) on this machine?")


__all__ = ["Arg", "CUDADevice", "Device", "InterpretedDevice", "cuda_device",
           "gpu_unavailable"]
