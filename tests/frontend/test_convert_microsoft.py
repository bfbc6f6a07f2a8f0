"""ONNX Runtime's quantized contrib operators (domain com.microsoft: QLinearAdd, QLinearMul,
QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearGlobalAveragePool, QLinearAveragePool,
QLinearConcat, QLinearWhere, QGemm and the domain's QuantizeLinear and DequantizeLinear) import
as dequantize, float operator, quantize. Their codes are ONNX Runtime's to within one (it
computes some with fixed-point arithmetic or tables), the compiled ones the reference
interpreter's to within one (the float functions' last bits), and a model that ONNX Runtime's
tool quantized in its QOperator format runs as ONNX Runtime runs it."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import OnnxImportError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402

rng = np.random.default_rng(17)
MS = "com.microsoft"


def codes(shape, dtype="uint8"):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def scalar(value, dtype="float32"):
    return np.array(value, dtype)


def contrib_model(op_type, inputs, names, consts, out=None, **attrs):
    """A model of one com.microsoft node over graph ``inputs`` (name -> array) reading
    ``names`` in order ('' leaves one out), the rest initializers ``consts``; its output of
    type ``out`` (default: the last graph input's)."""
    node = helper.make_node(op_type, names, ["y"], domain=MS, **attrs)
    out = np.dtype(out or list(inputs.values())[-1].dtype)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(out), None)],
        [numpy_helper.from_array(a, n) for n, a in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(MS, 1)])


def onnxruntime_output(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def assert_codes_within_one(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max(initial=0) <= 1


def check(model, feeds):
    """The model's import against ONNX Runtime, and compiled against the reference."""
    want = onnxruntime_output(model, feeds)
    mod, params = from_onnx(model)
    reference = opf.ir.evaluate(mod, feeds)
    got = opf.compile(mod, params=params).run(feeds)[0]
    if want.dtype.kind == "f":
        assert_close(reference, want, rtol=1e-5)
        assert_close(got, reference, rtol=1e-5)
    else:
        assert_codes_within_one(reference, want)
        assert_codes_within_one(got, reference)
    return reference


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("b_shape", [(2, 8, 5, 5), (8, 1, 1), ()], ids=str)
def test_binary_operators(op_type, dtype, b_shape):
    a, b = codes((2, 8, 5, 5), dtype), codes(b_shape, dtype)
    consts = {"sa": scalar(0.05), "za": scalar(3, dtype), "sb": scalar(0.02),
              "zb": scalar(-2 if dtype == "int8" else 200, dtype), "sc": scalar(0.07),
              "zc": scalar(7, dtype)}
    model = contrib_model(op_type, {"a": a, "b": b}, ["a", "sa", "za", "b", "sb", "zb", "sc",
                                                     "zc"], consts, out=dtype)
    check(model, {"a": a, "b": b})


def test_binary_operators_without_zero_points():
    """Absent zero points are zeros of the inputs' type (ONNX Runtime refuses the form, so
    the oracle is the node with explicit zeros)."""
    a, b = codes((3, 16)), codes((3, 16))
    consts = {"sa": scalar(0.05), "sb": scalar(0.02), "sc": scalar(0.1), "z": scalar(0, "uint8")}
    without = contrib_model("QLinearAdd", {"a": a, "b": b},
                            ["a", "sa", "", "b", "sb", "", "sc", "z"], consts)
    explicit = contrib_model("QLinearAdd", {"a": a, "b": b},
                             ["a", "sa", "z", "b", "sb", "z", "sc", "z"], consts)
    mod, _ = from_onnx(without)
    np.testing.assert_array_equal(opf.ir.evaluate(mod, {"a": a, "b": b}),
                                  check(explicit, {"a": a, "b": b}))


@pytest.mark.parametrize("op_type,attrs", [("QLinearSigmoid", {}),
                                           ("QLinearLeakyRelu", {"alpha": 0.1})], ids=str)
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_activations(op_type, attrs, dtype):
    x = codes((4, 64), dtype)
    consts = {"sx": scalar(0.06), "zx": scalar(100 if dtype == "uint8" else 5, dtype),
              "sy": scalar(0.004), "zy": scalar(0 if dtype == "uint8" else -128, dtype)}
    check(contrib_model(op_type, {"x": x}, ["x", "sx", "zx", "sy", "zy"], consts, **attrs),
          {"x": x})


@pytest.mark.parametrize("version,axis", [(13, -1), (13, 1), (11, 1), (11, None)], ids=str)
def test_softmax_along_an_axis_or_coerced_to_two_dimensions(version, axis):
    x = codes((2, 3, 10))
    attrs = {"opset": version} | ({} if axis is None else {"axis": axis})
    consts = {"sx": scalar(0.1), "zx": scalar(128, "uint8"), "sy": scalar(1 / 256),
              "zy": scalar(0, "uint8")}
    check(contrib_model("QLinearSoftmax", {"x": x}, ["x", "sx", "zx", "sy", "zy"], consts,
                        **attrs), {"x": x})


@pytest.mark.parametrize("channels_last", [0, 1])
def test_global_average_pool(channels_last):
    x = codes((1, 7, 7, 24) if channels_last else (1, 24, 7, 7))
    consts = {"sx": scalar(0.05), "zx": scalar(20, "uint8"), "sy": scalar(0.03),
              "zy": scalar(9, "uint8")}
    got = check(contrib_model("QLinearGlobalAveragePool", {"x": x},
                              ["x", "sx", "zx", "sy", "zy"], consts,
                              channels_last=channels_last), {"x": x})
    assert got.shape == ((1, 1, 1, 24) if channels_last else (1, 24, 1, 1))


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
    {"kernel_shape": [3, 3], "channels_last": 1},
], ids=str)
def test_average_pool(attrs):
    shape = (1, 9, 9, 8) if attrs.get("channels_last") else (1, 8, 9, 9)
    x = codes(shape, "int8")
    consts = {"sx": scalar(0.05), "zx": scalar(-3, "int8"), "sy": scalar(0.04),
              "zy": scalar(2, "int8")}
    check(contrib_model("QLinearAveragePool", {"x": x}, ["x", "sx", "zx", "sy", "zy"], consts,
                        **attrs), {"x": x})


def test_concat_requantizes_each_part_unless_it_has_the_outputs_quantization():
    parts = {"a": codes((1, 4, 3, 3)), "b": codes((1, 8, 3, 3)), "c": codes((1, 2, 3, 3)),
             "d": codes((1, 3, 3, 3))}
    consts = {"sy": scalar(0.05), "zy": scalar(10, "uint8")}
    names = ["sy", "zy"]
    for i, name in enumerate(parts):
        scale, point = (0.05, 10) if name == "d" else (0.02 * (i + 1), 30 * i)
        consts |= {f"s{name}": scalar(scale), f"z{name}": scalar(point, "uint8")}
        names += [name, f"s{name}", f"z{name}"]
    model = contrib_model("QLinearConcat", parts, names, consts, axis=1)
    check(model, parts)
    mod, _ = from_onnx(model)
    # the bytes of d are concatenated as they are: quantize(dequantize(d)) is d
    joined = mod["main"].body.args[0]
    assert joined.fields[3] is mod["main"].params[3]
    assert all(field.checked_type.dtype == "uint8" for field in joined.fields)


def test_where_chooses_between_requantized_values():
    cond = rng.random((4, 6)) < 0.5
    feeds = {"c": cond, "t": codes((4, 6), "int8"), "f": codes((6,), "int8")}
    consts = {"st": scalar(0.1), "zt": scalar(1, "int8"), "sf": scalar(0.2),
              "zf": scalar(-1, "int8"), "sz": scalar(0.15), "zz": scalar(0, "int8")}
    model = contrib_model("QLinearWhere", feeds,
                          ["c", "t", "st", "zt", "f", "sf", "zf", "sz", "zz"], consts)
    check(model, feeds)


@pytest.mark.parametrize("requantized", [True, False])
@pytest.mark.parametrize("trans_b,per_column,alpha", [(1, True, 1.0), (0, False, 0.5)],
                         ids=str)
def test_qgemm_is_an_exact_product_requantized_or_scaled(requantized, trans_b, per_column,
                                                        alpha):
    a = codes((5, 40))
    weight = codes((24, 40) if trans_b else (40, 24), "int8")
    columns = 24 if per_column else 1
    b_scale = rng.uniform(0.001, 0.01, columns).astype(np.float32).reshape(
        (columns,) if per_column else ())
    b_zero = np.zeros(b_scale.shape, "int8")
    consts = {"sa": scalar(0.04), "za": scalar(120, "uint8"), "w": weight, "sb": b_scale,
              "zb": b_zero, "bias": rng.integers(-5000, 5000, 24).astype(np.int32)}
    names = ["a", "sa", "za", "w", "sb", "zb", "bias"]
    if requantized:
        consts |= {"sy": scalar(0.05), "zy": scalar(128, "uint8")}
        names += ["sy", "zy"]
    model = contrib_model("QGemm", {"a": a}, names, consts, out=None if requantized else "float32",
                          transB=trans_b, alpha=alpha)
    check(model, {"a": a})


def test_the_domains_quantize_and_dequantize_steps():
    x = rng.standard_normal((3, 8)).astype(np.float32) * 3
    q = contrib_model("QuantizeLinear", {"x": x}, ["x", "s", "z"],
                      {"s": scalar(0.05), "z": scalar(-4, "int8")}, out="int8")
    check(q, {"x": x})
    c = codes((3, 8), "int8")
    d = contrib_model("DequantizeLinear", {"c": c}, ["c", "s", "z"],
                      {"s": scalar(0.05), "z": scalar(-4, "int8")}, out="float32")
    check(d, {"c": c})


@pytest.mark.parametrize("op_type,names,consts,attrs,message", [
    ("QLinearConcat", ["sy", "zy", "a", "sa"], {"sy": scalar(0.1), "zy": scalar(0, "uint8"),
                                                "sa": scalar(0.1)}, {"axis": 1}, "triples"),
    ("QLinearSoftmax", ["a", "sa", "za", "sa", "za"], {"sa": scalar(0.1),
                                                       "za": scalar(0, "uint8")}, {},
     "'opset'"),
    ("QLinearAdd", ["a", "sa", "za", "b", "sa", "zb", "sa"],
     {"sa": scalar(0.1), "za": scalar(0, "uint8"), "b": codes((2, 3), "int8"),
      "zb": scalar(0, "int8")}, {}, "one type"),
], ids=["concat-inputs", "softmax-opset", "add-types"])
def test_malformed_nodes_are_refused_naming_the_node(op_type, names, consts, attrs, message):
    a = codes((2, 3))
    model = contrib_model(op_type, {"a": a}, names, consts, **attrs)
    with pytest.raises(OnnxImportError, match=message) as err:
        from_onnx(model)
    assert op_type in str(err.value)


def test_standard_operators_are_not_taken_for_the_contrib_domain():
    """Relu registered for ONNX's domain is no com.microsoft Relu; QLinearAdd no ONNX op."""
    a = codes((2, 3))
    for op_type, domain in [("Relu", MS), ("QLinearAdd", "")]:
        node = helper.make_node(op_type, ["a"], ["y"], domain=domain)
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
            "a", TensorProto.UINT8, a.shape)], [helper.make_tensor_value_info(
                "y", TensorProto.UINT8, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid(MS, 1)])
        with pytest.raises(OnnxImportError, match=f"{op_type} .*domain"):
            from_onnx(model)


def residual_model():
    """A float model with what ONNX Runtime's QOperator format makes contrib operators of:
    convolutions, a residual add, a global average pool and a Gemm."""
    def weight(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.2,
                                       name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 4),
             helper.make_node("Add", ["c2", "r1"], ["s"]),
             helper.make_node("Relu", ["s"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    inits = [weight("w1", (32, 16, 3, 3)), weight("b1", (32,)), weight("w2", (32, 32, 3, 3)),
             weight("b2", (32,)), weight("wf", (10, 32)), weight("bf", (10,))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 16, 12, 12])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_model_in_onnxruntimes_qoperator_format_runs_as_onnxruntime_runs_it(tmp_path):
    pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Batches(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": rng.standard_normal((1, 16, 12, 12)).astype(np.float32)}
                                 for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    source, quantized = tmp_path / "float.onnx", tmp_path / "int8.onnx"
    import onnx

    onnx.save(residual_model(), str(source))
    quantize_static(str(source), str(quantized), Batches(), quant_format=QuantFormat.QOperator,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    model = onnx.load(str(quantized))
    assert {(n.domain, n.op_type) for n in model.graph.node} >= {
        ("", "QLinearConv"), (MS, "QLinearAdd"), (MS, "QLinearGlobalAveragePool"), (MS, "QGemm")}
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    want = onnxruntime_output(model, {"x": x})
    mod, params = from_onnx(model)
    got = opf.compile(mod, params=params).run({"x": x})[0]
    # the output is dequantized codes: one code apart at most, where ONNX Runtime rounds a
    # value within a float rounding of a boundary the other way
    last = model.graph.node[-1]
    assert last.op_type == "DequantizeLinear"
    step = float(numpy_helper.to_array(next(i for i in model.graph.initializer
                                            if i.name == last.input[1])))
    np.testing.assert_allclose(got, want, rtol=0, atol=step * 1.01)
