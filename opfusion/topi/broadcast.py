"""TE computes of the broadcasting operators (opfusion/opdefs/broadcast.py and fma.py): binary
arithmetic, comparisons, logical and bitwise ops, ``where`` and ``ewise_fma``.

Each input is read at the output index under NumPy's rule (:func:`._util.load_broadcast`).
Where te has no node for an operation the expression below is exact for every input:

* integer ``divide`` truncates toward zero, written with floor division and a correction;
* integer ``power`` squares (each square bound once by a let) and multiplies the squares
  that the exponent's bits select: exact modulo 2**bits for every exponent;
* ``bitwise_*`` adds up the bits of the operands, shifts pick among constant shifts.

Integer division or remainder by zero gives 0, INT_MIN / -1 wraps to INT_MIN as in NumPy,
and a negative integer exponent gives the truncated real power (0 unless the base is +-1):
the values the references define (see opfusion/opdefs/broadcast.py); nothing traps as C's
division would."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import te
from ..tir.expr import Let, PrimExpr, Var, dtype_bits, is_float
from ._util import is_unsigned, load_broadcast, shape_of, stage_name
from .registry import register_compute

BinaryFn = Callable[[PrimExpr, PrimExpr], PrimExpr]


def broadcast_compute(op_name: str, inputs: list[te.Tensor], out_type: Any,
                      fn: Callable[..., PrimExpr]) -> te.Tensor:
    """``out[i] = fn(a[i'], b[i''], ...)`` with every input broadcast to the output's shape,
    tagged "broadcast"."""

    dtype = out_type.dtype

    def element(*i: PrimExpr) -> PrimExpr:
        return te.cast(fn(*[load_broadcast(t, i) for t in inputs]), dtype)

    return te.compute(shape_of(out_type), element, name=stage_name(op_name), tag="broadcast")


def _zero(dtype: str) -> PrimExpr:
    return te.const(0, dtype)


def _negate(a: PrimExpr) -> PrimExpr:
    """-a for a signed integer, wrapping (-INT_MIN is INT_MIN) without signed overflow."""
    unsigned = _unsigned(a.dtype)
    return te.cast(te.const(0, unsigned) - te.cast(a, unsigned), a.dtype)


def _safe_division(a: PrimExpr, b: PrimExpr, quotient: PrimExpr, remainder: bool) -> PrimExpr:
    """``quotient`` (an integer a / b or a % b) made total: 0 for a zero divisor, and for
    signed b == -1 the wrapped -a (or 0), which C's division would trap on for INT_MIN."""
    zero = _zero(a.dtype)
    if is_unsigned(a.dtype):
        return te.select(b == zero, zero, quotient)
    special = te.select(b == zero, zero, zero if remainder else _negate(a))
    return te.select((b == zero) | (b == te.const(-1, b.dtype)), special, quotient)


def _divide(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    if is_float(a.dtype):
        return a / b
    if is_unsigned(a.dtype):
        return _safe_division(a, b, a // b, False)
    # Truncation differs from the floor only for an inexact quotient of negative sign.
    floor = a // b
    inexact = (a % b) != _zero(a.dtype)
    negative = (a < _zero(a.dtype)) != (b < _zero(b.dtype))
    return _safe_division(a, b, te.select(inexact & negative, floor + 1, floor), False)


def _floor_divide(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    if is_float(a.dtype):
        return te.floor(a / b)  # np.floor(np.divide(a, b)), as the reference
    return _safe_division(a, b, a // b, False)


def _mod(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    if not is_float(a.dtype):
        return _safe_division(a, b, a % b, True)
    # NumPy's float mod: C fmod, moved into the divisor's sign. Not a - floor(a/b)*b, whose
    # rounding differs.
    r = te.fmod(a, b)
    zero = _zero(a.dtype)
    return te.select((r != zero) & ((r < zero) != (b < zero)), r + b, r)


def _product(factors: list[PrimExpr]) -> PrimExpr:
    """The product as a balanced tree (shallow nesting in C and in the interpreter)."""
    while len(factors) > 1:
        factors = [factors[k] * factors[k + 1] if k + 1 < len(factors) else factors[k]
                   for k in range(0, len(factors), 2)]
    return factors[0]


def _sum(terms: list[PrimExpr]) -> PrimExpr:
    """The sum as a balanced tree."""
    while len(terms) > 1:
        terms = [terms[k] + terms[k + 1] if k + 1 < len(terms) else terms[k]
                 for k in range(0, len(terms), 2)]
    return terms[0]


def _int_power(a: PrimExpr, e: PrimExpr) -> PrimExpr:
    # a ** e modulo 2**bits (NumPy's int64 power cast to the dtype) by squaring: a, a**2,
    # a**4, ... in unsigned arithmetic (which wraps), each bound once by a let (written out
    # as a tree, the squarings would be exponentially long in C and in the interpreter), and
    # the product of those whose bit is set in e. A negative e gives the truncated real
    # power, as ONNX Runtime and the reference: 1 for a == 1, +-1 for a == -1 (below), 0
    # otherwise (0 ** -n included: a division by zero, which is 0 here).
    bits = dtype_bits(a.dtype)
    unsigned = _unsigned(a.dtype)
    e_bits = te.cast(e, _unsigned(e.dtype))
    squares = [Var(f"pow{k}", unsigned) for k in range(bits)]

    def bit(k: int) -> PrimExpr:
        return e_bits // te.const(1 << k, e_bits.dtype) % te.const(2, e_bits.dtype)

    product = _product([te.select(bit(k) != te.const(0, e_bits.dtype), square,
                                  te.const(1, unsigned)) for k, square in enumerate(squares)])
    for k in reversed(range(bits)):
        value = te.cast(a, unsigned) if k == 0 else squares[k - 1] * squares[k - 1]
        product = Let(squares[k], value, product)
    product = te.cast(product, a.dtype)
    if is_unsigned(a.dtype):
        return product
    one_over = te.select(a == te.const(1, a.dtype), te.const(1, a.dtype), _zero(a.dtype))
    product = te.select(e < _zero(e.dtype), one_over, product)
    minus_one = te.const(-1, a.dtype)
    odd = (e % 2) != _zero(e.dtype)
    return te.select(a == minus_one, te.select(odd, minus_one, te.const(1, a.dtype)), product)


def _power(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    return te.power(a, b) if is_float(a.dtype) else _int_power(a, b)


def _unsigned(dtype: str) -> str:
    """The unsigned dtype of the same width: its values are the two's complement bits, and C
    defines its division, remainder and wrapping multiplication."""
    return dtype if is_unsigned(dtype) else f"u{dtype}"


def _bits(x: PrimExpr) -> list[PrimExpr]:
    """The two's complement bits of integer ``x``, lowest first, each 0 or 1 (unsigned)."""
    u = te.cast(x, _unsigned(x.dtype))
    return [(u // (1 << k)) % 2 if k else u % 2 for k in range(dtype_bits(x.dtype))]


def _from_bits(bits: list[PrimExpr], dtype: str) -> PrimExpr:
    """The integer of ``dtype`` with these bits (each 0 or 1, unsigned)."""
    unsigned = _unsigned(dtype)
    terms = [bit * te.const(1 << k, unsigned) if k else bit for k, bit in enumerate(bits)]
    return te.cast(_sum(terms), dtype)


def _bitwise(combine: BinaryFn) -> BinaryFn:
    # No bitwise nodes in te: combine the operands bit by bit. Each bit expression is used
    # once (the C emitter writes shared sub-expressions out again).
    def fn(a: PrimExpr, b: PrimExpr) -> PrimExpr:
        return _from_bits([combine(x, y) for x, y in zip(_bits(a), _bits(b))], a.dtype)

    return fn


def _by_shift_count(count: PrimExpr, bits: int, at: Callable[[int], PrimExpr],
                    outside: PrimExpr) -> PrimExpr:
    """``at(count)`` for a shift count in 0..bits-1 (a balanced tree of selects on the
    count), ``outside`` for any other count."""

    def pick(lo: int, hi: int) -> PrimExpr:
        if hi - lo == 1:
            return at(lo)
        mid = (lo + hi) // 2
        return te.select(count < te.const(mid, count.dtype), pick(lo, mid), pick(mid, hi))

    inside = count < te.const(bits, count.dtype)
    if not is_unsigned(count.dtype):
        inside = inside & (count >= _zero(count.dtype))
    return te.select(inside, pick(0, bits), outside)


def _shift_left_by(x: PrimExpr, s: int) -> PrimExpr:
    """x << s for a constant 0 <= s < bits: an unsigned multiplication, which wraps."""
    if s == 0:
        return x
    unsigned = _unsigned(x.dtype)
    return te.cast(te.cast(x, unsigned) * te.const(1 << s, unsigned), x.dtype)


def _shift_right_by(x: PrimExpr, s: int) -> PrimExpr:
    """x >> s (arithmetic for signed) for a constant 0 <= s < bits: floor division."""
    n = dtype_bits(x.dtype)
    if s == 0:
        return x
    if s == n - 1 and not is_unsigned(x.dtype):
        return te.select(x < _zero(x.dtype), te.const(-1, x.dtype), _zero(x.dtype))
    return x // te.const(1 << s, x.dtype)


def _left_shift(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    # NumPy: a count outside 0..bits-1 (negative included) shifts everything out.
    return _by_shift_count(b, dtype_bits(a.dtype), lambda s: _shift_left_by(a, s), _zero(a.dtype))


def _right_shift(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    # NumPy: a count outside 0..bits-1 leaves only the sign: -1 for negative a, else 0.
    n = dtype_bits(a.dtype)
    fill = _zero(a.dtype) if is_unsigned(a.dtype) else te.select(
        a < _zero(a.dtype), te.const(-1, a.dtype), _zero(a.dtype))
    return _by_shift_count(b, n, lambda s: _shift_right_by(a, s), fill)


_BINARY: dict[str, BinaryFn] = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": _divide,
    "floor_divide": _floor_divide,
    "mod": _mod,
    "power": _power,
    # the C helpers propagate NaN from either side, as np.maximum / np.minimum do
    "maximum": te.max,
    "minimum": te.min,
    "equal": lambda a, b: a == b,
    "not_equal": lambda a, b: a != b,
    "less": lambda a, b: a < b,
    "less_equal": lambda a, b: a <= b,
    "greater": lambda a, b: a > b,
    "greater_equal": lambda a, b: a >= b,
    "logical_and": lambda a, b: a & b,
    "logical_or": lambda a, b: a | b,
    "logical_xor": lambda a, b: a != b,
    "bitwise_and": _bitwise(lambda x, y: x * y),
    "bitwise_or": _bitwise(te.max),
    "bitwise_xor": _bitwise(lambda x, y: (x + y) % 2),
    "left_shift": _left_shift,
    "right_shift": _right_shift,
}


def _binary_compute(op_name: str, fn: BinaryFn) -> None:
    @register_compute(op_name)
    def compute(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
        return broadcast_compute(op_name, inputs, out_type, fn)

    compute.__name__ = f"compute_{op_name}"
    compute.__doc__ = f"TE compute of {op_name} (NumPy broadcasting)."


for _name, _fn in _BINARY.items():
    _binary_compute(_name, _fn)


@register_compute("where")
def compute_where(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """x where the condition holds, else y; the three broadcast together."""
    return broadcast_compute("where", inputs, out_type, te.select)


@register_compute("ewise_fma")
def compute_ewise_fma(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """a * b + c; the C compiler may contract it into one fused multiply-add."""
    return broadcast_compute("ewise_fma", inputs, out_type, lambda a, b, c: a * b + c)
