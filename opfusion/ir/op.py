"""Operator declarations: the one place that says everything about an operator.

An operator is a subclass of :class:`Op` registered with :func:`register_op`. The class gives
its name, input names, attribute schema, pattern kind, type inference and NumPy reference;
later stages add the tensor-expression compute to the same class. Builders such as
``opf.op.nn.conv2d`` are generated from these declarations, so nothing is written twice."""

from __future__ import annotations

import difflib
import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ..errors import OpAttributeError, OpfusionTypeError, UnknownOpError
from .types import TensorType, TupleType, Type, normalize_dtype


class OpPatternKind(enum.IntEnum):
    """How an operator's output elements depend on its inputs; fusion reads only this."""

    kElemWise = 0
    kBroadcast = 1
    kInjective = 2
    kCommReduce = 3
    kOutEWiseFusable = 4
    kTuple = 7
    kOpaque = 8


# ---------------------------------------------------------------------------------------------
# attribute schema


class Attr:
    """One attribute of an operator: how to normalize a user's value, and its default.

    ``kind`` is one of ``int``, ``float``, ``bool``, ``str``, ``ints``, ``floats``, ``dtype``.
    ``length`` (for ``ints``/``floats``) is the required number of values; a single number is
    repeated to that length. ``optional`` allows ``None``. ``choices`` restricts strings.
    ``required`` attributes have no default. ``always_print`` shows the attribute in the text IR
    even at its default value (as conv2d's padding is)."""

    __slots__ = ("kind", "default", "length", "optional", "choices", "required", "always_print",
                 "doc")

    def __init__(
        self,
        kind: str,
        default: Any = None,
        *,
        length: int | None = None,
        optional: bool = False,
        choices: Sequence[str] | None = None,
        required: bool = False,
        always_print: bool = False,
        doc: str = "",
    ) -> None:
        assert kind in ("int", "float", "bool", "str", "ints", "floats", "dtype"), kind
        self.kind = kind
        self.length = length
        self.optional = optional
        self.choices = tuple(choices) if choices else None
        self.required = required
        self.always_print = always_print
        self.doc = doc
        self.default = default

    def normalize(self, value: Any, where: str) -> Any:
        """Convert ``value`` to the canonical, hashable form; raise OpAttributeError if bad."""
        if value is None:
            if self.optional:
                return None
            raise OpAttributeError(f"{where} must be given (it cannot be None)")
        try:
            return _NORMALIZERS[self.kind](self, value, where)
        except (TypeError, ValueError) as err:
            raise OpAttributeError(f"{where}: bad value {value!r} for a {self.kind} attribute"
                                   f" ({err})") from None


def _norm_int(spec: Attr, value: Any, where: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            return int(value)
        raise OpAttributeError(f"{where} must be an integer, got {value!r}")
    return int(value)


def _norm_float(spec: Attr, value: Any, where: str) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise OpAttributeError(f"{where} must be a number, got {value!r}")
    return float(value)


def _norm_bool(spec: Attr, value: Any, where: str) -> bool:
    if isinstance(value, (bool, np.bool_)) or value in (0, 1):
        return bool(value)
    raise OpAttributeError(f"{where} must be a boolean, got {value!r}")


def _norm_str(spec: Attr, value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise OpAttributeError(f"{where} must be a string, got {value!r}")
    if spec.choices and value not in spec.choices:
        raise OpAttributeError(f"{where} must be one of {', '.join(map(repr, spec.choices))}, "
                               f"got {value!r}")
    return value


def _norm_seq(spec: Attr, value: Any, where: str, one: Callable[[Attr, Any, str], Any]) -> tuple:
    if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
        if spec.length is None:
            items: list = [value]
        else:
            items = [value] * spec.length
    elif isinstance(value, (list, tuple, np.ndarray)):
        items = list(np.asarray(value).ravel()) if isinstance(value, np.ndarray) else list(value)
    else:
        raise OpAttributeError(f"{where} must be a list of numbers, got {value!r}")
    if spec.length is not None and len(items) != spec.length:
        raise OpAttributeError(f"{where} must have {spec.length} values, got {len(items)}")
    return tuple(one(spec, item, where) for item in items)


def _norm_dtype(spec: Attr, value: Any, where: str) -> str:
    try:
        return normalize_dtype(value)
    except Exception as err:  # noqa: BLE001 - re-raised with the attribute's name
        raise OpAttributeError(f"{where}: {err}") from None


_NORMALIZERS: dict[str, Callable[[Attr, Any, str], Any]] = {
    "int": _norm_int,
    "float": _norm_float,
    "bool": _norm_bool,
    "str": _norm_str,
    "ints": lambda spec, v, where: _norm_seq(spec, v, where, _norm_int),
    "floats": lambda spec, v, where: _norm_seq(spec, v, where, _norm_float),
    "dtype": _norm_dtype,
}


class Attrs(Mapping[str, Any]):
    """The normalized attributes of one call: an immutable, ordered, hashable mapping.

    Values are ints, floats, bools, strings, None or tuples of numbers; they can be read as
    items (``attrs["strides"]``) or attributes (``attrs.strides``)."""

    __slots__ = ("_items", "_hash", "checked_by")

    def __init__(self, items: Mapping[str, Any] | None = None,
                 checked_by: Op | None = None) -> None:
        object.__setattr__(self, "_items", dict(items or {}))
        object.__setattr__(self, "_hash", None)
        # The op whose schema validated these values (set by Op.make_attrs); a Call of that
        # op may reuse them without validating again.
        object.__setattr__(self, "checked_by", checked_by)

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __getattr__(self, key: str) -> Any:
        try:
            return self._items[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Attrs are immutable")

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._items == other._items
        return isinstance(other, Mapping) and self._items == dict(other)

    def __hash__(self) -> int:
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(tuple(self._items.items())))
        return self._hash

    def __repr__(self) -> str:
        return "Attrs(" + ", ".join(f"{k}={v!r}" for k, v in self._items.items()) + ")"


EMPTY_ATTRS = Attrs()


# ---------------------------------------------------------------------------------------------
# operators


class Op:
    """Base class of operator declarations. Subclasses set the class attributes and override
    :meth:`infer` and :meth:`reference`; :func:`register_op` makes the single instance.

    Conventions:
      * ``inputs`` names the tensor inputs; an op whose one input is a tuple of tensors
        (concatenate) sets ``tuple_input = True``.
      * ``infer(arg_types, attrs)`` returns the output type, raising OpfusionTypeError through
        :meth:`type_error` with the op and argument named.
      * ``reference(*arrays, **attrs)`` computes with NumPy; the interpreter casts its result
        to the inferred dtype, so references may compute in a wider type.
    """

    name: ClassVar[str] = ""
    inputs: ClassVar[tuple[str, ...]] = ()
    tuple_input: ClassVar[bool] = False
    attrs: ClassVar[dict[str, Attr]] = {}
    pattern: ClassVar[OpPatternKind] = OpPatternKind.kOpaque
    doc: ClassVar[str] = ""

    # -- type inference and reference: overridden by each declaration ---------------------
    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:  # pragma: no cover
        raise NotImplementedError(f"{self.name} declares no type inference")

    def reference(self, *args: np.ndarray, **attrs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError(f"{self.name} declares no reference implementation")

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Cross-attribute normalization (e.g. 2-value padding to 4 values); default: none."""
        return attrs

    # -- shared machinery ---------------------------------------------------------------
    @property
    def no_attrs(self) -> Attrs:
        """The (shared) empty attributes of an op whose schema has none."""
        cached = self.__dict__.get("_no_attrs")
        if cached is None:
            cached = self.__dict__["_no_attrs"] = Attrs({}, checked_by=self)
        return cached

    def make_attrs(self, given: Mapping[str, Any], where: str = "") -> Attrs:
        """Validate and normalize user attributes against the schema, filling defaults."""
        where = where or self.name
        unknown = [key for key in given if key not in self.attrs]
        if unknown:
            key = unknown[0]
            hint = difflib.get_close_matches(key, list(self.attrs), n=1)
            known = ", ".join(self.attrs) or "none"
            suggestion = f"; did you mean {hint[0]!r}?" if hint else f" (known: {known})"
            raise OpAttributeError(f"{where}: unknown attribute {key!r}{suggestion}")
        values: dict[str, Any] = {}
        for key, spec in self.attrs.items():
            if key in given:
                values[key] = spec.normalize(given[key], f"{where} attribute {key!r}")
            elif spec.required:
                raise OpAttributeError(f"{where}: attribute {key!r} is required")
            else:
                values[key] = (None if spec.default is None
                               else spec.normalize(spec.default, f"{where} attribute {key!r}"))
        return Attrs(self.normalize_attrs(values), checked_by=self)

    def type_error(self, message: str) -> OpfusionTypeError:
        return OpfusionTypeError(f"{self.name}: {message}")

    def expect_tensors(self, arg_types: Sequence[Type]) -> list[TensorType]:
        """Check the argument count and that every argument is a tensor."""
        if self.tuple_input:
            if len(arg_types) != 1 or not isinstance(arg_types[0], TupleType):
                raise self.type_error("expects one tuple of tensors as its input")
            fields = arg_types[0].fields
            if not fields or not all(isinstance(t, TensorType) for t in fields):
                raise self.type_error("expects a non-empty tuple of tensors")
            return list(fields)  # type: ignore[arg-type]
        if len(arg_types) != len(self.inputs):
            raise self.type_error(f"takes {len(self.inputs)} input(s) "
                                  f"({', '.join(self.inputs)}), got {len(arg_types)}")
        for name, ty in zip(self.inputs, arg_types):
            if not isinstance(ty, TensorType):
                raise self.type_error(f"input {name!r} must be a tensor, got {ty!r}")
        return list(arg_types)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"Op({self.name})"


_REGISTRY: dict[str, Op] = {}


def register_op(cls: type[Op]) -> type[Op]:
    """Class decorator: declare an operator. Its name must be unique."""
    assert cls.name and cls.name not in _REGISTRY, f"operator {cls.name!r} declared twice"
    _REGISTRY[cls.name] = cls()
    return cls


def get_op(name: str) -> Op:
    """Look up a declared operator by name (``"add"``, ``"nn.conv2d"``)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        hint = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        raise UnknownOpError(f"unknown operator {name!r}{suggestion}") from None


def list_ops() -> list[str]:
    """Names of every declared operator, in declaration order."""
    return list(_REGISTRY)
