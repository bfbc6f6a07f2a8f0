"""Turn a grouping of a function's ops into primitive functions, one per group.

Each group becomes ``fn (%p0, %p1, ..., Primitive=1) { ... }`` called with the values it reads
(parameters numbered in first-use order). A group with several outputs (horizontal or input
fusion) returns them as a tuple and its users read fields of the call. A kernel writes tensors,
so a tuple-valued output (the function's result tuple, merged into a group) is rebuilt outside
the call from the tensors the group computes and the values it passes along. Parameters and
constants follow the builder FuseOps uses too (:mod:`opfusion.transform.fuse.primitive`):
scalars stay inline, other constants are parameters unless ``link_params`` keeps them inside.
Groups made only of tuples, projections and calls of non-operators are not wrapped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ...ir.op import Op
from ...ir.types import TensorType, TupleType, Type
from ..fuse.primitive import PrimitiveFunctionBuilder
from .graph import FusionGraph


def rewrite_groups(graph: FusionGraph, groups: Sequence[Sequence[int]],
                   link_params: bool = False) -> Function:
    """The function of ``graph`` with each group (node indices; groups in topological order)
    wrapped into a primitive function."""
    value: dict[int, Expr] = {t.index: t.expr for t in graph.tensors if t.producer is None}
    # The groups holding each node: several for a node recomputed into its consumers' groups.
    holders: dict[int, set[int]] = {}
    for index, members in enumerate(groups):
        for n in members:
            holders.setdefault(n, set()).add(index)
    for members in groups:
        nodes = sorted(members)
        if not any(_is_op_call(graph.nodes[n].expr) for n in nodes):
            for n in nodes:
                node = graph.nodes[n]
                value[node.output] = _rebuild(node.expr, [value[t] for t in node.inputs])
            continue
        _emit_group(graph, nodes, value, holders, link_params)
    body = value[graph.output_tensor]
    func = graph.func
    return Function(func.params, body, func.ret_type, func.attrs)


def _emit_group(graph: FusionGraph, nodes: list[int], value: dict[int, Expr],
                holders: dict[int, set[int]], link_params: bool) -> None:
    member = set(nodes)
    builder = PrimitiveFunctionBuilder(link_params)
    inner: dict[int, Expr] = {}
    for n in nodes:
        for t in graph.nodes[n].inputs:
            tensor = graph.tensors[t]
            if t in inner or (tensor.producer is not None and tensor.producer in member):
                continue
            inner[t] = builder.operand(value[t], tensor.type)
    outputs: list[int] = []
    for n in nodes:
        node = graph.nodes[n]
        inner[node.output] = _rebuild(node.expr, [inner[t] for t in node.inputs])
        if _needed_outside(graph, n, member, holders):
            outputs.append(node.output)
    if _returns_tensors(graph, outputs, inner):
        body = inner[outputs[0]] if len(outputs) == 1 else Tuple([inner[t] for t in outputs])
        call = builder.call(body)
        if len(outputs) == 1:
            value[outputs[0]] = call
        else:
            for index, t in enumerate(outputs):
                value[t] = TupleGetItem(call, index)
        return
    _emit_flattened(graph, outputs, inner, builder, value)


def _needed_outside(graph: FusionGraph, n: int, member: set[int],
                    holders: dict[int, set[int]]) -> bool:
    """Whether the group must write node ``n``'s result: it is the function's result, or a
    reader outside the group lies in a group without its own copy of ``n`` (a recomputed
    producer is read from each consumer's copy, never written to memory)."""
    node = graph.nodes[n]
    if node.output == graph.output_tensor:
        return True
    copies = holders[n]
    return any(c not in member and not holders.get(c, set()) <= copies
               for c in graph.tensors[node.output].consumers)


def _returns_tensors(graph: FusionGraph, outputs: list[int], inner: dict[int, Expr]) -> bool:
    """Whether the group can return its outputs as they are: tensors, or one value that is a
    flat tuple of tensors computed by an operator (split's pieces). A kernel writes tensors
    only, so a tuple among several outputs (say the function's result tuple, absorbed by a
    merge) is flattened instead, and so is a result tuple built in the group, which is
    plumbing, not computation."""
    types = [graph.tensors[t].type for t in outputs]
    if all(isinstance(ty, TensorType) for ty in types):
        return True
    (only,) = types if len(types) == 1 else (None,)
    return (isinstance(only, TupleType) and not isinstance(inner[outputs[0]], Tuple)
            and all(isinstance(field, TensorType) for field in only.fields))


def _emit_flattened(graph: FusionGraph, outputs: list[int], inner: dict[int, Expr],
                    builder: PrimitiveFunctionBuilder, value: dict[int, Expr]) -> None:
    """Emit a group whose outputs include tuples: the kernel returns the distinct tensors in
    them that it computes, and each tuple is rebuilt outside the call from those results and
    from the values it merely passes along (the group's parameters and constants)."""
    leaves: dict[Expr, int] = {}  # tensor computed in the group -> its result index
    outer_of_param = dict(zip(builder.params, builder.arguments))

    def outer(expr: Expr) -> Expr | None:
        """The value outside the group of a parameter, a constant or a field of either."""
        if isinstance(expr, Constant):
            return expr
        if isinstance(expr, Var):
            return outer_of_param[expr]
        if isinstance(expr, TupleGetItem):
            source = outer(expr.tuple_value)
            return None if source is None else TupleGetItem(source, expr.index)
        return None

    def spread(expr: Expr, ty: Type) -> Any:
        """A nest of lists (the tuple structure) of passed-along values and result indices;
        recursion over a type's tuple nesting, a few levels at most."""
        if isinstance(ty, TupleType):
            fields = expr.fields if isinstance(expr, Tuple) else [
                TupleGetItem(expr, index) for index in range(len(ty.fields))]
            return [spread(field, field_type) for field, field_type in zip(fields, ty.fields)]
        passed = outer(expr)
        return passed if passed is not None else leaves.setdefault(expr, len(leaves))

    shapes = [spread(inner[t], graph.tensors[t].type) for t in outputs]
    results = list(leaves)
    body = results[0] if len(results) == 1 else Tuple(results)
    # A parameter the group only passed along into a tuple is no longer the kernel's.
    call = builder.call(body, drop_unused=True)

    def build(shape: Any) -> Expr:
        if isinstance(shape, list):
            return Tuple([build(item) for item in shape])
        if isinstance(shape, Expr):
            return shape
        return call if len(results) == 1 else TupleGetItem(call, shape)

    for t, shape in zip(outputs, shapes):
        value[t] = build(shape)


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
