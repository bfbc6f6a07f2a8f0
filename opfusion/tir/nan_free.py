"""Which float values of an expression can never be NaN, from their form and bounds.

A quantized kernel's epilogue computes its float values from an integer accumulator and
finite constants: ``clip(round((float(acc) * s + b) / s') + z, 0, 255)``, then
``where(isnan(c), 0, c)``, a residual ``(c - z) * s + float(bytes) * s''`` and the casts'
NaN rule. None of them can be NaN (an integer converts to a finite float; sums, products
and quotients of bounded values by finite non-zero constants stay bounded), so every NaN
test there is false, and a min or max of two such values is the machine's own ``vminps`` /
``vmaxps``, one instruction where the NaN-propagating form takes four. On the expansion
convolutions of a quantized ResNet-50 (64 input channels, a residual add and two
requantizations after them) the epilogue was two thirds of the kernel's instructions.

Each float node gets an interval that holds every value it can take (infinite ends where it
may overflow or is unbounded) and whether it may be NaN, computed in float64 with a margin
below float32's largest value (a bound beyond ``FINITE_LIMIT`` counts as infinite). The
analysis is conservative: loads of floats (but a kernel's constants, whose values the
lowering records), variables bound outside the expression, and intrinsics other than the
rounding ones, ``fabs`` and ``exp`` may be anything."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from . import expr as E
from .mma import tf32_exact_array
from .simplify import structural_equal

#: Magnitudes from which a bound counts as infinite: well below float32's largest (3.4e38),
#: so that rounding the float32 arithmetic may add cannot leave the interval finite.
FINITE_LIMIT = 1e37
INF = math.inf


@dataclass(frozen=True)
class Fact:
    """Every value a node can take lies in [low, high] (infinite ends: unbounded, or it may
    overflow), and it may be NaN when ``nan``; ``zero``: it may be exactly zero; ``tf32``:
    every value is one TF32 holds exactly (10 bits of mantissa: a tensor core's operand as
    it is, :func:`opfusion.tir.mma.round_tf32`), known of constants only."""

    low: float
    high: float
    nan: bool
    zero: bool = True
    tf32: bool = False


ANYTHING = Fact(-INF, INF, True)


def _bounded(low: float, high: float, nan: bool = False, zero: bool | None = None) -> Fact:
    low = -INF if math.isnan(low) or low < -FINITE_LIMIT else low
    high = INF if math.isnan(high) or high > FINITE_LIMIT else high
    return Fact(low, high, nan, low <= 0 <= high if zero is None else zero)


def constant_fact(data: np.ndarray, tf32: bool = False) -> Fact | None:
    """The fact of a load of a constant float array, or None (empty, not float); with
    ``tf32``, whether its values are all TF32's too (a pass over the array, asked for only
    where tensor cores may read it)."""
    data = np.asarray(data)  # (no copy of an array)
    if data.dtype.kind != "f" or not data.size:
        return None
    fact = _value_fact(data)
    if tf32 and data.dtype == np.float32 and tf32_exact_array(data):
        return replace(fact, tf32=True)
    return fact


def _value_fact(data: np.ndarray) -> Fact:
    """The bounds, NaN and zero of a non-empty float array."""
    # In the array's own dtype, without copies: a model's weights are hundreds of MB
    low, high = float(data.min()), float(data.max())  # NaN if any value is
    nan = math.isnan(low) or math.isnan(high)
    if nan:
        if bool(np.isnan(data).all()):
            return ANYTHING
        low, high = float(np.nanmin(data)), float(np.nanmax(data))
    # (NaN is no zero: all() takes it as true)
    return _bounded(low, high, nan, low <= 0 <= high and not bool(np.all(data)))


class NanFacts:
    """The :class:`Fact` of each float node of the expressions it is asked about, memoized by
    node identity (the nodes are held, so no other node takes one's id). ``constants``:
    facts of buffers (by id; the caller keeps the buffers alive) that hold a kernel's
    constants."""

    def __init__(self, constants: dict[int, Fact] | None = None) -> None:
        self.facts: dict[int, Fact] = {}
        #: the nodes of ``facts`` and the variables of ``bound``, held
        self._held: list[E.PrimExpr] = []
        #: facts of let-bound variables, by the variable's id
        self.bound: dict[int, Fact] = {}
        self.constants = dict(constants or {})

    def nan_free(self, node: E.PrimExpr) -> bool:
        """Whether ``node`` can never be NaN."""
        return not self.fact(node).nan

    def bind(self, var: E.Var, value: E.PrimExpr) -> None:
        """Record ``var`` (a let statement's) as bound to ``value``."""
        self._held.append(var)
        self.bound[id(var)] = self.fact(value)

    def fact(self, root: E.PrimExpr) -> Fact:
        if id(root) not in self.facts:
            order = E.post_order(root, enter=lambda n: not isinstance(n, E.BufferLoad))
            # a let's value comes before its body in the order: its variable is bound then
            values = {id(n.value): n.var for n in order if isinstance(n, E.Let)}
            for node in order:
                if id(node) not in self.facts:
                    self.facts[id(node)] = self._fact(node)
                    self._held.append(node)
                if id(node) in values:
                    self.bound[id(values[id(node)])] = self.facts[id(node)]
        return self.facts[id(root)]

    def _of(self, node: E.PrimExpr) -> Fact:
        return self.facts.get(id(node), ANYTHING)

    def _fact(self, node: E.PrimExpr) -> Fact:
        if not E.is_float(node.dtype):
            return _integer_fact(node.dtype)
        if isinstance(node, E.FloatImm):
            value = float(node.value)
            if math.isnan(value):
                return ANYTHING
            return _bounded(value, value, zero=value == 0)
        if isinstance(node, E.Cast):
            source = self._of(node.value)
            return _bounded(source.low, source.high, source.nan, source.zero)
        if isinstance(node, (E.Add, E.Sub)):
            return _sum(self._of(node.a), self._of(node.b), isinstance(node, E.Sub))
        if isinstance(node, E.Mul):
            return _product(self._of(node.a), self._of(node.b))
        if isinstance(node, E.Div):
            return _quotient(self._of(node.a), node.b)
        if isinstance(node, (E.Min, E.Max)):
            a, b = self._of(node.a), self._of(node.b)
            pick = min if isinstance(node, E.Min) else max
            return _bounded(pick(a.low, b.low), pick(a.high, b.high), a.nan or b.nan)
        if isinstance(node, E.Select):
            a, b = self._of(node.true_value), self._of(node.false_value)
            kept = _kept_when_not_nan(node)
            if kept is not None:  # x != x ? t : x (QuantizeLinear's NaN rule): x is no NaN
                b = Fact(b.low, b.high, False, b.zero) if kept else b
                a = Fact(a.low, a.high, False, a.zero) if not kept else a
            return _bounded(min(a.low, b.low), max(a.high, b.high), a.nan or b.nan)
        if isinstance(node, E.Let):
            return self._of(node.body)
        if isinstance(node, E.Var):
            return self.bound.get(id(node), ANYTHING)
        if isinstance(node, E.Call):
            return self._call(node)
        if isinstance(node, E.BufferLoad):
            return self.constants.get(id(node.buffer), ANYTHING)
        return ANYTHING

    def _call(self, node: E.Call) -> Fact:
        if len(node.args) != 1:
            return ANYTHING
        arg = self._of(node.args[0])
        if node.name in ("round", "nearbyint", "floor", "ceil", "trunc"):
            return _bounded(_whole(arg.low, math.floor), _whole(arg.high, math.ceil), arg.nan)
        if node.name in ("fabs", "abs"):
            top = max(abs(arg.low), abs(arg.high))
            bottom = 0.0 if arg.low <= 0 <= arg.high else min(abs(arg.low), abs(arg.high))
            return _bounded(bottom, top, arg.nan)
        if node.name == "exp":
            return _bounded(_exp(arg.low), _exp(arg.high), arg.nan)
        return ANYTHING


def _integer_fact(dtype: str) -> Fact:
    if E.is_float(dtype) or dtype == "bool":
        return Fact(0.0, 1.0, False)
    info = np.iinfo(np.dtype(dtype))
    return Fact(float(info.min), float(info.max), False)


def _whole(value: float, to_whole: Callable[[float], int]) -> float:
    return value if math.isinf(value) else float(to_whole(value))


def _exp(value: float) -> float:
    return INF if value > 700 else math.exp(value)


def _sum(a: Fact, b: Fact, subtract: bool) -> Fact:
    low_b, high_b = (-b.high, -b.low) if subtract else (b.low, b.high)
    nan = a.nan or b.nan or (a.high == INF and low_b == -INF) or \
        (a.low == -INF and high_b == INF)
    return _bounded(a.low + low_b, a.high + high_b, nan)


def _product(a: Fact, b: Fact) -> Fact:
    # inf * 0 is NaN: an operand that may be infinite beside one that may be zero
    infinite_a = math.isinf(a.low) or math.isinf(a.high)
    infinite_b = math.isinf(b.low) or math.isinf(b.high)
    nan = a.nan or b.nan or (infinite_a and b.zero) or (infinite_b and a.zero)
    if nan:
        return ANYTHING
    ends = [x * y for x in (a.low, a.high) for y in (b.low, b.high)
            if not (math.isinf(x) and y == 0) and not (math.isinf(y) and x == 0)]
    return _bounded(min(ends), max(ends), False, a.zero or b.zero)


def _quotient(a: Fact, divisor: E.PrimExpr) -> Fact:
    """A division by a literal that is finite and not zero; anything else may be NaN."""
    if not (isinstance(divisor, E.FloatImm) and math.isfinite(divisor.value)
            and divisor.value != 0) or a.nan:
        return ANYTHING
    ends = sorted((a.low / divisor.value, a.high / divisor.value))
    return _bounded(ends[0], ends[1], False, a.zero)


def _self_comparison(test: E.PrimExpr) -> E.PrimExpr | None:
    """``x`` when ``test`` compares a float value with itself (``x != x``: NaN, ``x == x``:
    not NaN); else None."""
    if not isinstance(test, (E.NE, E.EQ)) or not E.is_float(test.a.dtype):
        return None
    return test.a if test.a is test.b or structural_equal(test.a, test.b) else None


def _kept_when_not_nan(node: E.Select) -> bool | None:
    """For ``x != x ? t : x`` (or ``x == x ? x : t``), which branch is ``x`` taken only when
    it is no NaN: True for the false branch, False for the true one; else None."""
    value = _self_comparison(node.condition)
    if value is None:
        return None
    not_nan = isinstance(node.condition, E.NE)
    kept = node.false_value if not_nan else node.true_value
    return not_nan if kept is value or structural_equal(kept, value) else None


def always_false_nan_test(node: E.PrimExpr, facts: NanFacts) -> bool | None:
    """For a comparison of a value with itself (``x != x``: NaN; ``x == x``: not NaN) of a
    NaN-free ``x``, its constant result; else None."""
    value = _self_comparison(node)
    if value is None or not facts.nan_free(value):
        return None
    return isinstance(node, E.EQ)


def join_facts(a: dict[int, Fact], b: dict[int, Fact]) -> dict[int, Fact]:
    """The facts (by key: a kernel input's position) that hold for both ``a`` and ``b``: the
    keys both know, each with both bounds."""
    return {k: Fact(min(a[k].low, b[k].low), max(a[k].high, b[k].high), a[k].nan or b[k].nan,
                    a[k].zero or b[k].zero, a[k].tf32 and b[k].tf32) for k in a if k in b}


__all__ = ["ANYTHING", "FINITE_LIMIT", "Fact", "NanFacts", "always_false_nan_test",
           "constant_fact", "join_facts"]
