"""FuseOps and FusionMerge build fused functions with one builder, so they agree on which
constants stay inline: a scalar always (lowering makes it a literal in the kernel), any other
constant only with FuseOps.link_params (else it is a parameter of every group reading it)."""

import numpy as np
import pytest

import opfusion as opf
from opfusion import op
from opfusion.ir import Call, Constant, Function, evaluate, post_order
from opfusion.testing import assert_close
from opfusion.transform import FuseOps, FusionMerge, InferType, PassContext

FUSE = {"FuseOps": lambda mod: FuseOps()(mod),
        "FusionMerge": lambda mod: FusionMerge()(FuseOps()(mod))}


def shared_constant(value):
    """One constant read by two groups (each ending in a reduction)."""
    x = opf.var("x", (4, 8))
    c = opf.const(value)
    body = opf.Tuple([op.sum(op.multiply(x, c), axis=[1]), op.sum(op.add(x, c), axis=[1])])
    return opf.IRModule.from_expr(opf.Function([x], body))


def primitives(mod):
    return [n.op for n in post_order(mod["main"].body, into_functions=False)
            if isinstance(n, Call) and isinstance(n.op, Function)]


def inline_constants(func):
    return [n for n in post_order(func.body) if isinstance(n, Constant)]


def check_numbers(mod, fused):
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    for got, want in zip(evaluate(fused, [x]), evaluate(mod, [x])):
        assert_close(got, want)


@pytest.mark.parametrize("name", FUSE)
def test_a_scalar_constant_stays_inline_in_every_group_reading_it(name):
    mod = InferType()(shared_constant(np.float32(0.5)))
    fused = FUSE[name](mod)
    groups = primitives(fused)
    assert len(groups) == 2
    for func in groups:
        assert [p.checked_type.shape for p in func.params] == [(4, 8)]
        assert [c.data.item() for c in inline_constants(func)] == [0.5]
    check_numbers(mod, fused)


@pytest.mark.parametrize("link_params", [False, True])
@pytest.mark.parametrize("name", FUSE)
def test_a_tensor_constant_is_a_parameter_unless_link_params(name, link_params):
    mod = InferType()(shared_constant(np.arange(8, dtype=np.float32)))
    with PassContext(config={"FuseOps.link_params": link_params}):
        fused = FUSE[name](mod)
    groups = primitives(fused)
    assert len(groups) == 2
    for func in groups:
        assert len(func.params) == (1 if link_params else 2)
        assert len(inline_constants(func)) == (1 if link_params else 0)
    check_numbers(mod, fused)
