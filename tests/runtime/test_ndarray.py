"""opf.nd arrays and devices: zero-copy wrapping, copies when needed, clear device errors."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.errors import DeviceError, OpfusionError
from opfusion.runtime import nd
from opfusion.runtime.device import Device, cpu, device


def test_c_contiguous_array_is_wrapped_without_copy():
    x = np.arange(12, dtype="float32").reshape(3, 4)
    a = nd.array(x)
    assert np.shares_memory(np.asarray(a), x)
    assert a.shape == (3, 4) and a.dtype == "float32" and a.device == cpu()


def test_numpy_returns_a_copy():
    x = np.ones(4, dtype="float32")
    a = nd.array(x)
    out = a.numpy()
    out[0] = 5
    assert x[0] == 1


@pytest.mark.parametrize("make", [
    lambda: np.arange(20, dtype="float32")[::2],              # strided view
    lambda: np.asfortranarray(np.ones((3, 4), "float32")),     # Fortran order
    lambda: np.arange(6, dtype=">f4"),                         # foreign byte order
], ids=["strided", "fortran", "big-endian"])
def test_other_layouts_are_copied_to_contiguous_native(make):
    x = make()
    a = nd.array(x)
    data = np.asarray(a)
    assert data.flags.c_contiguous and data.dtype.isnative
    assert not np.shares_memory(data, x)
    np.testing.assert_array_equal(data, x)


def test_dtype_argument_converts():
    a = nd.array([1, 2, 3], dtype="float32")
    assert a.dtype == "float32"
    np.testing.assert_array_equal(a.numpy(), [1, 2, 3])


def test_empty_is_aligned_for_vector_loads():
    for shape in [(1,), (3, 5), (1000,)]:
        a = nd.empty(shape, "float32")
        assert a.shape == shape and np.asarray(a).ctypes.data % 64 == 0


def test_aligned_copy_moves_an_array_to_a_64_byte_boundary_once():
    from opfusion.runtime.ndarray import aligned_copy

    raw = np.arange(1 + 4096, dtype="float32")
    shifted = raw[1:].reshape(64, 64)  # 4 bytes past NumPy's own alignment
    moved = aligned_copy(shifted)
    assert moved.ctypes.data % 64 == 0 and moved.flags.c_contiguous
    np.testing.assert_array_equal(moved, shifted)
    assert aligned_copy(moved) is moved  # already aligned: no copy


def test_compiled_models_keep_their_constants_64_byte_aligned():
    # Kernels read weights in 64-byte vectors; NumPy's 16-byte alignment made each load span
    # two cache lines (alexnet's dense layers 10% slower).
    x = opf.var("x", shape=(1, 300))
    w = opf.const(np.ones((200, 300), "float32"))
    mod = opf.ir.IRModule.from_expr(opf.ir.Function([x], opf.op.nn.dense(x, w)))
    exe = opf.compile(mod)
    assert all(c.ctypes.data % 64 == 0 for c in exe._constants.values())


def test_copyfrom_checks_shape():
    a = nd.empty((2, 2))
    a.copyfrom(np.ones((2, 2)))
    np.testing.assert_array_equal(a.numpy(), np.ones((2, 2), "float32"))
    with pytest.raises(OpfusionError, match="shape"):
        a.copyfrom(np.ones(3))


def test_unsupported_dtype_is_an_opfusion_error():
    with pytest.raises(OpfusionError, match="dtype"):
        nd.array(np.zeros(3, dtype=np.complex64))


def test_device_names():
    assert device("cpu") == Device("cpu", 0) == cpu() == device("llvm", 0)
    assert opf.device("cpu") == opf.cpu()


@pytest.mark.parametrize("name", ["cuda", "gpu"])
def test_gpu_devices_are_not_supported_yet(name):
    with pytest.raises(DeviceError, match="not supported yet"):
        device(name)
    with pytest.raises(DeviceError):
        nd.array(np.zeros(3), device=name)


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(DeviceError, match="unknown device 'tpu'.*'cpu'"):
        device("tpu")


def test_cpu_has_one_index():
    with pytest.raises(DeviceError, match="cpu\\(1\\)"):
        device("cpu", 1)
