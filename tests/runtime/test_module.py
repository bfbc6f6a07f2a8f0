"""Calling a compiled kernel: every wrong argument is a clear KernelArgumentError, never a crash."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.errors import KernelArgumentError, OpfusionError
from opfusion.tir import expr as E
from opfusion.tir import stmt as S

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

N = 64


@pytest.fixture(scope="module")
def vecadd():
    A, B, C = (E.Buffer(name, (N,), "float32") for name in "ABC")
    i = E.Var("i")
    body = S.For(i, 0, N, S.ForKind.SERIAL,
                 S.BufferStore(C, A.load([i]) + B.load([i]), [i]))
    return opf.build(S.PrimFunc("vecadd", [A, B, C], body))


def arrays(n=N, dtype="float32"):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(n).astype(dtype) for _ in range(3)]


def test_numpy_and_nd_arrays_can_be_mixed(vecadd):
    a, b, c = arrays()
    vecadd(opf.nd.array(a), b, c)
    np.testing.assert_array_equal(c, a + b)


def test_output_written_through_zero_copy_nd_array(vecadd):
    a, b, c = arrays()
    out = opf.nd.array(c)
    vecadd(a, b, out)
    np.testing.assert_array_equal(c, a + b)
    np.testing.assert_array_equal(out.numpy(), a + b)


def test_wrong_argument_count(vecadd):
    a, b, _ = arrays()
    with pytest.raises(KernelArgumentError, match=r"takes 3 arguments \(A, B, C\) but was given 2"):
        vecadd(a, b)


def test_wrong_shape_names_the_argument(vecadd):
    a, b, _ = arrays()
    with pytest.raises(KernelArgumentError, match=r"argument 2 \('C'\): expected shape \(64,\)"):
        vecadd(a, b, np.zeros(N + 1, "float32"))
    with pytest.raises(KernelArgumentError, match="argument 0"):
        vecadd(np.zeros((8, 8), "float32"), b, np.zeros(N, "float32"))


def test_wrong_dtype_names_the_argument(vecadd):
    a, b, c = arrays()
    with pytest.raises(KernelArgumentError, match=r"argument 1 \('B'\): expected dtype float32, "
                                                   r"got float64"):
        vecadd(a, b.astype("float64"), c)


def test_non_contiguous_argument(vecadd):
    a, b, c = arrays()
    strided = np.zeros(2 * N, "float32")[::2]
    with pytest.raises(KernelArgumentError, match="not C-contiguous"):
        vecadd(a, b, strided)
    assert not strided.any()


def test_read_only_output(vecadd):
    a, b, c = arrays()
    c.flags.writeable = False
    with pytest.raises(KernelArgumentError, match="read-only"):
        vecadd(a, b, c)


def test_read_only_inputs_are_fine(vecadd):
    a, b, c = arrays()
    a.flags.writeable = False
    vecadd(a, b, c)
    np.testing.assert_array_equal(c, a + b)


def test_output_aliasing_an_input_is_refused(vecadd):
    a, b, _ = arrays()
    with pytest.raises(KernelArgumentError, match="shares memory"):
        vecadd(a, b, a)


def test_non_array_argument(vecadd):
    a, b, _ = arrays()
    with pytest.raises(KernelArgumentError, match="expected an opf.nd.array or numpy.ndarray"):
        vecadd(a, b, [0.0] * N)


def test_module_shows_source_and_names(vecadd):
    assert vecadd.name == "vecadd" and vecadd.entry_name == "vecadd"
    assert "int32_t vecadd(const float* restrict A" in vecadd.get_source()
    assert vecadd["vecadd"] is vecadd
    with pytest.raises(OpfusionError, match="no function"):
        vecadd.get_function("other")
    assert "vecadd(A: float32[64]" in repr(vecadd)
