"""A dataflow pattern language: describe a subgraph by its shape and find it.

Patterns are built from small constructors and combined like the expressions they match::

    x, w, b = wildcard(), wildcard(), is_constant()
    dense_add = is_op("add")(is_op("nn.dense")(x, w), b)
    dense_add.match(expr)                          # True / False
    node_map = dense_add.match_bindings(expr)      # None, or {pattern: matched node}
    node_map[x], node_map[b]

:mod:`opfusion.transform.pattern_rewrite` rewrites the matches (``rewrite((dense_add, fuse),
mod)``). Matching follows TVM's dataflow patterns:

* It is **structural**. ``is_op("add")(is_op("multiply")(a, b), c)`` matches an ``add`` whose
  first operand is a ``multiply``, whether or not that multiply has other users. A rewrite of
  the add therefore leaves the multiply in place for its other users (it is then computed
  twice); a rule that cares must check the users itself.
* A pattern object used twice inside one pattern must match the same node both times:
  ``x = wildcard(); is_op("add")(x, x)`` matches ``a + a`` but not ``a + b``.
* ``add`` and ``multiply`` are commutative: when their operands do not match in order, the
  swapped order is tried (``x * 1`` also finds ``1 * x``).
* ``is_op(name)`` alone, where an expression is expected, matches any call of that operator;
  called with argument patterns it matches only calls with exactly that many arguments, each
  matching its pattern.
* Type refinements (``has_dtype``, ``has_shape``, ``has_type``) read the node's inferred type;
  a node whose type cannot be inferred does not match them.

Patterns are small, so matching recurses over the *pattern*, never over the graph: a wildcard
does not look inside what it matches."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import OpfusionError
from ..ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ..ir.op import Op, get_op
from ..ir.types import TensorType, Type, normalize_dtype

__all__ = [
    "AltPattern", "AttrPattern", "Bindings", "CallPattern", "ConstantPattern",
    "DataTypePattern", "ExprPattern", "NamedPattern", "OpPattern", "Pattern",
    "PredicatePattern", "ShapePattern", "TupleGetItemPattern", "TuplePattern", "TypePattern",
    "VarPattern", "WildcardPattern", "has_attr", "has_dtype", "has_shape", "has_type",
    "is_constant", "is_expr", "is_op", "is_tuple", "is_tuple_get_item", "is_var", "wildcard",
]

#: Operators whose two operands may be matched in either order.
COMMUTATIVE_OPS = ("add", "multiply")

Matchable = Expr | Op  # what a pattern can be matched against: a node, or a call's op


# ---------------------------------------------------------------------------------------------
# patterns


class Pattern:
    """Base class of patterns. Combine with ``|`` (alternatives) and call to build a call
    pattern: ``(is_op("add") | is_op("subtract"))(wildcard(), is_constant())``.

    Patterns are compared by identity (they are dictionary keys of a match's bindings)."""

    def __or__(self, other: Pattern) -> AltPattern:
        return AltPattern(self, _as_pattern(other, "the right side of |"))

    def __ror__(self, other: Pattern) -> AltPattern:
        return AltPattern(_as_pattern(other, "the left side of |"), self)

    def __call__(self, *args: Pattern | Expr) -> CallPattern:
        return CallPattern(self, args)

    # -- refinements ---------------------------------------------------------------------
    def has_attr(self, attrs: Mapping[str, Any]) -> AttrPattern:
        """Also require attributes: a call's attributes, a function's attributes, or for an
        operator pattern its ``TOpPattern`` (an :class:`~opfusion.ir.OpPatternKind`)."""
        return AttrPattern(self, attrs)

    def has_type(self, ty: Type) -> TypePattern:
        """Also require the matched value to have exactly this type."""
        return TypePattern(self, ty)

    def has_dtype(self, dtype: object) -> DataTypePattern:
        """Also require a tensor of this dtype (``"float32"``, ``np.int64``, ...)."""
        return DataTypePattern(self, dtype)

    def has_shape(self, shape: Sequence[int]) -> ShapePattern:
        """Also require a tensor of this shape."""
        return ShapePattern(self, shape)

    def where(self, predicate: Callable[[Expr], bool]) -> PredicatePattern:
        """Also require ``predicate(node)`` to be true (for conditions patterns cannot say,
        such as "a constant whose elements are all 1")."""
        return PredicatePattern(self, predicate)

    def named(self, name: str) -> NamedPattern:
        """This pattern under a name, so a match's bindings can be read as ``node_map[name]``."""
        return NamedPattern(self, name)

    # -- matching ------------------------------------------------------------------------
    def match(self, expr: Expr) -> bool:
        """Whether ``expr`` matches this pattern."""
        return self.match_bindings(expr) is not None

    def match_bindings(self, expr: Expr) -> Bindings | None:
        """The node each part of this pattern matched (this pattern included), or None when
        ``expr`` does not match."""
        matcher = _Matcher()
        if not matcher.match(self, expr):
            return None
        return Bindings(matcher.memo)

    def root_ops(self) -> frozenset[Op] | None:
        """The operators a node must call for this pattern to match it, or None when it may
        match other nodes too. Rewriting uses it to skip rules that cannot apply."""
        return None

    def _roots(self) -> frozenset[Op] | None:
        # root_ops, computed once (a pattern does not change after it is built)
        try:
            return self.__dict__["_root_ops"]
        except KeyError:
            roots = self.__dict__["_root_ops"] = self.root_ops()
            return roots

    # -- implemented by each kind --------------------------------------------------------
    def _match(self, node: Matchable, matcher: _Matcher) -> bool:  # pragma: no cover
        raise NotImplementedError

    def _text(self) -> str:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return self._text()


def _as_pattern(value: Any, where: str) -> Pattern:
    if isinstance(value, Pattern):
        return value
    if isinstance(value, Expr):
        return ExprPattern(value)
    raise OpfusionError(f"{where} must be a pattern (wildcard(), is_op(...), ...) or an "
                        f"expression, got {type(value).__name__} {value!r}")


class WildcardPattern(Pattern):
    """Matches anything."""

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        return True

    def _text(self) -> str:
        return "wildcard()"


class ExprPattern(Pattern):
    """Matches one particular node; a constant also matches a constant of equal value."""

    def __init__(self, expr: Expr) -> None:
        if not isinstance(expr, Expr):
            raise OpfusionError(f"is_expr takes an expression, got {type(expr).__name__}")
        self.expr = expr

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        if node is self.expr:
            return True
        if isinstance(node, Constant) and isinstance(self.expr, Constant):
            a, b = node.data, self.expr.data
            return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
        return False

    def _text(self) -> str:
        return f"is_expr({self.expr!r})"


class OpPattern(Pattern):
    """Matches the operator of a call (in a call pattern's operator position), or, where an
    expression is expected, any call of that operator."""

    def __init__(self, op: Op) -> None:
        self.op = op

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        if isinstance(node, Call):
            return node.op is self.op
        return node is self.op

    def root_ops(self) -> frozenset[Op] | None:
        return frozenset([self.op])

    def _text(self) -> str:
        return f"is_op({self.op.name!r})"


class CallPattern(Pattern):
    """Matches a call whose operator matches ``op`` and whose arguments match ``args`` one by
    one (the same number of them)."""

    def __init__(self, op: Pattern, args: Sequence[Pattern | Expr]) -> None:
        self.op = _as_pattern(op, "a call pattern's operator")
        self.args = tuple(_as_pattern(arg, f"argument {i} of a call pattern")
                          for i, arg in enumerate(args))
        if isinstance(self.op, OpPattern):
            declared = self.op.op
            count = 1 if declared.tuple_input else len(declared.inputs)
            if len(self.args) != count:
                inputs = "one tuple" if declared.tuple_input else ", ".join(declared.inputs)
                raise OpfusionError(f"is_op({declared.name!r}) takes {count} argument "
                                    f"pattern(s) ({inputs or 'none'}), got {len(self.args)}")

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        if not isinstance(node, Call) or len(node.args) != len(self.args):
            return False
        if not matcher.match(self.op, node.op):
            return False
        mark = matcher.mark()
        if _match_all(matcher, self.args, node.args):
            return True
        matcher.rollback(mark)
        if len(node.args) == 2 and isinstance(node.op, Op) and node.op.name in COMMUTATIVE_OPS:
            if _match_all(matcher, self.args, node.args[::-1]):
                return True
            matcher.rollback(mark)
        return False

    def root_ops(self) -> frozenset[Op] | None:
        return self.op.root_ops()

    def _text(self) -> str:
        return f"{self.op._text()}({', '.join(arg._text() for arg in self.args)})"


def _match_all(matcher: _Matcher, patterns: Sequence[Pattern], nodes: Sequence[Expr]) -> bool:
    return all(matcher.match(pattern, node) for pattern, node in zip(patterns, nodes))


class VarPattern(Pattern):
    """Matches a variable, with the given name if one is given."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        return isinstance(node, Var) and (self.name is None or node.name_hint == self.name)

    def _text(self) -> str:
        return "is_var()" if self.name is None else f"is_var({self.name!r})"


class ConstantPattern(Pattern):
    """Matches any constant."""

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        return isinstance(node, Constant)

    def _text(self) -> str:
        return "is_constant()"


class TuplePattern(Pattern):
    """Matches a tuple with exactly these fields."""

    def __init__(self, fields: Sequence[Pattern | Expr]) -> None:
        self.fields = tuple(_as_pattern(field, f"tuple field {i}")
                            for i, field in enumerate(fields))

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        return (isinstance(node, Tuple) and len(node.fields) == len(self.fields)
                and _match_all(matcher, self.fields, node.fields))

    def _text(self) -> str:
        return f"is_tuple([{', '.join(field._text() for field in self.fields)}])"


class TupleGetItemPattern(Pattern):
    """Matches field ``index`` (any field for None) of a tuple value matching ``tuple``."""

    def __init__(self, tuple_value: Pattern | Expr, index: int | None = None) -> None:
        self.tuple_value = _as_pattern(tuple_value, "is_tuple_get_item's tuple")
        self.index = None if index is None else int(index)

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        return (isinstance(node, TupleGetItem)
                and (self.index is None or node.index == self.index)
                and matcher.match(self.tuple_value, node.tuple_value))

    def _text(self) -> str:
        return f"is_tuple_get_item({self.tuple_value._text()}, {self.index})"


class AltPattern(Pattern):
    """Matches what ``left`` matches, else what ``right`` matches (``left | right``)."""

    def __init__(self, left: Pattern, right: Pattern) -> None:
        self.left = left
        self.right = right

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        return matcher.match(self.left, node) or matcher.match(self.right, node)

    def root_ops(self) -> frozenset[Op] | None:
        left, right = self.left.root_ops(), self.right.root_ops()
        return None if left is None or right is None else left | right

    def _text(self) -> str:
        return f"({self.left._text()} | {self.right._text()})"


class _Refinement(Pattern):
    """A pattern that matches what ``pattern`` matches, with a further condition."""

    def __init__(self, pattern: Pattern) -> None:
        self.pattern = _as_pattern(pattern, "a refined pattern")

    def root_ops(self) -> frozenset[Op] | None:
        return self.pattern.root_ops()


class AttrPattern(_Refinement):
    """Matches what ``pattern`` matches when the node also has these attribute values."""

    def __init__(self, pattern: Pattern, attrs: Mapping[str, Any]) -> None:
        if not isinstance(attrs, Mapping):
            raise OpfusionError(f"has_attr takes a mapping of attribute values, got "
                                f"{type(attrs).__name__}")
        super().__init__(pattern)
        self.attrs = dict(attrs)

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        if not matcher.match(self.pattern, node):
            return False
        for key, want in self.attrs.items():
            found, have = _attribute(node, key)
            if not found or not _same_value(have, want):
                return False
        return True

    def _text(self) -> str:
        return f"{self.pattern._text()}.has_attr({self.attrs!r})"


def _attribute(node: Matchable, key: str) -> tuple[bool, Any]:
    """(whether ``node`` has attribute ``key``, its value)."""
    if isinstance(node, Op):
        if key == "TOpPattern":
            return True, node.pattern
        return False, None
    if isinstance(node, (Call, Function)) and key in node.attrs:
        return True, node.attrs[key]
    return False, None


def _same_value(have: Any, want: Any) -> bool:
    if isinstance(have, str) and not isinstance(want, str) and want is not None:
        try:  # a dtype attribute given as a NumPy dtype
            return have == normalize_dtype(want)
        except OpfusionError:
            return False
    return _canonical(have) == _canonical(want)


def _canonical(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return tuple(_canonical(item) for item in value.tolist())
    if isinstance(value, (list, tuple)):
        return tuple(_canonical(item) for item in value)
    if isinstance(value, np.generic):
        return value.item()
    return value


class _TypeCheck(_Refinement):
    """Matches what ``pattern`` matches when the node's inferred type passes ``accepts``."""

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        if not matcher.match(self.pattern, node) or not isinstance(node, Expr):
            return False
        ty = _type_of(node)
        return ty is not None and self.accepts(ty)

    def accepts(self, ty: Type) -> bool:  # pragma: no cover
        raise NotImplementedError


def _type_of(node: Expr) -> Type | None:
    """The node's type, or None when it cannot be inferred here (e.g. a call of a global
    function outside its module)."""
    try:
        return node.checked_type
    except OpfusionError:
        return None


class TypePattern(_TypeCheck):
    """Matches what ``pattern`` matches when the value has exactly type ``ty``."""

    def __init__(self, pattern: Pattern, ty: Type) -> None:
        super().__init__(pattern)
        if not isinstance(ty, Type):
            raise OpfusionError(f"has_type takes a type (TensorType(...)), got {ty!r}")
        self.ty = ty

    def accepts(self, ty: Type) -> bool:
        return ty == self.ty

    def _text(self) -> str:
        return f"{self.pattern._text()}.has_type({self.ty!r})"


class DataTypePattern(_TypeCheck):
    """Matches what ``pattern`` matches when the value is a tensor of dtype ``dtype``."""

    def __init__(self, pattern: Pattern, dtype: object) -> None:
        super().__init__(pattern)
        self.dtype = normalize_dtype(dtype)

    def accepts(self, ty: Type) -> bool:
        return isinstance(ty, TensorType) and ty.dtype == self.dtype

    def _text(self) -> str:
        return f"{self.pattern._text()}.has_dtype({self.dtype!r})"


class ShapePattern(_TypeCheck):
    """Matches what ``pattern`` matches when the value is a tensor of shape ``shape``."""

    def __init__(self, pattern: Pattern, shape: Sequence[int]) -> None:
        super().__init__(pattern)
        self.shape = tuple(int(dim) for dim in shape)

    def accepts(self, ty: Type) -> bool:
        return isinstance(ty, TensorType) and ty.shape == self.shape

    def _text(self) -> str:
        return f"{self.pattern._text()}.has_shape({self.shape})"


class PredicatePattern(_Refinement):
    """Matches what ``pattern`` matches when ``predicate(node)`` is also true."""

    def __init__(self, pattern: Pattern, predicate: Callable[[Expr], bool]) -> None:
        if not callable(predicate):
            raise OpfusionError(f"where takes a function of the matched node, got "
                                f"{predicate!r}")
        super().__init__(pattern)
        self.predicate = predicate

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        return matcher.match(self.pattern, node) and bool(self.predicate(node))  # type: ignore[arg-type]

    def _text(self) -> str:
        name = getattr(self.predicate, "__name__", "predicate")
        return f"{self.pattern._text()}.where({name})"


class NamedPattern(_Refinement):
    """``pattern`` under a name: a match's bindings give its node as ``node_map[name]``."""

    def __init__(self, pattern: Pattern, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise OpfusionError(f"a pattern's name must be a non-empty string, got {name!r}")
        super().__init__(pattern)
        self.name = name

    def _match(self, node: Matchable, matcher: _Matcher) -> bool:
        return matcher.match(self.pattern, node)

    def _text(self) -> str:
        return f"{self.pattern._text()}.named({self.name!r})"


# ---------------------------------------------------------------------------------------------
# constructors (TVM's names)


def wildcard() -> WildcardPattern:
    """A pattern that matches anything."""
    return WildcardPattern()


def is_op(name: str) -> OpPattern:
    """A pattern for the operator ``name``; call it with argument patterns to match calls:
    ``is_op("nn.relu")(wildcard())``. An unknown name is an error (with a suggestion)."""
    return OpPattern(get_op(name))


def is_expr(expr: Expr) -> ExprPattern:
    """A pattern that matches ``expr`` itself (a constant: any constant of equal value)."""
    return ExprPattern(expr)


def is_var(name: str | None = None) -> VarPattern:
    """A pattern for a variable, named ``name`` if given."""
    return VarPattern(name)


def is_constant() -> ConstantPattern:
    """A pattern for a constant tensor."""
    return ConstantPattern()


def is_tuple(fields: Sequence[Pattern | Expr]) -> TuplePattern:
    """A pattern for a tuple whose fields match ``fields``."""
    return TuplePattern(fields)


def is_tuple_get_item(tuple_value: Pattern | Expr, index: int | None = None
                      ) -> TupleGetItemPattern:
    """A pattern for field ``index`` (any, for None) of a tuple matching ``tuple_value``."""
    return TupleGetItemPattern(tuple_value, index)


def has_attr(attrs: Mapping[str, Any], pattern: Pattern | None = None) -> AttrPattern:
    """``pattern`` (default: anything) with these attribute values."""
    return (pattern or wildcard()).has_attr(attrs)


def has_type(ty: Type, pattern: Pattern | None = None) -> TypePattern:
    """``pattern`` (default: anything) with exactly type ``ty``."""
    return (pattern or wildcard()).has_type(ty)


def has_dtype(dtype: object, pattern: Pattern | None = None) -> DataTypePattern:
    """``pattern`` (default: anything) with tensor dtype ``dtype``."""
    return (pattern or wildcard()).has_dtype(dtype)


def has_shape(shape: Sequence[int], pattern: Pattern | None = None) -> ShapePattern:
    """``pattern`` (default: anything) with tensor shape ``shape``."""
    return (pattern or wildcard()).has_shape(shape)


# ---------------------------------------------------------------------------------------------
# matching


class _Matcher:
    """One match attempt: ``memo`` binds each pattern tried so far to its node, in order, so
    a failed branch is undone by dropping the bindings made after a mark."""

    def __init__(self) -> None:
        self.memo: dict[Pattern, Matchable] = {}

    def match(self, pattern: Pattern, node: Matchable) -> bool:
        memo = self.memo
        if pattern in memo:
            return memo[pattern] is node
        roots = pattern._roots()
        if roots is not None:  # a quick no: the node does not call one of these operators
            op = node.op if isinstance(node, Call) else node
            if op not in roots:
                return False
        mark = len(memo)
        if not pattern._match(node, self):
            self.rollback(mark)
            return False
        memo[pattern] = node
        return True

    def mark(self) -> int:
        return len(self.memo)

    def rollback(self, mark: int) -> None:
        memo = self.memo
        while len(memo) > mark:
            memo.popitem()  # dicts pop the most recently bound first


class Bindings(Mapping[Pattern, Any]):
    """What a successful match bound: ``node_map[pattern]`` is the node that ``pattern`` (any
    part of the matched pattern) matched, ``node_map["name"]`` the node of the part named
    ``name`` with :meth:`Pattern.named`. Parts of an alternative that was not taken are
    absent. An operator pattern binds the :class:`~opfusion.ir.Op` itself.

    (TVM's callbacks receive a list of nodes per pattern; here it is the node.)"""

    def __init__(self, memo: Mapping[Pattern, Matchable]) -> None:
        self._memo = dict(memo)

    def __getitem__(self, key: Pattern | str) -> Any:
        if isinstance(key, str):
            return self._by_name(key)
        return self._memo[key]

    def _by_name(self, name: str) -> Any:
        nodes = [node for pattern, node in self._memo.items()
                 if isinstance(pattern, NamedPattern) and pattern.name == name]
        if not nodes:
            raise KeyError(name)
        if any(node is not nodes[0] for node in nodes[1:]):
            raise OpfusionError(f"two parts of the pattern are named {name!r} and matched "
                                "different nodes; give them distinct names")
        return nodes[0]

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return any(isinstance(p, NamedPattern) and p.name == key for p in self._memo)
        return key in self._memo

    def __iter__(self) -> Iterator[Pattern]:
        return iter(self._memo)

    def __len__(self) -> int:
        return len(self._memo)

    def __repr__(self) -> str:
        return "Bindings(" + ", ".join(f"{p!r}: {n!r}" for p, n in self._memo.items()) + ")"
