"""Arithmetic simplifier: canonical linear forms of integer expressions, bounds, and guard removal.

An integer expression is read as a *linear form* ``sum(coef * atom) + const`` where an atom is a
variable or an expression that is not linear (``x // 4``, ``min(a, b)``, ``x * y``). On top of
that, small rules:

    (x*64 + y) // 64   ->  x          when 0 <= y < 64       (split the divisible part off)
    (x*64 + y) % 64    ->  y          when 0 <= y < 64
    min(a, b)          ->  a          when a - b <= 0 for every value in range
    a < b              ->  True       when a - b < 0 for every value in range
    a < b              ->  lhs < rhs  with positive terms left, negative terms and constant right

Ranges (inclusive integer bounds per variable) come from the caller or, in
:func:`simplify_stmt`, from the enclosing loops, so ``xo*64 + xi < 1024`` with ``xo`` in
[0, 16) and ``xi`` in [0, 64) simplifies to ``True`` and its ``if`` disappears.

Expressions are small: the helpers recurse over expression depth; statements are visited by
nesting depth (loop depth), never by the length of a sequence."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from . import expr as E
from . import stmt as S

Number = int | float  # float only for +-inf
Bound = tuple[Number, Number]
Ranges = dict[E.Var, Bound]

_INF = math.inf


# ---------------------------------------------------------------------------------------------
# structural keys


def var_key(v: E.Var) -> Any:
    """The structural key of a variable (its identity; never the Var itself, whose ``==``
    builds an expression)."""
    return ("Var", id(v))


def structural_key(e: E.PrimExpr) -> Any:
    """A hashable key equal for structurally equal expressions (variables by identity). Keys
    hold ids only: use them while the expressions they came from are alive."""
    if isinstance(e, E.Var):
        return var_key(e)
    if isinstance(e, (E.IntImm, E.FloatImm)):
        return (type(e).__name__, e.dtype, e.value)
    extra: Any = None
    if isinstance(e, E.Call):
        extra = e.name
    elif isinstance(e, E.BufferLoad):
        extra = id(e.buffer)
    elif isinstance(e, E.Let):
        extra = id(e.var)
    elif not isinstance(e, (E.BinaryOp, E.Not, E.Select, E.Cast)):
        extra = id(e)  # an unknown node (tensor expression): by identity
    return (type(e).__name__, e.dtype, extra, tuple(structural_key(c) for c in e.children()))


def structural_equal(a: E.PrimExpr, b: E.PrimExpr) -> bool:
    """Same tree, same variables."""
    return a is b or structural_key(a) == structural_key(b)


# ---------------------------------------------------------------------------------------------
# linear forms


class Linear:
    """``sum(coef * atom) + const`` over integer atoms; terms keyed structurally, in order."""

    __slots__ = ("terms", "const", "dtype")

    def __init__(self, dtype: str, const: int = 0) -> None:
        self.terms: dict[Any, list[Any]] = {}  # key -> [coef, atom]
        self.const = const
        self.dtype = dtype

    def add_term(self, coef: int, atom: E.PrimExpr, key: Any = None) -> None:
        if coef == 0:
            return
        key = structural_key(atom) if key is None else key
        slot = self.terms.get(key)
        if slot is None:
            self.terms[key] = [coef, atom]
        else:
            slot[0] += coef
            if slot[0] == 0:
                del self.terms[key]

    def add(self, other: Linear, scale: int = 1) -> None:
        self.const += scale * other.const
        for key, (coef, atom) in other.terms.items():
            self.add_term(scale * coef, atom, key)

    def scaled(self, scale: int) -> Linear:
        out = Linear(self.dtype)
        out.add(self, scale)
        return out

    @property
    def is_const(self) -> bool:
        return not self.terms

    def coef_of(self, var: E.Var) -> int:
        slot = self.terms.get(var_key(var))
        return slot[0] if slot else 0


def linear_form(e: E.PrimExpr) -> Linear:
    """The linear form of an integer expression."""
    out = Linear(e.dtype)
    _accumulate(e, 1, out)
    return out


def _accumulate(e: E.PrimExpr, scale: int, out: Linear) -> None:
    if isinstance(e, E.IntImm):
        out.const += scale * e.value
    elif isinstance(e, E.Add):
        _accumulate(e.a, scale, out)
        _accumulate(e.b, scale, out)
    elif isinstance(e, E.Sub):
        _accumulate(e.a, scale, out)
        _accumulate(e.b, -scale, out)
    elif isinstance(e, E.Mul) and isinstance(e.b, E.IntImm):
        _accumulate(e.a, scale * e.b.value, out)
    elif isinstance(e, E.Mul) and isinstance(e.a, E.IntImm):
        _accumulate(e.b, scale * e.a.value, out)
    elif isinstance(e, E.Mul):
        la, lb = linear_form(e.a), linear_form(e.b)
        if la.is_const:
            out.add(lb, scale * la.const)
        elif lb.is_const:
            out.add(la, scale * lb.const)
        else:
            out.add_term(scale, e)
    else:
        out.add_term(scale, e)


def _term_order(item: tuple[Any, list[Any]]) -> tuple[int, str]:
    coef, atom = item[1]
    name = atom.name if isinstance(atom, E.Var) else "~"  # variables before other atoms
    return (-abs(coef), name)


def linear_to_expr(lin: Linear) -> E.PrimExpr:
    """Rebuild an expression: bigger coefficients first, positive terms before subtracted ones,
    the constant last (``xo*64 + xi - 3``)."""
    dtype = lin.dtype
    items = sorted(lin.terms.items(), key=_term_order)
    # (a coefficient whose negation the dtype cannot hold, int32's -2^31, stays added)
    top = E.integer_range(dtype)[1] if dtype != "bool" else 1
    pos = [(c, a) for _, (c, a) in items if c > 0 or -c > top]
    neg = [(-c, a) for _, (c, a) in items if c < 0 and -c <= top]

    def term(c: int, a: E.PrimExpr) -> E.PrimExpr:
        return a if c == 1 else E.Mul(a, E.IntImm(c, dtype))

    out: E.PrimExpr | None = None
    for c, a in pos:
        t = term(c, a)
        out = t if out is None else E.Add(out, t)
    if out is None:
        if lin.const != 0 or not neg:
            out = E.IntImm(lin.const, dtype)
            const_left = 0
        else:
            out = E.IntImm(0, dtype)
            const_left = 0
    else:
        const_left = lin.const
    for c, a in neg:
        out = E.Sub(out, term(c, a))
    if const_left > 0 or -const_left > top:
        out = E.Add(out, E.IntImm(const_left, dtype))
    elif const_left < 0:
        out = E.Sub(out, E.IntImm(-const_left, dtype))
    return out


# ---------------------------------------------------------------------------------------------
# bounds


def _dtype_bound(dtype: str) -> Bound:
    if dtype == "bool":
        return (0, 1)
    if E.is_int(dtype):
        return E.integer_range(dtype)
    return (-_INF, _INF)


def _mul(a: Number, b: Number) -> Number:
    return 0 if a == 0 or b == 0 else a * b


def _scale(bound: Bound, c: int) -> Bound:
    lo, hi = _mul(bound[0], c), _mul(bound[1], c)
    return (lo, hi) if c >= 0 else (hi, lo)


def _floordiv_num(a: Number, c: int) -> Number:
    return a if math.isinf(a) else a // c


def const_bound(e: E.PrimExpr, ranges: Ranges | None = None) -> Bound:
    """Inclusive bounds ``(lo, hi)`` of an integer expression (``-inf``/``inf`` if unknown)."""
    return _bound(e, ranges or {})


def _bound(e: E.PrimExpr, ranges: Ranges) -> Bound:
    if isinstance(e, E.IntImm):
        return (e.value, e.value)
    if isinstance(e, E.Var):
        r = ranges.get(e)
        return r if r is not None else _dtype_bound(e.dtype)
    if isinstance(e, (E.Add, E.Sub)) or (isinstance(e, E.Mul) and
                                         isinstance(e.b, E.IntImm)):
        lin = linear_form(e)
        lo: Number = lin.const
        hi: Number = lin.const
        for coef, atom in lin.terms.values():
            blo, bhi = _scale(_bound(atom, ranges), coef)
            lo, hi = lo + blo, hi + bhi
        return (lo, hi)
    if isinstance(e, E.Mul):
        a, b = _bound(e.a, ranges), _bound(e.b, ranges)
        corners = [_mul(x, y) for x in a for y in b]
        return (min(corners), max(corners))
    if isinstance(e, E.FloorDiv) and isinstance(e.b, E.IntImm) and e.b.value != 0:
        lo, hi = _bound(e.a, ranges)
        c = e.b.value
        if c > 0:
            return (_floordiv_num(lo, c), _floordiv_num(hi, c))
        return (_floordiv_num(hi, c), _floordiv_num(lo, c))
    if isinstance(e, E.FloorMod) and isinstance(e.b, E.IntImm) and e.b.value > 0:
        lo, hi = _bound(e.a, ranges)
        c = e.b.value
        if not math.isinf(lo) and not math.isinf(hi) and lo // c == hi // c:
            return (lo % c, hi % c)
        return (0, c - 1)
    if isinstance(e, (E.Min, E.Max)):
        a, b = _bound(e.a, ranges), _bound(e.b, ranges)
        pick = min if isinstance(e, E.Min) else max
        return (pick(a[0], b[0]), pick(a[1], b[1]))
    if isinstance(e, E.Select):
        a, b = _bound(e.true_value, ranges), _bound(e.false_value, ranges)
        return (min(a[0], b[0]), max(a[1], b[1]))
    if isinstance(e, E.Cast) and (E.is_int(e.value.dtype) or e.value.dtype == "bool"):
        inner, outer = _bound(e.value, ranges), _dtype_bound(e.dtype)
        if outer[0] <= inner[0] and inner[1] <= outer[1]:
            return inner
        return outer
    if isinstance(e, E.CmpOp) or isinstance(e, (E.And, E.Or, E.Not)):
        return (0, 1)
    return _dtype_bound(e.dtype)


def prove(cond: E.PrimExpr, ranges: Ranges | None = None) -> bool | None:
    """True or False if ``cond`` is decided by the ranges, else None."""
    c = simplify(cond, ranges)
    if isinstance(c, E.IntImm):
        return bool(c.value)
    return None


# ---------------------------------------------------------------------------------------------
# expression simplification


def _is_index(e: E.PrimExpr) -> bool:
    return E.is_int(e.dtype)


def _canonical(e: E.PrimExpr, wrap: bool = False) -> E.PrimExpr:
    """``e`` as its linear form; with ``wrap`` (a value computed modulo 2^n), the merged
    constants and coefficients reduced into the dtype's range as the arithmetic would
    (``a * 2147483647 + a`` is ``a * -2147483648`` in int32)."""
    lin = _merge_div_mod(linear_form(e))
    if wrap and lin.dtype != "bool":
        low, high = E.integer_range(lin.dtype)
        span = high - low + 1
        lin.const = (lin.const - low) % span + low
        for slot in lin.terms.values():
            slot[0] = (slot[0] - low) % span + low
    return linear_to_expr(lin)


def _merge_div_mod(lin: Linear) -> Linear:
    """``lin`` with each pair of terms ``m * c * (x // c) + m * (x % c)`` replaced by
    ``m * x`` (floor division: true of every integer x and c > 0), so that an index split
    into a block and a lane, ``buf[x // 8, x % 8]``, flattens back to the offset ``x``, which
    a vector of lanes reads contiguously."""
    for key, (coef, atom) in list(lin.terms.items()):
        if key not in lin.terms or not isinstance(atom, E.FloorMod) \
                or not isinstance(atom.b, E.IntImm) or atom.b.value <= 0:
            continue
        c = atom.b.value
        for other, (quotient_coef, quotient) in list(lin.terms.items()):
            if isinstance(quotient, E.FloorDiv) and isinstance(quotient.b, E.IntImm) \
                    and quotient.b.value == c and quotient_coef == coef * c \
                    and structural_equal(quotient.a, atom.a):
                del lin.terms[key], lin.terms[other]
                lin.add(linear_form(atom.a), coef)
                break
    return lin


def _split_divisible(lin: Linear, c: int) -> tuple[Linear, Linear]:
    """``lin`` = ``c * q + r``: q holds the terms (and constant part) divisible by c."""
    q, r = Linear(lin.dtype, lin.const // c), Linear(lin.dtype, lin.const % c)
    for key, (coef, atom) in lin.terms.items():
        if coef % c == 0:
            q.add_term(coef // c, atom, key)
        else:
            r.add_term(coef, atom, key)
    return q, r


def _simplify_floordiv(e: E.FloorDiv, ranges: Ranges) -> E.PrimExpr:
    if not isinstance(e.b, E.IntImm) or e.b.value <= 0:
        return e
    c = e.b.value
    # (x // a) // b  ->  x // (a*b)
    if isinstance(e.a, E.FloorDiv) and isinstance(e.a.b, E.IntImm) and e.a.b.value > 0:
        return _simplify_floordiv(E.FloorDiv(e.a.a, E.IntImm(e.a.b.value * c, e.dtype)),
                                  ranges)
    lin = linear_form(e.a)
    q, r = _split_divisible(lin, c)
    lo, hi = _bound(linear_to_expr(r), ranges)
    if not math.isinf(lo) and not math.isinf(hi) and lo // c == hi // c:
        q.const += lo // c
        return linear_to_expr(q)
    blocked = _split_blocked(lin, c, ranges)
    if blocked is not None:  # (unit * x + rest) // c  ->  x // (c / unit)
        unit, outer, _ = blocked
        return _simplify_floordiv(E.FloorDiv(linear_to_expr(outer),
                                             E.IntImm(c // unit, e.dtype)), ranges)
    if q.is_const and q.const == 0:
        return E.FloorDiv(linear_to_expr(r), e.b)
    return linear_to_expr(_lin_add(q, E.FloorDiv(linear_to_expr(r), e.b)))


def _split_blocked(lin: Linear, c: int, ranges: Ranges
                   ) -> tuple[int, Linear, Linear] | None:
    """``lin`` = ``unit * outer + rest`` with ``unit`` a proper divisor of ``c`` (greater
    than 1; any coefficient of ``lin`` when ``c`` is 0) and ``0 <= rest < unit`` over
    ``ranges``, as ``(unit, outer, rest)``; None when no such split exists. Then ``lin // c
    == outer // (c / unit)`` and ``lin % c == (outer % (c / unit)) * unit + rest``: an index
    into blocks of ``unit`` (a lane inside a vector of 8) read in a layout of blocks of ``c``
    (16) divides without the lane."""
    units = sorted({math.gcd(coef, c) if c else abs(coef) for coef, _ in lin.terms.values()},
                   reverse=True)
    for unit in units:
        if unit in (1, c):
            continue
        outer, rest = _split_divisible(lin, unit)
        lo, hi = _bound(linear_to_expr(rest), ranges)
        if math.isinf(lo) or math.isinf(hi) or lo // unit != hi // unit:
            continue
        outer.const += lo // unit
        rest.const -= (lo // unit) * unit
        return unit, outer, rest
    return None


def _lin_add(lin: Linear, atom: E.PrimExpr) -> Linear:
    out = lin.scaled(1)
    out.add(linear_form(atom))
    return out


def _simplify_floormod(e: E.FloorMod, ranges: Ranges) -> E.PrimExpr:
    if not isinstance(e.b, E.IntImm) or e.b.value <= 0:
        return e
    c = e.b.value
    lin = linear_form(e.a)
    _, r = _split_divisible(lin, c)
    r_expr = linear_to_expr(r)
    lo, hi = _bound(r_expr, ranges)
    if not math.isinf(lo) and not math.isinf(hi) and lo // c == hi // c:
        r.const -= (lo // c) * c
        return linear_to_expr(r)
    blocked = _split_blocked(lin, c, ranges)
    if blocked is not None:  # (unit * x + rest) % c  ->  (x % (c / unit)) * unit + rest
        unit, outer, rest = blocked
        inner = _simplify_floormod(E.FloorMod(linear_to_expr(outer),
                                              E.IntImm(c // unit, e.dtype)), ranges)
        return linear_to_expr(_lin_add(rest, E.mul(inner, E.IntImm(unit, e.dtype))))
    if isinstance(r_expr, E.IntImm):
        return E.IntImm(r_expr.value % c, e.dtype)
    return E.FloorMod(r_expr, e.b)


def _diff_bound(a: E.PrimExpr, b: E.PrimExpr, ranges: Ranges) -> Bound:
    return _bound(E.sub(a, b) if a is not b else E.IntImm(0, a.dtype), ranges)


_FLIP = {E.GT: E.LT, E.GE: E.LE}


def _simplify_compare(e: E.CmpOp, ranges: Ranges) -> E.PrimExpr:
    a, b, cls = e.a, e.b, type(e)
    if cls in _FLIP:
        a, b, cls = b, a, _FLIP[cls]
    diff = linear_form(a)
    diff.add(linear_form(b), -1)
    lo, hi = _bound(linear_to_expr(diff), ranges)
    decided = {
        E.LT: (hi < 0, lo >= 0), E.LE: (hi <= 0, lo > 0),
        E.EQ: (lo == hi == 0, lo > 0 or hi < 0), E.NE: (lo > 0 or hi < 0, lo == hi == 0),
    }[cls]
    if decided[0]:
        return E.IntImm(1, "bool")
    if decided[1]:
        return E.IntImm(0, "bool")
    if cls in (E.LT, E.LE):
        # unit * x + rest < 0 with 0 <= rest < unit: x < 0 (d <= 0 is d - 1 < 0), a test
        # that a vector's lanes (rest) all pass or all fail
        strict = diff.scaled(1)
        if cls is E.LE:
            strict.const -= 1
        blocked = _split_blocked(strict, 0, ranges)
        if blocked is not None:
            diff, cls = blocked[1], E.LT
    # positive terms left, negative terms right; the constant goes right unless the left
    # would be empty (x < 1000, 1 <= x)
    left, right = Linear(diff.dtype), Linear(diff.dtype)
    for key, (coef, atom) in diff.terms.items():
        if coef > 0:
            left.add_term(coef, atom, key)
        else:
            right.add_term(-coef, atom, key)
    if left.terms:
        right.const = -diff.const
    else:
        left.const = diff.const
    return cls(linear_to_expr(left), linear_to_expr(right))


def _simplify_minmax(e: E.BinaryOp, ranges: Ranges) -> E.PrimExpr:
    if structural_equal(e.a, e.b):
        return e.a
    lo, hi = _diff_bound(e.a, e.b, ranges)
    if isinstance(e, E.Min):
        if hi <= 0:
            return e.a
        if lo >= 0:
            return e.b
    else:
        if lo >= 0:
            return e.a
        if hi <= 0:
            return e.b
    return e


def _simplify_node(e: E.PrimExpr, ranges: Ranges, data: bool = False) -> E.PrimExpr | None:
    """One rewrite step on a node whose children are already simplified. ``data``: the node
    computes on values read from memory, whose integer arithmetic may have wrapped (as
    NumPy's does, and the C emitter's unsigned sums and products, ``c_family._wrapping``, do):
    its sums and products are still
    canonicalised (a ring's laws hold modulo 2^n), but nothing that assumes exact integers
    is decided (``a * 2147483647 < 0`` is not ``a < 0`` once the product wraps)."""
    if isinstance(e, (E.Add, E.Sub, E.Mul)) and _is_index(e):
        return _canonical(e, wrap=data)
    if data and isinstance(e, (E.FloorDiv, E.FloorMod, E.Min, E.Max, E.CmpOp)):
        return None
    if isinstance(e, E.FloorDiv):
        return _simplify_floordiv(e, ranges)
    if isinstance(e, E.FloorMod):
        return _simplify_floormod(e, ranges)
    if isinstance(e, (E.Min, E.Max)) and _is_index(e):
        return _simplify_minmax(e, ranges)
    if isinstance(e, E.CmpOp) and _is_index(e.a):
        return _simplify_compare(e, ranges)
    if isinstance(e, (E.And, E.Or)) and structural_equal(e.a, e.b):
        return e.a
    return None


def simplify(e: E.PrimExpr, ranges: Ranges | None = None) -> E.PrimExpr:
    """Fold constants, canonicalise integer arithmetic and decide what the ranges decide
    (on indices: values read from memory may have wrapped, see :func:`_simplify_node`)."""
    ranges = ranges or {}
    data: set[int] = set()  # ids of rewritten nodes whose value depends on a load
    keep: list[E.PrimExpr] = []  # (so that those ids stay theirs)

    def step(node: E.PrimExpr) -> E.PrimExpr | None:
        reads = isinstance(node, E.BufferLoad) or any(id(c) in data for c in node.children())
        out = _simplify_node(node, ranges, reads)
        if reads:
            result = node if out is None else out
            data.add(id(result))
            keep.append(result)
        return out

    return E.rewrite(e, step)


# ---------------------------------------------------------------------------------------------
# statements


def map_stmt(stmt: S.Stmt, fexpr: Callable[[E.PrimExpr], E.PrimExpr]) -> S.Stmt:
    """``stmt`` with ``fexpr`` applied to every expression field (recursion by nesting depth)."""
    if isinstance(stmt, S.SeqStmt):
        return S.SeqStmt([map_stmt(s, fexpr) for s in stmt.stmts])
    if isinstance(stmt, S.BufferStore):
        return S.BufferStore(stmt.buffer, fexpr(stmt.value), [fexpr(i) for i in stmt.indices])
    if isinstance(stmt, S.For):
        return S.For(stmt.loop_var, fexpr(stmt.min), fexpr(stmt.extent), stmt.kind,
                     map_stmt(stmt.body, fexpr))
    if isinstance(stmt, S.IfThenElse):
        return S.IfThenElse(fexpr(stmt.condition), map_stmt(stmt.then_case, fexpr),
                            None if stmt.else_case is None else map_stmt(stmt.else_case, fexpr))
    if isinstance(stmt, S.LetStmt):
        return S.LetStmt(stmt.var, fexpr(stmt.value), map_stmt(stmt.body, fexpr))
    if isinstance(stmt, S.Allocate):
        return S.Allocate(stmt.buffer, map_stmt(stmt.body, fexpr))
    if isinstance(stmt, S.Evaluate):
        return S.Evaluate(fexpr(stmt.value))
    if isinstance(stmt, S.Prefetch):
        return S.Prefetch(stmt.buffer, [fexpr(i) for i in stmt.indices])
    if isinstance(stmt, S.AsyncCopy):
        source = fexpr(stmt.source)
        assert isinstance(source, E.BufferLoad), "an async copy's source stays one load"
        return S.AsyncCopy(stmt.buffer, [fexpr(i) for i in stmt.indices], source,
                           None if stmt.predicate is None else fexpr(stmt.predicate))
    if isinstance(stmt, (S.Barrier, S.AsyncCommit, S.AsyncWait)):
        return stmt
    raise TypeError(f"unknown statement {type(stmt).__name__}")


def map_nested(stmt: S.Stmt, visit: Callable[[S.Stmt], S.Stmt | None]) -> S.Stmt:
    """``stmt`` rebuilt with ``visit``'s replacement of each statement it returns one for, and
    the bodies of the others (sequences, loops, branches, lets, allocations) mapped the same
    way; statements with no body that ``visit`` leaves stay (recursion by nesting depth)."""
    out = visit(stmt)
    if out is not None:
        return out
    if isinstance(stmt, S.SeqStmt):
        return S.SeqStmt([map_nested(s, visit) for s in stmt.stmts])
    if isinstance(stmt, S.For):
        return S.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind,
                     map_nested(stmt.body, visit))
    if isinstance(stmt, S.IfThenElse):
        return S.IfThenElse(stmt.condition, map_nested(stmt.then_case, visit),
                            None if stmt.else_case is None
                            else map_nested(stmt.else_case, visit))
    if isinstance(stmt, S.LetStmt):
        return S.LetStmt(stmt.var, stmt.value, map_nested(stmt.body, visit))
    if isinstance(stmt, S.Allocate):
        return S.Allocate(stmt.buffer, map_nested(stmt.body, visit))
    return stmt


def substitute_stmt(stmt: S.Stmt, mapping: dict[E.Var, Any]) -> S.Stmt:
    """Replace variables by expressions everywhere in ``stmt``."""
    return map_stmt(stmt, lambda e: E.substitute(e, mapping))


def fresh_vars(stmt: S.Stmt, suffix: str = "") -> S.Stmt:
    """A copy of ``stmt`` whose loops and lets define new variables (named as before, plus
    ``suffix``), so that a statement placed more than once still defines each variable in
    one place (recursion by nesting depth)."""
    if isinstance(stmt, S.For):
        var = E.Var(f"{stmt.loop_var.name}{suffix}", stmt.loop_var.dtype)
        body = substitute_stmt(stmt.body, {stmt.loop_var: var})
        return S.For(var, stmt.min, stmt.extent, stmt.kind, fresh_vars(body, suffix))
    if isinstance(stmt, S.LetStmt):
        var = E.Var(f"{stmt.var.name}{suffix}", stmt.var.dtype)
        body = substitute_stmt(stmt.body, {stmt.var: var})
        return S.LetStmt(var, stmt.value, fresh_vars(body, suffix))
    if isinstance(stmt, S.IfThenElse):
        return S.IfThenElse(stmt.condition, fresh_vars(stmt.then_case, suffix),
                            None if stmt.else_case is None
                            else fresh_vars(stmt.else_case, suffix))
    if isinstance(stmt, S.SeqStmt):
        return S.SeqStmt([fresh_vars(s, suffix) for s in stmt.stmts])
    if isinstance(stmt, S.Allocate):
        return S.Allocate(stmt.buffer, fresh_vars(stmt.body, suffix))
    return stmt


def simplify_stmt(stmt: S.Stmt, ranges: Ranges | None = None) -> S.Stmt | None:
    """Simplify every expression using the ranges of enclosing loops; drop loops that never
    run, ifs decided by the ranges and unit loops (their variable becomes the loop's start;
    not a loop bound to a GPU index, which says only index 0 runs its body).
    Returns None when nothing is left."""
    return _simplify_stmt(stmt, dict(ranges or {}))


def _simplify_stmt(stmt: S.Stmt, ranges: Ranges) -> S.Stmt | None:
    if isinstance(stmt, S.SeqStmt):
        return S.seq([_simplify_stmt(s, ranges) for s in stmt.stmts])
    if isinstance(stmt, S.BufferStore):
        return S.BufferStore(stmt.buffer, simplify(stmt.value, ranges),
                             [simplify(i, ranges) for i in stmt.indices])
    if isinstance(stmt, S.For):
        lo = simplify(stmt.min, ranges)
        extent = simplify(stmt.extent, ranges)
        min_lo, min_hi = _bound(lo, ranges)
        _, ext_hi = _bound(extent, ranges)
        if ext_hi <= 0:
            return None
        if isinstance(extent, E.IntImm) and extent.value == 1 and not stmt.kind.is_thread_binding:
            # (a bound loop of one stays: in a larger launch, only index 0 runs its body)
            return _simplify_stmt(substitute_stmt(stmt.body, {stmt.loop_var: lo}), ranges)
        ranges[stmt.loop_var] = (min_lo, min_hi + ext_hi - 1)
        try:
            body = _simplify_stmt(stmt.body, ranges)
        finally:
            del ranges[stmt.loop_var]
        if body is None:
            return None
        return S.For(stmt.loop_var, lo, extent, stmt.kind, body)
    if isinstance(stmt, S.IfThenElse):
        cond = simplify(stmt.condition, ranges)
        if isinstance(cond, E.IntImm):
            chosen = stmt.then_case if cond.value else stmt.else_case
            return None if chosen is None else _simplify_stmt(chosen, ranges)
        then = _simplify_stmt(stmt.then_case, ranges)
        other = None if stmt.else_case is None else _simplify_stmt(stmt.else_case, ranges)
        if then is None and other is None:
            return None
        if then is None:
            return S.IfThenElse(E.logical_not(cond), other)
        return S.IfThenElse(cond, then, other)
    if isinstance(stmt, S.LetStmt):
        value = simplify(stmt.value, ranges)
        if E.is_int(value.dtype):
            ranges[stmt.var] = _bound(value, ranges)
        try:
            body = _simplify_stmt(stmt.body, ranges)
        finally:
            ranges.pop(stmt.var, None)
        return None if body is None else S.LetStmt(stmt.var, value, body)
    if isinstance(stmt, S.Allocate):
        body = _simplify_stmt(stmt.body, ranges)
        return None if body is None else S.Allocate(stmt.buffer, body)
    if isinstance(stmt, S.Evaluate):
        return S.Evaluate(simplify(stmt.value, ranges))
    if isinstance(stmt, S.Prefetch):
        return S.Prefetch(stmt.buffer, [simplify(i, ranges) for i in stmt.indices])
    if isinstance(stmt, S.AsyncCopy):
        source = simplify(stmt.source, ranges)
        assert isinstance(source, E.BufferLoad)
        return S.AsyncCopy(stmt.buffer, [simplify(i, ranges) for i in stmt.indices], source,
                           None if stmt.predicate is None else simplify(stmt.predicate, ranges))
    if isinstance(stmt, (S.Barrier, S.AsyncCommit, S.AsyncWait)):
        return stmt
    raise TypeError(f"unknown statement {type(stmt).__name__}")


#: Longest UNROLLED loop :func:`unroll_selecting_loops` copies out.
MAX_UNROLL_SELECTING = 16


def unroll_selecting_loops(stmt: S.Stmt) -> S.Stmt:
    """Copy out every UNROLLED loop of constant extent (at most MAX_UNROLL_SELECTING) whose
    body selects on its variable, one simplified copy per value, so that each copy's selects
    are decided: a compute written as ``select(i == 0, f0, select(i == 1, f1, ...))`` (the
    rows of a Winograd transform, each with its own few non-zero terms) becomes straight-line
    code with only the chosen branch's loads, which vectorizes. Other loops are kept (the C
    compiler unrolls them; register tiles plan them as they are)."""
    if isinstance(stmt, S.SeqStmt):
        return S.SeqStmt([unroll_selecting_loops(s) for s in stmt.stmts])
    if isinstance(stmt, S.For):
        body = stmt.body
        if (stmt.kind is S.ForKind.UNROLLED and isinstance(stmt.extent, E.IntImm)
                and isinstance(stmt.min, E.IntImm)
                and stmt.extent.value <= MAX_UNROLL_SELECTING
                and _selects_on(body, stmt.loop_var)):
            copies = []
            for i in range(stmt.extent.value):
                value = E.IntImm(stmt.min.value + i, stmt.loop_var.dtype)
                copy = simplify_stmt(substitute_stmt(body, {stmt.loop_var: value}))
                if copy is not None:
                    copies.append(unroll_selecting_loops(copy))
            return S.seq(copies) or S.Evaluate(E.IntImm(0))
        return S.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind,
                     unroll_selecting_loops(body))
    if isinstance(stmt, S.IfThenElse):
        return S.IfThenElse(stmt.condition, unroll_selecting_loops(stmt.then_case),
                            None if stmt.else_case is None
                            else unroll_selecting_loops(stmt.else_case))
    if isinstance(stmt, S.LetStmt):
        return S.LetStmt(stmt.var, stmt.value, unroll_selecting_loops(stmt.body))
    if isinstance(stmt, S.Allocate):
        return S.Allocate(stmt.buffer, unroll_selecting_loops(stmt.body))
    return stmt


def _selects_on(stmt: S.Stmt, var: E.Var) -> bool:
    """Whether a select in ``stmt`` has a condition that reads ``var``."""
    found = False

    def visit(expr: E.PrimExpr) -> E.PrimExpr:
        nonlocal found
        if not found:
            found = any(isinstance(node, E.Select)
                        and any(n is var for n in E.post_order(node.condition))
                        for node in E.post_order(expr))
        return expr

    map_stmt(stmt, visit)
    return found
