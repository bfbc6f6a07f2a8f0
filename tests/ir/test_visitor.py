"""Traversals: order, memoization, sharing — and no recursion over graph size."""

import numpy as np

import opfusion as opf
from opfusion.ir import Call, ExprMutator, ExprVisitor, Var, free_vars, post_order


def _diamond():
    x = opf.var("x", (2,))
    shared = opf.op.exp(x)
    return x, shared, opf.op.add(opf.op.nn.relu(shared), opf.op.negative(shared))


def test_post_order_lists_each_node_once_after_its_operands():
    x, shared, out = _diamond()
    order = post_order(out)
    assert len(order) == 5 and order[0] is x and order[1] is shared and order[-1] is out
    position = {node: i for i, node in enumerate(order)}
    for node in order:
        if isinstance(node, Call):
            assert all(position[arg] < position[node] for arg in node.args)


def test_post_order_can_treat_functions_as_leaves():
    p = opf.var("p", (2,))
    inner = opf.Function([p], opf.op.exp(p))
    x = opf.var("x", (2,))
    call = inner(x)
    assert post_order(call, into_functions=False) == [x, call]
    assert len(post_order(call)) == 5


def test_visitor_visits_a_shared_node_once():
    _, _, out = _diamond()
    seen = []

    class Names(ExprVisitor):
        def visit_call(self, call):
            seen.append(call.op.name)

    Names().visit(out)
    assert seen == ["exp", "nn.relu", "negative", "add"]


def test_mutator_keeps_sharing_and_unchanged_nodes():
    x, shared, out = _diamond()

    class ExpToSigmoid(ExprMutator):
        def visit_call(self, call):
            new = super().visit_call(call)
            if new.op.name == "exp":
                return opf.op.sigmoid(self.visit(call.args[0]))
            return new

    new = ExpToSigmoid().visit(out)
    left, right = new.args[0].args[0], new.args[1].args[0]
    assert left is right and left.op.name == "sigmoid"
    assert new.args[0].args[0].args[0] is x
    assert ExprMutator().visit(out) is out


def test_free_vars_skip_function_parameters():
    p = opf.var("p", (2,))
    inner = opf.Function([p], opf.op.exp(p))
    x = opf.var("x", (2,))
    assert free_vars(inner(x)) == [x]


def _chain(n):
    x = opf.var("x", (4,))
    y = x
    for _ in range(n):
        y = opf.op.add(y, opf.const(np.float32(1)))
    return x, y


def test_deep_chain_visit_mutate_and_infer_without_recursion():
    x, y = _chain(20000)
    assert len(post_order(y)) == 2 * 20000 + 1
    assert y.checked_type.shape == (4,)

    class Count(ExprVisitor):
        calls = 0

        def visit_call(self, call):
            Count.calls += 1

    Count().visit(y)
    assert Count.calls == 20000

    class AddToSub(ExprMutator):
        def visit_call(self, call):
            return opf.op.subtract(*[self.visit(a) for a in call.args])

    new = AddToSub().visit(y)
    assert new.op.name == "subtract"
    got = opf.ir.evaluate(opf.Function([x], new), [np.zeros(4, np.float32)])
    np.testing.assert_array_equal(got, np.full(4, -20000, np.float32))


def test_mutator_can_rename_parameters():
    x = opf.var("x", (2,))
    f = opf.Function([x], opf.op.exp(x))

    class Rename(ExprMutator):
        def visit_var(self, var):
            return Var("renamed", var.type_annotation)

    new = Rename().visit(f)
    assert new.params[0].name_hint == "renamed" and new.body.args[0] is new.params[0]
