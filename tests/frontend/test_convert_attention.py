"""ONNX Attention (opset 23): the common forms become one fused nn.attention, the others
ONNX's function body (the converter declines them); both agree with onnx.reference, and a
compiled model with ONNX Runtime."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402


def attention_model(shapes, dtype=np.float32, **attrs):
    names = ["q", "k", "v", "mask"][:len(shapes)]
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("Attention", names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, elem, s) for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(s).astype(dtype) for n, s in zip(names, shapes)}
    return model, feeds


def ops_of(mod):
    return [node.op.name for node in opf.ir.post_order(mod["main"].body)
            if isinstance(node, opf.ir.Call)]


@pytest.mark.parametrize("shapes,attrs", [
    ([(2, 3, 5, 8)] * 3, {}),
    ([(1, 2, 6, 4)] * 3, {"is_causal": 1, "scale": 0.3}),
    ([(1, 2, 5, 8), (1, 2, 7, 8), (1, 2, 7, 6)], {}),            # more keys, other value size
    ([(2, 5, 24), (2, 7, 24), (2, 7, 24)], {"q_num_heads": 3, "kv_num_heads": 3}),
])
def test_common_forms_are_one_fused_attention(shapes, attrs):
    model, feeds = attention_model(shapes, **attrs)
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    mod, params = from_onnx(model)
    assert "nn.attention" in ops_of(mod)
    assert_close(opf.ir.evaluate(mod, feeds), want)
    assert_close(opf.compile(mod, params=params).run(feeds)[0], want)


@pytest.mark.parametrize("mask_dtype,causal", [(np.float32, 0), (np.bool_, 0), (np.bool_, 1)])
def test_masked_forms_are_fused_and_a_fully_masked_query_gives_zeros(mask_dtype, causal):
    model, feeds = attention_model([(1, 2, 4, 8)] * 3 + [(1, 1, 4, 4)], is_causal=causal)
    rng = np.random.default_rng(1)
    if mask_dtype == np.bool_:
        mask = rng.random((1, 1, 4, 4)) < 0.6
        mask[0, 0, 2] = False  # query 2 may see no key
        model.graph.input[3].type.tensor_type.elem_type = TensorProto.BOOL
    else:
        mask = rng.standard_normal((1, 1, 4, 4)).astype(np.float32)
    feeds["mask"] = mask
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    mod, params = from_onnx(model)
    assert "nn.attention" in ops_of(mod)
    assert_close(opf.ir.evaluate(mod, feeds), want)
    got = opf.compile(mod, params=params).run(feeds)[0]
    assert_close(got, want)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("shapes,dtype,attrs", [
    ([(1, 4, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)], np.float32, {}),     # grouped heads
    ([(1, 2, 4, 8)] * 3, np.float16, {}),
    ([(1, 2, 4, 8)] * 3, np.float32, {"softcap": 2.0}),
    ([(1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8)], np.float32, {"is_causal": 1}),
])
def test_other_forms_convert_the_function_body(shapes, dtype, attrs):
    model, feeds = attention_model(shapes, dtype, **attrs)
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    mod, _ = from_onnx(model)
    assert_close(opf.ir.evaluate(mod, feeds), want, rtol=1e-3 if dtype == np.float16 else 1e-5)


def test_a_vision_transformer_sized_attention_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    model, feeds = attention_model([(1, 12, 197, 64)] * 3)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    mod, params = from_onnx(model)
    assert_close(opf.compile(mod, params=params).run(feeds)[0], want, rtol=1e-4)
