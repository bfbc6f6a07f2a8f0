"""The arithmetic simplifier: canonical linear forms, bounds, guard removal, and agreement of
random expressions before and after simplification."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from opfusion.tir import expr as E
from opfusion.tir import stmt as S
from opfusion.tir.simplify import const_bound, prove, simplify, simplify_stmt, structural_equal

xo, xi = E.Var("xo"), E.Var("xi")
RANGES = {xo: (0, 15), xi: (0, 63)}


def test_guard_proven_true_by_loop_ranges():
    assert prove(xo * 64 + xi < 1024, RANGES) is True


def test_guard_that_can_fail_is_kept_in_canonical_form():
    got = simplify(xo * 64 + xi < 1000, RANGES)
    assert str(got) == "xo*64 + xi < 1000"


def test_guard_proven_false():
    assert prove(xo * 64 + xi >= 1024, RANGES) is False


def test_divisible_part_splits_off_division_and_modulo():
    assert simplify((xo * 64 + xi) // 64, RANGES) is xo
    assert simplify((xo * 64 + xi) % 64, RANGES) is xi


def test_a_block_and_lane_split_of_an_offset_flattens_back():
    # c * (x // c) + x % c is x for every integer x: the offset of buf[x // 8, x % 8] with
    # rows of 8, whatever the ranges (x may be negative; floor division)
    x = xo * 8 + xi + 6
    assert str(simplify((x // 8) * 8 + x % 8)) == "xo*8 + xi + 6"
    assert str(simplify(((x // 8) * 8 + x % 8) * 3 - xi, RANGES)) == "xo*24 + xi*2 + 18"
    # a pair whose coefficients do not match stays
    assert "//" in str(simplify((x // 8) * 4 + x % 8))
    for value in range(-20, 20):
        for c in (1, 3, 8):
            got = simplify((E.IntImm(value) // c) * c + E.IntImm(value) % c)
            assert got.value == value


def test_division_keeps_what_it_cannot_prove():
    got = simplify((xo * 64 + xi + 8) // 64, RANGES)
    assert str(got) == "xo + (xi + 8) // 64"


def test_lane_of_a_small_block_divides_out_of_a_larger_one():
    # block b of 8 lanes, read from a layout of 16-lane blocks: b*8 + lane with lane < 8
    b, lane = E.Var("b"), E.Var("lane")
    ranges = {b: (0, 16), lane: (0, 7)}
    assert str(simplify((b * 8 + lane) // 16, ranges)) == "b // 2"
    assert str(simplify((b * 8 + lane) % 16, ranges)) == "b % 2*8 + lane"
    assert str(simplify(b * 8 + lane < 112, ranges)) == "b < 14"  # every lane, or none
    assert str(simplify(b * 8 + lane <= 111, ranges)) == "b < 14"
    # a lane offset that can cross a block keeps the lane in the arithmetic
    assert str(simplify((b * 8 + lane + 3) // 16, ranges)) == "(b*8 + lane + 3) // 16"
    assert str(simplify(b * 8 + lane < 113, ranges)) == "b*8 + lane < 113"


def test_nested_division_merges():
    x = E.Var("x")
    assert str(simplify(x // 4 // 8)) == "x // 32"


def test_like_terms_combine():
    assert str(simplify((xi + 3 + xo * 2 - xi) * 4)) == "xo*8 + 12"
    assert isinstance(simplify(xo - xo), E.IntImm)


def test_min_with_provable_order_is_removed():
    assert simplify(E.minimum(64, 1024 - xo * 64), RANGES).value == 64
    assert str(simplify(E.minimum(64, 1000 - xo * 64), RANGES)) == "min(64, 1000 - xo*64)"


def test_comparison_moves_negative_terms_right():
    got = simplify(xo - xi < 3)
    assert str(got) == "xo < xi + 3"


def test_const_bound_of_linear_form():
    assert const_bound(xo * 64 + xi, RANGES) == (0, 1023)
    assert const_bound(xo * -2 + 5, RANGES) == (-25, 5)


def test_const_bound_of_floormod_and_floordiv():
    assert const_bound((xo * 64 + xi) // 8, RANGES) == (0, 127)
    assert const_bound(E.floormod(E.Var("free"), 7), {}) == (0, 6)


def test_structural_equality():
    assert structural_equal(xo * 2 + 1, xo * 2 + 1)
    assert not structural_equal(xo * 2 + 1, xi * 2 + 1)


def test_float_arithmetic_is_left_alone_except_constants():
    f = E.Var("f", "float32")
    got = simplify(f * (E.FloatImm(2.0) + 1.0))
    assert str(got) == "f*3.0f"


def _loop(var, extent, body, kind=S.ForKind.SERIAL):
    return S.For(var, 0, extent, kind, body)


def test_simplify_stmt_removes_guard_implied_by_loops():
    buf = E.Buffer("A", (1024,))
    store = S.BufferStore(buf, 1.0, [xo * 64 + xi])
    nest = _loop(xo, 16, _loop(xi, 64, S.IfThenElse(xo * 64 + xi < 1024, store)))
    got = simplify_stmt(nest)
    assert "if" not in str(got)


def test_simplify_stmt_keeps_guard_that_can_fail():
    buf = E.Buffer("A", (1000,))
    store = S.BufferStore(buf, 1.0, [xo * 64 + xi])
    nest = _loop(xo, 16, _loop(xi, 64, S.IfThenElse(xo * 64 + xi < 1000, store)))
    assert "if xo*64 + xi < 1000" in str(simplify_stmt(nest))


def test_simplify_stmt_drops_empty_and_unit_loops():
    buf = E.Buffer("A", (4,))
    store = S.BufferStore(buf, 1.0, [xi])
    assert simplify_stmt(_loop(xi, 0, store)) is None
    assert str(simplify_stmt(_loop(xi, 1, store))) == "A[0] = 1.0f"


# -- property: random affine expressions agree before and after simplification ------------------

VARS = [E.Var("a"), E.Var("b"), E.Var("c")]
EXTENTS = [3, 5, 4]


def _exprs():
    leaf = st.one_of(st.sampled_from(VARS), st.integers(-6, 9).map(E.IntImm))

    def extend(children):
        return st.one_of(
            st.tuples(children, children).map(lambda p: p[0] + p[1]),
            st.tuples(children, children).map(lambda p: p[0] - p[1]),
            st.tuples(children, st.integers(-4, 5)).map(lambda p: p[0] * p[1]),
            st.tuples(children, st.integers(1, 7)).map(lambda p: p[0] // p[1]),
            st.tuples(children, st.integers(1, 7)).map(lambda p: p[0] % p[1]),
            st.tuples(children, children).map(lambda p: E.minimum(p[0], p[1])),
            st.tuples(children, children).map(lambda p: E.maximum(p[0], p[1])),
        )

    return st.recursive(leaf, extend, max_leaves=8)


def _evaluate(e, env):
    return E.substitute(e, {v: E.IntImm(env[v]) for v in VARS}).value


@settings(max_examples=150, deadline=None)
@given(_exprs())
def test_simplify_preserves_value_of_random_affine_expressions(e):
    ranges = {v: (0, n - 1) for v, n in zip(VARS, EXTENTS)}
    simple = simplify(e, ranges)
    for point in itertools.product(*(range(n) for n in EXTENTS)):
        env = dict(zip(VARS, point))
        assert _evaluate(simple, env) == _evaluate(e, env), (str(e), str(simple), point)


@settings(max_examples=100, deadline=None)
@given(_exprs(), st.integers(-10, 20))
def test_decided_comparisons_hold_everywhere(e, bound):
    ranges = {v: (0, n - 1) for v, n in zip(VARS, EXTENTS)}
    decided = prove(e < bound, ranges)
    values = [_evaluate(e, dict(zip(VARS, p)))
              for p in itertools.product(*(range(n) for n in EXTENTS))]
    if decided is True:
        assert all(v < bound for v in values)
    if decided is False:
        assert not any(v < bound for v in values)


@settings(max_examples=150, deadline=None)
@given(_exprs(), st.integers(1, 8), st.integers(-10, 20), st.booleans())
def test_blocked_expressions_keep_their_value(e, unit, bound, strict):
    # unit * e + a, a < 3: the form of a vector lane under a block index
    ranges = {v: (0, n - 1) for v, n in zip(VARS, EXTENTS)}
    blocked = e * unit + VARS[0]
    forms = [blocked // (unit * 2), blocked % (unit * 2), blocked // unit, blocked % unit,
             blocked < bound if strict else blocked <= bound]
    for form in forms:
        simple = simplify(form, ranges)
        for point in itertools.product(*(range(n) for n in EXTENTS)):
            env = dict(zip(VARS, point))
            assert _evaluate(simple, env) == _evaluate(form, env), (str(form), str(simple))


@settings(max_examples=100, deadline=None)
@given(_exprs())
def test_const_bound_contains_every_value(e):
    ranges = {v: (0, n - 1) for v, n in zip(VARS, EXTENTS)}
    lo, hi = const_bound(e, ranges)
    for p in itertools.product(*(range(n) for n in EXTENTS)):
        assert lo <= _evaluate(e, dict(zip(VARS, p))) <= hi


def test_values_read_from_memory_are_not_assumed_exact_integers():
    """A product of a loaded int32 value may wrap (NumPy's and the -fwrapv C's arithmetic),
    so ``a * 2147483647 < 0`` is not rewritten to ``a < 0``, nor its division or minimum
    decided, while sums and products still canonicalise (a ring's laws hold modulo 2^32)
    and an index of loop variables is still decided by its ranges (fuzzing, seed 63008:
    a fused ``Mul -> Div`` chain computed a truncated quotient's sign from ``a``)."""
    buf = E.Buffer("a", (8,), "int32")
    a = E.BufferLoad(buf, [xi])
    product = a * 2147483647
    assert str(simplify(product < 0, RANGES)) == str(product < 0)
    # a * 2^31 is a * -2^31 modulo 2^32; the division of it is left as it is
    assert str(simplify(E.floordiv(product + a, 2), RANGES)) == "a[xi]*-2147483648 // 2"
    low = E.Min(a * 4 + 1, a * 4 + 3)
    assert str(simplify(low, RANGES)) == str(low)
    assert str(simplify(a * 2 + a * 3, RANGES)) == "a[xi]*5"
    assert str(simplify(E.floordiv(xo * 64 + xi, 64), RANGES)) == "xo"
