"""FuseOps on the classic cases of TVM's operator fusion: what is fused with what, and why.

Every graph here is also checked to compute the same numbers fused as unfused, to give a
partition without cycles between groups, and to come out unchanged when fused again
(``test_every_graph_*`` at the end)."""

import numpy as np
import pytest
from fuse_helpers import (
    assert_fuses_to,
    check_fusion,
    fuse,
    group_sizes,
    main,
    plan,
    primitive,
)

from opfusion import op
from opfusion.errors import OpfusionError
from opfusion.ir import (
    Call,
    Function,
    IRModule,
    Tuple,
    TupleGetItem,
    assert_structural_equal,
    const,
    post_order,
    structural_equal,
    var,
)
from opfusion.testing.examples import seed_example
from opfusion.transform import PassContext, Sequential, get_pass
from opfusion.transform.fuse_ops import FuseOps

# ---------------------------------------------------------------------------------------------
# the graphs (each returns the unfused function)


def conv_epilogue():
    """conv2d followed by its elementwise epilogue: bias, relu, a scale."""
    x, w, b = var("x", (1, 3, 8, 8)), var("w", (4, 3, 3, 3)), var("b", (4,))
    y = op.nn.relu(op.nn.bias_add(op.nn.conv2d(x, w, padding=1), b))
    return Function([x, w, b], op.multiply(y, const(0.5)))


def elementwise_diamond():
    """An exp feeding two branches (one of them injective) that meet again."""
    x = var("x", (4, 8))
    y = op.exp(x)
    left = op.nn.relu(op.add(y, const(1.0)))
    right = op.tanh(op.transpose(op.transpose(y, axes=(1, 0)), axes=(1, 0)))
    return Function([x], op.subtract(left, right))


def conv_diamond_with_injective_branch():
    """conv2d whose two branches meet again, but one branch is injective (a transpose)."""
    x, w = var("x", (1, 2, 6, 6)), var("w", (2, 2, 3, 3))
    conv = op.nn.conv2d(x, w)
    twisted = op.transpose(conv, axes=(0, 1, 3, 2))
    return Function([x, w], op.add(op.nn.relu(conv), twisted))


def two_convs():
    """Two conv2d + relu in sequence."""
    x, w1, w2 = var("x", (1, 4, 8, 8)), var("w1", (4, 4, 3, 3)), var("w2", (4, 4, 3, 3))
    y = op.nn.relu(op.nn.conv2d(x, w1, padding=1))
    return Function([x, w1, w2], op.nn.relu(op.nn.conv2d(y, w2, padding=1)))


def convs_with_shared_input():
    """TVM's conv2d case: add -> conv2d (+ two adds), whose result feeds two conv2d that an
    add joins; the add can only go with one of them."""
    x = var("x", (1, 4, 6, 6))
    w1, w2, w3 = var("w1", (4, 4, 3, 3)), var("w2", (4, 4, 1, 1)), var("w3", (4, 4, 3, 3))
    y = op.nn.conv2d(op.add(x, const(1.0)), w1, padding=1)
    y = op.add(y, op.add(const(1.0), y))
    z = op.add(op.nn.conv2d(y, w2), op.nn.conv2d(y, w3, padding=1))
    return Function([x, w1, w2, w3], z)


def concatenates_in_a_row():
    """TVM's consecutive-tuple case: three concatenates of adds, concatenated, then a pool."""
    x = var("x", (1, 2, 4, 4))

    def block():
        joined = op.concatenate(Tuple([op.add(x, const(1.0)) for _ in range(3)]), axis=1)
        return op.add(joined, const(1.0))

    pooled = op.nn.max_pool2d(op.concatenate(Tuple([block() for _ in range(3)]), axis=1),
                              pool_size=2, strides=2)
    out = op.add(pooled, const(1.0))
    return Function([x], Tuple([out, op.add(out, const(1.0))]))


def injective_chain():
    """reshape -> transpose -> strided_slice."""
    x = var("x", (2, 3, 4))
    y = op.transpose(op.reshape(x, newshape=(6, 4)), axes=(1, 0))
    return Function([x], op.strided_slice(y, begin=(0, 1), end=(4, 5)))


def injective_and_elementwise_chain():
    """exp -> reshape -> multiply -> transpose -> relu."""
    x = var("x", (2, 3, 4))
    y = op.multiply(op.reshape(op.exp(x), newshape=(6, 4)), const(2.0))
    return Function([x], op.nn.relu(op.transpose(y, axes=(1, 0))))


def reshape_into_conv():
    """An injective op whose consumer is a conv2d."""
    x, w = var("x", (1, 32)), var("w", (2, 2, 3, 3))
    return Function([x, w], op.nn.conv2d(op.reshape(x, newshape=(1, 2, 4, 4)), w))


def pool_resize_concatenate():
    """TVM's concatenate case: a pooled, resized branch concatenated with the input."""
    x = var("x", (1, 4, 8, 8))
    pooled = op.nn.max_pool2d(x, pool_size=2, strides=2)
    resized = op.image.resize2d(pooled, size=(8, 8), method="nearest_neighbor")
    return Function([x], op.add(op.concatenate(Tuple([resized, x]), axis=1), const(1.0)))


def tuple_in_the_middle():
    """Injective and elementwise branches joined by a concatenate, then more injective ops."""
    x = var("x", (1, 4, 3, 3))
    inj = op.squeeze(x, axis=(0,))
    y1 = op.add(inj, const(1.0))
    y2 = op.add(op.add(op.transpose(inj, axes=(0, 2, 1)), const(1.0)), const(1.0))
    y3 = op.add(inj, const(1.0))
    joined = op.concatenate(Tuple([y1, y2, y3]), axis=1)
    return Function([x], op.add(op.reshape(joined, newshape=(4, 27)), const(1.0)))


def inception_like():
    """Two conv2d + relu branches concatenated, twice."""
    x = var("x", (1, 2, 6, 6))
    weights = [var(f"w{k}", (2, 2 if k < 2 else 4, 3, 3)) for k in range(4)]

    def block(data, w_a, w_b):
        a = op.nn.relu(op.nn.conv2d(data, w_a, padding=1))
        b = op.nn.relu(op.nn.conv2d(data, w_b, padding=1))
        return op.concatenate(Tuple([a, b]), axis=1)

    return Function([x, *weights], block(block(x, *weights[:2]), *weights[2:]))


def field_joins_fused_tuple():
    """A transpose and a relu feeding a concatenate that is fused with its consumer (phase 2)."""
    x, y = var("x", (2, 3)), var("y", (3, 2))
    joined = op.concatenate(Tuple([op.nn.relu(x), op.transpose(y, axes=(1, 0))]), axis=0)
    return Function([x, y], op.exp(joined))


def field_of_output_tuple():
    """The same fields in a tuple that is the function's result: nothing joins it."""
    x, y = var("x", (2, 3)), var("y", (3, 2))
    return Function([x, y], Tuple([op.nn.relu(x), op.transpose(y, axes=(1, 0))]))


def elementwise_into_reductions():
    """multiply -> exp -> sum(axis 1) -> add; abs -> mean(axis 0)."""
    x = var("x", (4, 8))
    summed = op.add(op.sum(op.exp(op.multiply(x, const(2.0))), axis=1), const(1.0))
    averaged = op.mean(op.abs(x), axis=0)
    return Function([x], Tuple([summed, averaged]))


def softmax_in_the_middle():
    """exp -> softmax -> add -> relu: the opaque softmax stands alone."""
    x = var("x", (4, 8))
    y = op.nn.softmax(op.exp(x))
    return Function([x], op.nn.relu(op.add(y, const(1.0))))


def branches_meet_at_output():
    """A value whose two consumers only meet in the output tuple."""
    x = var("x", (4, 8))
    y = op.add(x, const(1.0))
    return Function([x], Tuple([op.exp(y), op.sqrt(op.abs(y))]))


def no_common_post_dominator():
    """A value whose consumers never meet: one of them ends in a nested output tuple."""
    x = var("x", (4, 8))
    y = op.add(x, const(1.0))
    return Function([x], Tuple([Tuple([op.exp(y)]), op.nn.relu(y)]))


def split_feeding_opaque_ops():
    """exp -> split, each part into its own softmax: the group returns split's tuple."""
    x = var("x", (4, 6))
    parts = op.split(op.exp(x), indices_or_sections=2, axis=1)
    a = op.nn.softmax(TupleGetItem(parts, 0))
    b = op.nn.softmax(TupleGetItem(parts, 1))
    return Function([x], Tuple([a, b]))


def split_part_into_dense():
    """TVM's tuple-access root: split -> .0 -> dense."""
    x, w = var("x", (1, 30)), var("w", (10, 10))
    parts = op.split(x, indices_or_sections=3, axis=1)
    return Function([x, w], op.nn.dense(TupleGetItem(parts, 0), w))


def dense_split_elementwise():
    """TVM's tuple-access case: dense -> split -> sigmoid/tanh/exp of the parts -> combined."""
    x, w = var("x", (1, 10)), var("w", (30, 10))
    parts = op.split(op.nn.dense(x, w), indices_or_sections=3, axis=1)
    first, second, third = (TupleGetItem(parts, k) for k in range(3))
    return Function([x, w], op.add(op.sigmoid(first),
                                   op.multiply(op.tanh(second), op.exp(third))))


def tanh_chain(length=20):
    x = var("x", (2, 3))
    y = x
    for _ in range(length):
        y = op.tanh(y)
    return Function([x], y)


def diamonds(count=3, branch=5):
    """``count`` diamonds in a row, each two chains of ``branch`` ops joined by an add."""
    x = var("x", (2, 3))
    out = x
    for _ in range(count):
        a = b = out
        for _ in range(branch):
            a, b = op.tanh(a), op.sigmoid(b)
        out = op.add(a, b)
    return Function([x], out)


def many_inputs_summed(count=12):
    """TVM's argument-limit case: tanh(x_i + 1) for ``count`` inputs, summed in a chain."""
    inputs = [var(f"x{k}", (2, 3)) for k in range(count)]
    terms = [op.tanh(op.add(x, const(1.0))) for x in inputs]
    total = terms[0]
    for term in terms[1:]:
        total = op.add(total, term)
    return Function(inputs, total)


def concatenate_then_take():
    """TVM's take case: concatenate of an input with itself, then take with constant indices."""
    x = var("x", (10, 1))
    joined = op.concatenate(Tuple([x, x]), axis=-1)
    return Function([x], op.take(joined, const(np.array([0], np.int64))))


GRAPHS = {
    "seed_example": lambda: seed_example()["main"],
    "conv_epilogue": conv_epilogue,
    "elementwise_diamond": elementwise_diamond,
    "conv_diamond_with_injective_branch": conv_diamond_with_injective_branch,
    "two_convs": two_convs,
    "convs_with_shared_input": convs_with_shared_input,
    "concatenates_in_a_row": concatenates_in_a_row,
    "injective_chain": injective_chain,
    "injective_and_elementwise_chain": injective_and_elementwise_chain,
    "reshape_into_conv": reshape_into_conv,
    "pool_resize_concatenate": pool_resize_concatenate,
    "tuple_in_the_middle": tuple_in_the_middle,
    "inception_like": inception_like,
    "field_joins_fused_tuple": field_joins_fused_tuple,
    "field_of_output_tuple": field_of_output_tuple,
    "elementwise_into_reductions": elementwise_into_reductions,
    "softmax_in_the_middle": softmax_in_the_middle,
    "branches_meet_at_output": branches_meet_at_output,
    "no_common_post_dominator": no_common_post_dominator,
    "split_feeding_opaque_ops": split_feeding_opaque_ops,
    "split_part_into_dense": split_part_into_dense,
    "dense_split_elementwise": dense_split_elementwise,
    "tanh_chain": tanh_chain,
    "diamonds": diamonds,
    "many_inputs_summed": many_inputs_summed,
    "concatenate_then_take": concatenate_then_take,
}


# ---------------------------------------------------------------------------------------------
# the seed example


def seed_fused_module() -> IRModule:
    """The fused module seed 000 prints: one function holding conv2d, add, relu, multiply
    and add, called with (%x, %weight, <the constant>)."""
    p0, p1, p2 = var("p0", (1, 3, 16, 16)), var("p1", (3, 3, 3, 3)), var("p2", (1, 3, 14, 14))
    conv = op.nn.conv2d(p0, p1)
    fused = primitive([p0, p1, p2], op.add(op.nn.relu(op.add(conv, p2)),
                                           op.multiply(conv, const(0.5))))
    x, weight = var("x", (1, 3, 16, 16)), var("weight", (3, 3, 3, 3))
    return main([x, weight], Call(fused, [x, weight, const(np.ones((1, 3, 14, 14), "float32"))]))


def test_seed_example_becomes_the_seeds_single_primitive_function():
    assert_fuses_to(seed_example(), seed_fused_module())


def test_seed_example_prints_as_the_seed_shows():
    text = fuse(seed_example()).astext(show_meta_data=False)
    assert "%p2: Tensor[(1, 3, 14, 14), float32], Primitive=1)" in text
    assert "%0(%x, %weight, meta[Constant][0])" in text


# ---------------------------------------------------------------------------------------------
# kOutEWiseFusable ops and their epilogues


def test_conv2d_takes_its_elementwise_epilogue():
    p = [var("p0", (1, 3, 8, 8)), var("p1", (4, 3, 3, 3)), var("p2", (4,))]
    body = op.multiply(op.nn.relu(op.nn.bias_add(op.nn.conv2d(p[0], p[1], padding=1), p[2])),
                       const(0.5))
    x, w, b = var("x", (1, 3, 8, 8)), var("w", (4, 3, 3, 3)), var("b", (4,))
    assert_fuses_to(conv_epilogue(), main([x, w, b], Call(primitive(p, body), [x, w, b])))


def test_diamond_of_elementwise_and_injective_branches_is_one_group():
    p0 = var("p0", (4, 8))
    y = op.exp(p0)
    body = op.subtract(op.nn.relu(op.add(y, const(1.0))),
                       op.tanh(op.transpose(op.transpose(y, axes=(1, 0)), axes=(1, 0))))
    x = var("x", (4, 8))
    assert_fuses_to(elementwise_diamond(), main([x], Call(primitive([p0], body), [x])))


def test_conv2d_stays_alone_when_a_branch_to_its_post_dominator_is_injective():
    a, b = var("p0", (1, 2, 6, 6)), var("p1", (2, 2, 3, 3))
    conv_fn = primitive([a, b], op.nn.conv2d(a, b))
    c = var("p0", (1, 2, 4, 4))
    tail_fn = primitive([c], op.add(op.nn.relu(c), op.transpose(c, axes=(0, 1, 3, 2))))
    x, w = var("x", (1, 2, 6, 6)), var("w", (2, 2, 3, 3))
    # one parameter for the conv2d's result although two ops of the group read it
    assert_fuses_to(conv_diamond_with_injective_branch(),
                    main([x, w], Call(tail_fn, [Call(conv_fn, [x, w])])))


def test_second_conv2d_starts_a_new_group():
    def conv_relu():
        a, b = var("p0", (1, 4, 8, 8)), var("p1", (4, 4, 3, 3))
        return primitive([a, b], op.nn.relu(op.nn.conv2d(a, b, padding=1)))

    x, w1, w2 = var("x", (1, 4, 8, 8)), var("w1", (4, 4, 3, 3)), var("w2", (4, 4, 3, 3))
    first = Call(conv_relu(), [x, w1])
    assert_fuses_to(two_convs(), main([x, w1, w2], Call(conv_relu(), [first, w2])))


def test_add_joining_two_conv2d_goes_with_the_second():
    # add | conv2d + add + add | conv2d (3x3) | conv2d (1x1) + the final add
    assert group_sizes(convs_with_shared_input()) == [1, 3, 1, 2]
    fused = check_fusion(convs_with_shared_input())
    last = fused["main"].body
    assert [a.name_hint for a in last.op.params] == ["p0", "p1", "p2"]
    assert last.args[1].name_hint == "w2"  # the 1x1 conv2d takes the add


# ---------------------------------------------------------------------------------------------
# injective ops


def test_injective_chain_is_one_group():
    assert group_sizes(injective_chain()) == [3]
    check_fusion(injective_chain())


def test_injective_ops_mix_with_elementwise_ops():
    assert group_sizes(injective_and_elementwise_chain()) == [5]
    check_fusion(injective_and_elementwise_chain())


def test_injective_op_does_not_fuse_into_conv2d():
    assert group_sizes(reshape_into_conv()) == [1, 1]
    check_fusion(reshape_into_conv())


def test_parallel_injective_branches_fuse_into_their_elementwise_consumer():
    x = var("x", (10, 20))
    y = op.add(x, const(1.0))
    graph = Function([x], op.add(op.squeeze(y), op.transpose(y, axes=(0, 1))))
    assert group_sizes(graph) == [4]


# ---------------------------------------------------------------------------------------------
# tuples and concatenate (phases 1 and 2)


def test_concatenate_takes_its_tuple_and_injective_inputs():
    x = var("x", (1, 4, 8, 8))
    a = var("p0", (1, 4, 8, 8))
    pool_fn = primitive([a], op.nn.max_pool2d(a, pool_size=2, strides=2))
    b, c = var("p0", (1, 4, 4, 4)), var("p1", (1, 4, 8, 8))
    resized = op.image.resize2d(b, size=(8, 8), method="nearest_neighbor")
    concat_fn = primitive([b, c], op.add(op.concatenate(Tuple([resized, c]), axis=1),
                                         const(1.0)))
    expected = main([x], Call(concat_fn, [Call(pool_fn, [x]), x]))
    assert_fuses_to(pool_resize_concatenate(), expected)


def test_tuple_between_injective_ops_fuses_everything():
    assert len(plan(tuple_in_the_middle()).fused_groups()) == 1
    check_fusion(tuple_in_the_middle())


def test_concatenates_in_a_row_are_one_group_before_the_pool():
    assert group_sizes(concatenates_in_a_row()) == [16, 2, 1]
    check_fusion(concatenates_in_a_row())


def test_concatenate_of_two_conv_groups_stays_apart():
    sizes = group_sizes(inception_like())
    assert sizes == [2, 2, 1, 2, 2, 1]  # conv+relu, conv+relu, concatenate, ... twice
    check_fusion(inception_like())


def test_injective_field_joins_a_tuple_already_fused_with_its_consumer_in_phase_2():
    partition = plan(field_joins_fused_tuple(), explain=True)
    assert [group.num_ops for group in partition.fused_groups()] == [4]
    transpose = partition.graph.node(field_joins_fused_tuple_transpose(partition)).index
    assert transpose not in partition.refusals  # fused, in the last phase


def field_joins_fused_tuple_transpose(partition):
    return next(node.ref for node in partition.graph
                if isinstance(node.ref, Call) and node.ref.op_name == "transpose")


def test_fields_of_the_output_tuple_stay_in_their_own_groups():
    assert group_sizes(field_of_output_tuple()) == [1, 1]
    fused = check_fusion(field_of_output_tuple())
    assert isinstance(fused["main"].body, Tuple)  # the root tuple stays outside


# ---------------------------------------------------------------------------------------------
# reductions and opaque ops


def test_reduction_takes_its_elementwise_producers_but_nothing_after_it():
    assert group_sizes(elementwise_into_reductions()) == [3, 1, 2]
    check_fusion(elementwise_into_reductions())


def test_scalar_comparison_fuses_into_a_reduction():
    x = var("x", (), "int32")
    graph = Function([x], op.sum(op.multiply(x, const(3))))
    assert group_sizes(graph) == [2]
    check_fusion(graph)


def test_softmax_stops_fusion_on_both_sides():
    x, p, q, r = var("x", (4, 8)), var("p0", (4, 8)), var("p0", (4, 8)), var("p0", (4, 8))
    exp_fn = primitive([p], op.exp(p))
    softmax_fn = primitive([q], op.nn.softmax(q))
    tail_fn = primitive([r], op.nn.relu(op.add(r, const(1.0))))
    expected = main([x], Call(tail_fn, [Call(softmax_fn, [Call(exp_fn, [x])])]))
    assert_fuses_to(softmax_in_the_middle(), expected)


@pytest.mark.parametrize("opaque", [
    lambda y: op.nn.lrn(y, size=3),
    lambda y: op.cumsum(y, axis=1),
    lambda y: op.sort(y, axis=1),
], ids=["lrn", "cumsum", "sort"])
def test_other_opaque_ops_stand_alone(opaque):
    x = var("x", (1, 4, 3, 3))
    graph = Function([x], op.exp(opaque(op.abs(x))))
    assert group_sizes(graph) == [1, 1, 1]
    check_fusion(graph)


# ---------------------------------------------------------------------------------------------
# post-dominators that are far away or missing


def test_value_whose_consumers_meet_only_at_the_output_is_not_fused():
    assert group_sizes(branches_meet_at_output()) == [1, 1, 2]
    check_fusion(branches_meet_at_output())


def test_value_without_a_common_post_dominator_is_not_fused():
    partition = plan(no_common_post_dominator())
    add = next(n for n in partition.graph if isinstance(n.ref, Call) and n.ref.op_name == "add")
    assert partition.tree.parent[add.index] == -1
    assert group_sizes(no_common_post_dominator()) == [1, 1, 1]
    check_fusion(no_common_post_dominator())


# ---------------------------------------------------------------------------------------------
# multiple outputs and tuple-returning groups


def test_group_rooted_at_split_returns_its_tuple():
    x = var("x", (4, 6))
    p = var("p0", (4, 6))
    split_fn = primitive([p], op.split(op.exp(p), indices_or_sections=2, axis=1))
    parts = Call(split_fn, [x])
    softmax_fns = []
    for k in range(2):
        q = var("p0", (4, 3))
        softmax_fns.append(Call(primitive([q], op.nn.softmax(q)), [TupleGetItem(parts, k)]))
    assert_fuses_to(split_feeding_opaque_ops(), main([x], Tuple(softmax_fns)))


def test_group_rooted_at_a_tuple_access_returns_that_field():
    x, w = var("x", (1, 30)), var("w", (10, 10))
    p = var("p0", (1, 30))
    split_fn = primitive([p], TupleGetItem(op.split(p, indices_or_sections=3, axis=1), 0))
    a, b = var("p0", (1, 10)), var("p1", (10, 10))
    dense_fn = primitive([a, b], op.nn.dense(a, b))
    assert_fuses_to(split_part_into_dense(),
                    main([x, w], Call(dense_fn, [Call(split_fn, [x]), w])))


def test_tuple_accesses_fuse_with_the_split_and_its_elementwise_consumers():
    assert group_sizes(dense_split_elementwise()) == [1, 6]  # dense | split + 5 ops
    check_fusion(dense_split_elementwise())


def test_function_with_two_results_keeps_its_output_tuple():
    fused = check_fusion(elementwise_into_reductions())
    body = fused["main"].body
    assert isinstance(body, Tuple) and all(isinstance(f, Call) for f in body.fields)


# ---------------------------------------------------------------------------------------------
# limits


def test_max_depth_splits_a_long_chain():
    assert group_sizes(tanh_chain(20), max_depth=10) == [10, 10]
    check_fusion(tanh_chain(20), max_depth=10)


def test_default_max_depth_is_256_ops():
    assert group_sizes(tanh_chain(300)) == [256, 44]


@pytest.mark.parametrize("limit", [1, 2, 7, 256])
def test_max_depth_n_holds_a_chain_of_n_elementwise_ops(limit):
    # TVM's count: max_fuse_depth=N allows a group of N operators, not N - 1.
    assert group_sizes(tanh_chain(limit), max_depth=limit) == [limit]
    assert group_sizes(tanh_chain(limit + 1), max_depth=limit) == [limit, 1]
    check_fusion(tanh_chain(limit + 1), max_depth=limit)


def test_max_depth_keeps_whole_diamonds_together():
    assert group_sizes(diamonds(), max_depth=11) == [11, 11, 11]
    check_fusion(diamonds(), max_depth=11)


@pytest.mark.parametrize("limit, first", [(5, 4), (8, 7)])
def test_max_function_args_caps_the_inputs_of_a_group(limit, first):
    # As TVM: the first group takes limit-1 inputs (one slot is the output); every later
    # term is a group of its own, added to the running sum by a group of one add.
    sizes = group_sizes(many_inputs_summed(12), max_function_args=limit)
    assert sizes[0] == 2 * first + first - 1
    assert sizes[1:] == [2, 1] * (12 - first)
    check_fusion(many_inputs_summed(12), max_function_args=limit)


def test_without_max_function_args_everything_is_one_group():
    assert group_sizes(many_inputs_summed(12)) == [35]


def test_link_params_keeps_constants_inside_the_function():
    x = var("x", (10, 1))
    indices = const(np.array([0], np.int64))

    def expected(linked):
        p0, p1 = var("p0", (10, 1)), var("p1", (1,), "int64")
        body = op.take(op.concatenate(Tuple([p0, p0]), axis=-1), indices if linked else p1)
        fn = primitive([p0] if linked else [p0, p1], body)
        return main([x], Call(fn, [x] if linked else [x, indices]))

    assert_fuses_to(concatenate_then_take(), expected(False))
    assert_fuses_to(concatenate_then_take(), expected(True), link_params=True)


# ---------------------------------------------------------------------------------------------
# optimization level, re-fusion, the pass itself


def test_opt_level_0_wraps_every_op_alone():
    fused = check_fusion(seed_example(), opt_level=0)
    calls = [n for n in _outer_calls(fused["main"]) if n.op.is_primitive]
    assert [len(_op_calls(call.op)) for call in calls] == [1, 1, 1, 1, 1]


def test_fuse_opt_level_overrides_the_context():
    with PassContext(opt_level=3):
        fused = FuseOps(fuse_opt_level=0)(seed_example())
    assert len(_outer_calls(fused["main"])) == 5
    with PassContext(opt_level=0):
        assert len(_outer_calls(FuseOps()(seed_example())["main"])) == 5
        assert len(_outer_calls(FuseOps(fuse_opt_level=1)(seed_example())["main"])) == 1


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_fusing_a_fused_module_changes_nothing(name):
    once = fuse(GRAPHS[name]())
    twice = fuse(once)
    assert_structural_equal(twice, once)


def test_existing_primitive_functions_are_left_alone():
    x = var("x", (4,))
    p = var("p0", (4,))
    kernel = primitive([p], op.exp(p))
    graph = Function([x], op.nn.relu(Call(kernel, [x])))
    fused = check_fusion(graph)
    inner = fused["main"].body.args[0]
    assert inner.op is kernel


def test_every_global_function_is_fused_but_primitive_ones():
    x = var("x", (4,))
    p = var("p0", (4,))
    kernel = primitive([p], op.exp(op.exp(p)))
    mod = IRModule({"main": Function([x], op.exp(op.exp(x))), "helper": kernel})
    fused = fuse(mod)
    assert fused["helper"] is kernel
    assert len(_outer_calls(fused["main"])) == 1


def test_input_module_is_not_changed():
    mod = seed_example()
    before = mod.astext()
    fuse(mod)
    assert mod.astext() == before


def test_pass_is_registered_like_tvms():
    made = FuseOps()
    assert (made.info.name, made.info.opt_level, made.info.required) == \
        ("FuseOps", 0, ("InferType",))
    assert get_pass("FuseOps").info.name == "FuseOps"
    with PassContext(opt_level=3):
        fused = Sequential([FuseOps()])(seed_example())
    assert structural_equal(fused, seed_fused_module())


@pytest.mark.parametrize("bad", [-2, 1.5, True, "2"])
def test_bad_fuse_opt_level_is_refused(bad):
    with pytest.raises(OpfusionError, match="fuse_opt_level"):
        FuseOps(fuse_opt_level=bad)


def test_bad_limits_are_refused():
    with pytest.raises(OpfusionError, match="FuseOps.max_depth"):
        PassContext(config={"FuseOps.max_depth": "deep"})
    with pytest.raises(OpfusionError, match=">= 0"):
        fuse(seed_example(), max_function_args=-1)


# ---------------------------------------------------------------------------------------------
# every graph: same numbers, no cycle between groups, at every optimization level


@pytest.mark.parametrize("name", sorted(GRAPHS))
@pytest.mark.parametrize("opt_level", [0, 2])
def test_every_graph_fuses_into_acyclic_groups_with_the_same_numbers(name, opt_level):
    check_fusion(GRAPHS[name](), opt_level=opt_level)


@pytest.mark.parametrize("name", ["tanh_chain", "diamonds", "many_inputs_summed",
                                  "tuple_in_the_middle", "inception_like"])
@pytest.mark.parametrize("config", [{"max_depth": 3}, {"max_function_args": 4},
                                    {"link_params": True}])
def test_every_graph_stays_correct_under_tight_limits(name, config):
    check_fusion(GRAPHS[name](), **config)


def _outer_calls(func: Function) -> list[Call]:
    return [n for n in post_order(func.body, into_functions=False)
            if isinstance(n, Call) and isinstance(n.op, Function)]


def _op_calls(func: Function) -> list[Call]:
    return [n for n in post_order(func.body) if isinstance(n, Call) and n.op_name]


def test_nested_function_is_fused_on_its_own():
    x, y = var("x", (2, 3)), var("y", (2, 3))
    inner = Function([y], op.nn.relu(op.exp(y)))
    graph = Function([x], op.tanh(Call(inner, [op.negative(x)])))
    fused = check_fusion(graph)
    outer = _outer_calls(fused["main"])
    nested = next(call.op for call in outer if not call.op.is_primitive)
    assert [len(_op_calls(call.op)) for call in _outer_calls(nested)] == [2]
    assert sum(1 for call in outer if call.op.is_primitive) == 2  # negative | tanh
