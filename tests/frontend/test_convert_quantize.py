"""Quantized ONNX operators (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv): imported compositions agree with
onnx.reference exactly for integer results, and compiled models with ONNX Runtime."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_one_node import check_model  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402

rng = np.random.default_rng(5)


def one_node(op_type, inputs, consts, outputs=("y",), opset=21, out_elem=TensorProto.UNDEFINED,
             **attrs):
    """A model of one node over graph ``inputs`` then initializer ``consts`` ('' skips)."""
    names = list(inputs) + list(consts)
    node = helper.make_node(op_type, names, list(outputs), **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info(n, out_elem, None) for n in outputs],
        [numpy_helper.from_array(a, n) for n, a in consts.items() if n])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check(proto, feeds, compiled=True, oracle="reference"):
    check_model(proto, feeds, compiled=compiled, oracle=oracle)


def int8(shape, dtype=np.int8):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
def test_quantize_per_tensor_rounds_half_to_even_and_saturates(dtype):
    x = np.concatenate([rng.standard_normal(20) * 200, [0.5, 1.5, 2.5, -0.5, -1.5]]
                       ).astype(np.float32)
    scale, zero = np.array(1.0, np.float32), np.array(3, dtype)
    check(one_node("QuantizeLinear", {"x": x}, {"s": scale, "z": zero}), {"x": x})


def test_quantize_and_dequantize_per_axis_and_blocked():
    x = rng.standard_normal((2, 6, 4)).astype(np.float32) * 4
    scale = rng.uniform(0.01, 0.1, 6).astype(np.float32)
    zero = int8(6, np.uint8)
    check(one_node("QuantizeLinear", {"x": x}, {"s": scale, "z": zero}, axis=1), {"x": x})
    q = int8((2, 6, 4), np.uint8)
    check(one_node("DequantizeLinear", {"q": q}, {"s": scale, "z": zero}, axis=1), {"q": q})
    blocked_scale = rng.uniform(0.01, 0.1, (2, 3, 4)).astype(np.float32)
    blocked_zero = int8((2, 3, 4))
    qi = int8((2, 6, 4))
    check(one_node("DequantizeLinear", {"q": qi}, {"s": blocked_scale, "z": blocked_zero},
                   axis=1, block_size=2), {"q": qi})
    check(one_node("QuantizeLinear", {"x": x}, {"s": blocked_scale, "z": blocked_zero},
                   axis=1, block_size=2), {"x": x})


def test_dequantize_int32_without_zero_point():
    q = rng.integers(-(2 ** 20), 2 ** 20, (3, 5)).astype(np.int32)
    check(one_node("DequantizeLinear", {"q": q}, {"s": np.array(0.5, np.float32)}), {"q": q})


def test_dynamic_quantize_linear():
    x = rng.standard_normal((3, 7)).astype(np.float32)
    check(one_node("DynamicQuantizeLinear", {"x": x}, {}, outputs=("y", "s", "z")), {"x": x})


def test_matmul_integer_with_per_row_and_per_column_zero_points():
    a, b = int8((4, 8), np.uint8), int8((8, 5), np.uint8)
    a_zero, b_zero = int8(4, np.uint8), int8(5, np.uint8)
    # neither onnx.reference nor ONNX Runtime takes a per-row zero point: NumPy is the oracle
    proto = one_node("MatMulInteger", {"a": a, "b": b}, {"az": a_zero, "bz": b_zero})
    want = (a.astype(np.int32) - a_zero[:, None]) @ (b.astype(np.int32) - b_zero)
    mod, params = from_onnx(proto)
    np.testing.assert_array_equal(opf.ir.evaluate(mod, {"a": a, "b": b}), want)
    np.testing.assert_array_equal(opf.compile(mod, params=params).run({"a": a, "b": b})[0],
                                  want)
    check(one_node("MatMulInteger", {"a": int8((2, 4, 8)), "b": int8((8, 5))}, {}),
          {"a": int8((2, 4, 8)), "b": int8((8, 5))}, compiled=False)


def test_conv_integer_and_qlinear_conv_per_channel():
    x, w = int8((1, 3, 7, 7), np.uint8), int8((4, 3, 3, 3))
    check(one_node("ConvInteger", {"x": x}, {"w": w, "xz": np.array(128, np.uint8)},
                   pads=[1, 1, 1, 1]), {"x": x})
    consts = {"xs": np.array(0.02, np.float32), "xz": np.array(120, np.uint8), "w": w,
              "ws": rng.uniform(0.005, 0.02, 4).astype(np.float32),
              "wz": np.zeros(4, np.int8), "ys": np.array(0.05, np.float32),
              "yz": np.array(128, np.uint8),
              "b": rng.integers(-500, 500, 4).astype(np.int32)}
    proto = one_node("QLinearConv", {"x": x}, consts, strides=[2, 2], pads=[1, 1, 1, 1])
    check(proto, {"x": x})


def test_qlinear_matmul_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    a = int8((3, 16), np.uint8)
    consts = {"as": np.array(0.03, np.float32), "az": np.array(113, np.uint8),
              "b": int8((16, 8), np.uint8), "bs": np.array(0.02, np.float32),
              "bz": np.array(114, np.uint8), "ys": np.array(0.2, np.float32),
              "yz": np.array(118, np.uint8)}
    proto = one_node("QLinearMatMul", {"a": a}, consts, opset=13, out_elem=TensorProto.UINT8)
    names = ["a", "as", "az", "b", "bs", "bz", "ys", "yz"]
    proto.graph.node[0].ClearField("input")
    proto.graph.node[0].input.extend(names)
    want = ort.InferenceSession(proto.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    mod, params = from_onnx(proto)
    got = opf.compile(mod, params=params).run({"a": a})[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_then_dequantize_stays_in_float_and_matches(per_axis):
    """QDQ pairs (every activation of a QDQ model) compute the codes in float: the same
    numbers, NaN included (its code is 0), as the integer round trip."""
    x = (rng.standard_normal((2, 3, 4)) * 3).astype(np.float32)
    x[0, 0, 0] = np.nan
    scale = (rng.uniform(0.01, 0.05, 3) if per_axis else np.array(0.02)).astype(np.float32)
    zero = (rng.integers(0, 255, 3) if per_axis else np.array(128)).astype(np.uint8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zero, "z")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    mod, params = from_onnx(proto)
    names = [node.op.name for node in opf.ir.post_order(mod["main"].body)
             if isinstance(node, opf.ir.Call)]
    assert "cast" not in names  # no integer round trip left
    s_b, z_b = (scale.reshape(1, 3, 1), zero.reshape(1, 3, 1)) if per_axis else (scale, zero)
    codes = np.clip(np.round(x / s_b) + z_b.astype(np.float32), 0, 255)
    want = (np.nan_to_num(codes, nan=0.0).astype(np.uint8).astype(np.int32)
            - z_b.astype(np.int32)).astype(np.float32) * s_b
    np.testing.assert_allclose(opf.ir.evaluate(mod, {"x": x}), want, rtol=1e-6)
    np.testing.assert_allclose(opf.compile(mod, params=params).run({"x": x})[0], want,
                               rtol=1e-6)
