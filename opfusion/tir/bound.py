"""Symbolic intervals: the values an index expression takes while some variables sweep ranges.

Bound inference asks, for a consumer's read ``A[xo*64 + xi]`` with ``xi`` sweeping [0, 64)
and ``xo`` fixed, which part of ``A`` is touched: ``[xo*64, xo*64 + 63]``. Variables not in
``relax`` stay symbolic. Results are inclusive ``(lo, hi)`` pairs of expressions, or None when
the expression is not monotone enough to bound (the caller then takes the whole dimension)."""

from __future__ import annotations

from . import expr as E
from .simplify import Ranges, linear_form, simplify

Interval = tuple[E.PrimExpr, E.PrimExpr]


def _uses(e: E.PrimExpr, relax: dict[E.Var, Interval]) -> bool:
    return any(isinstance(n, E.Var) and n in relax for n in E.post_order(e))


def eval_interval(e: E.PrimExpr, relax: dict[E.Var, Interval],
                  ranges: Ranges | None = None) -> Interval | None:
    """The inclusive interval of integer ``e`` when each variable of ``relax`` sweeps its
    interval; ``ranges`` (constant bounds of all variables) help simplify the result."""
    out = _interval(e, relax)
    if out is None:
        return None
    return simplify(out[0], ranges), simplify(out[1], ranges)


def _interval(e: E.PrimExpr, relax: dict[E.Var, Interval]) -> Interval | None:
    if not _uses(e, relax):
        return e, e
    if isinstance(e, E.Var):
        return relax[e]
    if isinstance(e, (E.Add, E.Sub, E.Mul)):
        lin = linear_form(e)
        lo = hi = E.IntImm(lin.const, e.dtype)
        for coef, atom in lin.terms.values():
            if not _uses(atom, relax):
                sub: Interval | None = (atom, atom)
            elif isinstance(atom, E.Mul):
                return None  # a product of two varying values
            else:
                sub = _interval(atom, relax)
            if sub is None:
                return None
            a, b = E.mul(sub[0], coef), E.mul(sub[1], coef)
            if coef < 0:
                a, b = b, a
            lo, hi = E.add(lo, a), E.add(hi, b)
        return lo, hi
    if isinstance(e, E.FloorDiv) and isinstance(e.b, E.IntImm) and e.b.value > 0:
        sub = _interval(e.a, relax)
        return None if sub is None else (E.floordiv(sub[0], e.b), E.floordiv(sub[1], e.b))
    if isinstance(e, E.FloorMod) and isinstance(e.b, E.IntImm) and e.b.value > 0:
        return E.IntImm(0, e.dtype), E.IntImm(e.b.value - 1, e.dtype)
    if isinstance(e, (E.Min, E.Max)):
        a, b = _interval(e.a, relax), _interval(e.b, relax)
        if a is None or b is None:
            return None
        pick = E.minimum if isinstance(e, E.Min) else E.maximum
        return pick(a[0], b[0]), pick(a[1], b[1])
    if isinstance(e, E.Select):
        a, b = _interval(e.true_value, relax), _interval(e.false_value, relax)
        if a is None or b is None:
            return None
        return E.minimum(a[0], b[0]), E.maximum(a[1], b[1])
    if isinstance(e, E.Cast) and E.is_int(e.value.dtype) and E.is_int(e.dtype):
        sub = _interval(e.value, relax)
        return None if sub is None else (E.cast(sub[0], e.dtype), E.cast(sub[1], e.dtype))
    return None


def union(a: Interval | None, b: Interval | None, ranges: Ranges | None = None) -> Interval | None:
    """The smallest interval holding both (None if either is unknown)."""
    if a is None or b is None:
        return None
    return simplify(E.minimum(a[0], b[0]), ranges), simplify(E.maximum(a[1], b[1]), ranges)


__all__ = ["Interval", "eval_interval", "union"]
