"""Tensors, operations and iteration variables: what a tensor expression computes.

``placeholder`` declares an input; ``compute`` declares an output as a function of its indices;
``reduce_axis`` declares an axis summed (or maxed, ...) over inside a ``compute``. Each
operation knows its input tensors, so the operations reachable from a set of outputs form the
read graph; :func:`post_dfs_order` lists them producers first."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import TensorExprError
from ..tir.expr import (
    ExprOp,
    IntImm,
    Let,
    PrimExpr,
    Var,
    as_expr,
    dtype_of_name,
    is_bool,
    is_int,
    post_order,
    substitute,
)

_set = object.__setattr__

DATA_PAR = "data_par"
REDUCE = "reduce"


class Range:
    """The half-open integer interval ``[min, min + extent)``."""

    __slots__ = ("min", "extent")

    def __init__(self, min: int, extent: int) -> None:
        _set(self, "min", int(min))
        _set(self, "extent", int(extent))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Range is immutable")

    def __repr__(self) -> str:
        return f"Range({self.min}, {self.min + self.extent})"


class IterVar(ExprOp):
    """An iteration variable: a data-parallel axis of a compute, a reduction axis, or a loop
    variable made by a schedule primitive. In expressions it stands for its ``var``."""

    __slots__ = ("dom", "var", "iter_type")

    def __init__(self, dom: Range, var: Var, iter_type: str) -> None:
        _set(self, "dom", dom)
        _set(self, "var", var)
        _set(self, "iter_type", iter_type)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("IterVar is immutable")

    def _as_expr(self) -> PrimExpr:
        return self.var

    @property
    def name(self) -> str:
        """The name of the variable."""
        return self.var.name

    @property
    def is_reduce(self) -> bool:
        """True for a reduction axis (or a loop variable derived from one)."""
        return self.iter_type == REDUCE

    def __repr__(self) -> str:
        kind = "reduce_axis" if self.is_reduce else "axis"
        return f"{kind}({self.name}, {self.dom!r})"

    __str__ = __repr__


def _shape_tuple(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, (int, IntImm)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = list(shape)
    except TypeError as err:
        raise TensorExprError(f"{what}: shape {shape!r} is not a tuple of ints") from err
    out = []
    for d in dims:
        if isinstance(d, IntImm):
            d = d.value
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise TensorExprError(
                f"{what}: shape {tuple(dims)} has a bad dimension {d!r}; dimensions are "
                "non-negative ints (symbolic shapes are not supported yet)"
            )
        out.append(int(d))
    return tuple(out)


class Operation:
    """Base of operations; an operation has one output tensor, ``op.output(0)``."""

    __slots__ = ("name", "tag", "attrs", "_output")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def output(self, index: int = 0) -> Tensor:
        """The output tensor (only index 0 exists)."""
        if index != 0:
            raise TensorExprError(f"operation {self.name} has one output; asked for {index}")
        return self._output

    @property
    def num_outputs(self) -> int:
        """Always 1."""
        return 1

    @property
    def input_tensors(self) -> list[Tensor]:
        """The tensors this operation reads, in first-read order."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class PlaceholderOp(Operation):
    """An input tensor, supplied by the caller."""

    __slots__ = ("shape", "dtype")

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str) -> None:
        _set(self, "name", name)
        _set(self, "tag", "")
        _set(self, "attrs", {})
        _set(self, "shape", shape)
        _set(self, "dtype", dtype)
        _set(self, "_output", Tensor(self, shape, dtype))


class ComputeOp(Operation):
    """``out[axis] = body`` for every point of ``axis``; ``body`` may be one reduction."""

    __slots__ = ("axis", "body", "_inputs")

    def __init__(self, name: str, tag: str, attrs: dict[str, Any] | None,
                 axis: Sequence[IterVar], body: PrimExpr) -> None:
        from .reduction import Reduce

        _set(self, "name", name)
        _set(self, "tag", tag)
        _set(self, "attrs", dict(attrs or {}))
        _set(self, "axis", tuple(axis))
        _set(self, "body", body)
        inputs: list[Tensor] = []
        for node in post_order(body):
            if isinstance(node, TensorLoad) and not any(node.tensor is t for t in inputs):
                inputs.append(node.tensor)
            if isinstance(node, Reduce) and node is not body:
                raise TensorExprError(
                    f"te.compute {name!r}: a reduction must be the whole body (found "
                    f"{node} inside {body}); compute the reduction in its own te.compute and "
                    "use its result"
                )
        _set(self, "_inputs", tuple(inputs))
        shape = tuple(iv.dom.extent for iv in self.axis)
        _set(self, "_output", Tensor(self, shape, body.dtype))

    @property
    def reduce_axis(self) -> tuple[IterVar, ...]:
        """The reduction axes of the body (empty without a reduction)."""
        from .reduction import Reduce

        return self.body.axis if isinstance(self.body, Reduce) else ()

    @property
    def input_tensors(self) -> list[Tensor]:
        return list(self._inputs)

    def __str__(self) -> str:
        index = ", ".join(iv.name for iv in self.axis)
        return f"{self.name}[{index}] = {self.body}"


class Tensor:
    """The output of an operation: ``shape``, ``dtype``, ``op``; ``A[i, j]`` reads an element."""

    __slots__ = ("op", "shape", "dtype")

    def __init__(self, op: Operation, shape: tuple[int, ...], dtype: str) -> None:
        _set(self, "op", op)
        _set(self, "shape", shape)
        _set(self, "dtype", dtype)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Tensor is immutable")

    @property
    def name(self) -> str:
        """The name of the producing operation."""
        return self.op.name

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def __getitem__(self, indices: Any) -> TensorLoad:
        if not isinstance(indices, tuple):
            indices = (indices,)
        return TensorLoad(self, indices)

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Tensor({self.name}, shape={self.shape}, dtype={self.dtype})"


class TensorLoad(PrimExpr):
    """``tensor[indices]`` inside a tensor expression (becomes a BufferLoad when lowered)."""

    __slots__ = ("tensor", "indices")

    def __init__(self, tensor: Tensor, indices: Sequence[Any]) -> None:
        exprs = []
        for i in indices:
            if isinstance(i, slice) or i is Ellipsis:
                raise TensorExprError(
                    f"tensor {tensor.name} is indexed with a slice; index it element by "
                    "element with one integer expression per dimension"
                )
            e = as_expr(i)
            if not (is_int(e.dtype) or is_bool(e.dtype)):
                raise TensorExprError(
                    f"index {e} of tensor {tensor.name} has dtype {e.dtype}; indices are ints"
                )
            exprs.append(e)
        if len(exprs) != len(tensor.shape):
            raise TensorExprError(
                f"tensor {tensor.name} has {len(tensor.shape)} dimension(s) "
                f"{tensor.shape} but is indexed with {len(exprs)} index(es)"
            )
        _set(self, "tensor", tensor)
        _set(self, "indices", tuple(exprs))
        _set(self, "dtype", tensor.dtype)

    def children(self) -> tuple[PrimExpr, ...]:
        return self.indices

    def _rebuild(self, children: list[PrimExpr]) -> PrimExpr:
        return TensorLoad(self.tensor, children)

    def _text(self, fmt: Callable[[PrimExpr], str]) -> str:
        return f"{self.tensor.name}[{', '.join(fmt(i) for i in self.indices)}]"


def var(name: str = "v", dtype: object = "int32") -> Var:
    """A free scalar variable."""
    return Var(name, dtype)


def placeholder(shape: Any, dtype: object = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor of static ``shape`` and ``dtype``."""
    dims = _shape_tuple(shape, f"te.placeholder {name!r}")
    return PlaceholderOp(str(name), dims, dtype_of_name(dtype)).output(0)


def reduce_axis(dom: Any, name: str = "rv") -> IterVar:
    """A reduction axis over ``[lo, hi)`` (``dom`` is ``(lo, hi)``, or ``hi`` for ``[0, hi)``)."""
    if isinstance(dom, (int, IntImm)):
        dom = (0, dom)
    try:
        lo, hi = (int(d) for d in dom)
    except (TypeError, ValueError) as err:
        raise TensorExprError(
            f"te.reduce_axis {name!r}: dom {dom!r} must be (lo, hi) with int bounds"
        ) from err
    if hi < lo:
        raise TensorExprError(f"te.reduce_axis {name!r}: empty or negative range {dom!r}")
    return IterVar(Range(lo, hi - lo), Var(name), REDUCE)


def _axis_names(fcompute: Callable[..., Any], ndim: int, name: str) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        return [f"i{d}" for d in range(ndim)]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return [f"i{d}" for d in range(ndim)]
    # parameters with defaults are the caller's closure tricks (lambda i, t=t: ...), not indices
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.default is p.empty]
    if len(positional) != ndim:
        raise TensorExprError(
            f"te.compute {name!r}: the shape has {ndim} dimension(s) but fcompute takes "
            f"{len(positional)} index argument(s) ({', '.join(p.name for p in positional)})"
        )
    return [p.name for p in positional]


def compute(shape: Any, fcompute: Callable[..., Any], name: str = "compute", tag: str = "",
            attrs: dict[str, Any] | None = None) -> Tensor:
    """A tensor whose element at ``(i0, i1, ...)`` is ``fcompute(i0, i1, ...)``.

    ``fcompute`` gets one int32 index variable per dimension (named after its parameters) and
    returns a scalar expression; it may be one reduction (``te.sum(..., axis=k)``) as a
    whole."""
    from .reduction import Reduce

    name = str(name)
    dims = _shape_tuple(shape, f"te.compute {name!r}")
    names = _axis_names(fcompute, len(dims), name)
    axis = [IterVar(Range(0, d), Var(n), DATA_PAR) for d, n in zip(dims, names)]
    result = fcompute(*[iv.var for iv in axis])
    if isinstance(result, (tuple, list)):
        raise TensorExprError(
            f"te.compute {name!r}: fcompute returned {len(result)} values; operations with "
            "several outputs are not supported, make one te.compute per output"
        )
    if isinstance(result, Tensor):
        raise TensorExprError(
            f"te.compute {name!r}: fcompute returned the tensor {result.name} itself; return "
            f"an element of it, e.g. {result.name}[i]"
        )
    body = as_expr(result)
    for node in post_order(body):
        if isinstance(node, Reduce) and node is not body:
            raise TensorExprError(
                f"te.compute {name!r}: a reduction must be the whole body (found {node} inside "
                f"{body}); compute the reduction in its own te.compute and use its result"
            )
    allowed: list[Var] = [iv.var for iv in axis]
    if isinstance(body, Reduce):
        for r in body.axis:
            if any(r.var is v for v in allowed):
                raise TensorExprError(
                    f"te.compute {name!r}: {r.name} is both a data axis and a reduction axis"
                )
        allowed += [r.var for r in body.axis]
    # A let inside the body (a value computed once and used several times) binds its own.
    allowed += [node.var for node in post_order(body) if isinstance(node, Let)]
    for node in post_order(body):
        if isinstance(node, Var) and not any(node is v for v in allowed):
            raise TensorExprError(
                f"te.compute {name!r}: the body {body} uses the variable {node.name}, which is "
                "neither an index of this compute nor one of its reduction axes (a reduction "
                "axis must be listed in te.sum(..., axis=...))"
            )
    return ComputeOp(name, tag, attrs, axis, body).output(0)


def _as_ops(ops: Any) -> list[Operation]:
    if isinstance(ops, (Operation, Tensor)):
        ops = [ops]
    out: list[Operation] = []
    for o in ops:
        if isinstance(o, Tensor):
            o = o.op
        if not isinstance(o, Operation):
            raise TensorExprError(f"expected an operation or tensor, got {o!r}")
        if not any(o is p for p in out):
            out.append(o)
    return out


def reads_of(op: Operation, tensor: Tensor) -> list[TensorLoad]:
    """The reads of ``tensor`` in the body of the compute ``op``, in post order."""
    body = getattr(op, "body", None)
    if body is None:
        return []
    return [node for node in post_order(body)
            if isinstance(node, TensorLoad) and node.tensor.op is tensor.op]


def read_graph(outputs: Any) -> dict[Operation, list[Tensor]]:
    """Each operation reachable from ``outputs`` -> the tensors it reads (iterative walk)."""
    graph: dict[Operation, list[Tensor]] = {}
    stack = list(reversed(_as_ops(outputs)))
    while stack:
        op = stack.pop()
        if op in graph:
            continue
        graph[op] = op.input_tensors
        for t in reversed(graph[op]):
            if t.op not in graph:
                stack.append(t.op)
    return graph


def post_dfs_order(outputs: Any) -> list[Operation]:
    """The operations reachable from ``outputs``, every producer before its consumers, in the
    order a depth-first walk from the outputs (inputs left to right) finishes them."""
    order: list[Operation] = []
    done: set[int] = set()  # ids of operations kept alive by `order`
    for root in _as_ops(outputs):
        stack: list[tuple[Operation, int]] = [(root, 0)]
        while stack:
            op, child = stack.pop()
            if id(op) in done:
                continue
            inputs = op.input_tensors
            if child < len(inputs):
                stack.append((op, child + 1))
                nxt = inputs[child].op
                if id(nxt) not in done:
                    stack.append((nxt, 0))
            else:
                done.add(id(op))
                order.append(op)
    return order


def replace_reads(body: PrimExpr, old: Tensor, new: Tensor) -> PrimExpr:
    """``body`` with every read of ``old`` a read of ``new`` at the same indices."""
    from ..tir.expr import rewrite

    def visit(node: PrimExpr) -> PrimExpr | None:
        if isinstance(node, TensorLoad) and node.tensor.op is old.op:
            return TensorLoad(new, node.indices)
        return None

    return rewrite(body, visit)


def substitute_axes(body: PrimExpr, mapping: dict[Var, Any]) -> PrimExpr:
    """``body`` with index variables replaced (reductions keep their axes)."""
    return substitute(body, mapping)
