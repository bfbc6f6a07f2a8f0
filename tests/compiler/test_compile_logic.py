"""Boolean logic on float comparisons, compiled, in loop nests of every shape the default
schedule leaves nested: GCC 12.2 with ``-fno-trapping-math`` vectorized
``(float)(a > 0 && !(b > 0))`` over a 2 x 5 x 6 nest into code that got 3 of 60 elements
wrong (see ``opfusion.backend.cpu.toolchain.BASE_FLAGS``)."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.ir.expr import Expr, Var

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

SHAPES = [(2, 5, 6), (4, 4, 4), (1, 4, 16), (3, 7), (2, 3, 5, 9), (1, 64, 7, 7, 8)]


def _logic(x: Var, y: Var) -> Expr:
    """((x > 0) & ~(y > 0)) | (x < -1), as a float tensor."""
    zero, minus_one = opf.const(np.float32(0)), opf.const(np.float32(-1))
    o = opf.op
    return o.cast(o.logical_or(o.logical_and(o.greater(x, zero), o.logical_not(o.greater(y, zero))),
                               o.less(x, minus_one)), dtype="float32")


@pytest.mark.parametrize("shape", SHAPES)
def test_compiled_logic_matches_numpy_in_nested_loops(shape):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    x, y = opf.var("x", shape=shape), opf.var("y", shape=shape)
    mod = opf.IRModule.from_expr(opf.Function([x, y], _logic(x, y)))
    got = np.asarray(opf.compile(mod)(a, b))
    want = (((a > 0) & ~(b > 0)) | (a < -1)).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.asarray(opf.ir.evaluate(mod, [a, b])), want)
