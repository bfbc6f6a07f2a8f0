"""FusionMerge and the CINN-style policy API: views, contexts, default policies, registry,
cycle checks, limits, determinism, and fused == unfused numbers."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import opfusion as opf
from opfusion import op
from opfusion.ir import Call, Function, assert_structural_equal, evaluate, post_order
from opfusion.testing.examples import seed_example
from opfusion.testing.random_graphs import dataflow_graphs, random_inputs
from opfusion.transform import PassContext
from opfusion.transform.fusion import (
    DefaultHorizontalFusePass,
    DefaultInputFusePass,
    DefaultRecomputeFusePass,
    DefaultVerticalFusePass,
    FusionGraph,
    FusionMerge,
    FusionState,
    OpGroup,
    VerticalFusePass,
    register_fusion_policy,
    registered_policies,
    unregister_fusion_policy,
)
from opfusion.transform.fusion.policy import FuseHelper

RNG = np.random.default_rng(0)


def module(params, body):
    return opf.IRModule.from_expr(opf.Function(params, body))


def primitive(params, body):
    return Function(params, body, attrs={"Primitive": 1})


def fused_groups(mod):
    """The op names of each primitive function called from @main, in order."""
    groups = []
    for node in post_order(mod["main"].body, into_functions=False):
        if isinstance(node, Call) and isinstance(node.op, Function):
            groups.append([n.op.name for n in post_order(node.op.body)
                           if isinstance(n, Call)])
    return groups


def check_numbers(mod, fused, seed=0):
    inputs = random_inputs(mod, seed)
    want = evaluate(mod, inputs)
    got = evaluate(fused, inputs)
    if isinstance(want, tuple):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    else:
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------
# default policies, each on the graph that shows it


def test_horizontal_fusion_puts_two_siblings_in_one_kernel_with_two_outputs():
    x = opf.var("x", (4, 8))
    total = op.sum(x, axis=1)
    mod = module([x], opf.Tuple([op.exp(total), op.negative(total)]))
    fused = FusionMerge([DefaultHorizontalFusePass()])(mod)

    x2, p0, q0 = opf.var("x", (4, 8)), opf.var("p0", (4, 8)), opf.var("p0", (4,))
    reduce_call = opf.Call(primitive([p0], op.sum(p0, axis=1)), [x2])
    pair = opf.Call(primitive([q0], opf.Tuple([op.exp(q0), op.negative(q0)])), [reduce_call])
    want = module([x2], opf.Tuple([opf.TupleGetItem(pair, 0), opf.TupleGetItem(pair, 1)]))
    assert_structural_equal(fused, want)
    check_numbers(mod, fused)


def test_recompute_copies_a_cheap_producer_into_both_consumers():
    x = opf.var("x", (4, 8))
    e = op.exp(x)
    mod = module([x], opf.Tuple([op.sum(e, axis=0), op.max(e, axis=0)]))
    fused = FusionMerge()(mod)
    assert fused_groups(fused) == [["exp", "sum"], ["exp", "max"]]
    check_numbers(mod, fused)


def test_recompute_needs_every_consumer_to_take_the_producer():
    x = opf.var("x", (4, 8))
    e = op.exp(x)
    mod = module([x], opf.Tuple([op.sum(e, axis=0), op.nn.softmax(e)]))
    fused = FusionMerge([DefaultRecomputeFusePass()])(mod)
    assert fused_groups(fused) == [["exp"], ["sum"], ["nn.softmax"]]


def test_horizontal_fusion_is_refused_when_it_would_make_a_cycle():
    # s1 -> softmax -> s2 and both read p: fusing s1 with s2 would put softmax both before
    # and after the fused kernel.
    x = opf.var("x", (4, 8))
    p = op.sum(x, axis=1)
    s1 = op.exp(p)
    s2 = op.add(p, op.nn.softmax(s1))
    mod = module([x], s2)
    fused = FusionMerge([DefaultHorizontalFusePass()])(mod)
    assert fused_groups(fused) == [["sum"], ["exp"], ["nn.softmax"], ["add"]]
    check_numbers(mod, fused)

    state = FusionState(FusionGraph(mod["main"]), FusionGraph(mod["main"]).initial_groups)
    groups = {OpGroup(state, g).op_nodes[0].op_name: OpGroup(state, g)
              for g in state.alive_groups()}
    helper = FuseHelper(state)
    assert helper.detect_cycle_if_fuse(groups["exp"], groups["add"])
    assert not helper.detect_cycle_if_fuse(groups["exp"], groups["nn.softmax"])


def test_input_fusion_joins_readers_of_the_same_graph_input():
    x = opf.var("x", (4, 8))
    mod = module([x], opf.Tuple([op.exp(x), op.log(op.abs(x))]))
    fused = FusionMerge()(mod)
    assert fused_groups(fused) == [["exp", "abs", "log"]]
    check_numbers(mod, fused)


def test_vertical_fusion_gives_conv_its_epilogue_and_stops_at_the_next_conv():
    x = opf.var("x", (1, 3, 8, 8))
    w1, w2 = opf.var("w1", (4, 3, 3, 3)), opf.var("w2", (4, 4, 3, 3))
    b = opf.const(RNG.standard_normal((4, 1, 1)).astype(np.float32))
    y = op.nn.relu(op.nn.conv2d(x, w1, padding=1) + b)
    z = op.nn.relu(op.nn.conv2d(y, w2, padding=1))
    mod = module([x, w1, w2], z)
    fused = FusionMerge()(mod)
    assert fused_groups(fused) == [["nn.conv2d", "add", "nn.relu"], ["nn.conv2d", "nn.relu"]]
    check_numbers(mod, fused)


def test_elementwise_producers_do_not_go_into_a_conv():
    x = opf.var("x", (1, 3, 8, 8))
    w = opf.var("w", (4, 3, 3, 3))
    mod = module([x, w], op.nn.conv2d(op.exp(x), w))
    assert fused_groups(FusionMerge()(mod)) == [["exp"], ["nn.conv2d"]]


def test_the_seed_example_fuses_into_the_seed_group():
    fused = FusionMerge()(seed_example())
    assert fused_groups(fused) == [["nn.conv2d", "add", "nn.relu", "multiply", "add"]]
    check_numbers(seed_example(), fused)


# ---------------------------------------------------------------------------------------------
# engine: limits, determinism, starting groups


def test_max_depth_limits_group_size():
    x = opf.var("x", (4,))
    y = x
    for _ in range(10):
        y = op.exp(y)
    mod = module([x], y)
    with PassContext(config={"FuseOps.max_depth": 4}):
        groups = fused_groups(FusionMerge()(mod))
    assert all(len(g) <= 4 for g in groups) and sum(map(len, groups)) == 10
    assert len(fused_groups(FusionMerge()(mod))) == 1


@pytest.mark.parametrize("limit", [1, 4, 256])
def test_max_depth_n_holds_a_chain_of_n_ops(limit):
    def chain(length):
        x = opf.var("x", (4,))
        y = x
        for _ in range(length):
            y = op.exp(y)
        return module([x], y)

    with PassContext(config={"FuseOps.max_depth": limit}):
        assert [len(g) for g in fused_groups(FusionMerge()(chain(limit)))] == [limit]
        assert sorted(len(g) for g in fused_groups(FusionMerge()(chain(limit + 1)))) \
            == [1, limit]


def test_max_function_args_limits_inputs():
    xs = [opf.var(f"x{k}", (4,)) for k in range(6)]
    y = xs[0]
    for other in xs[1:]:
        y = op.add(y, other)
    mod = module(xs, y)
    with PassContext(config={"FuseOps.max_function_args": 3}):
        fused = FusionMerge()(mod)
    for node in post_order(fused["main"]):
        if isinstance(node, Function) and node.is_primitive:
            assert len(node.params) <= 3
    check_numbers(mod, fused)


def test_fusion_is_deterministic():
    mod = opf.testing.examples.wide_dag(300, width=10)
    first = FusionMerge()(mod).astext(show_meta_data=False)
    assert all(FusionMerge()(mod).astext(show_meta_data=False) == first for _ in range(3))


def test_groups_already_in_the_module_are_the_starting_point():
    x = opf.var("x", (4,))
    p = opf.var("p0", (4,))
    pre = opf.Call(primitive([p], op.exp(op.negative(p))), [x])
    mod = module([x], op.sum(pre))
    fused = FusionMerge([])(mod)  # no policy: the starting groups come back unchanged
    assert fused_groups(fused) == [["negative", "exp"], ["sum"]]
    assert fused_groups(FusionMerge()(mod)) == [["negative", "exp", "sum"]]
    check_numbers(mod, fused)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dataflow_graphs())
def test_fused_random_graphs_compute_the_same_numbers(mod):
    fused = FusionMerge()(mod)
    check_numbers(mod, fused, seed=4)


# ---------------------------------------------------------------------------------------------
# the API a policy writer sees


def test_views_are_read_only():
    x = opf.var("x", (2, 3))
    mod = module([x], op.exp(op.negative(x)))
    graph = FusionGraph(mod["main"])
    state = FusionState(graph, graph.initial_groups)
    group = OpGroup(state, state.alive_groups()[0])
    node = group.op_nodes[0]
    assert node.op_name == "negative" and node.kind.name == "kElemWise"
    tensor = node.inputs[0]
    assert tensor.shape == (2, 3) and tensor.shape.numel() == 6 and tensor.dtype == "float32"
    assert tensor.producer is None and tensor.consumers == (node,)
    assert group.consumers[0].op_nodes[0].op_name == "exp"
    assert isinstance(group.op_nodes, tuple) and isinstance(group.consumers, tuple)
    with pytest.raises(AttributeError):
        group.kind = None
    with pytest.raises(AttributeError):
        node.extra = 1
    seen = []
    group.walk_op_nodes(lambda n: seen.append(n.op_name))
    assert seen == ["negative"]


def test_op_node_reads_attributes():
    x = opf.var("x", (2, 3))
    mod = module([x], op.sum(x, axis=1, keepdims=True))
    graph = FusionGraph(mod["main"])
    state = FusionState(graph, graph.initial_groups)
    node = OpGroup(state, state.alive_groups()[0]).op_nodes[0]
    assert node.attr("axis") == (1,) and node.attr("keepdims") is True
    assert node.attr("no_such_attr", "dflt") == "dflt"


class FuseAnyChain(VerticalFusePass):
    """Fuse a producer into its only consumer whatever their kinds (ignores the rules)."""

    def benefit(self) -> int:
        return 99

    def __call__(self, ctx) -> None:
        producer = ctx.pick_op_group()
        if len(producer.consumers) == 1:
            ctx.mark_fusible(producer, producer.consumers[0])


def test_a_registered_policy_changes_the_default_partition():
    x = opf.var("x", (4, 8))
    mod = module([x], op.exp(op.nn.softmax(x)))
    assert fused_groups(FusionMerge()(mod)) == [["nn.softmax"], ["exp"]]
    policy = register_fusion_policy(FuseAnyChain())
    try:
        assert registered_policies()[0] is policy
        fused = FusionMerge()(mod)
        assert fused_groups(fused) == [["nn.softmax", "exp"]]
        check_numbers(mod, fused)
    finally:
        unregister_fusion_policy(policy)
    assert fused_groups(FusionMerge()(mod)) == [["nn.softmax"], ["exp"]]


def test_priority_orders_policies_and_defaults_are_registered():
    names = [type(p).__name__ for p in registered_policies()]
    assert names[:4] == ["DefaultVerticalFusePass", "DefaultRecomputeFusePass",
                         "DefaultHorizontalFusePass", "DefaultInputFusePass"]
    low = register_fusion_policy(FuseAnyChain(), priority=-5)
    try:
        assert registered_policies()[-1] is low
    finally:
        unregister_fusion_policy(low)


def test_bad_policies_are_rejected_with_a_hint():
    with pytest.raises(opf.OpfusionError, match="subclass VerticalFusePass"):
        register_fusion_policy(lambda ctx: None)
    with pytest.raises(opf.OpfusionError, match="FusionMerge takes FusePolicy"):
        FusionMerge([object()])


def test_default_policies_are_importable_by_name():
    for cls in (DefaultVerticalFusePass, DefaultRecomputeFusePass, DefaultHorizontalFusePass,
                DefaultInputFusePass):
        assert cls().benefit() > 0
