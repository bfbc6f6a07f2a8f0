"""Per-channel parameters of ONNX normalizations and PRelu's slope: shapes that ONNX Runtime
refuses are import errors naming the node, not values broadcast over every channel (fuzz
case 242 seed 1: InstanceNormalization's B replaced by a scalar -1e30 compiled and ran)."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from opfusion.errors import OnnxImportError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.ir.evaluate import evaluate  # noqa: E402

X_SHAPE = (1, 4, 3, 3)


def model(op_type, params, opset=18, **attrs):
    """One node over a float input of X_SHAPE and ``params`` (name -> array) initializers."""
    node = helper.make_node(op_type, ["x", *params], ["y"], name="n0", **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, X_SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in params.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("bad", [np.float32(-1e30), np.ones(1), np.ones(3), np.ones((4, 1))])
@pytest.mark.parametrize("which", ["scale", "B"])
def test_instance_norm_parameters_must_have_one_value_per_channel(bad, which):
    params = {"scale": np.ones(4), "B": np.zeros(4)}
    params[which] = bad
    with pytest.raises(OnnxImportError, match=rf"node 'n0'.*\({which}\) must be 1-D"):
        from_onnx(model("InstanceNormalization", params))


def test_instance_norm_with_vectors_imports_and_agrees_with_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    onnx_model = model("InstanceNormalization",
                       {"scale": [1.0, 2.0, 0.5, -1.0], "B": [0.0, 1.0, -1.0, 3.0]})
    x = np.random.default_rng(0).standard_normal(X_SHAPE).astype(np.float32)
    want = ort.InferenceSession(onnx_model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    mod, _ = from_onnx(onnx_model)
    np.testing.assert_allclose(evaluate(mod, {"x": x}), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("opset, size", [(18, 2), (21, 4)])
def test_group_norm_parameters_must_have_one_value_per_group_or_channel(opset, size):
    good = {"scale": np.ones(size), "bias": np.zeros(size)}
    from_onnx(model("GroupNormalization", good, opset=opset, num_groups=2))
    for bad in (np.float32(2.0), np.ones(size + 1)):
        with pytest.raises(OnnxImportError, match=r"node 'n0'.*\(bias\) must be 1-D"):
            from_onnx(model("GroupNormalization", {**good, "bias": bad}, opset=opset,
                            num_groups=2))


def test_prelu_slope_that_would_grow_the_output_is_refused():
    # (4, 3, 3) broadcasts with data's (1, 4, 3, 3); (2, 4, 1, 1) would make the output 2x.
    from_onnx(model("PRelu", {"slope": np.full((4, 3, 3), 0.1)}))
    with pytest.raises(OnnxImportError, match=r"node 'n0'.*unidirectionally"):
        from_onnx(model("PRelu", {"slope": np.full((2, 4, 1, 1), 0.1)}))
