"""NarrowGroupOutputs (opfusion.transform.narrow_group_outputs): a fused group whose result is
dequantized codes writes the codes as bytes, and the groups that read it dequantize them
where they read it. The module's values are the same to the bit, NaN and infinities included;
readers
that would widen the bytes badly (pools, layout transforms) and model outputs keep floats."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.compiler.compile import fused_module
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Call, Function
from opfusion.ir.visitor import post_order
from opfusion.target import host_target
from opfusion.transform.fold_constant import BindParams

rng = np.random.default_rng(5)


def residual_block(channels=32, size=10, shortcut="uint8", reader="add", output=False,
                   pool=None):
    """x -> QuantizeLinear -> DequantizeLinear -> two 1x1 convolutions (int8 weights per
    channel), each quantized and dequantized (the shortcut's codes ``shortcut``), summed
    (``reader="add"``) or the shortcut pooled into the sum (``"pool"``: ``pool`` the
    pooling node's op and attributes, a 3x3 max pool by default), Relu, quantized
    and dequantized: ResNet's block with a projection shortcut, as ONNX Runtime's
    quantize_static writes it. ``output``: the shortcut's dequantized value is an output too."""
    from onnx import TensorProto, helper, numpy_helper

    inits = []

    def scalar(name, value, dtype):
        inits.append(numpy_helper.from_array(np.array(value, dtype), name))

    def weight(name):
        q = rng.integers(-127, 128, (channels, channels, 1, 1)).astype(np.int8)
        inits.extend([numpy_helper.from_array(q, f"{name}q"),
                      numpy_helper.from_array(rng.uniform(0.002, 0.02, channels).astype(
                          np.float32), f"{name}s"),
                      numpy_helper.from_array(np.zeros(channels, np.int8), f"{name}z"),
                      numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32),
                                              f"{name}b")])
        return helper.make_node("DequantizeLinear", [f"{name}q", f"{name}s", f"{name}z"],
                                [f"{name}w"], axis=0)

    def qdq(src, dst, scale, point, dtype):
        scalar(f"{dst}_s", scale, np.float32)
        scalar(f"{dst}_z", point, dtype)
        return [helper.make_node("QuantizeLinear", [src, f"{dst}_s", f"{dst}_z"], [f"{dst}q"]),
                helper.make_node("DequantizeLinear", [f"{dst}q", f"{dst}_s", f"{dst}_z"], [dst])]

    nodes = qdq("x", "xd", 0.05, 7, np.uint8)
    nodes += [weight("a"), helper.make_node("Conv", ["xd", "aw", "ab"], ["a"])]
    nodes += qdq("a", "ad", 0.06, 120, np.uint8)
    nodes += [weight("s"), helper.make_node("Conv", ["xd", "sw", "sb"], ["s"])]
    nodes += qdq("s", "sd", 0.07, -5 if shortcut == "int8" else 127, np.dtype(shortcut))
    if reader == "pool":
        op, attrs = pool or ("MaxPool", {"kernel_shape": [3, 3], "pads": [1] * 4})
        nodes.append(helper.make_node(op, ["sd"], ["sp"], **attrs))
    nodes += [helper.make_node("Add", ["ad", "sp" if reader == "pool" else "sd"], ["sum"]),
              helper.make_node("Relu", ["sum"], ["r"])]
    nodes += qdq("r", "y", 0.04, 0, np.uint8)
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if output:
        outputs.append(helper.make_tensor_value_info("sd", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, channels, size, size])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def imported(model):
    from opfusion.frontend import from_onnx

    mod, params = from_onnx(model)
    return BindParams(params)(mod)


def fused(mod, disabled=()):
    with opf.transform.PassContext(opt_level=3, disabled_pass=list(disabled)):
        return fused_module(mod, None, host_target())


def groups(mod):
    return [n for n in post_order(mod["main"].body, into_functions=False)
            if isinstance(n, Call) and isinstance(n.op, Function)]


def narrow_results(mod):
    """The dtypes of the groups' 8-bit results that another group reads as a parameter it
    casts to float32 (or max-pools) first."""
    found = []
    for call in groups(mod):
        for arg, param in zip(call.args, call.op.params):
            if not (isinstance(arg, Call) and isinstance(arg.op, Function)):
                continue
            readers = [n for n in post_order(call.op.body) if isinstance(n, Call)
                       and n.args and n.args[0] is param]
            if arg.checked_type.dtype in ("uint8", "int8") and readers and all(
                    (n.op.name == "cast" and n.attrs.dtype == "float32")
                    or n.op.name == "nn.max_pool2d" for n in readers):
                found.append(arg.checked_type.dtype)
    return found


def inputs(channels=32, size=10):
    x = rng.standard_normal((1, channels, size, size)).astype(np.float32) * 3
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, -1e9]
    return x


def compiled(mod, disabled=()):
    with opf.transform.PassContext(opt_level=3, disabled_pass=list(disabled)):
        return opf.compile(mod)


@pytest.mark.parametrize("shortcut", ["uint8", "int8"])
def test_a_shortcut_that_ends_in_a_dequantize_writes_its_codes(shortcut):
    mod = imported(residual_block(shortcut=shortcut))
    new = fused(mod)
    # the shortcut's group returns its codes; the block's last group dequantizes them
    assert shortcut in narrow_results(new)
    assert not narrow_results(fused(mod, disabled=["NarrowGroupOutputs"]))
    x = inputs()
    want = evaluate(mod, [x])
    # the same values to the bit: in the fused module's reference and compiled
    np.testing.assert_array_equal(evaluate(new, [x]), evaluate(fused(
        mod, disabled=["NarrowGroupOutputs"]), [x]))
    # compiled, within the float rounding of the reference (the C compiler contracts a
    # product and the residual add into one FMA, narrowed or not; a code may flip)
    scale = float(np.abs(want).max())
    for got in (compiled(mod)(x), compiled(mod, disabled=["NarrowGroupOutputs"])(x)):
        np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * scale)
        assert np.mean(got != want) < 0.02


@pytest.mark.parametrize("shortcut", ["uint8", "int8"])
def test_a_max_pool_of_narrowed_codes_pools_the_bytes(shortcut):
    """max_pool(dequantize(c)) = dequantize(max_pool(c)): the dequantize is non-decreasing,
    and every window of the pool holds an input value, so the bytes' padding (their lowest
    value) never wins where -inf did."""
    mod = imported(residual_block(reader="pool", shortcut=shortcut))
    new = fused(mod)
    assert shortcut in narrow_results(new)
    pools = [n for call in groups(new) for n in post_order(call.op.body)
             if isinstance(n, Call) and n.op.name == "nn.max_pool2d"]
    assert [p.args[0].checked_type.dtype for p in pools] == [shortcut]
    x = inputs()
    np.testing.assert_array_equal(evaluate(new, [x]), evaluate(fused(
        mod, disabled=["NarrowGroupOutputs"]), [x]))
    want = evaluate(mod, [x])
    got = compiled(mod)(x)
    np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))
    assert np.mean(got != want) < 0.02


@pytest.mark.parametrize("pool", [
    ("AveragePool", {"kernel_shape": [3, 3], "pads": [1] * 4}),
    ("MaxPool", {"kernel_shape": [3, 3], "dilations": [2, 2], "pads": [2] * 4}),  # taps on pads
    ("MaxPool", {"kernel_shape": [3, 3], "pads": [1] * 4, "ceil_mode": 1}),  # may overhang
], ids=["average", "dilated", "ceil_mode"])
def test_codes_read_by_other_pools_stay_float(pool):
    """An average pool reads each value at every tap of its window, and a max pool whose
    windows may hold padding alone must see -inf there: the shortcut's floats stay."""
    mod = imported(residual_block(reader="pool", pool=pool))
    assert not narrow_results(fused(mod))


def test_codes_given_out_stay_float():
    """Floats that are a model output stay floats."""
    mod = imported(residual_block(output=True))
    assert not narrow_results(fused(mod))
    x = inputs()
    for got, want in zip(compiled(mod)(x), evaluate(mod, [x]), strict=True):
        # (a code may flip where the C compiler contracts a product and an add)
        np.testing.assert_allclose(got, want, rtol=0, atol=0.02 * float(np.abs(want).max()))
        assert np.mean(got != want) < 0.02


def test_a_dequantize_of_a_parameter_stays_where_it_is():
    """A group that only dequantizes its input has nothing to narrow: its codes come in."""
    from opfusion.transform.narrow_group_outputs import NarrowGroupOutputs

    new = fused(imported(residual_block()))
    with opf.transform.PassContext(opt_level=3):
        again = NarrowGroupOutputs()(new)
    assert [c.checked_type for c in groups(again)] == [c.checked_type for c in groups(new)]
