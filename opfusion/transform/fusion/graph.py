"""The graph the fusion engine works on: one op node per computing expression, one tensor per
value, and the groups the engine starts from.

A module that FuseOps already fused is flattened first: every call of a primitive function is
replaced by its body (parameters bound to the call's arguments) and the body's nodes start in
one group. An unfused module starts with one group per op. Either way, node indices follow the
post-order of the flattened body, so they are a topological order of the ops."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ...ir.op import Op, OpPatternKind
from ...ir.types import TensorType, TupleType, Type
from ...ir.visitor import ExprMutator, post_order, rebuild


@dataclass
class GraphNode:
    """One computing expression (an op call, a tuple or a projection)."""

    index: int
    expr: Expr
    kind: OpPatternKind
    inputs: list[int] = field(default_factory=list)  # tensor indices
    output: int = -1  # tensor index


@dataclass
class GraphTensor:
    """One value: a node's result, a function parameter or a constant."""

    index: int
    expr: Expr
    producer: int | None  # node index, None for parameters and constants
    consumers: list[int] = field(default_factory=list)  # node indices, in order, no repeats

    @property
    def type(self) -> Type:
        return self.expr.checked_type

    @property
    def numel(self) -> int:
        """Scalars in the value (cached: policies ask often)."""
        count = self.__dict__.get("_numel")
        if count is None:
            count = self.__dict__["_numel"] = type_numel(self.type)
        return count


class FusionGraph:
    """Ops and tensors of one function body, with the initial grouping."""

    def __init__(self, func: Function) -> None:
        body, initial_group = _flatten_primitive_calls(func)
        self.func = func
        self.params = func.params
        self.body = body
        self.nodes: list[GraphNode] = []
        self.tensors: list[GraphTensor] = []
        self.tensor_of: dict[Expr, int] = {}
        self.node_of: dict[Expr, int] = {}
        for expr in post_order(body, into_functions=False):
            if isinstance(expr, (Var, Constant, Function)):
                self._add_tensor(expr, None)
            else:
                self._add_node(expr)
        self.output_tensor = self.tensor_of[body]
        # Initial groups: the primitive function each node came from, else the node alone.
        self.initial_groups: list[list[int]] = []
        by_origin: dict[int, list[int]] = {}
        for node in self.nodes:
            origin = initial_group.get(node.expr)
            if origin is None:
                self.initial_groups.append([node.index])
            elif origin in by_origin:
                by_origin[origin].append(node.index)
            else:
                by_origin[origin] = [node.index]
                self.initial_groups.append(by_origin[origin])

    def _add_tensor(self, expr: Expr, producer: int | None) -> int:
        index = len(self.tensors)
        self.tensors.append(GraphTensor(index, expr, producer))
        self.tensor_of[expr] = index
        return index

    def _add_node(self, expr: Expr) -> None:
        node = GraphNode(len(self.nodes), expr, node_kind(expr))
        self.nodes.append(node)
        self.node_of[expr] = node.index
        for operand in _operands(expr):
            tensor = self.tensors[self.tensor_of[operand]]
            node.inputs.append(tensor.index)
            # Nodes are added in order, so a repeated operand can only repeat the last entry.
            if not tensor.consumers or tensor.consumers[-1] != node.index:
                tensor.consumers.append(node.index)
        node.output = self._add_tensor(expr, node.index)


def node_kind(expr: Expr) -> OpPatternKind:
    """The pattern kind fusion rules see for a computing expression."""
    if isinstance(expr, Call):
        return expr.op.pattern if isinstance(expr.op, Op) else OpPatternKind.kOpaque
    if isinstance(expr, Tuple):
        return OpPatternKind.kTuple
    if isinstance(expr, TupleGetItem):
        return OpPatternKind.kInjective
    return OpPatternKind.kOpaque


def _operands(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, Call):
        if isinstance(expr.op, Expr) and not isinstance(expr.op, Function):
            return (expr.op, *expr.args)
        return expr.args
    if isinstance(expr, Tuple):
        return expr.fields
    if isinstance(expr, TupleGetItem):
        return (expr.tuple_value,)
    return ()


def type_numel(ty: Type) -> int:
    """Number of scalars in a value of type ``ty`` (tuples sum their fields)."""
    if isinstance(ty, TupleType):
        return sum(type_numel(f) for f in ty.fields)
    if isinstance(ty, TensorType):
        count = 1
        for dim in ty.shape:
            count *= int(dim)
        return count
    return 0


class _Inliner(ExprMutator):
    """Rebuild a primitive function's body with its parameters replaced by the call's
    (already rewritten) arguments."""

    def __init__(self, binding: dict[Expr, Expr]) -> None:
        super().__init__()
        self.memo.update(binding)


def _flatten_primitive_calls(func: Function) -> tuple[Expr, dict[Expr, int]]:
    """``func``'s body with calls of primitive functions replaced by their bodies, and the
    index of the call each inlined node came from."""
    origin: dict[Expr, int] = {}
    replaced: dict[Expr, Expr] = {}
    calls_seen = 0
    for expr in post_order(func.body, into_functions=False):
        new = rebuild(expr, lambda e: replaced.get(e, e))
        if isinstance(new, Call) and isinstance(new.op, Function) and new.op.is_primitive:
            callee = new.op
            binding = dict(zip(callee.params, new.args))
            inliner = _Inliner(binding)
            inlined = inliner.visit(callee.body)
            for node in post_order(inlined, into_functions=False, skip=set(new.args)):
                if not isinstance(node, (Var, Constant)) and node not in origin:
                    origin[node] = calls_seen
            calls_seen += 1
            new = inlined
        replaced[expr] = new
    return replaced[func.body], origin
