"""Turn a grouping of a function's ops into primitive functions, one per group.

Each group becomes ``fn (%p0, %p1, ..., Primitive=1) { ... }`` called with the values it reads
(parameters numbered in first-use order). A group with several outputs (horizontal or input
fusion) returns them as a tuple and its users read fields of the call. Constants become
parameters, except scalars and, with ``link_params``, all constants, which stay inside.
Groups made only of tuples, projections and calls of non-operators are not wrapped."""

from __future__ import annotations

from collections.abc import Sequence

from ...ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ...ir.op import Op
from .graph import FusionGraph


def rewrite_groups(graph: FusionGraph, groups: Sequence[Sequence[int]],
                   link_params: bool = False) -> Function:
    """The function of ``graph`` with each group (node indices; groups in topological order)
    wrapped into a primitive function."""
    value: dict[int, Expr] = {t.index: t.expr for t in graph.tensors if t.producer is None}
    for members in groups:
        nodes = sorted(members)
        if not any(_is_op_call(graph.nodes[n].expr) for n in nodes):
            for n in nodes:
                node = graph.nodes[n]
                value[node.output] = _rebuild(node.expr, [value[t] for t in node.inputs])
            continue
        _emit_group(graph, nodes, value, link_params)
    body = value[graph.output_tensor]
    func = graph.func
    return Function(func.params, body, func.ret_type, func.attrs)


def _emit_group(graph: FusionGraph, nodes: list[int], value: dict[int, Expr],
                link_params: bool) -> None:
    member = set(nodes)
    params: list[Var] = []
    args: list[Expr] = []
    inner: dict[int, Expr] = {}
    for n in nodes:
        for t in graph.nodes[n].inputs:
            tensor = graph.tensors[t]
            if t in inner or (tensor.producer is not None and tensor.producer in member):
                continue
            outer = value[t]
            if isinstance(outer, Constant) and (link_params or outer.data.ndim == 0):
                inner[t] = outer
                continue
            param = Var(f"p{len(params)}", tensor.type)
            params.append(param)
            args.append(outer)
            inner[t] = param
    outputs: list[int] = []
    for n in nodes:
        node = graph.nodes[n]
        inner[node.output] = _rebuild(node.expr, [inner[t] for t in node.inputs])
        consumers = graph.tensors[node.output].consumers
        if node.output == graph.output_tensor or any(c not in member for c in consumers):
            outputs.append(node.output)
    body = inner[outputs[0]] if len(outputs) == 1 else Tuple([inner[t] for t in outputs])
    call = Call(Function(params, body, attrs={"Primitive": 1}), args)
    if len(outputs) == 1:
        value[outputs[0]] = call
    else:
        for index, t in enumerate(outputs):
            value[t] = TupleGetItem(call, index)


def _is_op_call(expr: Expr) -> bool:
    return isinstance(expr, Call) and isinstance(expr.op, Op)


def _rebuild(expr: Expr, operands: list[Expr]) -> Expr:
    """``expr`` with its operands replaced (same order as the graph lists them)."""
    if isinstance(expr, Call):
        if isinstance(expr.op, Expr) and not isinstance(expr.op, Function):
            return Call(operands[0], operands[1:], expr.attrs, expr.span)
        return Call(expr.op, operands, expr.attrs, expr.span)
    if isinstance(expr, Tuple):
        return Tuple(operands)
    if isinstance(expr, TupleGetItem):
        return TupleGetItem(operands[0], expr.index)
    raise AssertionError(f"not a computing node: {expr!r}")
