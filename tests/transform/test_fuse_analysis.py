"""The analysis behind FuseOps: the forward graph, the post-dominator tree, the partition
checker, explanations, drawings, random graphs and 100,000-node graphs."""

import sys

import numpy as np
import pytest
from fuse_helpers import check_fusion, fuse, plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opfusion import op
from opfusion.errors import OpfusionError
from opfusion.ir import (
    Call,
    Function,
    IRModule,
    OpPatternKind,
    Tuple,
    TupleGetItem,
    assert_structural_equal,
    const,
    infer_type,
    var,
)
from opfusion.testing.examples import chain_graph, seed_example, wide_dag
from opfusion.testing.random_graphs import dataflow_graphs
from opfusion.transform import PassContext
from opfusion.transform.fuse.check import (
    InvalidFusionError,
    check_fused_function,
    check_fusion_plan,
)
from opfusion.transform.fuse.dominator import NO_PARENT, PostDominatorTree
from opfusion.transform.fuse.dot import fusion_to_dot, render_fusion_svg
from opfusion.transform.fuse.explain import explain_fusion
from opfusion.transform.fuse.graph import build_forward_graph

K = OpPatternKind


def forward_graph(func):
    infer_type(func)
    return build_forward_graph(func)


# ---------------------------------------------------------------------------------------------
# the indexed forward graph


def test_seed_graph_is_numbered_and_linked_as_the_seed_draws_it():
    graph = forward_graph(seed_example()["main"])
    kinds = [type(n.ref).__name__ if not isinstance(n.ref, Call) else n.ref.op_name
             for n in graph]
    assert kinds == ["Var", "Var", "nn.conv2d", "Constant", "add", "nn.relu", "Constant",
                     "multiply", "add"]
    assert [n.index for n in graph if n.extern_ref] == [0, 1, 8]
    assert [(e.node.index, K(e.pattern)) for e in graph.nodes[2].outputs] == \
        [(4, K.kElemWise), (7, K.kElemWise)]
    assert [K(n.pattern) for n in graph] == [
        K.kOpaque, K.kOpaque, K.kOutEWiseFusable, K.kOpaque, K.kBroadcast, K.kElemWise,
        K.kElemWise, K.kBroadcast, K.kBroadcast]
    # the scalar 0.5 is broadcast into multiply; the full-size constant is not
    assert graph.nodes[6].outputs[0].pattern == K.kBroadcast
    assert graph.nodes[3].outputs[0].pattern == K.kElemWise
    assert "node[2] nn.conv2d kOutEWiseFusable -> [4(kElemWise), 7(kElemWise)]" in graph.dump()


def test_tuple_fields_are_injective_edges_and_non_tensor_fields_are_external():
    x = var("x", (2, 2))
    inner = Tuple([op.exp(x)])
    relu = op.nn.relu(x)
    graph = forward_graph(Function([x], Tuple([inner, relu])))
    assert graph.node(relu).outputs[0].pattern == K.kInjective
    assert graph.node(inner).extern_ref and graph.node(inner).pattern == K.kTuple


def test_tuple_access_is_injective_unless_the_tuple_holds_non_tensors():
    x = var("x", (2, 2))
    flat = Tuple([x, op.exp(x)])
    nested = Tuple([Tuple([x]), op.exp(x)])
    a, b = TupleGetItem(flat, 1), TupleGetItem(nested, 1)
    graph = forward_graph(Function([x], op.add(a, b)))
    assert graph.node(a).pattern == K.kInjective
    assert graph.node(flat).outputs[0].pattern == K.kInjective
    assert graph.node(b).pattern == K.kOpaque and graph.node(nested).extern_ref


def test_only_simple_scalar_constants_are_fusable():
    x = var("x", (2,), "int8")
    small = const(np.int8(3))
    big = const(np.ones(2, np.float32))
    graph = forward_graph(Function([x], op.add(op.cast(op.add(x, small), dtype="float32"), big)))
    assert graph.node(small).pattern == K.kOpaque  # int8 is not a kernel literal type
    assert graph.node(big).pattern == K.kOpaque
    y = var("y", (2,))
    scalar = const(2.0)
    assert forward_graph(Function([y], op.add(y, scalar))).node(scalar).pattern == K.kElemWise


def test_function_returning_its_parameter_has_a_one_node_graph():
    x = var("x", (2,))
    graph = forward_graph(Function([x], x))
    assert len(graph) == 1 and graph.nodes[0].extern_ref
    assert_structural_equal(fuse(Function([x], x)),
                            IRModule.from_expr(Function([x], x, ret_type=x.type_annotation)))


# ---------------------------------------------------------------------------------------------
# the post-dominator tree


def test_seed_post_dominator_tree():
    tree = PostDominatorTree(forward_graph(seed_example()["main"]))
    assert tree.parent == [NO_PARENT, NO_PARENT, 8, 4, 5, 8, 7, 8, NO_PARENT]
    assert K(tree.pattern[2]) == K.kElemWise and K(tree.pattern[6]) == K.kBroadcast
    assert tree.depth[8] == 1 and tree.depth[2] == 2 and tree.depth[3] == 4
    assert "node[2] -> 8 (kElemWise, depth 2)" in tree.dump()


def test_the_way_to_a_post_dominator_takes_the_largest_kind_met():
    x = var("x", (4, 4))
    y = op.exp(x)
    out = op.add(op.nn.relu(y), op.transpose(op.nn.relu(y), axes=(1, 0)))
    graph = forward_graph(Function([x], out))
    tree = PostDominatorTree(graph)
    assert tree.parent[graph.node(y).index] == graph.node(out).index
    assert K(tree.pattern[graph.node(y).index]) == K.kInjective


def brute_force_post_dominators(graph):
    """Immediate post-dominators by set intersection (external references end every path)."""
    dominators = [None] * len(graph)
    parent = [NO_PARENT] * len(graph)
    for node in reversed(graph.nodes):
        if node.extern_ref or not node.outputs:
            dominators[node.index] = {node.index}
            continue
        common = set.intersection(*(dominators[e.node.index] for e in node.outputs))
        dominators[node.index] = common | {node.index}
        parent[node.index] = min(common) if common else NO_PARENT
    return parent


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dataflow_graphs(max_ops=14))
def test_tree_parents_are_the_immediate_post_dominators(mod):
    graph = forward_graph(mod["main"])
    assert PostDominatorTree(graph).parent == brute_force_post_dominators(graph)


# ---------------------------------------------------------------------------------------------
# random graphs: same numbers, valid partitions, idempotent


@st.composite
def mixed_graphs(draw, max_ops=12):
    """Graphs on (4, 4) tensors mixing every kind: elementwise, broadcast, injective
    (transpose; concatenate + strided_slice through a tuple), reductions (keepdims),
    kOutEWiseFusable (dense, whose result feeds on) and opaque (softmax)."""
    x, y = var("x", (4, 4)), var("y", (4, 4))
    values = [x, y]

    def pick():
        return values[draw(st.integers(0, len(values) - 1))]

    builders = {
        "relu": lambda: op.nn.relu(pick()),
        "tanh": lambda: op.tanh(pick()),
        "add": lambda: op.add(pick(), pick()),
        "scale": lambda: op.multiply(pick(), const(0.5)),
        "transpose": lambda: op.transpose(pick(), axes=(1, 0)),
        "concat_slice": lambda: op.strided_slice(
            op.concatenate(Tuple([pick(), pick()]), axis=0), begin=(2, 0), end=(6, 4)),
        "sum_broadcast": lambda: op.add(pick(), op.sum(pick(), axis=1, keepdims=True)),
        "dense": lambda: op.nn.dense(pick(), pick()),
        "softmax": lambda: op.nn.softmax(pick()),
        "split_part": lambda: TupleGetItem(op.split(pick(), indices_or_sections=2, axis=0),
                                           draw(st.integers(0, 1))),
    }
    for _ in range(draw(st.integers(1, max_ops))):
        value = builders[draw(st.sampled_from(sorted(builders)))]()
        if value.checked_type.shape != (4, 4):
            value = op.concatenate(Tuple([value, value]), axis=0)  # a (2, 4) split part
        values.append(value)
    outputs = [values[-1]] + [pick() for _ in range(draw(st.integers(0, 2)))]
    body = outputs[0] if len(outputs) == 1 else Tuple(outputs)
    return IRModule.from_expr(Function([x, y], body))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_graphs(), st.sampled_from([{}, {"max_depth": 3}, {"max_function_args": 4},
                                        {"link_params": True}]))
def test_random_graphs_fuse_correctly(mod, config):
    fused = check_fusion(mod, **config)
    assert_structural_equal(fuse(fused, **config), fused)
    context = PassContext(config={f"FuseOps.{key}": value for key, value in config.items()})
    assert "unknown" not in explain_fusion(mod, ctx=context).by_rule()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dataflow_graphs(max_ops=14))
def test_random_elementwise_graphs_fuse_correctly(mod):
    check_fusion(mod)


# ---------------------------------------------------------------------------------------------
# the checker


def softmax_diamond():
    x = var("x", (2, 3))
    a = op.exp(x)
    b = op.nn.softmax(a)
    return Function([x], op.add(a, b))


def test_checker_accepts_fusions_partition():
    check_fusion_plan(plan(softmax_diamond()))


def test_checker_refuses_a_group_whose_inner_value_escapes():
    partition = plan(softmax_diamond())
    a, _, c = (partition.graph.node(e).index for e in _calls(partition))
    partition.root_of[a] = c  # exp joins the add, but softmax still reads it
    with pytest.raises(InvalidFusionError, match="not the root of its own group"):
        check_fusion_plan(partition)


def test_checker_refuses_groups_that_wait_on_each_other():
    partition = plan(softmax_diamond())
    a, _, c = (partition.graph.node(e).index for e in _calls(partition))
    partition.root_of[c] = a  # {exp, add} rooted at exp: exp -> softmax -> add -> ...
    with pytest.raises(InvalidFusionError, match="form a cycle"):
        check_fusion_plan(partition)


def test_checker_refuses_an_op_outside_a_primitive_function():
    with pytest.raises(InvalidFusionError, match="outside any primitive function"):
        check_fused_function(softmax_diamond())


def test_checker_refuses_a_primitive_function_with_free_variables():
    x, p = var("x", (2,)), var("p0", (2,))
    leaky = Function([p], op.add(p, x), attrs={"Primitive": 1})
    with pytest.raises(InvalidFusionError, match="does not bind: %x"):
        check_fused_function(Function([x], Call(leaky, [x])))


def _calls(partition):
    return [n.ref for n in partition.graph if isinstance(n.ref, Call)]


# ---------------------------------------------------------------------------------------------
# explanations


def two_convs_meeting():
    """Two conv2d whose results meet; the first takes the meeting add into its group."""
    x, w1, w2 = var("x", (1, 2, 5, 5)), var("w1", (2, 2, 3, 3)), var("w2", (2, 2, 3, 3))
    conv1, conv2 = op.nn.conv2d(x, w1, padding=1), op.nn.conv2d(x, w2, padding=1)
    meet = op.add(conv1, conv2)
    out = op.add(op.add(meet, op.nn.relu(conv1)), op.tanh(conv2))
    return Function([x, w1, w2], out)


def reasons(graph, **kwargs):
    return {(r.producer_name, r.consumer_name): r.reason for r in explain_fusion(graph, **kwargs)}


def test_fully_fused_graph_has_nothing_to_explain():
    report = explain_fusion(seed_example())
    assert list(report) == [] and str(report) == "every edge was fused"


def test_explains_a_path_through_another_anchors_group():
    report = explain_fusion(two_convs_meeting())
    assert [(r.producer_name, r.consumer_name, r.rule) for r in report] == [
        ("%1 nn.conv2d", "%2 add", "path"), ("%1 nn.conv2d", "%5 tanh", "path")]
    assert report[0].reason == (
        "nn.conv2d (%1) is kOutEWiseFusable and its post-dominator path passes through "
        "add (%2), whose group already holds nn.conv2d (%0) (kOutEWiseFusable > kBroadcast)")


def test_explains_an_opaque_op_and_the_way_into_it():
    x = var("x", (4, 8))
    graph = Function([x], op.nn.relu(op.nn.softmax(op.exp(x))))
    assert reasons(graph) == {
        ("%0 exp", "%1 nn.softmax"):
            "exp (%0) is kElemWise and the way to its post-dominator nn.softmax (%1) is "
            "kOpaque (kOpaque > kInjective): elementwise ops fuse only into injective or "
            "reduction consumers",
        ("%1 nn.softmax", "nn.relu (the result)"):
            "nn.softmax (%1) is kOpaque: opaque operators are never fused",
    }


def test_explains_a_conv2d_followed_by_a_pool():
    x, w = var("x", (1, 2, 6, 6)), var("w", (2, 2, 3, 3))
    graph = Function([x, w], op.nn.max_pool2d(op.nn.conv2d(x, w), pool_size=2))
    (refusal,) = explain_fusion(graph)
    assert refusal.rule == "dominator-pattern"
    assert refusal.reason.startswith(
        "nn.conv2d (%0) is kOutEWiseFusable and the way to its post-dominator nn.max_pool2d "
        "(the result) is kOutEWiseFusable, not kElemWise")


def test_explains_the_limits():
    x = var("x", (2,))
    chain = Function([x], op.tanh(op.tanh(op.tanh(x))))
    with PassContext(config={"FuseOps.max_depth": 2}):
        (refusal,) = explain_fusion(chain)
    assert refusal.rule == "max_depth"
    assert refusal.reason == (
        "fusing tanh (%1) into the group of tanh (the result) would exceed max_depth=2")
    inputs = [var(f"x{k}", (2,)) for k in range(4)]
    total = op.add(op.add(op.tanh(inputs[0]), op.tanh(inputs[1])),
                   op.add(op.tanh(inputs[2]), op.tanh(inputs[3])))
    rules = {r.rule for r in explain_fusion(Function(inputs, total), ctx=PassContext(
        config={"FuseOps.max_function_args": 3}))}
    assert "max_function_args" in rules


def test_explains_reductions_tuples_and_missing_post_dominators():
    x = var("x", (4, 8))
    summed = Function([x], op.exp(op.sum(x, axis=1)))
    assert [r.rule for r in explain_fusion(summed)] == ["reduction"]
    y, z = var("y", (2, 3)), var("z", (3, 2))
    fields = Function([y, z], Tuple([op.nn.relu(y), op.transpose(z, axes=(1, 0))]))
    assert [r.rule for r in explain_fusion(fields)] == ["tuple-root", "tuple-root"]
    y = op.add(x, const(1.0))
    apart = Function([x], Tuple([Tuple([op.exp(y)]), op.nn.relu(y)]))
    report = explain_fusion(apart)
    assert report[0].rule == "no-post-dominator"
    assert "have no common post-dominator" in report[0].reason


def test_explains_opt_level_0_and_inputs_on_request():
    report = explain_fusion(seed_example(), fuse_opt_level=0)
    assert {r.rule for r in report} == {"opt_level"}
    with_inputs = explain_fusion(seed_example(), include_inputs=True)
    assert [(r.producer_name, r.rule) for r in with_inputs] == [
        ("%x", "opaque"), ("%weight", "opaque"), ("constant (1, 3, 14, 14)", "opaque")]
    assert with_inputs[0].reason == "%x is an input of the function"


def test_report_prints_grouped_and_wrapped():
    report = explain_fusion(two_convs_meeting())
    text = str(report)
    assert text.startswith("2 edges not fused in @main:\n  %1 nn.conv2d -> %2 add: nn.conv2d")
    assert all(len(line) <= 100 for line in text.splitlines())
    assert report.by_rule() == {"path": 2}
    assert str(report[0]).startswith("%1 nn.conv2d -> %2 add: ")


# ---------------------------------------------------------------------------------------------
# drawing


def test_dot_has_one_cluster_per_fused_group():
    dot = fusion_to_dot(two_convs_meeting())
    assert dot.startswith("digraph fusion {") and dot.endswith("}")
    assert dot.count("subgraph cluster_") == 2
    assert 'label="group 0: kOutEWiseFusable, anchor %0 nn.conv2d"' in dot
    assert 'label="group 1: kOutEWiseFusable, anchor %1 nn.conv2d"' in dot
    assert dot.count("[style=dashed, color=gray50]") == 4 + 2  # from inputs, between groups
    assert dot.count("{") == dot.count("}")


def test_dot_escapes_names_from_models():
    x = var('in"put\\0', (2,))
    dot = fusion_to_dot(Function([x], op.exp(x)))
    assert 'label="%in\\"put\\\\0"' in dot


def test_dot_draws_every_function_of_a_module():
    x = var("x", (2,))
    mod = IRModule({"main": Function([x], op.exp(x)), "other": Function([x], op.tanh(x))})
    dot = fusion_to_dot(mod, include_constants=False)
    assert 'label="@main"' in dot and 'label="@other"' in dot


def test_svg_needs_the_graphviz_package():
    try:
        import graphviz  # noqa: F401
    except ImportError:
        with pytest.raises(OpfusionError, match="pip install graphviz"):
            render_fusion_svg(seed_example())
    else:  # pragma: no cover - depends on the machine
        pytest.skip("graphviz is installed")


# ---------------------------------------------------------------------------------------------
# 100,000 nodes (times are measured by benchmarks/fuse_ops_scale.py)


@pytest.fixture
def low_recursion_limit():
    # A small limit makes any recursion over graph size fail at once.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    yield
    sys.setrecursionlimit(old)


@pytest.mark.slow
@pytest.mark.parametrize("build, groups", [(chain_graph, 391), (wide_dag, 99100)],
                         ids=["chain", "wide_dag"])
def test_100k_node_graphs_fuse_without_recursion(build, groups, low_recursion_limit):
    mod = build(100_000)
    partition = plan(mod)
    assert len(partition.fused_groups()) == groups
    check_fusion_plan(partition)
    fused = fuse(mod)
    assert len(fused["main"].body.args) >= 1

