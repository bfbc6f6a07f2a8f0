"""What a merged group writes. FusionMerge may merge the function's result tuple (or any
tuple-valued value that leaves a group) into a group; the group still returns tensors only, as
a kernel writes tensors: the tuple is rebuilt outside the call. Each graph here has an
intermediate that is both a result and read by ops that get merged; it compiles under every
strategy and matches the reference. A producer recomputed into its consumers' groups is read
from their copies, never written."""

import numpy as np
import pytest

import opfusion as opf
from opfusion import op
from opfusion.compiler.lower_group import lower_primitive_function
from opfusion.ir import Call, Function, Tuple, TupleGetItem, post_order
from opfusion.ir.types import TensorType, TupleType
from opfusion.transform import FuseOps, FusionMerge, InferType

SHAPE = (4, 8)


def softmax_parts():
    """The fuzzer's case: the row sums are a result and the divisor of the next group."""
    x = opf.var("x", SHAPE)
    e = op.exp(x)
    s = op.sum(e, axis=[1], keepdims=True)
    return [x], Tuple([s, op.add(op.divide(e, s), opf.const(np.float32(1)))])


def nested_results():
    """A nested result tuple whose fields are read by later ops, and a graph input passed
    through to the result."""
    x, y = opf.var("x", SHAPE), opf.var("y", SHAPE)
    a = op.nn.relu(op.subtract(x, y))
    b = op.multiply(a, opf.const(np.float32(2)))
    c = op.add(b, a)
    return [x, y], Tuple([a, Tuple([b, Tuple([c, y])]), op.negative(c)])


def split_pieces():
    """A split (an op returning a tuple) whose pieces are results and read again."""
    x = opf.var("x", SHAPE)
    pieces = op.split(op.tanh(x), indices_or_sections=2, axis=1)
    first, second = TupleGetItem(pieces, 0), TupleGetItem(pieces, 1)
    return [x], Tuple([pieces, op.add(first, second), op.abs(second)])


GRAPHS = [softmax_parts, nested_results, split_pieces]


def _module(graph):
    params, body = graph()
    return opf.IRModule.from_expr(Function(params, body))


def _inputs(mod):
    rng = np.random.default_rng(0)
    return {p.name_hint: rng.standard_normal(SHAPE).astype(np.float32)
            for p in mod["main"].params}


def _flat(value):
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flat(item)]
    return [value]


@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: g.__name__)
def test_merged_groups_return_tensors_and_lower(graph):
    fused = FusionMerge()(FuseOps(fuse_opt_level=3)(InferType()(_module(graph))))
    groups = [n.op for n in post_order(fused["main"].body, into_functions=False)
              if isinstance(n, Call) and isinstance(n.op, Function)]
    assert groups
    for index, func in enumerate(groups):
        ty = func.body.checked_type
        fields = ty.fields if isinstance(ty, TupleType) else [ty]
        assert all(isinstance(field, TensorType) for field in fields), func
        lower_primitive_function(func, f"group{index}")  # no LoweringUnsupportedError


@pytest.mark.parametrize("fusion", ["tvm", "cinn", "none"])
@pytest.mark.parametrize("graph", GRAPHS, ids=lambda g: g.__name__)
def test_compiles_under_every_strategy_and_matches_the_reference(graph, fusion):
    mod = _module(graph)
    feeds = _inputs(mod)
    want = _flat(opf.ir.evaluate(mod, feeds))
    got = opf.compile(mod, fusion=fusion).run(feeds)
    assert len(got) == len(want)
    for have, expected in zip(got, want):
        np.testing.assert_allclose(have, expected, rtol=1e-5, atol=1e-6)


def test_a_recomputed_producer_is_not_written_by_its_copies():
    """Recompute copies exp into the sum's and the max's groups: each reads its own copy, so
    neither kernel writes exp to memory (each returns its reduction alone)."""
    x = opf.var("x", SHAPE)
    e = op.exp(x)
    mod = opf.IRModule.from_expr(Function([x], Tuple([op.sum(e, axis=0), op.max(e, axis=0)])))
    fused = FusionMerge()(InferType()(mod))
    bodies = [n.op.body for n in post_order(fused["main"].body, into_functions=False)
              if isinstance(n, Call) and isinstance(n.op, Function)]
    assert [b.op.name for b in bodies] == ["sum", "max"]  # a single output each
    feeds = _inputs(mod)
    for have, expected in zip(opf.compile(mod, fusion="cinn").run(feeds),
                              opf.ir.evaluate(mod, feeds)):
        np.testing.assert_allclose(have, expected, rtol=1e-5)
