"""Graph-IR expressions: Var, GlobalVar, Constant, Call, Tuple, TupleGetItem, Function.

Nodes are immutable. Two nodes are the same value only if they are the same object (``is``);
structural comparison lives in :mod:`opfusion.ir.structural`. A node's type is inferred on
first use of :attr:`Expr.checked_type` and cached (nodes never change, so the cache holds)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import OpfusionError
from .op import EMPTY_ATTRS, Attrs, Op, get_op
from .types import FuncType, TensorType, Type, normalize_dtype

_set = object.__setattr__


class Expr:
    """Base class of graph-IR expressions."""

    __slots__ = ("_checked_type",)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} nodes are immutable")

    @property
    def checked_type(self) -> Type:
        """The inferred type of this expression (computed once, then cached)."""
        ty = getattr(self, "_checked_type", None)
        if ty is None:
            from .infer import infer_type

            ty = infer_type(self)
        return ty

    # Python operators build calls, as in TVM: x + y, x * 0.5, -x.
    def __add__(self, other: Any) -> Call:
        return _binary("add", self, other)

    def __radd__(self, other: Any) -> Call:
        return _binary("add", other, self)

    def __sub__(self, other: Any) -> Call:
        return _binary("subtract", self, other)

    def __rsub__(self, other: Any) -> Call:
        return _binary("subtract", other, self)

    def __mul__(self, other: Any) -> Call:
        return _binary("multiply", self, other)

    def __rmul__(self, other: Any) -> Call:
        return _binary("multiply", other, self)

    def __truediv__(self, other: Any) -> Call:
        return _binary("divide", self, other)

    def __rtruediv__(self, other: Any) -> Call:
        return _binary("divide", other, self)

    def __neg__(self) -> Call:
        return Call(get_op("negative"), [self])

    def __str__(self) -> str:
        from .printer import astext

        return astext(self)

    def __bool__(self) -> bool:
        # An expression is a node, never a truth value (an empty Tuple is still a node).
        return True

    __hash__ = object.__hash__


def _binary(op_name: str, lhs: Any, rhs: Any) -> Call:
    """Build a binary call, turning a Python/NumPy scalar into a constant of the other
    operand's dtype (so ``x * 0.5`` stays float32 for a float32 ``x``)."""
    if not isinstance(lhs, Expr):
        lhs = _scalar_like(lhs, rhs)
    if not isinstance(rhs, Expr):
        rhs = _scalar_like(rhs, lhs)
    return Call(get_op(op_name), [lhs, rhs])


def _scalar_like(value: Any, other: Expr) -> Constant:
    other_type = other.checked_type
    if not isinstance(other_type, TensorType):
        raise OpfusionError(f"cannot combine the scalar {value!r} with a value of type "
                            f"{other_type!r}; only tensors take arithmetic operators")
    return Constant(np.asarray(value, dtype=other_type.dtype))


class Var(Expr):
    """A variable: a function parameter, with its type annotation."""

    __slots__ = ("name_hint", "type_annotation")

    def __init__(self, name_hint: str, type_annotation: Type) -> None:
        if not isinstance(type_annotation, Type):
            raise OpfusionError(f"variable %{name_hint} needs a type, got {type_annotation!r}")
        _set(self, "name_hint", str(name_hint))
        _set(self, "type_annotation", type_annotation)
        _set(self, "_checked_type", type_annotation)

    def __repr__(self) -> str:
        return f"Var(%{self.name_hint}: {self.type_annotation!r})"


class GlobalVar(Expr):
    """The name of a function in an IRModule (``@main``); calls to it go through the module."""

    __slots__ = ("name_hint",)

    def __init__(self, name_hint: str) -> None:
        _set(self, "name_hint", str(name_hint))
        _set(self, "_checked_type", None)

    def __repr__(self) -> str:
        return f"GlobalVar(@{self.name_hint})"


class Constant(Expr):
    """A constant tensor. The array is copied if writeable and frozen, so it cannot change."""

    __slots__ = ("data",)

    def __init__(self, data: Any, dtype: object = None) -> None:
        if dtype is not None:
            dtype = normalize_dtype(dtype)
        array = np.asarray(data, dtype=dtype)
        normalize_dtype(array.dtype)  # reject unsupported dtypes with a clear message
        if array.flags.writeable:
            array = array.copy()
            array.setflags(write=False)
        _set(self, "data", array)
        _set(self, "_checked_type", TensorType(array.shape, array.dtype))

    def __repr__(self) -> str:
        return f"Constant({self.data.dtype}{list(self.data.shape)})"


class Call(Expr):
    """A call of an operator (an :class:`Op`), a :class:`Function` or a :class:`GlobalVar`.

    ``attrs`` are validated and normalized against the op's schema unless they are an
    :class:`Attrs` that this op's schema already checked (taken from another call). ``span``
    is an optional source name (an ONNX node name) used in messages; it is not part of the
    structure."""

    __slots__ = ("op", "args", "attrs", "span")

    def __init__(
        self,
        op: Op | Function | GlobalVar | str,
        args: Sequence[Expr],
        attrs: Mapping[str, Any] | None = None,
        span: str | None = None,
    ) -> None:
        if isinstance(op, str):
            op = get_op(op)
        args = tuple(args)
        for index, arg in enumerate(args):
            if not isinstance(arg, Expr):
                name = op.name if isinstance(op, Op) else "function"
                raise OpfusionError(f"{name}: argument {index} must be an expression, got "
                                    f"{type(arg).__name__}; wrap values with opf.const()")
        if isinstance(op, Op):
            if not attrs and not op.attrs:
                attrs = op.no_attrs  # the common case, kept cheap: 10^5-node graphs build fast
            elif not (isinstance(attrs, Attrs) and attrs.checked_by is op):
                attrs = op.make_attrs(attrs or {}, where=_describe(op.name, span))
        elif isinstance(op, (Function, GlobalVar)):
            attrs = EMPTY_ATTRS if attrs is None else Attrs(attrs)
        else:
            raise OpfusionError(f"cannot call {op!r}: expected an operator, function or @name")
        _set(self, "op", op)
        _set(self, "args", args)
        _set(self, "attrs", attrs)
        _set(self, "span", span)
        _set(self, "_checked_type", None)

    @property
    def op_name(self) -> str | None:
        """The operator's name if this calls an operator, else None."""
        return self.op.name if isinstance(self.op, Op) else None

    def __repr__(self) -> str:
        target = self.op.name if isinstance(self.op, Op) else type(self.op).__name__
        return f"Call({target}, {len(self.args)} args)"


def _describe(op_name: str, span: str | None) -> str:
    return f"{op_name} (node {span!r})" if span else op_name


class Tuple(Expr):
    """A tuple of values; ``t[i]`` builds a TupleGetItem."""

    __slots__ = ("fields",)

    def __init__(self, fields: Sequence[Expr]) -> None:
        fields = tuple(fields)
        for field in fields:
            if not isinstance(field, Expr):
                raise OpfusionError(f"tuple fields must be expressions, got {type(field).__name__}")
        _set(self, "fields", fields)
        _set(self, "_checked_type", None)

    def __len__(self) -> int:
        return len(self.fields)

    def __getitem__(self, index: int) -> TupleGetItem:
        return TupleGetItem(self, index)

    def __repr__(self) -> str:
        return f"Tuple({len(self.fields)} fields)"


class TupleGetItem(Expr):
    """Field ``index`` of a tuple-typed value."""

    __slots__ = ("tuple_value", "index")

    def __init__(self, tuple_value: Expr, index: int) -> None:
        if not isinstance(tuple_value, Expr):
            raise OpfusionError("TupleGetItem needs an expression for its tuple")
        _set(self, "tuple_value", tuple_value)
        _set(self, "index", int(index))
        _set(self, "_checked_type", None)

    def __repr__(self) -> str:
        return f"TupleGetItem(.{self.index})"


class Function(Expr):
    """A function: parameters, a body, an optional return-type annotation and attributes.

    Attributes are plain values; ``Primitive=1`` marks a fused group that later stages lower
    to one kernel."""

    __slots__ = ("params", "body", "ret_type", "attrs")

    def __init__(
        self,
        params: Sequence[Var],
        body: Expr,
        ret_type: Type | None = None,
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        params = tuple(params)
        seen: set[int] = set()
        for param in params:
            if not isinstance(param, Var):
                raise OpfusionError(f"function parameters must be Vars, got {param!r}")
            if id(param) in seen:
                raise OpfusionError(f"parameter %{param.name_hint} is listed twice")
            seen.add(id(param))
        if not isinstance(body, Expr):
            raise OpfusionError(f"function body must be an expression, got {type(body).__name__}")
        _set(self, "params", params)
        _set(self, "body", body)
        _set(self, "ret_type", ret_type)
        _set(self, "attrs", attrs if isinstance(attrs, Attrs) else Attrs(attrs or {}))
        _set(self, "_checked_type", None)

    @property
    def is_primitive(self) -> bool:
        return bool(self.attrs.get("Primitive", 0))

    def with_attr(self, key: str, value: Any) -> Function:
        """A copy of this function with one attribute set."""
        attrs = dict(self.attrs)
        attrs[key] = value
        return Function(self.params, self.body, self.ret_type, attrs)

    @property
    def func_type(self) -> FuncType:
        ty = self.checked_type
        assert isinstance(ty, FuncType)
        return ty

    def __call__(self, *args: Expr) -> Call:
        return Call(self, args)

    def __repr__(self) -> str:
        return f"Function({len(self.params)} params)"


# ---------------------------------------------------------------------------------------------
# builder helpers (re-exported as opf.var / opf.const)


def var(name: str, shape: Sequence[int] | Type | None = None, dtype: object = "float32",
        type_annotation: Type | None = None) -> Var:
    """Make a variable. ``shape`` may be a tuple or a full type: ``var("x", (1, 3, 8, 8))``."""
    if type_annotation is None:
        if isinstance(shape, Type):
            type_annotation = shape
        elif shape is None:
            raise OpfusionError(f"variable %{name} needs a shape (or a type_annotation)")
        else:
            type_annotation = TensorType(shape, dtype)
    return Var(name, type_annotation)


def const(value: Any, dtype: object = None) -> Constant:
    """Make a constant. Python floats become float32 and ints int32 unless ``dtype`` is given;
    NumPy arrays keep their dtype."""
    if dtype is None and not isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.dtype.kind == "f":
            dtype = "float32"
        elif array.dtype.kind in "iu":
            dtype = "int32"
    return Constant(value, dtype)
