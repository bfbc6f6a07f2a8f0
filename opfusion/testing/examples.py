"""Small built-in graphs used by the demo, the docs and the tests."""

from __future__ import annotations

import numpy as np

from .. import op
from ..ir.expr import Function, const, var
from ..ir.module import IRModule


def seed_example() -> IRModule:
    """The graph of seed 000: a conv2d whose result feeds both ``relu(conv + 1)`` and
    ``conv * 0.5``, which are added. x: (1, 3, 16, 16), weight: (3, 3, 3, 3)."""
    x = var("x", shape=(1, 3, 16, 16))
    weight = var("weight", shape=(3, 3, 3, 3))
    conv = op.nn.conv2d(x, weight)
    act = op.nn.relu(op.add(conv, const(np.ones((1, 3, 14, 14), np.float32))))
    out = act + op.multiply(conv, const(0.5, "float32"))
    return IRModule.from_expr(Function([x, weight], out))


def chain_graph(num_ops: int, shape: tuple[int, ...] = (4,)) -> IRModule:
    """``num_ops`` calls in one line: x -> add 1 -> relu -> add 1 -> relu ... (deep, narrow)."""
    x = var("x", shape=shape)
    one = const(np.ones(shape, np.float32))
    y = x
    for index in range(num_ops):
        y = op.add(y, one) if index % 2 == 0 else op.nn.relu(y)
    return IRModule.from_expr(Function([x], y))


def wide_dag(num_ops: int, width: int = 100, shape: tuple[int, ...] = (4,)) -> IRModule:
    """``num_ops`` calls in layers of ``width``: node i of a layer combines nodes i and i+1 of
    the layer before (wrapping), so every value has two users. The result sums the last layer
    pairwise. Wide, shallow-ish, and full of shared subexpressions."""
    x = var("x", shape=shape)
    layer = [op.multiply(x, const(np.float32(1.0 + k / width))) for k in range(width)]
    made = width
    kinds = (op.add, op.subtract, op.maximum, op.minimum)
    while made + width < num_ops:
        layer = [kinds[k % 4](layer[k], layer[(k + 1) % width]) for k in range(width)]
        made += width
    while len(layer) > 1:
        layer = [op.add(layer[k], layer[k + 1]) if k + 1 < len(layer) else layer[k]
                 for k in range(0, len(layer), 2)]
    return IRModule.from_expr(Function([x], layer[0]))
