"""Read-only views of the fusion graph, the only thing fusion policies see.

``OpGroup`` (a group of ops), ``OpNode`` (one op), ``TensorNode`` (one value) and ``Shape``.
Views expose properties and tuples, never the engine's lists, so a policy cannot change the
graph by accident; the only way to act is to mark pairs through its pass context."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ...ir.expr import Call
from ...ir.op import Op, OpPatternKind
from ...ir.types import TensorType
from .engine import FusionState, Group


class Shape(tuple):
    """A tensor shape (a tuple of ints) with :meth:`numel`."""

    def numel(self) -> int:
        count = 1
        for dim in self:
            count *= int(dim)
        return count


class TensorNode:
    """A value of the graph: ``shape``, ``dtype``, the ``producer`` op (None for inputs and
    constants) and the ``consumers`` ops."""

    __slots__ = ("_state", "_index")

    def __init__(self, state: FusionState, index: int) -> None:
        self._state, self._index = state, index

    @property
    def _tensor(self) -> Any:
        return self._state.graph.tensors[self._index]

    @property
    def shape(self) -> Shape:
        ty = self._tensor.type
        return Shape(ty.shape) if isinstance(ty, TensorType) else Shape(())

    @property
    def dtype(self) -> str | None:
        ty = self._tensor.type
        return str(ty.dtype) if isinstance(ty, TensorType) else None

    @property
    def numel(self) -> int:
        return self._tensor.numel

    @property
    def is_input(self) -> bool:
        """True for function parameters and constants (values no op computes)."""
        return self._tensor.producer is None

    @property
    def is_result(self) -> bool:
        """True for the value the function returns."""
        return self._index == self._state.graph.output_tensor

    @property
    def producer(self) -> OpNode | None:
        producer = self._tensor.producer
        return None if producer is None else OpNode(self._state, producer)

    @property
    def consumers(self) -> tuple[OpNode, ...]:
        return tuple(OpNode(self._state, n) for n in self._tensor.consumers)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorNode) and other._index == self._index

    def __hash__(self) -> int:
        return hash(("tensor", self._index))

    def __repr__(self) -> str:
        return f"TensorNode({self._index}, shape={tuple(self.shape)})"


class OpNode:
    """One op of the graph: ``kind``, ``op_name``, ``inputs``, ``outputs``, ``attr(name)``."""

    __slots__ = ("_state", "_index")

    def __init__(self, state: FusionState, index: int) -> None:
        self._state, self._index = state, index

    @property
    def _node(self) -> Any:
        return self._state.graph.nodes[self._index]

    @property
    def kind(self) -> OpPatternKind:
        return self._node.kind

    @property
    def op_name(self) -> str:
        expr = self._node.expr
        if isinstance(expr, Call):
            return expr.op.name if isinstance(expr.op, Op) else "call"
        return "tuple" if type(expr).__name__ == "Tuple" else "tuple_get_item"

    @property
    def inputs(self) -> tuple[TensorNode, ...]:
        return tuple(TensorNode(self._state, t) for t in self._node.inputs)

    @property
    def outputs(self) -> tuple[TensorNode, ...]:
        return (TensorNode(self._state, self._node.output),)

    def attr(self, name: str, default: Any = None) -> Any:
        """The value of attribute ``name`` (``default`` when the op has no such attribute)."""
        expr = self._node.expr
        if isinstance(expr, Call):
            return expr.attrs.get(name, default)
        return default

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpNode) and other._index == self._index

    def __hash__(self) -> int:
        return hash(("op", self._index))

    def __repr__(self) -> str:
        return f"OpNode({self._index}, {self.op_name})"


class OpGroup:
    """A group of ops as policies see it: ``kind``, ``producers``, ``consumers``,
    ``op_nodes``, ``walk_op_nodes(fn)``, ``inputs`` and ``outputs``."""

    __slots__ = ("_state", "_group")

    def __init__(self, state: FusionState, group: Group) -> None:
        self._state, self._group = state, group

    @property
    def kind(self) -> OpPatternKind:
        """The most restrictive kind among the group's ops (tuples count as injective)."""
        return self._group.pattern

    @property
    def producers(self) -> tuple[OpGroup, ...]:
        state = self._state
        return tuple(OpGroup(state, g) for g in state.neighbours(self._group)[0])

    @property
    def consumers(self) -> tuple[OpGroup, ...]:
        state = self._state
        return tuple(OpGroup(state, g) for g in state.neighbours(self._group)[1])

    @property
    def op_nodes(self) -> tuple[OpNode, ...]:
        return tuple(OpNode(self._state, n) for n in self._group.sorted_nodes())

    def walk_op_nodes(self, fn: Callable[[OpNode], None]) -> None:
        """Call ``fn`` on every op of the group, in topological order."""
        for node in self.op_nodes:
            fn(node)

    @property
    def num_ops(self) -> int:
        return len(self._group.nodes)

    @property
    def inputs(self) -> tuple[TensorNode, ...]:
        """Values the group reads but does not compute, in first-use order."""
        return tuple(TensorNode(self._state, t) for t in self._state.input_tensors(self._group))

    @property
    def outputs(self) -> tuple[TensorNode, ...]:
        """Values the group computes that something outside it reads."""
        return tuple(TensorNode(self._state, t)
                     for t in self._state.output_tensors(self._group))

    def __iter__(self) -> Iterator[OpNode]:
        return iter(self.op_nodes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpGroup) and other._group is self._group

    def __hash__(self) -> int:
        return hash(("group", self._group.uid))

    def __repr__(self) -> str:
        names = ", ".join(node.op_name for node in self.op_nodes)
        return f"OpGroup({self.kind.name}: {names})"

