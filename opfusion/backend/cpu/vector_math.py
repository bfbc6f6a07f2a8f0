"""Transcendental functions the CPU kernels compute themselves, as C text: the same algorithm
for one float and for a GCC vector of any width, so that a vectorized loop and its scalar
remainder agree bit for bit, and a loop with ``exp`` in it runs in vectors (libm's ``expf``
is a call per element, which GCC does not vectorize without ``-ffast-math``).

``exp`` (float32), after Cephes' ``expf``: ``n = round(x * log2(e))``, ``r = x - n * ln 2``
in two parts (Cody and Waite), ``e^r`` by a degree-7 polynomial on ``|r| <= ln 2 / 2``
(``1 + r + r^2 P(r)``, evaluated as ``(P(r) r + 1) r + 1``: a multiplication and an addition
fewer than Cephes' ``(P(r) r^2 + r) + 1``, and closer: 0.46% of the floats one ulp off
instead of 0.77%, with fused multiply-adds; 0.82% against 0.81% without), then scaled by
``2^n`` as two exact powers of two (so that results round correctly into the subnormals and
overflow to infinity); on AVX-512 the vector form scales by one ``scalef`` instead, which
rounds the same way, and clamps by one min (the same bits, a half fewer instructions).
Maximum error measured against float64 over every float32 in [-104, 89]: 1 ulp
(``tests/backend/test_vector_math.py``). NaN gives NaN, +inf gives +inf, -inf and anything
below -103.97 give 0, anything above 88.72 gives +inf, as ``numpy.exp`` in float32 does.
Below -103.98 the result is set to 0 rather than scaled there (on AVX-512, by the scalef's
mask, which leaves those lanes unscaled): a multiplication whose result
falls below the normal range takes a microcode assist on Intel cores, and softmax's masked
(-inf) scores made a third of an attention kernel's time of them.

``select(x < EXP_NORMAL_BELOW, 0, exp(x))`` (``opfusion.te.exp_normal``: softmax's and
attention's weights, 0 where they would be subnormal) is ``exp_normal(x)``: exp with its zero
threshold at -87.3365, so that no lane is scaled into the subnormals and none leaves one for
the products that read it (a microcode assist each).

``exp(0 - x)`` and ``exp(-1 * x)`` (a sigmoid's, an exported Exp(Neg(x))) are ``exp_neg(x)``:
the same algorithm with its clamps mirrored and the negation folded into the reduction's
multiply-adds, the same bits in an instruction fewer; and ``a * (1 / b)`` in floats (SiLU's
``x * sigmoid(x)``) is ``a / b``, one correctly rounded division in place of two roundings
(:func:`expand_intrinsics`). With the Horner form above, EfficientNet-B0 on a Xeon with
AVX-512: 0.976x and then 0.984x the time.

``tanh`` and ``erf`` (float32) are rewritten, before code generation, into arithmetic, selects
and (tanh) that ``exp`` (:func:`expand_intrinsics`), so they vectorize (and ``pow(x, n)``
for n = 2, 3, 4, of any float dtype, into products):

- ``tanh``: Cephes' odd polynomial below 0.625, ``1 - 2 / (exp(2|x|) + 1)`` with the sign above;
  at most 3 ulp; NaN stays NaN, +-inf give +-1.
- ``erf``: ``x * P(x^2)`` (degree 5, fitted to erf(x)/x) below 0.875; on [0.875, 3.92) a
  polynomial of degree 14 in ``(|x| - 2.3975) / 1.5225`` (Chebyshev interpolation of erf,
  1.1e-8 in float64, 2.1 ulp in float32's arithmetic), 1 from 3.92 (where erf rounds to 1),
  with the sign; at most 3 ulp; NaN stays NaN, +-inf give +-1. No exp and no division (the
  form it replaced, ``1 - exp(-x^2) * Q(1 / (1 + x/2))``, cost 5x an exp: a GELU epilogue
  took 0.29 ms of ViT-B/16's 2.93 ms 768 -> 3072 product on a Xeon).

The maximum errors are measured in ``tests/backend/test_vector_math.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ...tir import expr as E
from ...tir import stmt as S
from ...tir.simplify import map_nested, map_stmt, structural_equal

#: Functions a vectorized loop computes in vectors, by the IR intrinsic's name, and the dtypes
#: they cover: ``exp`` by the helpers here, ``sqrt`` lane by lane with libm's correctly
#: rounded ``sqrtf``/``sqrt`` (GCC makes the loop one vector square-root instruction), the
#: same value as the scalar code's; ``round`` (half to even) lane by lane with ``nearbyintf``,
#: which GCC makes one ``vrndscaleps``/``vroundps`` (every QuantizeLinear rounds: a scalar
#: loop before); ``dot4_u8s8`` and ``dot2_s16`` by their helpers (VNNI's ``vpdpbusd``, the
#: ``vpmaddwd`` of SSE2, AVX2 and AVX512-BW).
VECTOR_INTRINSICS: dict[str, tuple[str, ...]] = {"exp": ("float32",), "exp_neg": ("float32",),
                                                 "exp_normal": ("float32",),
                                                 "sqrt": ("float32", "float64"),
                                                 "round": ("float32", "float64"),
                                                 "dot4_u8s8": ("int32",),
                                                 "dot2_s16": ("int32",)}
#: Those whose scalar form is computed here as well (the rest are libm calls).
HELPER_INTRINSICS: dict[str, tuple[str, ...]] = {"exp": ("float32",), "exp_neg": ("float32",),
                                                 "exp_normal": ("float32",)}

# Cephes expf: ln 2 in two parts, and the polynomial for e^r - 1 - r over r^2.
_LN2_HI = "0.693359375f"
_LN2_LO = "-2.12194440e-4f"
_LOG2E = "1.44269504088896341f"
_POLY = ("1.9875691500E-4f", "1.3981999507E-3f", "8.3334519073E-3f", "4.1665795894E-2f",
         "1.6666665459E-1f", "5.0000001201E-1f")
#: Above this, exp(x) is +inf in float32 (the clamp keeps n inside the exponent).
_HIGH = "89.0f"
#: Below this, exp(x) is below half the smallest subnormal (x < -150 ln 2 = -103.97208) and
#: rounds to 0. Such lanes compute exp(0) and are set to 0 after: scaling them by 2^-150
#: would round to 0 too, but through the processor's microcode assist for a result below
#: the normal range (about 150 cycles on Intel cores; softmax's masked keys are -inf, and
#: those assists were a third of ViT-B/16's attention kernel).
_ZERO_BELOW = "-103.98f"
#: 1.5 * 2^23: adding and subtracting it rounds a float of magnitude < 2^22 to an integer.
_ROUNDER = "12582912.0f"


class _Form(NamedTuple):
    """Where exp or exp_neg is 0 and where it overflows, in the comparisons and AVX-512
    operations that test them: the result is 0 where ``x {zero_side} zero`` (AVX-512 keeps
    the lanes where ``keep_if``), +inf where ``x {bound_side} bound`` (the clamp, by
    ``clamp_op``); ``log2e`` rounds ``k``."""

    zero: str
    zero_side: str
    keep_if: str
    bound: str
    bound_side: str
    clamp_op: str
    log2e: str


#: exp's form, exp_neg's: its mirror image, 0 above 103.98 and +inf below -89; and
#: exp_normal's: exp's, 0 from where the result would be subnormal
#: (:data:`opfusion.tir.expr.EXP_NORMAL_BELOW`), so that no lane is scaled into the
#: subnormals (a microcode assist) and none comes out one (an assist in each product that
#: reads it).
_FORMS = {"exp": _Form(_ZERO_BELOW, "<", "_CMP_NLT_UQ", _HIGH, ">", "min", _LOG2E),
          "exp_neg": _Form("103.98f", ">", "_CMP_NGT_UQ", "-89.0f", "<", "max",
                           "-1.44269504088896341f"),
          "exp_normal": _Form(f"{E.EXP_NORMAL_BELOW!r}f", "<", "_CMP_NLT_UQ", _HIGH, ">",
                              "min", _LOG2E)}
#: The intrinsics :func:`exp_body` computes.
EXP_FORMS = tuple(_FORMS)


def exp_body(vt: str, it: str, splat: str | None, scalef: tuple[str, str, str] | None = None,
             kind: str = "exp") -> str:
    """The body of ``exp`` for a value type ``vt`` whose integer twin is ``it`` (float and
    int32_t for the scalar; the vector types otherwise): ``splat`` makes a constant of the
    type (None for the scalar). Selects are written with comparisons that give all-ones
    masks on vectors and 1 on scalars, so each form is spelled where they differ.

    ``scalef`` (vectors only): AVX-512's intrinsics' prefix for the width, its register and
    mask types (``("_mm512", "__m512", "__mmask16")``): the scaling by ``2^k`` is then one
    ``scalef``, rounding once as the two exact powers of two do (the same results, bit for
    bit, in about 20 instructions a vector instead of 30: 0.28 -> 0.17 ns an element on a
    Xeon, one core), and the clamp one min (see :func:`_avx512_clamp_and_scale`).

    ``kind`` ``exp_neg``: the body of ``exp_neg(x) = exp(0 - x)`` (a sigmoid's exp), without
    the negation: the clamps mirrored, ``k`` rounded from ``x * -log2(e)``, and the
    reduction's first step ``-(k ln2_hi) - v``, one fused negated multiply-subtract of the
    same value as exp's ``(0 - v) - k ln2_hi``; the same bits as exp of the negation, an
    instruction fewer. ``exp_normal``: exp's body, 0 below
    :data:`opfusion.tir.expr.EXP_NORMAL_BELOW` instead of -103.98."""
    negated = kind == "exp_neg"

    def c(text: str) -> str:
        return text if splat is None else f"{splat}({text})"

    poly = c(_POLY[0])
    for coefficient in _POLY[1:]:
        poly = f"({poly} * r + {c(coefficient)})"
    form = _FORMS[kind]
    zero, zero_side, bound, bound_side = form.zero, form.zero_side, form.bound, form.bound_side
    if splat is None:
        clamp = (f"float v = (x != x || x {zero_side} {zero}) ? 0.0f : x; "
                 f"v = v {bound_side} {bound} ? {bound} : v;")
        ints = "int32_t n = (int32_t)k;"
        scale = ("int32_t h = n >> 1; int32_t b1 = (h + 127) << 23; "
                 "int32_t b2 = (n - h + 127) << 23; float s1, s2; "
                 "memcpy(&s1, &b1, 4); memcpy(&s2, &b2, 4);")
        result = f"return x != x ? x : (x {zero_side} {zero} ? 0.0f : (y * s1) * s2);"
    else:
        nan, past = "(x != x)", f"(x {zero_side} {c(zero)})"

        def pick(mask: str, a: str, b: str) -> str:
            return f"({vt})(({mask} & ({it}){a}) | (~{mask} & ({it}){b}))"

        limit = c(bound)
        # (a lane of 0 where the result is x or 0: the and-not of the mask)
        clamp = (f"{vt} v = ({vt})(~({nan} | {past}) & ({it})x); "
                 f"v = {pick(f'(v {bound_side} {limit})', limit, 'v')};")
        ints = f"{it} n = __builtin_convertvector(k, {it});"
        scale = (f"{it} h = n >> 1; {vt} s1 = ({vt})((h + 127) << 23); "
                 f"{vt} s2 = ({vt})((n - h + 127) << 23);")
        result = (f"{vt} out = ({vt})(~{past} & ({it})((y * s1) * s2)); "
                  f"return {pick(nan, 'x', 'out')};")
        if scalef is not None:
            ints, scale = "", ""
            clamp, result = _avx512_clamp_and_scale(vt, c, *scalef, form=form)
    first = f"-(k * {c(_LN2_HI)}) - v" if negated else f"v - k * {c(_LN2_HI)}"
    return " ".join([
        clamp,
        f"{vt} k = (v * {c(form.log2e)} + {c(_ROUNDER)}) - {c(_ROUNDER)};",
        f"{vt} r = ({first}) - k * {c(_LN2_LO)};",
        f"{vt} y = ({poly} * r + {c('1.0f')}) * r + {c('1.0f')};",
        *(part for part in (ints, scale) if part), result,
    ])


def _avx512_clamp_and_scale(vt: str, c: Callable[[str], str], prefix: str, register: str,
                            mask: str, form: _Form = _FORMS["exp"]) -> tuple[str, str]:
    """exp's clamp and its scaling by ``2^k`` in AVX-512's instructions for vectors of type
    ``register`` (intrinsics ``prefix``_..., masks of type ``mask``). The clamp is a min
    above, whose operand order keeps a NaN (it returns its second operand when one is NaN),
    so NaN lanes run through the arithmetic as NaN and no select restores them. Nothing
    clamps below: the lanes under _ZERO_BELOW compute from their own value (a reduced
    argument and a polynomial as any other, or NaN and infinities for -inf and the largest
    magnitudes) and are zeroed by the scalef's mask, which leaves their scaling undone (no
    subnormal result, so no microcode assist: -inf lanes run as fast as 0). The same bits as
    the plain form; 13 instructions a vector instead of 20 (EfficientNet's SiLU layer of 96
    channels at 112 x 112, on a Xeon: 400 -> 355 us with a max below as well). exp_neg's
    ``form`` is the mirror image: a max below, the lanes above zeroed."""
    limit, past = f"({register}){c(form.bound)}", f"({register}){c(form.zero)}"
    clamp = (f"{vt} v = ({vt}){prefix}_{form.clamp_op}_ps({limit}, ({register})x); "
             f"{mask} keep = {prefix}_cmp_ps_mask(({register})x, {past}, {form.keep_if});")
    result = f"return ({vt}){prefix}_maskz_scalef_ps(keep, ({register})y, ({register})k);"
    return clamp, result


def scalar_exp_helper(name: str, kind: str = "exp") -> str:
    """``static inline float name(float x)``: the scalar form of ``kind`` (one of
    :data:`EXP_FORMS`)."""
    body = exp_body("float", "int32_t", None, kind=kind)
    return f"static inline float {name}(float x) {{ {body} }}"


#: AVX-512's forms by vector width in bytes: (intrinsics' prefix, register type, mask type,
#: the features they need as the compiler's macros).
_SCALEF = {64: ("_mm512", "__m512", "__mmask16", "defined(__AVX512F__)"),
           32: ("_mm256", "__m256", "__mmask8", "defined(__AVX512F__) && defined(__AVX512VL__)"),
           16: ("_mm", "__m128", "__mmask8", "defined(__AVX512F__) && defined(__AVX512VL__)")}


def has_scalef(nbytes: int) -> bool:
    """Whether AVX-512 has a scalef for vectors of ``nbytes``."""
    return nbytes in _SCALEF


def vector_exp_helper(name: str, vt: str, it: str, splat: str, nbytes: int = 0,
                      scalef: bool = False, kind: str = "exp") -> str:
    """``static inline vt name(vt x)``: the vector form (``it`` the int32 vector of as many
    lanes, ``splat`` the float splat helper). With ``scalef`` (a target with AVX-512, and a
    vector of ``nbytes`` that has the instruction), the scalef form where the compiler has
    the instruction set (see :func:`exp_body`), the plain one elsewhere: the same values."""
    plain = (f"static inline {vt} {name}({vt} x) "
             f"{{ {exp_body(vt, it, splat, kind=kind)} }}")
    entry = _SCALEF.get(nbytes)
    if not scalef or entry is None:
        return plain
    prefix, register, mask, guard = entry
    fast = (f"static inline {vt} {name}({vt} x) "
            f"{{ {exp_body(vt, it, splat, (prefix, register, mask), kind)} }}")
    return f"#if {guard}\n{fast}\n#else\n{plain}\n#endif"


# -- tanh and erf as expressions of exp ------------------------------------------------------

#: Cephes' tanhf polynomial (|x| < 0.625), highest power first.
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
              -3.33332819422e-1)
_TANH_SPLIT = 0.625
#: erf(x) / x as a polynomial in x^2 on [0, 0.875], least squares at Chebyshev points
#: (relative error 1.1e-8 in float64).
_ERF_SMALL = (-0.0006253727223322476, 0.005042236068756952, -0.026798588879527078,
              0.11282667767938301, -0.3761257423154565, 1.1283791632035556)
#: erf(x) on [0.875, 3.92] as a polynomial in u = (x - 2.3975) / 1.5225 (u in [-1, 1]), highest
#: power first: Chebyshev interpolation at 4000 points, degree 14 (1.1e-8 in float64; 2.1 ulp
#: evaluated in float32). From 3.92 on, erf(x) rounds to 1 in float32.
_ERF_LARGE = (0.00048643440804157785, -0.0002778706596101677, -0.002910846245089918,
              0.004037770135248491, 0.0039479708224417235, -0.015191718126498855,
              0.01531954574390126, 0.004603826560165221, -0.03847135473909368,
              0.06487285565600093, -0.06563793650176349, 0.044438969269505364,
              -0.01999884101714241, 0.005478630717026145, 0.9993025449044057)
_ERF_CENTER, _ERF_HALF_WIDTH = 2.3975, 1.5225
_ERF_ONE = 3.92
_ERF_SPLIT = 0.875


def _f(value: float) -> E.PrimExpr:
    return E.FloatImm(value, "float32")


def _horner(coefficients: tuple[float, ...], v: E.PrimExpr) -> E.PrimExpr:
    result: E.PrimExpr = _f(coefficients[0])
    for coefficient in coefficients[1:]:
        result = result * v + _f(coefficient)
    return result


def _exp(v: E.PrimExpr) -> E.PrimExpr:
    return E.Call("exp", [v], "float32")


def _magnitude(x: E.PrimExpr) -> E.PrimExpr:
    """|x| as a select (no fabs call, which does not vectorize); NaN stays NaN."""
    return E.Select(x < _f(0.0), _f(0.0) - x, x)


def _with_sign_of(x: E.PrimExpr, value: E.PrimExpr) -> E.PrimExpr:
    return E.Select(x < _f(0.0), _f(0.0) - value, value)


def tanh_expr(x: E.PrimExpr) -> E.PrimExpr:
    """float32 tanh as arithmetic, selects and exp (see the module docstring)."""
    z = x * x
    small = x * (_horner(_TANH_POLY, z) * z + _f(1.0))  # x * (...): tanh(-0) is -0
    large = _f(1.0) - _f(2.0) / (_exp(_f(2.0) * _magnitude(x)) + _f(1.0))
    return E.Select(_magnitude(x) < _f(_TANH_SPLIT), small, _with_sign_of(x, large))


def erf_expr(x: E.PrimExpr) -> E.PrimExpr:
    """float32 erf as arithmetic, selects and exp (see the module docstring)."""
    a = _magnitude(x)
    small = x * _horner(_ERF_SMALL, x * x)
    u = (a - _f(_ERF_CENTER)) * _f(1.0 / _ERF_HALF_WIDTH)
    # a >= 3.92, not a < 3.92: NaN takes the polynomial and stays NaN
    large = E.Select(a >= _f(_ERF_ONE), _f(1.0), _horner(_ERF_LARGE, u))
    return E.Select(a < _f(_ERF_SPLIT), small, _with_sign_of(x, large))


_EXPANSIONS = {"tanh": tanh_expr, "erf": erf_expr}


def expand_intrinsics(func: S.PrimFunc) -> S.PrimFunc:
    """``func`` with its float32 tanh and erf calls rewritten into exp, its exps of a negation
    into exp_neg, its exps flushed below the normal floats into exp_normal and its products
    with a reciprocal into quotients. In a store, each
    call's argument is bound by a let first, so that the selects of the expansion choose
    between values, not loads (a vector select of loads would not be planned: a load in a
    branch may be a guarded out-of-bounds read)."""
    return S.PrimFunc(func.name, func.params, _expand_stmt(func.body), func.attrs)


def _expand_stmt(stmt: S.Stmt) -> S.Stmt:
    return map_nested(stmt, _expand_one)


def _expand_one(stmt: S.Stmt) -> S.Stmt | None:
    """A store or let with its calls expanded (their arguments bound by lets before it), a
    statement without a body with its expressions expanded; None for the others (their
    bodies are mapped)."""
    if isinstance(stmt, (S.BufferStore, S.LetStmt)):
        # (a let's value too: a shared value bound before the store, tir.shared_values)
        lets: list[tuple[E.Var, E.PrimExpr]] = []
        value = E.rewrite(stmt.value, lambda node: _expansion(node, lets))
        out: S.Stmt = (S.BufferStore(stmt.buffer, value, list(stmt.indices))
                       if isinstance(stmt, S.BufferStore)
                       else S.LetStmt(stmt.var, value, _expand_stmt(stmt.body)))
        for var, bound in reversed(lets):
            out = S.LetStmt(var, bound, out)
        return out
    if isinstance(stmt, (S.SeqStmt, S.For, S.IfThenElse, S.Allocate)):
        return None
    return map_stmt(stmt, _expand_plain)


#: pow(x, n) for these constant n as products (GPT-2's GELU has x ** 3): the same value for
#: every x as pow's to an ulp or two, signed zeros, infinities and NaN included.
_INTEGER_POWERS = {2.0: lambda x: x * x, 3.0: lambda x: x * x * x,
                   4.0: lambda x: (x * x) * (x * x)}


def _expansion(node: E.PrimExpr, lets: list[tuple[E.Var, E.PrimExpr]] | None
               ) -> E.PrimExpr | None:
    if (isinstance(node, E.Call) and node.name == "pow" and isinstance(node.args[1], E.FloatImm)
            and node.args[1].value in _INTEGER_POWERS):
        return _INTEGER_POWERS[node.args[1].value](_bound(node.args[0], lets))
    negated = _exp_of_negation(node)
    if negated is not None:
        return E.Call("exp_neg", [negated], "float32")
    flushed = _exp_normal_argument(node)
    if flushed is not None:
        return E.Call("exp_normal", [flushed], "float32")
    quotient = _times_reciprocal(node)
    if quotient is not None:
        return quotient
    if not (isinstance(node, E.Call) and node.dtype == "float32" and node.name in _EXPANSIONS):
        return None
    return _EXPANSIONS[node.name](_bound(node.args[0], lets))


def _exp_of_negation(node: E.PrimExpr) -> E.PrimExpr | None:
    """``y`` where ``node`` is float32 ``exp(0 - y)`` (a sigmoid's) or ``exp(y * -1)`` (an
    exported Exp(Neg(y))), else None: computed as ``exp_neg(y)``, the same bits without the
    negation (see :func:`exp_body`; a NaN comes out a NaN either way)."""
    if not (isinstance(node, E.Call) and node.name == "exp" and node.dtype == "float32"):
        return None
    (argument,) = node.args
    if isinstance(argument, E.Sub) and _is_constant(argument.a, 0.0):
        return argument.b
    if isinstance(argument, E.Mul):
        if _is_constant(argument.b, -1.0):
            return argument.a
        if _is_constant(argument.a, -1.0):
            return argument.b
    return None


def _exp_normal_argument(node: E.PrimExpr) -> E.PrimExpr | None:
    """``x`` where ``node`` is ``select(x < EXP_NORMAL_BELOW, 0, exp(x))`` in float32
    (:func:`opfusion.te.exp_normal`), else None: computed as ``exp_normal(x)``, the same
    values in one helper whose flushed lanes are never scaled into the subnormals."""
    if not (isinstance(node, E.Select) and isinstance(node.condition, E.LT)
            and _is_constant(node.condition.b, E.EXP_NORMAL_BELOW)
            and _is_constant(node.true_value, 0.0)):
        return None
    exp = node.false_value
    if not (isinstance(exp, E.Call) and exp.name == "exp" and exp.dtype == "float32"
            and structural_equal(exp.args[0], node.condition.a)):
        return None
    return exp.args[0]


def _is_constant(node: E.PrimExpr, value: float) -> bool:
    return isinstance(node, E.FloatImm) and node.value == value


def _times_reciprocal(node: E.PrimExpr) -> E.PrimExpr | None:
    """``a / b`` where ``node`` is ``a * (1 / b)`` or ``(1 / b) * a`` in float32 or float64
    (SiLU's ``x * sigmoid(x)``), else None: one division, correctly rounded, in place of a
    division and a product that round twice (at most half an ulp from the exact quotient
    rather than about one; zeros, infinities and NaN the same), and an instruction fewer.
    The reference rounds twice, so the results may differ from it in that last ulp."""
    if not (isinstance(node, E.Mul) and node.dtype in ("float32", "float64")):
        return None
    for factor, other in ((node.b, node.a), (node.a, node.b)):
        if isinstance(factor, E.Div) and _is_constant(factor.a, 1.0):
            return E.Div(other, factor.b)
    return None


def _bound(argument: E.PrimExpr, lets: list[tuple[E.Var, E.PrimExpr]] | None) -> E.PrimExpr:
    """``argument``, bound to a new variable by a let around the store (when ``lets`` is
    given) unless it is a variable or a constant already: computed once however often the
    expansion reads it."""
    if lets is None or isinstance(argument, (E.Var, E.FloatImm)):
        return argument
    var = E.Var("arg", argument.dtype)
    lets.append((var, argument))
    return var


def _expand_plain(expr: E.PrimExpr) -> E.PrimExpr:
    return E.rewrite(expr, lambda node: _expansion(node, None))


def scalar_dot4_helper() -> str:
    """``opf_dot4_u8s8(a, b)``: the sum of the products of the bytes of ``a`` (unsigned) and
    ``b`` (signed), byte by byte (:func:`opfusion.tir.expr.dot4_u8s8`)."""
    return ("static inline int32_t opf_dot4_u8s8(int32_t a, int32_t b) {\n"
            "  uint32_t x = (uint32_t)a, y = (uint32_t)b;\n"
            "  int32_t sum = 0;\n"
            "  for (int i = 0; i < 32; i += 8)\n"
            "    sum += (int32_t)((x >> i) & 0xFFu)\n"
            "           * (int32_t)(int8_t)(uint8_t)((y >> i) & 0xFFu);\n"
            "  return sum;\n"
            "}")


#: VNNI's ``vpdpbusd`` by the width of its vectors in bytes: its forms, each a (target features
#: it needs, preprocessor guard, intrinsic, integer vector type, the zero of that type), the
#: first the target has taken.
_DPBUSD = {
    64: ((("avx512vnni",), "defined(__AVX512VNNI__)", "_mm512_dpbusd_epi32", "__m512i",
          "_mm512_setzero_si512()"),),
    32: ((("avx512vnni", "avx512vl"), "defined(__AVX512VNNI__) && defined(__AVX512VL__)",
          "_mm256_dpbusd_epi32", "__m256i", "_mm256_setzero_si256()"),
         # AVX-VNNI: the same instruction, VEX-encoded, on CPUs without AVX-512
         (("avxvnni",), "defined(__AVXVNNI__)", "_mm256_dpbusd_avx_epi32", "__m256i",
          "_mm256_setzero_si256()")),
}


def vector_dot4_helper(name: str, vt: str, lanes: int, has: Callable[[str], bool],
                       accumulate: bool) -> str:
    """``name(acc, a, b)`` (``accumulate``) or ``name(a, b)``: :func:`scalar_dot4_helper` lane by
    lane on int32 vectors of ``lanes``, added to ``acc``: one ``vpdpbusd`` where the target
    (``has``: whether it has a feature) has a VNNI form at that width, else a loop over the
    lanes."""
    found = next((form[1:] for form in _DPBUSD.get(lanes * 4, ())
                  if all(has(feature) for feature in form[0])), None)
    body = None
    if found is not None:
        guard, intrinsic, itype, zero = found
        start = f"({itype})acc" if accumulate else zero
        body = (guard, f"({vt}){intrinsic}({start}, ({itype})a, ({itype})b)")
    return _word_dot_helper(name, vt, lanes, "opf_dot4_u8s8", body, accumulate)


def vector_dot4_memory_helper(name: str, vt: str, lanes: int, registers: str) -> str:
    """``name(acc, a, b)``: ``registers(acc, a, *b)`` (the accumulating dot4 helper) for
    ``b`` the address of an int32 vector of ``lanes``, which AVX-VNNI's ``vpdpbusd`` reads as
    its memory operand. Written as ``asm`` because GCC loads a vector that several products
    read into one register (its common subexpressions), which a register tile on 16
    registers then spills; elsewhere the load and the register helper."""
    if lanes != 8:  # pragma: no cover - AVX-VNNI's vectors are 32 bytes
        raise ValueError(f"no memory form of vpdpbusd for {lanes} int32 lanes")
    return "\n".join([
        f"static inline {vt} {name}({vt} acc, {vt} a, const int32_t* b) {{",
        "#if defined(__GNUC__) && defined(__AVXVNNI__) && !defined(__AVX512VL__)",
        f'  __asm__("%{{vex%}} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a), "m"(*(const {vt}*)b));',
        "  return acc;",
        "#else",
        f"  {vt} v; memcpy(&v, b, sizeof v);",
        f"  return {registers}(acc, a, v);",
        "#endif",
        "}"])


def _word_dot_helper(name: str, vt: str, lanes: int, scalar: str,
                     instruction: tuple[str, str] | None, accumulate: bool) -> str:
    """A vector helper of an integer intrinsic: ``instruction`` (its preprocessor guard and
    the expression of its result, ``acc`` included) where the guard holds, else the scalar
    helper ``scalar`` lane by lane."""
    params = f"{vt} acc, {vt} a, {vt} b" if accumulate else f"{vt} a, {vt} b"
    lines = [f"static inline {vt} {name}({params}) {{"]
    if instruction is not None:
        lines += [f"#if {instruction[0]}", f"  return {instruction[1]};", "#else"]
    lines += [f"  {vt} r = {'acc' if accumulate else '{0}'};",
              f"  for (int i = 0; i < {lanes}; ++i) r[i] += {scalar}(a[i], b[i]);",
              "  return r;"]
    if instruction is not None:
        lines.append("#endif")
    lines.append("}")
    return "\n".join(lines)


def scalar_dot2_helper() -> str:
    """``opf_dot2_s16(a, b)``: the sum of the products of the signed 16-bit halves of ``a``
    and ``b`` (:func:`opfusion.tir.expr.dot2_s16`)."""
    return ("static inline int32_t opf_dot2_s16(int32_t a, int32_t b) {\n"
            "  uint32_t x = (uint32_t)a, y = (uint32_t)b;\n"
            "  return (int32_t)(int16_t)(uint16_t)(x & 0xFFFFu)\n"
            "         * (int16_t)(uint16_t)(y & 0xFFFFu)\n"
            "         + (int32_t)(int16_t)(uint16_t)(x >> 16) * (int16_t)(uint16_t)(y >> 16);\n"
            "}")


#: The scalar helpers of the integer intrinsics, by name.
WORD_DOTS = {"dot4_u8s8": scalar_dot4_helper, "dot2_s16": scalar_dot2_helper}

#: ``pmaddwd`` by the width of its vectors in bytes: (the target feature it needs,
#: preprocessor guard, intrinsic, integer vector type).
_MADDWD = {
    64: ("avx512bw", "defined(__AVX512BW__)", "_mm512_madd_epi16", "__m512i"),
    32: ("avx2", "defined(__AVX2__)", "_mm256_madd_epi16", "__m256i"),
    16: ("sse2", "defined(__SSE2__)", "_mm_madd_epi16", "__m128i"),
}


def vector_dot2_helper(name: str, vt: str, lanes: int, has: Callable[[str], bool],
                       accumulate: bool) -> str:
    """``name(acc, a, b)`` (``accumulate``) or ``name(a, b)``: :func:`scalar_dot2_helper` lane by
    lane on int32 vectors of ``lanes``, added to ``acc``: one ``pmaddwd`` (and an add) where
    the target has it at this width (``has``: the target's feature test), else a loop."""
    found = _MADDWD.get(lanes * 4)
    body = None
    if found is not None and has(found[0]):
        _, guard, intrinsic, itype = found
        product = f"({vt}){intrinsic}(({itype})a, ({itype})b)"
        body = (guard, f"{'acc + ' if accumulate else ''}{product}")
    return _word_dot_helper(name, vt, lanes, "opf_dot2_s16", body, accumulate)
