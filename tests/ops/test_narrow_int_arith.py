"""Arithmetic on 8- and 16-bit integers wraps after every operation, in compiled kernels as in
the reference (NumPy) and the loop-IR interpreter. C promotes such operands to int and kept
the wide result, so a division after a product saw the unwrapped product (fuzz cases 2303
seed 0, 4346 and 4893 seed 1: Cast to uint8, then Pow and Div)."""

import numpy as np
import pytest

import opfusion as opf
from opfusion import te
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule
from opfusion.ir.types import cast_array
from opfusion.tir import interp
from opfusion.topi.testing import call_over_arrays

NARROW = ["uint8", "int8", "uint16", "int16"]


def operands(dtype: str, size: int = 48) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values spread over the whole range of ``dtype``, and a divisor without zeros."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(5)
    a = rng.integers(info.min, info.max, size, endpoint=True).astype(dtype)
    b = rng.integers(info.min, info.max, size, endpoint=True).astype(dtype)
    a[:4] = [info.max, info.max, info.min, info.min]
    b[:4] = [info.max, 2, info.max, info.min]
    c = rng.integers(1, 7, size).astype(dtype)
    return a, b, c


def both(builder, *arrays):
    call, params, values = call_over_arrays(builder, arrays, {})
    mod = IRModule.from_expr(Function(params, call))
    feeds = {p.name_hint: v for p, v in zip(params, values)}
    return evaluate(mod, feeds), opf.compile(mod).run(feeds)[0]


CHAINS = {
    "product then quotient": (lambda x, y, z: opf.op.divide(opf.op.multiply(x, y), z),
                              lambda a, b, c: _trunc_div(a * b, c)),
    "sum then floor quotient": (lambda x, y, z: opf.op.floor_divide(opf.op.add(x, y), z),
                                lambda a, b, c: (a + b) // c),
    "difference then remainder": (lambda x, y, z: opf.op.mod(opf.op.subtract(x, y), z),
                                  lambda a, b, c: (a - b) % c),
    "product compared": (lambda x, y, z: opf.op.less(opf.op.multiply(x, y), z),
                         lambda a, b, c: (a * b) < c),
    "square then maximum": (lambda x, y, z: opf.op.maximum(opf.op.multiply(x, x), y),
                            lambda a, b, c: np.maximum(a * a, b)),
}


def _trunc_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.abs(a.astype(np.int64)) // np.abs(b.astype(np.int64))
    return np.where((a < 0) != (b < 0), -q, q).astype(a.dtype)


@pytest.mark.parametrize("dtype", NARROW)
@pytest.mark.parametrize("chain", list(CHAINS))
def test_chained_narrow_arithmetic_wraps_in_both_engines(dtype, chain):
    builder, numpy_fn = CHAINS[chain]
    a, b, c = operands(dtype)
    with np.errstate(over="ignore"):
        want = numpy_fn(a, b, c)
    reference, compiled = both(builder, a, b, c)
    np.testing.assert_array_equal(reference, want)
    np.testing.assert_array_equal(compiled, want)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int8"])
def test_cast_to_narrow_then_power_then_divide(dtype):
    # The fuzz cases' chain: a float cast to a narrow dtype, squared, divided.
    x = np.array([9.7, 17.2, 200.9, 3.1, 255.0, 81.0, 16.0, 1.0], np.float32)

    def chain(v, e, d):
        narrow = opf.op.cast(v, dtype=dtype)
        return opf.op.divide(opf.op.power(narrow, e), d)

    e = np.full(8, 2, dtype)
    d = np.array([3, 5, 7, 1, 2, 9, 4, 6], dtype)
    reference, compiled = both(chain, x, e, d)
    with np.errstate(over="ignore"):
        squared = cast_array(x, dtype) * cast_array(x, dtype)  # 200.9 -> int8 is 127
    np.testing.assert_array_equal(reference, _trunc_div(squared, d))
    np.testing.assert_array_equal(compiled, reference)


@pytest.mark.parametrize("dtype", NARROW)
def test_interpreter_wraps_each_narrow_operation(dtype):
    a, b, c = operands(dtype, 16)
    A, B, C = (te.placeholder((16,), dtype, name=n) for n in "ABC")
    D = te.compute((16,), lambda i: (A[i] * B[i]) // C[i], name="D")
    func = opf.lower(te.create_schedule(D.op), [A, B, C, D])
    out = np.zeros(16, dtype)
    interp.run(func, a, b, c, out)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, (a * b) // c)
