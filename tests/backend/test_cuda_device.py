"""CUDADevice, the driver-API device, on a stand-in for ``cuda.bindings.driver``: host memory
at made-up device addresses, and a ``cuLaunchKernel`` that reads the kernel's arguments
from ``kernelParams`` exactly as the driver does (an array of pointers, each to one
argument's value) and runs the launch in the loop-IR interpreter. So the byte offsets,
the argument marshalling and the order of calls a GPU sees are checked on any machine; on
a GPU, tests/backend/test_cuda_backend.py runs the same models on the real driver."""

import ctypes

import numpy as np
import pytest

from opfusion import op, testing
from opfusion.backend.cuda.nvrtc import nvrtc_available
from opfusion.backend.cuda.runtime import CUDADevice, InterpretedDevice
from opfusion.compiler.executor import InputError
from opfusion.compiler.gpu import GPUExecutor, build_gpu_model
from opfusion.errors import DeviceError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function, Var
from opfusion.ir.types import TensorType
from opfusion.tir.interp import run_launch

pytestmark = pytest.mark.skipif(nvrtc_available() is not None,
                                reason=f"loading compiles with NVRTC: {nvrtc_available()}")


class _Result:
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1


class _Attribute:
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = "major"
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = "minor"


class FakeDriver:
    """The calls CUDADevice makes, on host memory (see the module docstring)."""

    CUresult = _Result
    CUdevice_attribute = _Attribute

    def __init__(self, model) -> None:
        self.buffers: dict[int, np.ndarray] = {}
        self.next_address = 1 << 32
        self.launched: list[str] = []
        self.loaded = 0
        self.capturing = None
        self.captured: list = []
        self.graph_launches = 0
        self.graphs_destroyed = 0
        # symbol -> (the group's PrimFunc, launch number, its buffers' shapes and dtypes)
        self.kernels = {}
        funcs = {g.name: g.prim_func for g in model.kernels if g.prim_func is not None}
        for code in model.source.groups:
            func = funcs[code.name]
            buffers = [(tuple(int(d) for d in b.shape), b.dtype) for b in func.params]
            buffers += [(tuple(shape), dtype) for shape, dtype in code.temporaries]
            for number, launch in enumerate(code.launches):
                self.kernels[launch.symbol] = (func, number, buffers)

    @staticmethod
    def CUdeviceptr(address):  # noqa: N802 - the driver's spelling
        return address

    def cuInit(self, flags):  # noqa: N802
        return (0,)

    def cuDeviceGet(self, ordinal):  # noqa: N802
        return (0, ordinal)

    def cuDevicePrimaryCtxRetain(self, device):  # noqa: N802
        return (0, "context")

    def cuCtxSetCurrent(self, context):  # noqa: N802
        return (0,)

    def cuDeviceGetAttribute(self, attribute, device):  # noqa: N802
        return (0, {"major": 9, "minor": 0}[attribute])

    def cuDeviceGetName(self, length, device):  # noqa: N802
        return (0, b"Stand-in GPU\0\0\0")

    def cuMemAlloc(self, nbytes):  # noqa: N802
        address = self.next_address
        self.next_address += -(-nbytes // 4096) * 4096 + 4096
        self.buffers[address] = np.zeros(nbytes, np.uint8)
        return (0, address)

    def cuMemFree(self, address):  # noqa: N802
        del self.buffers[address]
        return (0,)

    def _host(self, address: int, nbytes: int) -> np.ndarray:
        for base, buffer in self.buffers.items():
            if base <= address and address + nbytes <= base + buffer.size:
                return buffer[address - base:address - base + nbytes]
        raise AssertionError(f"{nbytes} bytes at {address:#x} are outside every allocation")

    def cuMemcpyHtoD(self, device, host, nbytes):  # noqa: N802
        ctypes.memmove(self._host(device, nbytes).ctypes.data, host, nbytes)
        return (0,)

    def cuMemcpyDtoH(self, host, device, nbytes):  # noqa: N802
        ctypes.memmove(host, self._host(device, nbytes).ctypes.data, nbytes)
        return (0,)

    def cuMemcpyDtoD(self, device, source, nbytes):  # noqa: N802
        self._host(device, nbytes)[...] = self._host(source, nbytes)
        return (0,)

    def cuModuleLoadData(self, image):  # noqa: N802
        assert image.startswith(b"\x7fELF")  # a cubin
        self.loaded += 1
        return (0, "module")

    def cuModuleUnload(self, module):  # noqa: N802
        return (0,)

    def cuModuleGetFunction(self, module, name):  # noqa: N802
        return (0, name.decode())

    def cuLaunchKernel(self, symbol, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # noqa: N802
        _, _, buffers = self.kernels[symbol]
        pointers = np.ctypeslib.as_array((ctypes.c_uint64 * len(buffers)).from_address(params))
        # The driver copies the argument values when the launch is made (or captured).
        values = [ctypes.c_uint64.from_address(int(p)).value for p in pointers]
        if self.capturing is not None and stream == self.capturing:
            self.captured.append((symbol, values))
        else:
            self._run(symbol, values)
        return (0,)

    def _run(self, symbol, values) -> None:
        func, number, buffers = self.kernels[symbol]
        arrays = []
        for value, (shape, dtype) in zip(values, buffers):
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            arrays.append(self._host(value, nbytes).view(dtype).reshape(shape))
        copies = [a.copy() for a in arrays]
        run_launch(func, number, *copies)
        for array, copy in zip(arrays, copies):
            array[...] = copy
        self.launched.append(symbol)

    # -- graphs: launches on a capturing stream are recorded, a graph launch replays them --
    class CUstreamCaptureMode:
        CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 2

    def cuStreamCreate(self, flags):  # noqa: N802
        return (0, "capture stream")

    def cuStreamDestroy(self, stream):  # noqa: N802
        return (0,)

    def cuStreamBeginCapture(self, stream, mode):  # noqa: N802
        self.capturing, self.captured = stream, []
        return (0,)

    def cuStreamEndCapture(self, stream):  # noqa: N802
        graph, self.capturing = list(self.captured), None
        return (0, graph)

    def cuGraphInstantiate(self, graph, flags):  # noqa: N802
        return (0, tuple(graph))

    def cuGraphLaunch(self, executable, stream):  # noqa: N802
        self.graph_launches += 1
        for symbol, values in executable:
            self._run(symbol, values)
        return (0,)

    def cuGraphExecDestroy(self, executable):  # noqa: N802
        self.graphs_destroyed += 1
        return (0,)

    def cuGraphDestroy(self, graph):  # noqa: N802
        return (0,)

    def cuCtxSynchronize(self):  # noqa: N802
        return (0,)

    def cuEventCreate(self, flags):  # noqa: N802
        return (0, object())

    def cuEventRecord(self, event, stream):  # noqa: N802
        return (0,)

    def cuEventSynchronize(self, event):  # noqa: N802
        return (0,)

    def cuEventElapsedTime(self, start, stop):  # noqa: N802
        return (0, 0.5)

    def cuEventDestroy(self, event):  # noqa: N802
        return (0,)


def _device(monkeypatch, model) -> tuple[CUDADevice, FakeDriver]:
    from opfusion.backend.cuda import runtime

    fake = FakeDriver(model)
    monkeypatch.setattr(runtime, "_driver", lambda: fake)
    return CUDADevice(), fake


def _model():
    x = Var("x", TensorType((3, 20), "float32"))
    w = Var("w", TensorType((12, 20), "float32"))
    body = op.nn.softmax(op.nn.relu(op.nn.dense(x, w)), axis=-1)
    return Function([x, w], op.sigmoid(op.add(body, op.sigmoid(body))))


def test_a_model_runs_through_the_driver_calls(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))
    func = _model()
    model = build_gpu_model(func, target="cuda -arch=sm_90")
    device, fake = _device(monkeypatch, model)
    assert device.arch == "sm_90" and device.name == "Stand-in GPU"
    exe = GPUExecutor(model, device)
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal(p.type_annotation.shape).astype("float32")
              for p in func.params]
    for _ in range(2):  # the first run captures the launches as a graph, both replay it
        (got,) = exe.run(*inputs)
        testing.assert_close(got, evaluate(func, inputs), 1e-5)
    launches = sum(len(code.launches) for code in model.source.groups)
    assert fake.graph_launches == 2 and len(fake.launched) == 2 * launches
    assert len(device._params) == launches
    assert [name for name, ms in exe.profile(*inputs)] == [s.group.name for s in model.steps]
    assert len(fake.launched) == 3 * launches  # the profile launches one by one
    exe.close()
    assert fake.buffers == {} and device._params == {} and fake.graphs_destroyed == 1
    with pytest.raises(DeviceError, match="closed"):
        exe.execute()


def test_a_second_model_on_the_device_frees_the_first_ones_memory(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))
    model = build_gpu_model(_model(), target="cuda -arch=sm_90")
    device, fake = _device(monkeypatch, model)
    first = GPUExecutor(model, device)
    GPUExecutor(model, device)
    assert len(fake.buffers) == 1 and fake.loaded == 2
    with pytest.raises(DeviceError, match="released or given to another model"):
        first.execute()  # its memory is the second's now: refused, not run on it


def test_a_failing_driver_call_is_a_device_error_naming_it(monkeypatch, tmp_path):
    model = build_gpu_model(_model(), target="cuda -arch=sm_90")
    device, fake = _device(monkeypatch, model)
    monkeypatch.setattr(fake, "cuMemAlloc", lambda nbytes: (_Result.CUDA_ERROR_INVALID_VALUE,
                                                           None))
    with pytest.raises(DeviceError, match=r"cuMemAlloc\(\d+\) failed"):
        GPUExecutor(model, device)


class _OnTheGPU:
    """An array in (the stand-in's) GPU memory, as PyTorch and CuPy expose theirs."""

    def __init__(self, fake: FakeDriver, array: np.ndarray, strides=None, typestr=None):
        (_, self.address) = fake.cuMemAlloc(array.nbytes)
        fake.cuMemcpyHtoD(self.address, np.ascontiguousarray(array).ctypes.data, array.nbytes)
        self.shape, self.strides = array.shape, strides
        self.typestr = typestr or array.dtype.str

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.address, False),
                "strides": self.strides, "version": 3}


class _RequiresGrad:
    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")


def test_inputs_already_on_the_gpu_are_copied_there(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))
    func = _model()
    model = build_gpu_model(func, target="cuda -arch=sm_90")
    device, fake = _device(monkeypatch, model)
    exe = GPUExecutor(model, device)
    rng = np.random.default_rng(4)
    x, w = (rng.standard_normal(p.type_annotation.shape).astype("float32")
            for p in func.params)
    (got,) = exe.run(_OnTheGPU(fake, x), w)
    testing.assert_close(got, evaluate(func, [x, w]), 1e-5)
    (got,) = exe.run({"x": _OnTheGPU(fake, x), "w": _OnTheGPU(fake, w)})
    testing.assert_close(got, evaluate(func, [x, w]), 1e-5)
    with pytest.raises(InputError, match=r"input 'x' must have shape \(3, 20\)"):
        exe.run(_OnTheGPU(fake, x.T.copy()), w)
    with pytest.raises(InputError, match="input 'x' must be float32, got float64"):
        exe.run(_OnTheGPU(fake, x.astype("float64")), w)
    with pytest.raises(InputError, match="not a contiguous array in GPU memory"):
        exe.run(_OnTheGPU(fake, x, strides=(4, 12)), w)
    with pytest.raises(InputError, match="requires grad"):
        exe.run(_RequiresGrad(), w)


def test_the_interpreter_device_refuses_gpu_arrays():
    func = _model()
    model = build_gpu_model(func, target="cuda -arch=sm_90")
    exe = GPUExecutor(model, InterpretedDevice())
    x = np.zeros((3, 20), "float32")
    fake = FakeDriver(model)
    with pytest.raises(DeviceError, match="cannot read arrays in GPU memory"):
        exe.run(_OnTheGPU(fake, x), np.zeros((12, 20), "float32"))


def test_without_graphs_the_launches_run_one_by_one(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))
    func = _model()
    model = build_gpu_model(func, target="cuda -arch=sm_90")
    device, fake = _device(monkeypatch, model)
    monkeypatch.setattr(fake, "cuGraphInstantiate", lambda graph, flags: (1, None))
    exe = GPUExecutor(model, device)
    x, w = (np.ones(p.type_annotation.shape, "float32") for p in func.params)
    (got,) = exe.run(x, w)
    testing.assert_close(got, evaluate(func, [x, w]), 1e-5)
    assert fake.graph_launches == 0 and len(fake.launched) == len(model.steps)
