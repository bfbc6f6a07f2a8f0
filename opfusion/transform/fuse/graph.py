"""The indexed forward graph: the dataflow of one function, as the fusion analysis reads it.

Each value of the function body (operator calls, tuples, tuple accesses, variables, constants)
becomes a :class:`GraphNode` numbered in post-DFS order, so every producer is numbered before
its consumers. A node knows its pattern kind and its *output* edges, each with the pattern of
the consumer on that edge. This is TVM's ``IndexedForwardGraph`` (seed 000):

* an operator call takes its operator's declared kind; a call of anything else is kOpaque;
* a tuple is kTuple and reads its tensor fields through kInjective edges;
* a tuple access is kInjective when the tuple holds only tensors (else it is kOpaque and the
  tuple becomes an external reference, so nothing fuses through it);
* a scalar constant of a simple dtype is kElemWise (it is inlined into its consumer's kernel);
  any other constant, every variable and every nested function is kOpaque;
* a kBroadcast edge whose argument already has the result's shape is a kElemWise edge;
* function parameters and the function's result are ``extern_ref``: referenced from outside,
  so they never have a post-dominator.

Nested functions are leaves here: a primitive function is already fused, and a non-primitive
one is fused on its own by the pass."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from ...ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ...ir.op import Op, OpPatternKind
from ...ir.types import TensorType, TupleType

# Pattern kinds as plain ints: the partitioner compares them in its inner loops.
ELEMWISE = int(OpPatternKind.kElemWise)
BROADCAST = int(OpPatternKind.kBroadcast)
INJECTIVE = int(OpPatternKind.kInjective)
COMM_REDUCE = int(OpPatternKind.kCommReduce)
OUT_EWISE_FUSABLE = int(OpPatternKind.kOutEWiseFusable)
TUPLE = int(OpPatternKind.kTuple)
OPAQUE = int(OpPatternKind.kOpaque)

# Scalar constants of these dtypes are folded into the generated kernel as literals.
_SIMPLE_CONSTANT_DTYPES = frozenset({"int32", "int64", "float32", "float64", "bool"})


class Edge(NamedTuple):
    """An output edge: the consuming node and the pattern kind the consumer has on this edge."""

    node: GraphNode
    pattern: int


class GraphNode:
    """One value of the function body in the forward graph."""

    __slots__ = ("ref", "index", "extern_ref", "pattern", "outputs")

    def __init__(self, ref: Expr) -> None:
        self.ref = ref
        #: Position in post-DFS order (producers before consumers); -1 until visited.
        self.index = -1
        #: Referenced from outside the dataflow (a parameter, the result): never fused onward.
        self.extern_ref = False
        self.pattern = OPAQUE
        self.outputs: list[Edge] = []

    def __repr__(self) -> str:
        outputs = [edge.node.index for edge in self.outputs]
        return (f"GraphNode({self.index}, {describe_expr(self.ref)}, "
                f"{OpPatternKind(self.pattern).name}, outputs={outputs})")


class IndexedForwardGraph:
    """The nodes of a function body in post-DFS order (``nodes[i].index == i``) and the map
    from expressions to nodes."""

    def __init__(self) -> None:
        self.nodes: list[GraphNode] = []
        self.node_map: dict[Expr, GraphNode] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[GraphNode]:
        return iter(self.nodes)

    def node(self, expr: Expr) -> GraphNode:
        """The node of ``expr`` (KeyError if it is not a value of this function body)."""
        return self.node_map[expr]

    def dump(self) -> str:
        """One line per node: index, what it is, its kind and its output edges."""
        lines = []
        for node in self.nodes:
            outputs = ", ".join(f"{e.node.index}({OpPatternKind(e.pattern).name})"
                                for e in node.outputs)
            extern = " extern_ref" if node.extern_ref else ""
            lines.append(f"node[{node.index}] {describe_expr(node.ref)} "
                         f"{OpPatternKind(node.pattern).name}{extern} -> [{outputs}]")
        return "\n".join(lines)


def describe_expr(expr: Expr) -> str:
    """A short name for an expression: its operator, ``%name`` of a variable, or its kind."""
    if isinstance(expr, Call):
        if isinstance(expr.op, Op):
            return expr.op.name
        return "call of a function"
    if isinstance(expr, Var):
        return f"%{expr.name_hint}"
    if isinstance(expr, Constant):
        return "scalar constant" if expr.data.ndim == 0 else "constant"
    if isinstance(expr, Tuple):
        return "tuple"
    if isinstance(expr, TupleGetItem):
        return f"tuple field .{expr.index}"
    if isinstance(expr, Function):
        return "function"
    return type(expr).__name__


def _operands(expr: Expr) -> tuple[Expr, ...]:
    """The dataflow operands of a node. The callee of a call is not one: an operator is not
    a value, and a called function is a leaf of the analysis."""
    if isinstance(expr, Call):
        return expr.args
    if isinstance(expr, Tuple):
        return expr.fields
    if isinstance(expr, TupleGetItem):
        return (expr.tuple_value,)
    return ()


def build_forward_graph(func: Function) -> IndexedForwardGraph:
    """The indexed forward graph of ``func``'s body (types must be inferred).

    Parameters come first (indices 0..), then the body in post-DFS order. Output edges are
    recorded in the order TVM's visitor records them: when a consumer is first entered, for
    each of its operands in turn."""
    builder = _GraphBuilder()
    graph, node_of = builder.graph, builder.node_of
    for param in func.params:
        node_of(param).extern_ref = True
    body = func.body
    node_of(body).extern_ref = True
    for param in func.params:
        builder.number(node_of(param))
    if node_of(body).index >= 0:
        return graph  # the function returns one of its parameters
    builder.enter(node_of(body))
    stack = [(body, iter(_operands(body)))]
    entered = {body}
    while stack:
        expr, pending = stack[-1]
        for operand in pending:
            if operand not in entered:
                entered.add(operand)
                builder.enter(node_of(operand))
                stack.append((operand, iter(_operands(operand))))
                break
        else:
            stack.pop()
            node = graph.node_map[expr]
            if node.index < 0:  # parameters were numbered first
                builder.number(node)
    return graph


class _GraphBuilder:
    def __init__(self) -> None:
        self.graph = IndexedForwardGraph()

    def node_of(self, expr: Expr) -> GraphNode:
        node = self.graph.node_map.get(expr)
        if node is None:
            node = self.graph.node_map[expr] = GraphNode(expr)
        return node

    def number(self, node: GraphNode) -> None:
        node.index = len(self.graph.nodes)
        self.graph.nodes.append(node)

    def enter(self, node: GraphNode) -> None:
        """Set ``node``'s pattern and add the edges from its operands to it (TVM's
        pre-visit)."""
        expr = node.ref
        node_of = self.node_of
        if isinstance(expr, Call):
            pattern = int(expr.op.pattern) if isinstance(expr.op, Op) else OPAQUE
            node.pattern = pattern
            result = expr.checked_type
            broadcast = pattern == BROADCAST and isinstance(result, TensorType)
            for arg in expr.args:
                edge_pattern = pattern
                if broadcast:
                    arg_type = arg.checked_type
                    if isinstance(arg_type, TensorType) and arg_type.shape == result.shape:
                        edge_pattern = ELEMWISE
                node_of(arg).outputs.append(Edge(node, edge_pattern))
        elif isinstance(expr, Tuple):
            node.pattern = TUPLE
            for field in expr.fields:
                if isinstance(field.checked_type, TensorType):
                    node_of(field).outputs.append(Edge(node, INJECTIVE))
                else:
                    node_of(field).extern_ref = True
        elif isinstance(expr, TupleGetItem):
            tuple_type = expr.tuple_value.checked_type
            assert isinstance(tuple_type, TupleType), f"tuple field .{expr.index} of a non-tuple"
            if all(isinstance(field, TensorType) for field in tuple_type.fields):
                node.pattern = INJECTIVE
                node_of(expr.tuple_value).outputs.append(Edge(node, INJECTIVE))
            else:
                # Fused functions take tensors or tuples of tensors: do not fuse through it.
                node_of(expr.tuple_value).extern_ref = True
        elif isinstance(expr, Constant):
            simple = expr.data.ndim == 0 and expr.checked_type.dtype in _SIMPLE_CONSTANT_DTYPES
            node.pattern = ELEMWISE if simple else OPAQUE
        # Var, Function, GlobalVar: kOpaque leaves.
