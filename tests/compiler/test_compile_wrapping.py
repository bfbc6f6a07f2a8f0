"""Integer arithmetic that overflows wraps, as NumPy's (the reference's) does, fused or not:
the C computes sums, differences and products of values read from memory in unsigned types
(signed overflow is undefined in C, and GCC assumed it away), and the loop-IR simplifier
decides nothing on such values as if they were exact integers (fuzzing, seed 63008: a fused
``a * 2147483647`` then a truncated division took the quotient's sign from ``a``)."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")


def _chain(x):
    """mod and truncated division of a product that wraps, compared and selected."""
    o = opf.op
    big = opf.const(np.int32(2147483647))
    product = o.multiply(x, big)
    quotient = o.divide(product, opf.const(np.int32(-2)))
    remainder = o.subtract(product, o.multiply(o.divide(product, opf.const(np.int32(5))),
                                               opf.const(np.int32(5))))
    clipped = o.clip(o.abs(quotient), a_min=1.0, a_max=4.0)
    return o.cast(o.where(o.not_equal(remainder, clipped), remainder, clipped),
                  dtype="float32")


@pytest.mark.parametrize("fusion", ["tvm", "none"])
def test_a_wrapping_product_computes_the_reference_fused_or_not(fusion):
    x = opf.var("x", shape=(4, 16), dtype="int32")
    mod = opf.IRModule.from_expr(opf.Function([x], _chain(x)))
    data = np.random.default_rng(0).integers(-60, 60, size=(4, 16)).astype(np.int32)
    got = np.asarray(opf.compile(mod, fusion=fusion)(data))
    want = np.asarray(opf.ir.evaluate(mod, [data]))
    np.testing.assert_array_equal(got, want)
    # the products wrap: a plain int64 evaluation would give other numbers
    assert not np.array_equal(want, _chain_int64(data))


def _chain_int64(data):
    product = data.astype(np.int64) * 2147483647
    quotient = np.trunc(product / -2).astype(np.int64)
    remainder = product - np.trunc(product / 5).astype(np.int64) * 5
    clipped = np.clip(np.abs(quotient), 1, 4)
    return np.where(remainder != clipped, remainder, clipped).astype(np.float32)
