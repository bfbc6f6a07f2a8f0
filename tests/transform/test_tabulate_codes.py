"""TabulateCodes and nn.code_lookup: costly functions of quantized codes read from tables.

The tables hold the reference's own numbers, so a compiled model with them matches the
reference interpreter exactly; the lookup's index is clamped into the table whatever the
codes (NaN reads the first entry), in the reference and compiled (a vector gather on the
host, AVX2 and SSE)."""

import numpy as np
import pytest
from int8_helpers import AVX2, SSE, module, runs_here

import opfusion as opf
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Call, Constant
from opfusion.ir.op import get_op
from opfusion.transform import PassContext, TabulateCodes


def const(value):
    return opf.const(np.float32(value))


def quantize(x, scale, point, low=0.0, high=255.0):
    """QuantizeLinear before its cast, as the import keeps it."""
    return opf.op.clip(opf.op.add(opf.op.round(opf.op.divide(x, const(scale))), const(point)),
                       a_min=low, a_max=high)


def dequantize(codes, scale, point):
    kept = opf.op.where(opf.op.isnan(codes), const(0), codes)
    return opf.op.multiply(opf.op.subtract(kept, const(point)), const(scale))


def qdq(x, scale, point):
    return dequantize(quantize(x, scale, point), scale, point)


def gelu_erf(x):
    """BERT's GELU with a quantize/dequantize pair after every step (quantize_static's)."""
    d = qdq(opf.op.divide(x, const(1.4142135)), 0.02, 120)
    e = qdq(opf.op.erf(d), 0.0078, 128)
    one = qdq(opf.op.add(e, const(1)), 0.0079, 0)
    return qdq(opf.op.multiply(qdq(opf.op.multiply(x, one), 0.03, 10), const(0.5)), 0.015, 10)


def gelu_tanh(x):
    """GPT's GELU (the tanh form) likewise."""
    cube = qdq(opf.op.power(x, const(3)), 1.3, 170)
    inner = qdq(opf.op.add(x, qdq(opf.op.multiply(cube, const(0.044715)), 0.06, 170)), 0.1, 158)
    t = qdq(opf.op.tanh(qdq(opf.op.multiply(inner, const(0.7978846)), 0.08, 158)), 0.0078, 128)
    one = qdq(opf.op.add(t, const(1)), 0.0078, 0)
    return qdq(opf.op.multiply(qdq(opf.op.multiply(x, const(0.5)), 0.02, 142), one), 0.0196, 9)


def feed(shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 3
    x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, -0.0, 1e30, -1e30]
    return x


def lookups(mod):
    return [n for n in opf.ir.post_order(mod["main"].body)
            if isinstance(n, Call) and getattr(n.op, "name", "") == "nn.code_lookup"]


@pytest.mark.parametrize("gelu", [gelu_erf, gelu_tanh], ids=["erf", "tanh"])
def test_a_quantized_gelu_becomes_one_lookup_with_the_references_numbers(gelu):
    x = opf.var("x", shape=(4, 96))
    mod = module(quantize(gelu(dequantize(quantize(x, 0.04, 142), 0.04, 142)), 0.0196, 9))
    new = TabulateCodes()(mod)
    (lookup,) = lookups(new)
    names = {n.op.name for n in opf.ir.post_order(new["main"].body) if isinstance(n, Call)}
    assert not names & {"erf", "tanh", "power"}  # the whole chain is in the table
    assert lookup.args[1].data.shape == (257,) and lookup.attrs["low"] == 0
    x_value = feed((4, 96))
    want = evaluate(mod, [x_value])
    np.testing.assert_array_equal(evaluate(new, [x_value]), want)
    exe = opf.compile(mod)
    assert "opf_gather_float32x" in exe.source()  # the lookup's vector loop gathers
    np.testing.assert_array_equal(exe(x_value), want)
    with PassContext(disabled_pass=["TabulateCodes"]):
        untabulated = opf.compile(mod)
    assert "gather" not in untabulated.source()
    np.testing.assert_allclose(untabulated(x_value), want, atol=0.02 * np.abs(want).max())


def test_codes_of_int8_and_several_results_of_one_chain():
    """Signed codes (low -128); two results of one chain read by other operators, each its
    own table of the same codes."""
    x, y = opf.var("x", shape=(2, 64)), opf.var("y", shape=(2, 64))
    codes = quantize(x, 0.05, 3, -128.0, 127.0)
    value = dequantize(codes, 0.05, 3)
    first = opf.op.exp(opf.op.divide(value, const(3.0)))
    second = opf.op.tanh(opf.op.multiply(first, const(0.25)))
    mod = module(opf.ir.Tuple([opf.op.add(first, y), opf.op.multiply(second, y)]))
    new = TabulateCodes()(mod)
    found = lookups(new)
    assert len(found) == 2 and {f.attrs["low"] for f in found} == {-128}
    inputs = [feed((2, 64)), feed((2, 64), seed=1)]
    want = evaluate(mod, inputs)
    for got in (evaluate(new, inputs), opf.compile(mod)(*inputs)):
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)


def test_cheap_or_mixed_chains_are_not_tabulated():
    x, y = opf.var("x", shape=(2, 32)), opf.var("y", shape=(2, 32))
    codes = quantize(x, 0.05, 128)
    # a requantization costs less than the lookup
    _untouched(module(quantize(dequantize(codes, 0.05, 128), 0.1, 100)))
    # a second computed operand (a residual) is not a function of the codes alone
    _untouched(module(opf.op.exp(opf.op.add(dequantize(codes, 0.05, 128), y))))
    # values that are not whole (no round) are not codes
    _untouched(module(opf.op.erf(opf.op.clip(x, a_min=0.0, a_max=255.0))))
    # a range wider than 256 codes
    _untouched(module(opf.op.erf(quantize(x, 0.05, 0, -1000.0, 1000.0))))


def _untouched(mod):
    new = TabulateCodes()(mod)
    assert not lookups(new)


def _lookup_module(shape, table, low):
    codes = opf.var("c", shape=shape)
    return module(Call(get_op("nn.code_lookup"), [codes, Constant(table)], {"low": low}))


@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_a_lookup_clamps_its_index_into_the_table(dtype):
    """NaN reads entry 0; code low + j entry 1 + j; anything else a clamped entry, the
    same in the reference and in the compiled vector gathers of every target here."""
    table = (np.arange(12) * 7 - 20).astype(dtype)
    mod = _lookup_module((3, 32), table, -3)
    codes = np.random.default_rng(0).integers(-10, 15, (3, 32)).astype(np.float32)
    codes.reshape(-1)[:8] = [np.nan, np.inf, -np.inf, -3, 7, 2.5, 3e9, -0.0]
    want = evaluate(mod, [codes])
    assert want.reshape(-1)[0] == table[0] and want.reshape(-1)[3] == table[1]
    assert want.reshape(-1)[4] == table[11] and want.reshape(-1)[1] == table[11]
    assert want.reshape(-1)[2] == table[0] and want.reshape(-1)[7] == table[4]
    for target in (None, AVX2, SSE):
        if target is None or runs_here(target):
            exe = opf.compile(mod, target=target)
            np.testing.assert_array_equal(exe(codes), want)


def test_a_lookup_needs_float_codes_and_a_flat_table():
    with pytest.raises(opf.OpfusionTypeError, match="float32"):
        module(Call(get_op("nn.code_lookup"), [opf.var("c", shape=(4,), dtype="int32"),
                                               Constant(np.zeros(3, np.float32))], {"low": 0}))
    with pytest.raises(opf.OpfusionTypeError, match="1-D"):
        _lookup_module((4,), np.zeros((2, 3), np.float32), 0)
    with pytest.raises(opf.OpfusionTypeError, match="float32 or int32"):
        _lookup_module((4,), np.zeros(3, np.float64), 0)
