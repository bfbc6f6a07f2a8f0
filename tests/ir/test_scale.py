"""100,000-node graphs go through every IR step without hitting the recursion limit.

Timing is measured by benchmarks/ir_scale.py, not here."""

import sys

import numpy as np
import pytest

from opfusion.ir import (
    ExprMutator,
    ExprVisitor,
    evaluate,
    parse,
    post_order,
    structural_equal,
)
from opfusion.testing.examples import chain_graph, wide_dag

NODES = 100_000


class CountCalls(ExprVisitor):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def visit_call(self, call):
        self.calls += 1


class ReluToIdentity(ExprMutator):
    def visit_call(self, call):
        new = super().visit_call(call)
        return new.args[0] if new.op.name == "nn.relu" else new


@pytest.fixture(autouse=True)
def low_recursion_limit():
    # A small limit makes any recursion over graph size fail at once instead of by luck.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    yield
    sys.setrecursionlimit(old)


@pytest.mark.slow
@pytest.mark.parametrize("build", [chain_graph, wide_dag], ids=["chain", "wide_dag"])
def test_every_step_handles_100k_nodes(build):
    mod = build(NODES)
    calls = [n for n in post_order(mod["main"]) if hasattr(n, "op")]
    assert len(calls) >= NODES - 200

    counter = CountCalls()
    counter.visit(mod["main"])
    assert counter.calls == len(calls)

    text = str(mod)
    parsed = parse(text)
    assert structural_equal(parsed, mod)

    x = np.random.default_rng(0).standard_normal(4).astype(np.float32)
    want = evaluate(mod, [x])
    np.testing.assert_array_equal(evaluate(parsed, [x]), want)

    mutated = ReluToIdentity().visit(mod["main"])
    if build is chain_graph:
        # x + 1 repeated 50,000 times once the relus are gone.
        np.testing.assert_allclose(evaluate(mutated, [x]), x + NODES // 2, rtol=1e-6)
    else:
        assert mutated is mod["main"]  # nothing to rewrite: the mutator keeps every node
