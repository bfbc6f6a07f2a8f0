"""Models whose shapes depend on data run in compiled stages (frontend/onnx/staged.py): a
NonMaxSuppression detection head, NonZero-driven gathers, shapes and conditions computed
at run time, a loop whose exit depends on data. Each is checked against ONNX Runtime on
several inputs, and the stages are built once per new size."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx_one_node import const, model, value  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import DataDependentError, OpfusionError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.frontend.onnx.staged import OnnxStagedModel  # noqa: E402
from opfusion.testing import assert_close, run_in_threads  # noqa: E402
from opfusion.testing.detection import nms_model  # noqa: E402

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def compare_with_onnxruntime(proto, feeds_list, **compile_options):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    mod, params = from_onnx(proto)
    assert isinstance(mod, OnnxStagedModel)
    exe = opf.compile(mod, params=params, **compile_options)
    for feeds in feeds_list:
        want = session.run(None, feeds)
        got = exe.run(feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_close(g, w, rtol=1e-5)
    return exe


def test_nonzero_then_gather_runs_in_stages_built_once_per_size():
    nodes = [const("zero", np.array(0.0, np.float32)),
             helper.make_node("Greater", ["x", "zero"], ["mask"]),
             helper.make_node("NonZero", ["mask"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "idx"], ["picked"]),
             helper.make_node("Exp", ["picked"], ["y"]),
             helper.make_node("Shape", ["picked"], ["n"])]
    proto = model(nodes, [value("x", FLOAT, [3, 4])],
                  [value("y", FLOAT, None), value("n", INT64, None)])
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    exe = compare_with_onnxruntime(proto, [{"x": x}, {"x": -x}, {"x": x}])
    # the part before NonZero once, the part after it once per count of positive values
    assert exe.stages_compiled == 3


def test_detection_head_with_non_max_suppression_matches_onnxruntime():
    proto = nms_model(boxes=32, features=16, classes=3)
    rng = np.random.default_rng(1)
    feeds = [{"features": rng.standard_normal((1, 32, 16)).astype(np.float32)}
             for _ in range(3)]
    compare_with_onnxruntime(proto, feeds)


def test_a_computed_shape_is_frozen_and_the_rest_compiled():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    proto = model(nodes, [value("x", FLOAT, [4, 6]), value("shape", INT64, [2])],
                  [value("y", FLOAT, None)])
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    feeds = [{"x": x, "shape": np.array(s, np.int64)} for s in [(3, 8), (2, 12), (3, 8)]]
    exe = compare_with_onnxruntime(proto, feeds)
    assert exe.stages_compiled == 3  # the cut (nothing runs before it), one per shape value


def test_if_whose_branches_differ_in_shape_specializes_on_the_condition():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [value("t", FLOAT, [4])])
    other = helper.make_graph([const("two", np.array([0, 2], np.int64)),
                               helper.make_node("Gather", ["x", "two"], ["e"])], "else", [],
                              [value("e", FLOAT, [2])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             const("zero", np.array(0.0, np.float32)),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    proto = model(nodes, [value("x", FLOAT, [4])], [value("y", FLOAT, None)])
    x = np.array([1.0, -0.5, 2.0, 0.25], np.float32)
    compare_with_onnxruntime(proto, [{"x": x}, {"x": -x}])


def test_loop_whose_exit_depends_on_data_is_computed_between_stages():
    body = helper.make_graph(
        [helper.make_node("Add", ["v_in", "v_in"], ["v_out"]),
         helper.make_node("ReduceSum", ["v_out"], ["s"], keepdims=0),
         const("lim", np.array(100.0, np.float32)),
         helper.make_node("Less", ["s", "lim"], ["cond_out"])],
        "body", [value("i", INT64, []), value("cond_in", BOOL, []), value("v_in", FLOAT, [2])],
        [value("cond_out", BOOL, []), value("v_out", FLOAT, [2])])
    nodes = [helper.make_node("Abs", ["x"], ["v0"]),
             const("M", np.array(50, np.int64)), const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "v0"], ["v"], body=body),
             helper.make_node("Sqrt", ["v"], ["y"])]
    proto = model(nodes, [value("x", FLOAT, [2])], [value("y", FLOAT, [2])])
    compare_with_onnxruntime(proto, [{"x": np.array([1.0, 2.0], np.float32)},
                                     {"x": np.array([0.01, -0.02], np.float32)}])


def test_data_dependent_raise_and_export_refusal():
    nodes = [helper.make_node("NonZero", ["x"], ["y"], name="nz")]
    proto = model(nodes, [value("x", FLOAT, [5])], [value("y", INT64, None)])
    with pytest.raises(DataDependentError, match="'nz'"):
        from_onnx(proto, data_dependent="raise")
    mod, params = from_onnx(proto)
    exe = opf.compile(mod, params=params)
    got = exe.run({"x": np.array([0, 1, 0, 2, 3], np.float32)})
    np.testing.assert_array_equal(got[0], [[1, 3, 4]])
    with pytest.raises(OpfusionError, match="cannot be exported"):
        exe.export("unused.opf")
    with pytest.raises(OpfusionError, match="input 'x'"):
        exe.run({"x": np.zeros(4, np.float32)})


def recurrence(trip=None, cond=False):
    """h <- tanh(h @ w), an energy per step as scan output: a Loop of ``trip`` iterations
    (None: none given) with a condition input when ``cond``."""
    w = (np.random.default_rng(0).standard_normal((16, 16)) / 4).astype(np.float32)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["h_in", "w"], ["hw"]),
         helper.make_node("Tanh", ["hw"], ["h_out"]),
         helper.make_node("ReduceSum", ["h_out"], ["e"], keepdims=0)],
        "body", [value("i", INT64, []), value("cond_in", BOOL, []), value("h_in", FLOAT, [1, 16])],
        [value("cond_out", BOOL, []), value("h_out", FLOAT, [1, 16]), value("e", FLOAT, [])])
    nodes = [const("w", w)]
    if trip is not None:
        nodes.append(const("M", np.array(trip, np.int64)))
    if cond:
        nodes.append(const("c", np.array(True)))
    nodes.append(helper.make_node("Loop", ["M" if trip is not None else "", "c" if cond else "",
                                           "h0"], ["h", "es"], body=body, name="recur"))
    return model(nodes, [value("h0", FLOAT, [1, 16])],
                 [value("h", FLOAT, [1, 16]), value("es", FLOAT, None)])


def test_a_long_loop_runs_its_body_compiled_once():
    rng = np.random.default_rng(4)
    exe = compare_with_onnxruntime(recurrence(trip=3000),
                                   [{"h0": rng.standard_normal((1, 16)).astype(np.float32)}])
    assert exe.loop_bodies_compiled == 1  # the body compiled once, called 3000 times


def test_a_loop_that_never_ends_is_an_error_not_a_hang(monkeypatch):
    from opfusion.frontend.onnx import staged
    monkeypatch.setattr(staged, "MAX_LOOP_ITERATIONS", 50)
    mod, params = from_onnx(recurrence(cond=True))
    exe = opf.compile(mod, params=params)
    with pytest.raises(OpfusionError, match="would not end"):
        exe.run({"h0": np.zeros((1, 16), np.float32)})


def test_a_loop_trip_count_of_many_values_is_an_error_naming_the_loop():
    """A trip count computed at run time (here an input) that holds more than one value:
    an OpfusionError naming the Loop node, not numbers from its first element."""
    proto = recurrence(trip=3)
    graph = proto.graph
    kept = [n for n in graph.node if n.output[0] != "M"]
    del graph.node[:]
    graph.node.extend(kept)
    graph.input.append(value("M", INT64, [2, 3]))
    mod, params = from_onnx(proto)
    exe = opf.compile(mod, params=params)
    with pytest.raises(OpfusionError, match=r"Loop \(node 'recur'.*must hold one value, got "
                                            r"shape \(2, 3\)"):
        exe.run({"h0": np.zeros((1, 16), np.float32), "M": np.full((2, 3), 3000, np.int64)})


def test_a_loop_run_as_a_loop_names_itself_for_a_trip_count_of_many_values():
    """The staged runner's own check (a Loop it runs as a loop, its trip count computed by
    earlier stages: fuzzing found a ReduceMean turned Loop reading a data tensor)."""
    from opfusion.frontend.onnx.staged import _loop_scalar

    node = helper.make_node("Loop", ["M", "", "h0"], ["h"], name="recur")
    assert _loop_scalar(np.array([7]), "trip count M", node) == 7
    assert _loop_scalar(None, "condition", node) is None
    with pytest.raises(OpfusionError, match=r"Loop \(node 'recur'\): its trip count M must "
                                            r"hold one value, got shape \(1, 8, 3, 2\)"):
        _loop_scalar(np.zeros((1, 8, 3, 2)), "trip count M", node)


def test_staged_runs_from_many_threads_at_once_agree_with_single_runs():
    mod, params = from_onnx(nms_model(boxes=24, features=8, classes=2))
    exe = opf.compile(mod, params=params)
    inputs = [np.random.default_rng(seed).standard_normal((1, 24, 8)).astype(np.float32)
              for seed in range(6)]
    want = [exe.run({"features": x}) for x in inputs]  # each count of kept boxes built once

    def work(index: int) -> None:
        for _ in range(3):
            got = exe.run({"features": inputs[index]})
            for g, w in zip(got, want[index]):
                np.testing.assert_array_equal(g, w)

    run_in_threads(6, work)


def test_symbolic_input_dims_and_data_dependent_shapes_together():
    """A detection head whose box count is a symbolic dimension: one staged executor per
    input shape (SpecializingExecutor), each staging its NonMaxSuppression."""
    ort = pytest.importorskip("onnxruntime")
    proto = nms_model(boxes=32, features=16, classes=3)
    proto.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "boxes"
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    mod, params = from_onnx(proto)
    exe = opf.compile(mod, params=params)
    for count in (32, 20):
        x = np.random.default_rng(count).standard_normal((1, count, 16)).astype(np.float32)
        for got, want in zip(exe.run({"features": x}), session.run(None, {"features": x})):
            assert_close(got, want)
    assert [shape["features"] for shape in exe.specializations] == [(1, 32, 16), (1, 20, 16)]


def test_passes_the_interpreter_and_main_refuse_a_staged_model_saying_why():
    mod, _ = from_onnx(nms_model())
    for attempt in (lambda: opf.transform.InferType()(mod), lambda: opf.ir.evaluate(mod, {}),
                    lambda: mod["main"]):
        with pytest.raises(OpfusionError, match="opf.compile runs it in stages"):
            attempt()


@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression_matches_onnx_reference_on_random_boxes(center):
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(center)
    boxes = rng.uniform(0, 10, (2, 60, 4)).astype(np.float32)
    scores = rng.choice([0.2, 0.5, 0.7, 0.9], (2, 3, 60)).astype(np.float32)  # many ties
    consts = {"boxes": boxes, "scores": scores, "limit": np.array([7], np.int64),
              "iou": np.array([0.3], np.float32), "threshold": np.array([0.4], np.float32)}
    node = helper.make_node("NonMaxSuppression", list(consts), ["y"], center_point_box=center)
    graph = helper.make_graph([node], "g", [], [value("y", INT64, None)],
                              [numpy_helper.from_array(a, n) for n, a in consts.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (want,) = ReferenceEvaluator(proto).run(None, {})
    mod, _ = from_onnx(proto)
    np.testing.assert_array_equal(opf.ir.evaluate(mod, {}), want)
