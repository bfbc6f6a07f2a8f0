"""The ONNX importer records the graph's output names on @main (attr ``output_names``), and
every pass of ``opf.compile``'s pipeline (optimize, each fusion strategy) keeps them, as do
the text form and its parser."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.compiler.compile import fuse
from opfusion.testing import assert_close
from opfusion.transform.fusion_strategy import fusion_strategies

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def two_output_model():
    """x (1, 2, 4, 4) -> conv + batch norm -> "features"; relu -> global pool -> "pooled"."""
    rng = np.random.default_rng(0)
    initializers = [numpy_helper.from_array(rng.standard_normal((2, 2, 1, 1)).astype("float32"),
                                            "w")]
    initializers += [numpy_helper.from_array(np.full(2, value, np.float32), name)
                     for name, value in (("g", 2.0), ("b", 0.5), ("mean", 0.1), ("var", 1.5))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "mean", "var"],
                              ["features"]),
             helper.make_node("Relu", ["features"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["pooled"])]
    graph = helper.make_graph(
        nodes, "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [1, 2, 4, 4]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, 2, 1, 1])],
        initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_importer_records_the_graphs_output_names():
    mod, _ = opf.frontend.from_onnx(two_output_model())
    assert mod["main"].attrs["output_names"] == ("features", "pooled")


@pytest.mark.parametrize("strategy", list(fusion_strategies()))
def test_optimize_and_fusion_keep_the_output_names(strategy):
    mod, params = opf.frontend.from_onnx(two_output_model())
    with opf.transform.PassContext(opt_level=3):
        optimized = opf.transform.optimize(opf.transform.InferType()(mod), params)
        fused = fuse(optimized, strategy, 3)
    assert optimized["main"].attrs["output_names"] == ("features", "pooled")
    assert fused["main"].attrs["output_names"] == ("features", "pooled")
    # The passes changed the graph (batch norm folded, groups formed) and not its numbers.
    x = np.random.default_rng(1).standard_normal((1, 2, 4, 4)).astype(np.float32)
    want = opf.ir.evaluate(mod, {"x": x, **params})
    assert_close(opf.ir.evaluate(fused, {"x": x}), want)


def test_the_text_form_keeps_the_output_names():
    mod, _ = opf.frontend.from_onnx(two_output_model())
    assert opf.parse(mod.astext())["main"].attrs["output_names"] == ("features", "pooled")
