"""Control flow (If, Loop, Scan): imported bodies agree with onnx.reference, bodies read the
enclosing graph's values, constant conditions pick a branch at import, loops unroll, and
what depends on data at run time is a DataDependentError naming the node."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from onnx_one_node import check_model as check  # noqa: E402
from onnx_one_node import const, model, value  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import DataDependentError, OnnxImportError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402

FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
rng = np.random.default_rng(11)


def branches(then_value, else_value, shape=(3,)):
    """Two bodies that read the outer ``x`` and give x*then_value / x+else_value."""
    def body(name, node_op, operand):
        c = np.full(shape, operand, np.float32)
        nodes = [const(f"{name}_c", c), helper.make_node(node_op, ["x", f"{name}_c"],
                                                         [f"{name}_out"])]
        return helper.make_graph(nodes, name, [], [value(f"{name}_out", FLOAT, shape)])
    return body("then", "Mul", then_value), body("else", "Add", else_value)


def if_model(cond_nodes, cond_inputs, shape=(3,)):
    then, other = branches(2.0, 5.0, shape)
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)
    return model(cond_nodes + [node], [value("x", FLOAT, shape)] + cond_inputs,
                 [value("y", FLOAT, shape)])


@pytest.mark.parametrize("flag", [True, False])
def test_if_constant_condition_inlines_one_branch(flag):
    proto = if_model([const("cond", np.array(flag))], [])
    mod = check(proto, {"x": rng.standard_normal(3).astype(np.float32)})
    text = mod.astext() if hasattr(mod, "astext") else str(mod)
    assert ("multiply" in text) == flag and ("add" in text) != flag
    assert "where" not in text


def test_if_runtime_condition_selects_between_both_branches():
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             const("zero", np.array(0.0, np.float32)),
             helper.make_node("Greater", ["s", "zero"], ["cond"])]
    proto = if_model(nodes, [])
    for seed in range(4):
        x = np.random.default_rng(seed).standard_normal(3).astype(np.float32)
        check(proto, {"x": x}, compiled=seed == 0)


def test_if_runtime_condition_with_branches_of_different_shapes_is_data_dependent():
    then = helper.make_graph([const("t", np.ones(2, np.float32))], "then", [],
                             [value("t", FLOAT, [2])])
    other = helper.make_graph([const("e", np.ones(3, np.float32))], "else", [],
                              [value("e", FLOAT, [3])])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other,
                            name="pick")
    proto = model([node], [value("cond", BOOL, [])], [value("y", FLOAT, None)])
    with pytest.raises(DataDependentError, match="pick"):
        from_onnx(proto, data_dependent="raise")


def loop_body(scan=True):
    """(i, cond, acc) -> (cond, acc + x[i] * w, tanh(acc)) reading the outer x and w. (The
    values are vectors: onnx.reference concatenates scan values where ONNX stacks them, the
    same only for vectors.)"""
    nodes = [
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
        helper.make_node("Mul", ["row", "w"], ["scaled"]),
        helper.make_node("Add", ["acc_in", "scaled"], ["acc_out"]),
        helper.make_node("Tanh", ["acc_out"], ["scan_out"]),
    ]
    outputs = [value("cond_out", BOOL, []), value("acc_out", FLOAT, [4])]
    if scan:
        outputs.append(value("scan_out", FLOAT, [4]))
    return helper.make_graph(
        nodes, "body", [value("i", INT64, []), value("cond_in", BOOL, []),
                        value("acc_in", FLOAT, [4])], outputs)


def loop_model(trip, scan=True, opset=17):
    nodes = [const("M", np.array(trip, np.int64)), const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "acc0"], ["acc", "ys"][:2 if scan else 1],
                              body=loop_body(scan), name="loop")]
    outputs = [value("acc", FLOAT, [4])] + ([value("ys", FLOAT, None)] if scan else [])
    return model(nodes, [value("x", FLOAT, [6, 4]), value("w", FLOAT, [4]),
                         value("acc0", FLOAT, [4])], outputs, opset)


def test_loop_of_zero_iterations_gives_the_initial_values_and_empty_scans():
    # (onnx.reference cannot run it: it stacks no scan values)
    acc0 = rng.standard_normal((4,)).astype(np.float32)
    mod, _ = from_onnx(loop_model(0))
    feeds = {"x": np.zeros((6, 4), np.float32), "w": np.zeros(4, np.float32), "acc0": acc0}
    acc, ys = opf.ir.evaluate(mod, feeds)
    np.testing.assert_array_equal(acc, acc0)
    assert ys.shape == (0, 4) and ys.dtype == np.float32


@pytest.mark.parametrize("trip", [1, 5])
def test_loop_with_a_trip_count_unrolls(trip):
    feeds = {"x": rng.standard_normal((6, 4)).astype(np.float32),
             "w": rng.standard_normal(4).astype(np.float32),
             "acc0": rng.standard_normal((4,)).astype(np.float32)}
    check(loop_model(trip), feeds, compiled=trip == 5)


def test_loop_that_stops_on_a_folded_condition():
    # cond_out = i < 2: known per iteration at import, so the loop runs 3 times of 10
    body = helper.make_graph(
        [const("two", np.array(2, np.int64)), helper.make_node("Less", ["i", "two"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [value("i", INT64, []), value("cond_in", BOOL, []), value("v_in", FLOAT, [2])],
        [value("cond_out", BOOL, []), value("v_out", FLOAT, [2])])
    nodes = [const("M", np.array(10, np.int64)), const("c", np.array(True)),
             const("one", np.ones(2, np.float32)),
             helper.make_node("Loop", ["M", "c", "v0"], ["v"], body=body)]
    proto = model(nodes, [value("v0", FLOAT, [2])], [value("v", FLOAT, [2])])
    check(proto, {"v0": np.zeros(2, np.float32)})


def test_loop_whose_condition_depends_on_data_is_data_dependent():
    body = helper.make_graph(
        [helper.make_node("ReduceSum", ["v_in"], ["s"], keepdims=0),
         const("lim", np.array(10.0, np.float32)),
         helper.make_node("Less", ["s", "lim"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "v_in"], ["v_out"])],
        "body", [value("i", INT64, []), value("cond_in", BOOL, []), value("v_in", FLOAT, [2])],
        [value("cond_out", BOOL, []), value("v_out", FLOAT, [2])])
    nodes = [const("c", np.array(True)),
             helper.make_node("Loop", ["", "c", "v0"], ["v"], body=body, name="grow")]
    proto = model(nodes, [value("v0", FLOAT, [2])], [value("v", FLOAT, [2])])
    with pytest.raises(DataDependentError, match="grow"):
        from_onnx(proto, data_dependent="raise")


def test_loop_without_trip_count_or_condition_is_refused():
    nodes = [helper.make_node("Loop", ["", "", "acc0"], ["acc"], body=loop_body(False))]
    proto = model(nodes, [value("acc0", FLOAT, [4])], [value("acc", FLOAT, [4])])
    with pytest.raises(OnnxImportError, match="never end"):
        from_onnx(proto)


def test_loop_too_long_to_unroll_runs_as_a_loop_of_its_compiled_body(monkeypatch):
    from opfusion.frontend.onnx.converters import control
    monkeypatch.setattr(control, "MAX_UNROLLED_NODES", 20)
    with pytest.raises(DataDependentError, match="runs as a loop"):
        from_onnx(loop_model(5), data_dependent="raise")
    feeds = {"x": rng.standard_normal((6, 4)).astype(np.float32),
             "w": rng.standard_normal(4).astype(np.float32),
             "acc0": rng.standard_normal(4).astype(np.float32)}
    want = ReferenceEvaluator(loop_model(5)).run(None, feeds)
    mod, params = from_onnx(loop_model(5))
    exe = opf.compile(mod, params=params)  # the body compiled once, called 5 times
    assert_close(tuple(exe.run(feeds)), tuple(want))


def scan_body():
    nodes = [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
             helper.make_node("Mul", ["s_out", "x_t"], ["y_t"])]
    return helper.make_graph(nodes, "body", [value("s_in", FLOAT, [3]), value("x_t", FLOAT, [3])],
                             [value("s_out", FLOAT, [3]), value("y_t", FLOAT, [3])])


@pytest.mark.parametrize("in_axis,in_dir,out_axis,out_dir",
                         [(0, 0, 0, 0), (1, 1, 0, 0), (0, 0, 1, 1), (1, 0, -1, 0)])
def test_scan_axes_and_directions(in_axis, in_dir, out_axis, out_dir):
    shape = (4, 3) if in_axis == 0 else (3, 4)
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], num_scan_inputs=1,
                            body=scan_body(), scan_input_axes=[in_axis],
                            scan_input_directions=[in_dir], scan_output_axes=[out_axis],
                            scan_output_directions=[out_dir])
    proto = model([node], [value("s0", FLOAT, [3]), value("xs", FLOAT, list(shape))],
                  [value("s", FLOAT, [3]), value("ys", FLOAT, None)])
    feeds = {"s0": rng.standard_normal(3).astype(np.float32),
             "xs": rng.standard_normal(shape).astype(np.float32)}
    # onnx.reference implements direction 0 only
    check(proto, feeds, compiled=in_axis == 1 and in_dir == 1, oracle="onnxruntime")


def test_scan_opset8_batches():
    node = helper.make_node("Scan", ["", "s0", "xs"], ["s", "ys"], num_scan_inputs=1,
                            body=scan_body())
    proto = model([node], [value("s0", FLOAT, [2, 3]), value("xs", FLOAT, [2, 4, 3])],
                  [value("s", FLOAT, [2, 3]), value("ys", FLOAT, [2, 4, 3])], opset=8)
    feeds = {"s0": rng.standard_normal((2, 3)).astype(np.float32),
             "xs": rng.standard_normal((2, 4, 3)).astype(np.float32)}
    check(proto, feeds, oracle="onnxruntime")  # onnx.reference runs opset 9's Scan only


def test_nested_bodies_read_every_enclosing_scope():
    # Loop body holds an If whose branches read the loop body's value and the model's w.
    then = helper.make_graph([helper.make_node("Mul", ["acc_out", "w"], ["t"])], "then", [],
                             [value("t", FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Sub", ["acc_out", "w"], ["e"])], "else", [],
                              [value("e", FLOAT, [4])])
    body = loop_body(scan=False)
    body.node.extend([
        const("one", np.array(1, np.int64)),
        helper.make_node("Less", ["i", "one"], ["first"]),
        helper.make_node("If", ["first"], ["picked"], then_branch=then, else_branch=other)])
    body.output[1].name = "picked"
    nodes = [const("M", np.array(3, np.int64)), const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "acc0"], ["acc"], body=body)]
    proto = model(nodes, [value("x", FLOAT, [6, 4]), value("w", FLOAT, [4]),
                          value("acc0", FLOAT, [4])], [value("acc", FLOAT, [4])])
    feeds = {"x": rng.standard_normal((6, 4)).astype(np.float32),
             "w": rng.standard_normal(4).astype(np.float32),
             "acc0": rng.standard_normal((4,)).astype(np.float32)}
    check(proto, feeds, compiled=True)


def test_unsupported_op_inside_a_body_is_listed_up_front():
    body = helper.make_graph([helper.make_node("NoSuchOp", ["cond_in"], ["cond_out"])], "body",
                             [value("i", INT64, []), value("cond_in", BOOL, [])],
                             [value("cond_out", BOOL, [])])
    nodes = [const("M", np.array(2, np.int64)), const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c"], [], body=body)]
    proto = model(nodes, [], [])
    from opfusion.frontend import UnsupportedOnnxError
    with pytest.raises(UnsupportedOnnxError, match="NoSuchOp"):
        from_onnx(proto)


def test_model_with_loop_and_if_matches_onnxruntime():
    """A recurrent refinement: a Loop of 4 steps (state h, a scan output per step) whose body
    picks, by a condition computed from the data, one of two updates of the same shape, and
    an If on a condition folded from shapes. Compiled and compared with ONNX Runtime."""
    ort = pytest.importorskip("onnxruntime")
    w = (rng.standard_normal((8, 8)) / np.sqrt(8)).astype(np.float32)
    then = helper.make_graph([helper.make_node("Tanh", ["mixed"], ["t"])], "then", [],
                             [value("t", FLOAT, [1, 8])])
    other = helper.make_graph([helper.make_node("Sigmoid", ["mixed"], ["e"])], "else", [],
                              [value("e", FLOAT, [1, 8])])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Gather", ["x", "i"], ["row"], axis=1),
         helper.make_node("MatMul", ["h_in", "w"], ["hw"]),
         helper.make_node("Add", ["hw", "row"], ["mixed"]),
         helper.make_node("ReduceMean", ["mixed"], ["m"], keepdims=0),
         const("zero", np.array(0.0, np.float32)),
         helper.make_node("Greater", ["m", "zero"], ["positive"]),
         helper.make_node("If", ["positive"], ["h_out"], then_branch=then, else_branch=other),
         helper.make_node("ReduceSum", ["h_out"], ["energy"], keepdims=0)],
        "body", [value("i", INT64, []), value("cond_in", BOOL, []), value("h_in", FLOAT, [1, 8])],
        [value("cond_out", BOOL, []), value("h_out", FLOAT, [1, 8]), value("energy", FLOAT, [])])
    shape_then = helper.make_graph([helper.make_node("Relu", ["h"], ["r"])], "st", [],
                                   [value("r", FLOAT, [1, 8])])
    shape_else = helper.make_graph([helper.make_node("Neg", ["h"], ["n"])], "se", [],
                                   [value("n", FLOAT, [1, 8])])
    nodes = [const("w", w), const("M", np.array(4, np.int64)), const("c", np.array(True)),
             helper.make_node("Loop", ["M", "c", "h0"], ["h", "energies"], body=body),
             helper.make_node("Shape", ["x"], ["xs"]),
             const("one", np.array([1], np.int64)), const("two", np.array([2], np.int64)),
             const("four", np.array([4], np.int64)),
             helper.make_node("Slice", ["xs", "one", "two"], ["steps"]),
             helper.make_node("Equal", ["steps", "four"], ["is_four"]),
             helper.make_node("If", ["is_four"], ["y"], then_branch=shape_then,
                              else_branch=shape_else)]
    proto = model(nodes, [value("x", FLOAT, [1, 4, 8]), value("h0", FLOAT, [1, 8])],
                  [value("y", FLOAT, [1, 8]), value("energies", FLOAT, [4])])
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    mod, params = from_onnx(proto)
    exe = opf.compile(mod, params=params)
    for seed in range(3):
        feeds = {"x": np.random.default_rng(seed).standard_normal((1, 4, 8)).astype(np.float32),
                 "h0": np.random.default_rng(seed + 9).standard_normal((1, 8)).astype(np.float32)}
        want = session.run(None, feeds)
        got = exe.run(feeds)
        for g, wv in zip(got, want):
            assert_close(g, wv, rtol=1e-5)


def test_if_whose_branch_indexes_only_when_taken_runs_only_the_taken_branch():
    """then: table[floor(sum(x))], valid only when 0 <= sum < 4 (the condition); computing
    it for the other case too would raise. The If runs in stages instead of selecting."""
    ort = pytest.importorskip("onnxruntime")
    then = helper.make_graph(
        [helper.make_node("Floor", ["s"], ["f"]), helper.make_node("Cast", ["f"], ["k"], to=7),
         helper.make_node("Gather", ["table", "k"], ["t"], axis=0)],
        "then", [], [value("t", FLOAT, [])])
    other = helper.make_graph([const("e", np.array(-1.0, np.float32))], "else", [],
                              [value("e", FLOAT, [])])
    nodes = [const("table", np.array([10, 20, 30, 40], np.float32)),
             const("zero", np.array(0.0, np.float32)), const("four", np.array(4.0, np.float32)),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("GreaterOrEqual", ["s", "zero"], ["low_ok"]),
             helper.make_node("Less", ["s", "four"], ["high_ok"]),
             helper.make_node("And", ["low_ok", "high_ok"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)]
    proto = model(nodes, [value("x", FLOAT, [3])], [value("y", FLOAT, [])])
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    mod, params = from_onnx(proto)
    exe = opf.compile(mod, params=params)
    for x in ([0.5, 1.0, 1.2], [3.0, 4.0, 5.0], [-9.0, 0.0, 1.0]):
        feeds = {"x": np.array(x, np.float32)}
        assert_close(exe.run(feeds)[0], session.run(None, feeds)[0])
