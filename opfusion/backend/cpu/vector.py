"""Vectorized loops as GCC vector types: explicit SIMD code that GCC and clang both accept.

A VECTORIZED loop that :mod:`.loop_planning` gave a :class:`VectorPlan` (a body of a few stores
and lets with unit-stride indices) is emitted as a loop over chunks of ``lanes`` iterations,
each chunk one vector statement per store (8 float32 lanes with AVX2, 16 with AVX-512)::

    for (int32_t yi = 0; yi < 32; yi += 8) {
      opf_store_float32x8(&C[(x * 32) + yi], opf_load_float32x8(&C[(x * 32) + yi])
                          + opf_splat_float32x8(A[k]) * opf_load_float32x8(&B[k * 32 + yi]));
    }

Why not leave it to the auto-vectorizer: with explicit vectors, GCC keeps a small local
accumulator (a cache_write buffer) in registers across the reduction loop around it, which it
does not do for the equivalent scalar loop; matmul runs about twice as fast.
Semantics match the scalar loop exactly: same operations, same rounding, same NaN rules. The
helpers are plain GCC vector code for any width; the only x86 intrinsics (streaming stores and
their fence) are emitted for the features the target has, each also under its preprocessor
guard."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...ir.types import float_to_int_bounds
from ...target import Target
from ...tir import expr as E
from ...tir import stmt as S
from ...tir.nan_free import NanFacts, always_false_nan_test
from ..c_family import CFamilyEmitter, float_literal
from ..c_names import c_type
from .loop_planning import (
    ARITHMETIC,
    COMPARISONS,
    ELEMENT_SIZES,
    NARROW_DTYPES,
    SCALAR,
    VECTOR_DTYPES,
    VectorAnalysis,
    VectorPlan,
    value_nodes,
)
from .vector_math import (
    EXP_FORMS,
    WORD_DOTS,
    has_scalef,
    vector_dot2_helper,
    vector_dot4_helper,
    vector_dot4_memory_helper,
    vector_exp_helper,
)

#: float32 values that convert to int32 exactly as truncated (the ends of the range the
#: vector conversion is defined on)
INT32_LOW, INT32_HIGH = -2147483648.0, 2147483648.0
#: Streaming-store instructions, widest first: (bytes, target feature, preprocessor guard,
#: intrinsic, vector type). The fence after them, ``_mm_sfence``, needs SSE.
_STREAM_STORES = (
    (64, "avx512f", "__AVX512F__", "_mm512_stream_ps", "__m512"),
    (32, "avx", "__AVX__", "_mm256_stream_ps", "__m256"),
    (16, "sse", "__SSE__", "_mm_stream_ps", "__m128"),
)


@dataclass(frozen=True)
class QuantizeClip:
    """``clip(round(x) [+ z], lo, hi)`` taken apart (:func:`_quantize_clip`): the two clamps
    (``inner`` applied first), the ``round`` call, the zero point ``z`` (0 where there is no
    add), the clamps' bounds in that order, and the low and high ones."""

    inner: E.PrimExpr
    outer: E.PrimExpr
    rounded: E.Call
    point: float
    bounds: tuple[float, float]

    @property
    def low(self) -> float:
        return self.bounds[0] if isinstance(self.inner, E.Max) else self.bounds[1]

    @property
    def high(self) -> float:
        return self.bounds[1] if isinstance(self.inner, E.Max) else self.bounds[0]


def _quantize_clip(node: E.PrimExpr | None) -> QuantizeClip | None:
    """``node`` as a quantize step's clip of float32 ``round(x) [+ z]`` (a ``min`` of a ``max``
    or the other way round) with whole bounds and zero point below 2^23; else None."""
    if not isinstance(node, (E.Min, E.Max)):
        return None
    outer, inner = node, node.children()[0]
    if type(inner) is type(outer) or not isinstance(inner, (E.Min, E.Max)):
        return None
    rounded, point = inner.children()[0], 0.0
    if isinstance(rounded, E.Add) and isinstance(rounded.b, E.FloatImm):
        rounded, point = rounded.a, float(rounded.b.value)  # round(x) + z: a zero point
    bounds = [float(b.value) for b in (inner.children()[1], outer.children()[1])
              if isinstance(b, E.FloatImm)]
    if not (isinstance(rounded, E.Call) and rounded.name == "round"
            and rounded.dtype == "float32" and len(bounds) == 2
            and all(v.is_integer() and abs(v) < 2.0 ** 23 for v in (*bounds, point))):
        return None
    return QuantizeClip(inner, outer, rounded, point, (bounds[0], bounds[1]))


class VectorEmitter:
    """Emits vectorized loops that have a :class:`VectorPlan`, and the vector helpers (types,
    loads, stores, splats, selects, min/max, streaming stores), into a C emitter for
    ``target``."""

    def __init__(self, emitter: CFamilyEmitter, target: Target) -> None:
        self.c = emitter
        self.target = target
        #: which values of the loop being emitted cannot be NaN (their NaN tests fold, their
        #: mins and maxes are the machine's): one loop's (:meth:`emit`), or one value's
        self.facts = NanFacts()
        self._in_loop = False
        #: the values of the loop's vector lets, by the variable's id (the variables are held
        #: by the loop being emitted)
        self._let_values: dict[int, E.PrimExpr] = {}
        #: variables (by id) that hold the address of a product of words' vector operand,
        #: which the product reads from memory (see :mod:`.regtile`)
        self.memory_operands: set[int] = set()

    # -- helper types and functions ----------------------------------------------------------

    def vtype(self, dtype: str, lanes: int) -> str:
        name = f"opf_{dtype}x{lanes}"
        nbytes = lanes * ELEMENT_SIZES[dtype]
        self.c.need_helper(
            f"0_type_{name}",
            f"typedef {c_type(dtype)} {name} __attribute__((vector_size({nbytes})));",
        )
        return name

    def mask_type(self, bits: str, lanes: int) -> str:
        return self.vtype(f"int{bits}", lanes)

    def helper(self, kind: str, dtype: str, lanes: int) -> str:
        vt = self.vtype(dtype, lanes)
        scalar = c_type(dtype)
        name = f"opf_{kind}_{dtype}x{lanes}"
        key = f"1_{name}"
        if kind == "splat":
            items = ", ".join(["s"] * lanes)
            text = f"static inline {vt} {name}({scalar} s) {{ return ({vt}){{{items}}}; }}"
        elif kind == "ramp":
            items = ", ".join(f"s + {i}" for i in range(lanes))
            text = f"static inline {vt} {name}({scalar} s) {{ return ({vt}){{{items}}}; }}"
        elif kind == "load":
            self.c.includes.add("string.h")
            text = (f"static inline {vt} {name}(const {scalar}* p) "
                    f"{{ {vt} v; memcpy(&v, p, sizeof v); return v; }}")
        elif kind == "store":
            self.c.includes.add("string.h")
            text = f"static inline void {name}({scalar}* p, {vt} v) {{ memcpy(p, &v, sizeof v); }}"
        elif kind == "select":
            mt = self.mask_type(str(VECTOR_DTYPES[dtype] * 8), lanes)
            text = (f"static inline {vt} {name}({mt} m, {vt} t, {vt} f) "
                    f"{{ return ({vt})((m & ({mt})t) | (~m & ({mt})f)); }}")
        elif kind in ("max_not_nan", "min_not_nan"):
            text = self._min_max_helper(name, vt, dtype, lanes, kind.startswith("max"))
        elif kind in ("max", "min"):
            select = self.helper("select", dtype, lanes)
            cmp = ">" if kind == "max" else "<"
            nan = " | (a != a)" if dtype.startswith("float") else ""
            text = (f"static inline {vt} {name}({vt} a, {vt} b) "
                    f"{{ return {select}((a {cmp} b){nan}, a, b); }}")
        elif kind in EXP_FORMS:
            self.c.includes.add("string.h")
            nbytes = lanes * VECTOR_DTYPES[dtype]
            scalef = self.target.has("avx512f") and has_scalef(nbytes)
            if scalef:
                self._include_intrinsics()
            text = vector_exp_helper(name, vt, self.vtype("int32", lanes),
                                     self.helper("splat", dtype, lanes), nbytes, scalef,
                                     kind=kind)
        elif kind in ("sqrt", "round"):
            self.c.includes.add("math.h")
            base = "sqrt" if kind == "sqrt" else "nearbyint"
            root = f"{base}f" if dtype == "float32" else base
            text = (f"static inline {vt} {name}({vt} v) {{ {vt} r; for (int i = 0; i < {lanes}; "
                    f"++i) r[i] = {root}(v[i]); return r; }}")
        elif kind in ("dot4_u8s8", "dot4_add_u8s8", "dot2_s16", "dot2_add_s16"):
            # the intrinsic (or, "_add_", its sum with an accumulator), on the scalar helper
            scalar = "dot4_u8s8" if kind.startswith("dot4") else "dot2_s16"
            self.c.need_helper(f"1_opf_{scalar}", WORD_DOTS[scalar]())
            self._include_intrinsics()
            accumulate = "_add_" in kind
            text = (vector_dot4_helper(name, vt, lanes, self.target.has,
                                       accumulate) if scalar == "dot4_u8s8"
                    else vector_dot2_helper(name, vt, lanes, self.target.has, accumulate))
        elif kind == "dot4_add_memory_u8s8":
            self.c.includes.add("string.h")
            text = vector_dot4_memory_helper(name, vt, lanes,
                                             self.helper("dot4_add_u8s8", dtype, lanes))
        elif kind == "gather":
            text = self._gather_helper(name, vt, scalar, dtype, lanes)
        elif kind == "satcast_float32" and dtype == "int32":
            text = self._int32_cast_helper(name, vt, lanes)
        elif kind.startswith("satcast_"):  # float32 -> 8 or 16 bits: NaN 0, truncated, saturated
            not_nan = kind.startswith("satcast_not_nan_")
            source = kind.removeprefix("satcast_not_nan_" if not_nan else "satcast_")
            lo, hi = float_to_int_bounds(dtype)
            ft, it = self.vtype(source, lanes), self.vtype("int32", lanes)
            splat = self.helper("splat", source, lanes)
            select = self.helper("select", source, lanes)
            nan_rule = "" if not_nan else f"x = {select}(x == x, x, {splat}(0)); "
            # (NaN gone: the clamps are the machine's max and min, vmaxps / vminps)
            high = self.helper("max_not_nan", source, lanes)
            low = self.helper("min_not_nan", source, lanes)
            text = (f"static inline {vt} {name}({ft} x) {{ "
                    f"{nan_rule}"
                    f"x = {high}(x, {splat}({float(lo)!r}f)); "
                    f"x = {low}(x, {splat}({float(hi - 1)!r}f)); "
                    f"return {self.narrowed(f'__builtin_convertvector(x, {it})', dtype, lanes)};"
                    f" }}")
        elif kind == "quotient":
            text = self._quotient_helper(name, vt, lanes)
        elif kind == "round_int32":
            text = self._round_int32_helper(name, vt, lanes)
        elif kind.startswith("widen_"):
            text = self._widen_helper(name, kind.removeprefix("widen_"), lanes)
        elif kind == "narrow":
            text = self._narrow_helper(name, dtype, lanes)
        elif kind == "usat_shift":
            text = self._usat_shift_helper(name, vt, lanes)
        elif kind == "stream":
            text = self._stream_helper(name, vt, scalar, lanes * ELEMENT_SIZES[dtype])
        else:  # pragma: no cover - internal
            raise AssertionError(kind)
        self.c.need_helper(key, text)
        return name

    def _min_max_helper(self, name: str, vt: str, dtype: str, lanes: int, is_max: bool) -> str:
        """``name(a, b)``: ``a > b ? a : b`` (``<`` for min) of values that are never NaN: the
        machine's ``vmaxps`` / ``vminps`` (``a`` against ``b``, ``b`` when equal: the same
        choice for zeros of either sign), where the target has it at this width; a select
        elsewhere."""
        nbytes = lanes * ELEMENT_SIZES[dtype]
        suffix = {"float32": "ps", "float64": "pd"}[dtype]
        op = "max" if is_max else "min"
        forms = {64: ("avx512f", "__AVX512F__", f"_mm512_{op}_{suffix}", "__m512"),
                 32: ("avx", "__AVX__", f"_mm256_{op}_{suffix}", "__m256"),
                 16: ("sse2", "__SSE2__", f"_mm_{op}_{suffix}", "__m128")}
        lines = [f"static inline {vt} {name}({vt} a, {vt} b) {{"]
        if nbytes in forms and self.target.has(forms[nbytes][0]):
            self._include_intrinsics()
            _, guard, intrinsic, mtype = forms[nbytes]
            mtype += "d" if dtype == "float64" else ""
            lines += [f"#if defined({guard})", f"  return ({vt}){intrinsic}(({mtype})a, "
                                                f"({mtype})b);", "#else"]
        select = self.helper("select", dtype, lanes)
        lines.append(f"  return {select}(a {'>' if is_max else '<'} b, a, b);")
        if len(lines) > 2:
            lines.append("#endif")
        return "\n".join([*lines, "}"])

    def _gather_helper(self, name: str, vt: str, scalar: str, dtype: str, lanes: int) -> str:
        """``name(p, i)``: ``p[i[k]]`` in every lane ``k`` (4-byte elements): one ``vgatherdps``
        / ``vpgatherdd`` where the target has it at this width, a loop elsewhere."""
        it = self.vtype("int32", lanes)
        nbytes = lanes * 4
        kind = "ps" if dtype == "float32" else "epi32"
        forms = {64: ("avx512f", "__AVX512F__", f"_mm512_i32gather_{kind}((__m512i)i, p, 4)"),
                 32: ("avx2", "__AVX2__", f"_mm256_i32gather_{kind}(p, (__m256i)i, 4)"),
                 16: ("avx2", "__AVX2__", f"_mm_i32gather_{kind}(p, (__m128i)i, 4)")}
        pointer = "const void*" if nbytes == 64 else f"const {'float' if kind == 'ps' else 'int'}*"
        lines = [f"static inline {vt} {name}(const {scalar}* restrict t, {it} i) {{"]
        loop = (f"  {vt} r; for (int k = 0; k < {lanes}; ++k) r[k] = t[i[k]]; return r;")
        if nbytes in forms and self.target.has(forms[nbytes][0]):
            self._include_intrinsics()
            _, guard, call = forms[nbytes]
            lines += [f"#if defined({guard})", f"  {pointer} p = ({pointer})t;",
                      f"  return ({vt}){call};", "#else", loop, "#endif"]
        else:
            lines.append(loop)
        return "\n".join([*lines, "}"])

    def _rounded_quotient(self, node: E.PrimExpr, text: dict[int, str],
                          lanes: int) -> str | None:
        """``a / c`` that a ``round`` reads, as ``a * (1 / c)`` corrected by two fused
        multiply-adds (Markstein's: ``q = a y``, ``r = a - q c`` exact, ``q + r y`` the
        correctly rounded quotient for ``y`` = the rounded reciprocal and no overflow or
        underflow), where the rounding makes it exact: a float32 literal divisor whose
        reciprocal is normal and whose significand is not all ones, a dividend the NaN facts
        prove never NaN and bounded, so the quotient cannot overflow. Only a quotient below
        about 2^-90 may differ in its last bit (its residual below the normal range; checked
        over all 2^32 dividends), and it rounds to zero either way. QuantizeLinear's
        ``round(x / s)``: three instructions on the two vector ports instead of a ``vdivps``
        (about 10 cycles each on the divider). None elsewhere (the division stays)."""
        if not (isinstance(node, E.Div) and node.dtype == "float32"
                and isinstance(node.b, E.FloatImm) and self._fma_width(lanes)):
            return None
        divisor = np.float32(node.b.value)
        if not 2.0 ** -100 <= abs(float(divisor)) <= 2.0 ** 100:
            return None
        if int(divisor.view(np.uint32)) & 0x7FFFFF == 0x7FFFFF:
            return None  # (all ones: outside the proof's conditions)
        fact = self.facts.fact(node.a)
        if fact.nan or max(abs(fact.low), abs(fact.high)) > 2.0 ** 120 * abs(float(divisor)):
            return None
        dividend = self._operand(node.a, text.get(id(node.a)), lanes)
        reciprocal = np.float32(1) / divisor  # (correctly rounded)
        helper = self.helper("quotient", "float32", lanes)
        return (f"{helper}({dividend}, {float_literal(float(divisor), 'float32')}, "
                f"{float_literal(float(reciprocal), 'float32')})")

    def _rounding_conversion(self, node: E.PrimExpr, text: dict[int, str],
                             lanes: int) -> str | None:
        """The int32 conversion of ``node`` = ``clip(round(x) [+ z], lo, hi)`` (a ``min`` of a
        ``max`` or the other way round; whole bounds and zero point) as the machine's rounding
        conversion of ``clip(x, lo - z, hi - z)``, plus ``z`` in int32: ``vcvtps2dq`` rounds
        to nearest even, as ``round`` does (both in the current rounding mode), and rounding
        commutes with a clip to whole bounds, NaN included (the clamps' ``vmaxps`` /
        ``vminps`` give the bound, either way). The round's ``vrndscaleps`` (two micro-ops
        with AVX-512) and the float add are gone from every quantize step. None where
        ``node`` is not of that form, or the target has no such conversion at this width
        (``round`` and the truncating conversion stay)."""
        found = self._rounded_clip(node, text, lanes, saturated=False)
        if found is None:
            return None
        converted, point = found
        if point:
            converted = f"({converted} + {self.helper('splat', 'int32', lanes)}({point}))"
        return converted

    def _saturated_bytes(self, node: E.PrimExpr, text: dict[int, str], lanes: int
                         ) -> str | None:
        """``uint8(clip(round(x) + z, lo, 255))`` (``z`` >= 0, ``lo`` >= 0, no NaN) as the
        rounding conversion of ``max(x, lo - z)``, plus ``z``, narrowed with unsigned
        saturation (AVX-512's ``vpmovusdb``): the upper clamp is the narrowing's. A lane the
        conversion overflows (``0x80000000``) or whose sum with ``z`` wraps is above 2^31 as
        an unsigned number, so it saturates to 255 as the clip would have. None where the
        target narrows without saturation at this width or ``node`` is not of that form."""
        if not self._saturating_narrow(lanes):
            return None
        found = self._rounded_clip(node, text, lanes, saturated=True)
        if found is None:
            return None
        converted, point = found
        return f"{self.helper('usat_shift', 'uint8', lanes)}({converted}, {point})"

    def _saturating_narrow(self, lanes: int) -> bool:
        """Whether int32 lanes narrow to bytes with unsigned saturation in one instruction
        (``vpmovusdb``) at this width."""
        return (lanes == 16 and self.target.has("avx512f")) or (
            lanes in (8, 4) and self.target.has("avx512vl"))

    def _rounded_clip(self, node: E.PrimExpr, text: dict[int, str], lanes: int,
                      saturated: bool) -> tuple[str, int] | None:
        """(the rounding conversion of ``clip(x, lo - z, hi - z)``, ``z``) for ``node`` =
        ``clip(round(x) [+ z], lo, hi)`` (see :meth:`_rounding_conversion`); ``saturated``:
        without the upper clamp, for a narrowing that saturates to it
        (:meth:`_saturated_bytes`), which needs ``hi`` = 255, ``z`` >= 0 and a lower bound of
        at least 0."""
        clip = _quantize_clip(node) if self._cvtps_form(lanes) is not None else None
        if clip is None:
            return None
        if saturated and not (clip.high == 255.0 and clip.point >= 0 and clip.low >= 0):
            return None
        value = clip.rounded.children()[0]
        quotient = self._rounded_quotient(value, text, lanes) or text.get(id(value))
        if quotient is None:
            return None
        clipped = self._shifted_clamps(quotient, clip, lanes, upper=not saturated)
        return f"{self.helper('round_int32', 'float32', lanes)}({clipped})", int(clip.point)

    def _shifted_clamps(self, value: str, clip: QuantizeClip, lanes: int,
                        upper: bool = True) -> str:
        """``value`` (the text of ``round(x)``, or of ``x`` where a rounding conversion
        follows) clamped to ``clip``'s bounds less its zero point: ``clip(round(x) + z, lo,
        hi) = clip(round(x), lo - z, hi - z) + z`` exactly (the sum is exact below 2^24, and
        anything larger is clipped either way; rounding keeps whole bounds). A clamp that
        the value's bounds already hold (a quantize step after a ReLU: ``max(x, 0)`` of an
        ``x`` that is never negative) is left out, and the upper one unless ``upper``."""
        fact = self.facts.fact(clip.rounded)
        for clamp, bound in ((clip.inner, clip.bounds[0]), (clip.outer, clip.bounds[1])):
            is_max = isinstance(clamp, E.Max)
            shifted = bound - clip.point
            if not fact.nan and (fact.low >= shifted if is_max else fact.high <= shifted):
                continue  # (the value's bounds hold it)
            if not (upper or is_max):
                continue  # (the narrowing saturates to it)
            kind = "max" if is_max else "min"
            if all(self.facts.nan_free(k) for k in clamp.children()):
                kind = f"{kind}_not_nan"
            splat = self._operand(E.FloatImm(shifted, "float32"), None, lanes)
            value = f"{self.helper(kind, 'float32', lanes)}({value}, {splat})"
        return value

    def _shifted_codes(self, node: E.PrimExpr, point: float, analysis: VectorAnalysis,
                       lanes: int) -> str | None:
        """``c - z`` for quantized codes ``c = clip(round(x) + z, lo, hi)`` (directly, through
        their NaN rule ``where(isnan(c), 0, c)`` where that folds, or through a let), the
        first step of dequantizing them, as ``clip(round(x), lo - z, hi - z)``: exactly the
        same values (:meth:`_shifted_clamps`; ``round(x)`` is never NaN), without the two
        adds. A QDQ pair before a residual add (ResNet's expansion convolutions) requantizes
        this way. None for any other form."""
        value = node
        if isinstance(value, E.Select):
            known = always_false_nan_test(value.condition, self.facts)
            if known is None:
                return None
            value = value.true_value if known else value.false_value
        if isinstance(value, E.Var):
            value = self._let_values.get(id(value))
        clip = _quantize_clip(value)
        if clip is None or clip.point != point or not self.facts.nan_free(clip.rounded) \
                or id(clip.rounded) not in analysis.kinds:
            return None
        return self._shifted_clamps(self._text(clip.rounded, analysis, lanes), clip, lanes)

    def _cvtps_form(self, lanes: int) -> tuple[str, str, str, str] | None:
        """(feature, guard, intrinsic, argument type) of the rounding float32 -> int32
        conversion of ``lanes`` lanes, where the target has it; else None."""
        forms = {16: ("avx512f", "__AVX512F__", "_mm512_cvtps_epi32", "__m512"),
                 8: ("avx", "__AVX__", "_mm256_cvtps_epi32", "__m256"),
                 4: ("sse2", "__SSE2__", "_mm_cvtps_epi32", "__m128")}
        if lanes not in forms or not self.target.has(forms[lanes][0]):
            return None
        return forms[lanes]

    def _round_int32_helper(self, name: str, vt: str, lanes: int) -> str:
        """``name(x)``: the int32 vector of float32 ``x`` rounded to nearest even (in the
        current rounding mode, as ``nearbyintf``), for lanes already inside int32's range."""
        form = self._cvtps_form(lanes)
        assert form is not None
        _, guard, intrinsic, mtype = form
        self._include_intrinsics()
        self.c.includes.add("math.h")
        it = self.vtype("int32", lanes)
        return "\n".join([
            f"static inline {it} {name}({vt} x) {{",
            f"#if defined({guard})",
            f"  return ({it}){intrinsic}(({mtype})x);",
            "#else",
            f"  {it} r; for (int i = 0; i < {lanes}; ++i) r[i] = (int32_t)nearbyintf(x[i]); "
            "return r;",
            "#endif",
            "}"])

    def _fma_width(self, lanes: int) -> bool:
        """Whether the target has vector fused multiply-adds of ``lanes`` float32."""
        return (lanes == 16 and self.target.has("avx512f")) or (
            lanes in (4, 8) and self.target.has("fma"))

    def _quotient_helper(self, name: str, vt: str, lanes: int) -> str:
        """``name(a, c, y)``: Markstein's quotient ``a / c`` from ``y`` = 1 / c rounded (see
        :meth:`_rounded_quotient`), with the target's fused multiply-adds."""
        self._include_intrinsics()
        prefix, mtype, guard = {16: ("_mm512", "__m512", "__AVX512F__"),
                                8: ("_mm256", "__m256", "__FMA__"),
                                4: ("_mm", "__m128", "__FMA__")}[lanes]
        splat = self.helper("splat", "float32", lanes)
        return "\n".join([
            f"static inline {vt} {name}({vt} a, float c, float y) {{",
            f"#if defined({guard})",
            f"  {mtype} q = {prefix}_mul_ps(({mtype})a, {prefix}_set1_ps(y));",
            f"  {mtype} r = {prefix}_fnmadd_ps(q, {prefix}_set1_ps(c), ({mtype})a);",
            f"  return ({vt}){prefix}_fmadd_ps(r, {prefix}_set1_ps(y), q);",
            "#else",
            f"  return a / {splat}(c);",
            "#endif",
            "}"])

    def narrowed(self, value: str, dtype: str, lanes: int) -> str:
        """The int32 vector ``value``, whose lanes are inside the range of ``dtype`` (8 or 16
        bits), converted to ``dtype``: by packs where AVX2 or SSE4.1 has no single
        instruction for it (:meth:`_narrow_helper`), else by ``__builtin_convertvector``
        (AVX-512's ``vpmovdb``, which GCC picks itself)."""
        if self._pack_form(lanes) is None:
            return f"__builtin_convertvector({value}, {self.vtype(dtype, lanes)})"
        return f"{self.helper('narrow', dtype, lanes)}({value})"

    def _pack_form(self, lanes: int) -> tuple[str, str] | None:
        """(preprocessor guard, the int32 halves as one ``__m128i`` argument list) of the packs
        that narrow ``lanes`` int32 lanes, or None where GCC's own conversion is kept."""
        if lanes == 8 and self.target.has("avx2") and not self.target.has("avx512vl"):
            return ("__AVX2__", "_mm256_castsi256_si128((__m256i)v), "
                    "_mm256_extracti128_si256((__m256i)v, 1)")
        if lanes == 4 and self.target.has("sse4.1") and not self.target.has("avx512vl"):
            return "__SSE4_1__", "(__m128i)v, (__m128i)v"
        return None

    def _usat_shift_helper(self, name: str, vt: str, lanes: int) -> str:
        """``name(v, z)``: the bytes of the int32 lanes ``v + z`` (a wrapping sum) with
        unsigned saturation: ``vpmovusdb`` (see :meth:`_saturated_bytes`)."""
        self._include_intrinsics()
        self.c.includes.add("string.h")
        it = self.vtype("int32", lanes)
        prefix, mtype = {16: ("_mm512", "__m512i"), 8: ("_mm256", "__m256i"),
                         4: ("_mm", "__m128i")}[lanes]
        add = f"{prefix}_add_epi32(({mtype})v, {prefix}_set1_epi32(z))"
        guard = "defined(__AVX512F__)" if lanes == 16 else "defined(__AVX512VL__)"
        return "\n".join([
            f"static inline {vt} {name}({it} v, int32_t z) {{",
            f"#if {guard}",
            f"  __m128i p = {prefix}_cvtusepi32_epi8({add}); {vt} r; "
            "memcpy(&r, &p, sizeof r); return r;",
            "#else",
            f"  {vt} r; for (int i = 0; i < {lanes}; ++i) {{ uint32_t u = (uint32_t)v[i] + "
            "(uint32_t)z; r[i] = (uint8_t)(u > 255u ? 255u : u); } return r;",
            "#endif",
            "}",
        ])

    def _narrow_helper(self, name: str, dtype: str, lanes: int) -> str:
        """``name(v)``: int32 lanes already inside ``dtype``'s range (a quantize step's clip,
        or a saturating cast's clamps) to ``dtype``, by two packs (``vpackusdw`` /
        ``vpackssdw``, then ``vpackuswb`` / ``vpacksswb`` for bytes), which saturate and so
        equal the truncation on such lanes. Without AVX-512's ``vpmovdb``, GCC's
        ``__builtin_convertvector`` took each lane apart (``vpextrd`` and a byte store each):
        a quantized 3x3 convolution in AVX2 code with AVX-VNNI 1020 -> 869 us."""
        form = self._pack_form(lanes)
        assert form is not None
        guard, halves = form
        vt, it = self.vtype(dtype, lanes), self.vtype("int32", lanes)
        signed = dtype.startswith("int")
        words = f"_mm_pack{'s' if signed else 'us'}_epi32({halves})"
        packed = (words if NARROW_DTYPES[dtype] == 2
                  else f"_mm_pack{'s' if signed else 'us'}_epi16(w, w)")
        nbytes = lanes * NARROW_DTYPES[dtype]
        self._include_intrinsics()
        self.c.includes.add("string.h")
        keep = {16: f"  return ({vt})p;",
                8: f"  long long bits = _mm_cvtsi128_si64(p); {vt} r; "
                   "memcpy(&r, &bits, sizeof r); return r;",
                4: f"  int bits = _mm_cvtsi128_si32(p); {vt} r; "
                   "memcpy(&r, &bits, sizeof r); return r;"}[nbytes]
        body = [f"  __m128i p = {packed};"]
        if packed != words:
            body.insert(0, f"  __m128i w = {words};")
        return "\n".join([f"static inline {vt} {name}({it} v) {{", f"#if defined({guard})",
                          *body, keep, "#else", f"  return __builtin_convertvector(v, {vt});",
                          "#endif", "}"])

    def _widen_helper(self, name: str, source: str, lanes: int) -> str:
        """``name(v)``: 8- or 16-bit integers to int32, zero- or sign-extended: one
        ``vpmovzxbd`` (or its kin) where the target has it at this width. GCC's own
        ``__builtin_convertvector`` of 16 bytes to 16 int32 took each byte apart with scalar
        instructions (a quantized ResNet-50 block's residual: 0.41 -> 0.30 ms)."""
        it, nt = self.vtype("int32", lanes), self.vtype(source, lanes)
        size = NARROW_DTYPES[source]
        extend = f"{'epi' if source.startswith('int') else 'epu'}{8 * size}_epi32"
        lines = [f"static inline {it} {name}({nt} v) {{"]
        fallback = f"  return __builtin_convertvector(v, {it});"
        nbytes = lanes * size
        if lanes == 16 and self.target.has("avx512f"):
            mtype = "__m128i" if nbytes == 16 else "__m256i"
            call = f"_mm512_cvt{extend}(({mtype})v)"
            guard = "__AVX512F__"
        elif lanes == 8 and self.target.has("avx2") and nbytes == 16:
            call, guard = f"_mm256_cvt{extend}((__m128i)v)", "__AVX2__"
        elif lanes == 8 and self.target.has("avx2") and nbytes == 8:
            self.c.includes.add("string.h")
            lines.append("  long long bits; memcpy(&bits, &v, sizeof bits);")
            call, guard = f"_mm256_cvt{extend}(_mm_cvtsi64_si128(bits))", "__AVX2__"
        else:
            return "\n".join([*lines, fallback, "}"])
        self._include_intrinsics()
        lines += [f"#if defined({guard})", f"  return ({it}){call};", "#else", fallback,
                  "#endif", "}"]
        return "\n".join(lines)

    def _int32_cast_helper(self, name: str, vt: str, lanes: int) -> str:
        """``name(x)``: float32 to int32 by opfusion's rule (NaN 0, truncated, saturated) in
        vectors: lanes at 2^31 and above are replaced before the conversion (undefined for
        them) and set to INT32_MAX after it; -2^31 is exact in float32."""
        ft, it = self.vtype("float32", lanes), self.vtype("int32", lanes)
        splat = self.helper("splat", "float32", lanes)
        select = self.helper("select", "float32", lanes)
        return (f"static inline {it} {name}({ft} x) {{ "
                f"x = {select}(x == x, x, {splat}(0)); "
                f"{it} big = (x >= {splat}(2147483648.0f)); "
                f"x = {select}(x < {splat}(-2147483648.0f), {splat}(-2147483648.0f), x); "
                f"x = {select}(big, {splat}(0), x); "
                f"return (__builtin_convertvector(x, {it}) & ~big) | (big & 2147483647); }}")

    def _include_intrinsics(self) -> None:
        """``immintrin.h`` where the compiler targets x86 (guarded: the helpers that use it
        are guarded by the instruction sets they need)."""
        self.c.need_helper("0_include_immintrin",
                           "#if defined(__SSE__)\n#include <immintrin.h>\n#endif")

    def _stream_helper(self, name: str, vt: str, scalar: str, nbytes: int) -> str:
        # Non-temporal stores write whole cache lines to memory without first reading them
        # (as memcpy does for large copies): a third less memory traffic for a pure output.
        # Each instruction the target has, widest first, for a pointer aligned to its width.
        self.c.includes.add("string.h")
        self._include_intrinsics()
        self.c.need_helper(
            "1_opf_stream_fence",
            "static inline void opf_stream_fence(void) {\n"
            "#if defined(__SSE__)\n  _mm_sfence();\n#endif\n}",
        )
        lines = [f"static inline void {name}({scalar}* p, {vt} v) {{"]
        for width, feature, guard, store, mtype in _STREAM_STORES:
            if width > nbytes or not self.target.has(feature):
                continue
            parts, aligned = nbytes // width, f"(((uintptr_t)p & {width - 1}u) == 0)"
            lines.append(f"#if defined({guard})")
            if parts == 1:
                lines.append(f"  if {aligned} {{ {store}((float*)p, ({mtype})v); return; }}")
            elif parts == 2:
                lines += [f"  if {aligned} {{",
                          f"    {mtype} lo, hi;",
                          f"    memcpy(&lo, &v, {width});",
                          f"    memcpy(&hi, (const char*)&v + {width}, {width});",
                          f"    {store}((float*)p, lo);",
                          f"    {store}((float*)p + {width // 4}, hi);",
                          "    return;",
                          "  }"]
            else:
                lines += [f"  if {aligned} {{",
                          f"    {mtype} part[{parts}];",
                          "    memcpy(part, &v, sizeof v);",
                          f"    for (int i = 0; i < {parts}; ++i) "
                          f"{store}((float*)p + {width // 4} * i, part[i]);",
                          "    return;",
                          "  }"]
            lines.append("#endif")
        lines += ["  memcpy(p, &v, sizeof v);", "}"]
        return "\n".join(lines)

    # -- emission ----------------------------------------------------------------------------

    def emit(self, loop: S.For, plan: VectorPlan, indent: int) -> None:
        c = self.c
        lanes = plan.lanes
        start, end = c.loop_bounds(loop)
        var = c.bind_var(loop.loop_var, c.non_negative(loop.min))
        chunks = loop.extent.value // lanes
        if chunks <= 16:
            c.line(indent, f"#pragma GCC unroll {chunks}")
        ctype = c_type(loop.loop_var.dtype)
        c.line(indent, f"for ({ctype} {var} = {start}; {var} < {end}; {var} += {lanes}) {{")
        analysis = VectorAnalysis(loop)
        self.facts = self._new_facts()
        self._in_loop = True
        self._let_values = {}
        analysis.vector_lets = set(plan.vector_lets)
        analysis.coefficients.update(plan.affine_lets)
        analysis.dependent |= plan.vector_lets | {var for var, _ in plan.affine_lets}
        bound: list[E.Var] = []
        for stmt in plan.body:
            if isinstance(stmt, S.LetStmt):
                if id(stmt.var) in plan.vector_lets:
                    text = self.value(stmt.value, analysis, lanes)
                    name = c.bind_var(stmt.var)
                    vt = self.vtype(stmt.var.dtype, lanes)
                    c.line(indent + 1, f"const {vt} {name} = {text};")
                    self.facts.bind(stmt.var, stmt.value)
                    self._let_values[id(stmt.var)] = stmt.value
                else:
                    # A scalar, or an affine index evaluated at the chunk's first lane.
                    text = c.expr(stmt.value)
                    name = c.bind_var(stmt.var, c.non_negative(stmt.value))
                    c.line(indent + 1, f"const {c_type(stmt.var.dtype)} {name} = {text};")
                bound.append(stmt.var)
                continue
            value = self.value(stmt.value, analysis, lanes)
            address = (f"&{c.buffer_name(stmt.buffer)}"
                       f"[{c.expr(c.offset(stmt.buffer, stmt.indices))}]")
            store = self.helper("stream" if id(stmt) in plan.streams else "store",
                                stmt.buffer.dtype, lanes)
            c.line(indent + 1, f"{store}({address}, {value});")
        c.line(indent, "}")
        self._in_loop = False
        self._let_values = {}  # (the loop's variables go with it: no id may outlive them)
        for v in reversed(bound):
            c.unbind_var(v)
        c.unbind_var(loop.loop_var)

    def _new_facts(self) -> NanFacts:
        """NaN facts that know the kernel's constant parameters (the lowering records their
        bounds: ``constant_facts``)."""
        func = self.c.func
        known = func.attrs.get("constant_facts", {}) if func is not None else {}
        return NanFacts({id(func.params[index]): fact for index, fact in known.items()})

    def value(self, root: E.PrimExpr, analysis: VectorAnalysis, lanes: int) -> str:
        """C text of ``root`` as a vector of ``lanes`` (a scalar root is broadcast)."""
        kind = analysis.value(root)
        assert kind is not None, f"planned vector expression became unvectorizable: {root}"
        if not self._in_loop:  # (a register tile's update: facts of its own)
            self.facts = self._new_facts()
        if kind == SCALAR:
            return self._operand(root, None, lanes)
        return self._text(root, analysis, lanes)

    def _text(self, root: E.PrimExpr, analysis: VectorAnalysis, lanes: int) -> str:
        """C text of the vector ``root`` from its nodes' planned kinds."""
        text: dict[int, str] = {}
        for node in value_nodes(root):
            if analysis.kinds[id(node)] == SCALAR:
                continue  # printed where a vector parent needs it
            if isinstance(node, E.BufferLoad):
                args: list[str | None] = []
            else:
                args = [None if analysis.kinds[id(k)] == SCALAR else text[id(k)]
                        for k in node.children()]
            text[id(node)] = self._format(node, args, analysis, lanes, text)
        return text[id(root)]

    def _operand(self, node: E.PrimExpr, text: str | None, lanes: int) -> str:
        if text is not None:
            return text
        return f"{self.helper('splat', node.dtype, lanes)}({self.c.expr(node)})"

    def _format(self, node: E.PrimExpr, args: list[str | None], analysis: VectorAnalysis,
                lanes: int, text: dict[int, str]) -> str:
        """C text of ``node`` from its operands' (``args``: None for a scalar operand;
        ``text``: every vector node's so far, by id)."""
        c = self.c
        kids = node.children()
        if isinstance(node, E.Var):
            if id(node) in analysis.vector_lets:
                return c.var_name(node)
            return f"{self.helper('ramp', node.dtype, lanes)}({c.var_name(node)})"
        if isinstance(node, E.BufferLoad) and id(node) in analysis.gathers:
            index = self._text(node.indices[0], analysis, lanes)
            gather = self.helper("gather", node.dtype, lanes)
            return f"{gather}({c.buffer_name(node.buffer)}, {index})"
        if isinstance(node, E.BufferLoad):
            offset = c.expr(c.offset(node.buffer, node.indices))
            load = self.helper("load", node.dtype, lanes)
            return f"{load}(&{c.buffer_name(node.buffer)}[{offset}])"
        if isinstance(node, E.Add) and _is_word_dot(kids[1]):
            # acc + dot4(a, b): one vpdpbusd, which adds to its accumulator itself (dot2: a
            # pmaddwd and an add)
            a, b = (self._operand(k, text.get(id(k)), lanes) for k in kids[1].children())
            acc = self._operand(kids[0], args[0], lanes)
            kind = "dot4_add_u8s8" if kids[1].name == "dot4_u8s8" else "dot2_add_s16"
            weight = kids[1].children()[1]
            if kind == "dot4_add_u8s8" and id(weight) in self.memory_operands:
                kind = "dot4_add_memory_u8s8"  # (b: the address of the weight vector)
                b = c.var_name(weight)
            return f"{self.helper(kind, node.dtype, lanes)}({acc}, {a}, {b})"
        if isinstance(node, E.Sub) and isinstance(kids[1], E.FloatImm):
            shifted = self._shifted_codes(kids[0], float(kids[1].value), analysis, lanes)
            if shifted is not None:
                return shifted
        op = ARITHMETIC.get(type(node)) or COMPARISONS.get(type(node))
        if op is not None:
            a = self._operand(kids[0], args[0], lanes)
            b = self._operand(kids[1], args[1], lanes)
            return f"({a} {op} {b})"
        if isinstance(node, (E.Min, E.Max)):
            kind = "max" if isinstance(node, E.Max) else "min"
            if E.is_float(node.dtype) and all(self.facts.nan_free(k) for k in kids):
                kind = f"{kind}_not_nan"  # (one vminps / vmaxps)
            fn = self.helper(kind, node.dtype, lanes)
            a = self._operand(kids[0], args[0], lanes)
            b = self._operand(kids[1], args[1], lanes)
            return f"{fn}({a}, {b})"
        if isinstance(node, (E.And, E.Or)):
            return f"({args[0]} {'&' if isinstance(node, E.And) else '|'} {args[1]})"
        if isinstance(node, E.Not):
            return f"(~{args[0]})"
        if isinstance(node, E.Select):
            t = self._operand(kids[1], args[1], lanes)
            f = self._operand(kids[2], args[2], lanes)
            known = always_false_nan_test(kids[0], self.facts)
            if known is not None:  # isnan(x) of an x that cannot be NaN
                return t if known else f
            if args[0] is None:
                return f"({c.expr(kids[0])} ? {t} : {f})"
            return f"{self.helper('select', node.dtype, lanes)}({args[0]}, {t}, {f})"
        if isinstance(node, E.Cast):
            if node.dtype == "int32" and E.is_float(node.value.dtype):  # (float32 only)
                fact = self.facts.fact(kids[0])
                if not fact.nan and INT32_LOW <= fact.low and fact.high < INT32_HIGH:
                    rounded = self._rounding_conversion(kids[0], text, lanes)
                    if rounded is not None:
                        return rounded
                    return f"__builtin_convertvector({args[0]}, {self.vtype('int32', lanes)})"
                return f"{self.helper('satcast_float32', 'int32', lanes)}({args[0]})"
            if node.dtype in NARROW_DTYPES:  # (planned from float32 only)
                fact = self.facts.fact(kids[0])
                lo, hi = float_to_int_bounds(node.dtype)
                if not fact.nan and lo <= fact.low and fact.high <= hi - 1:
                    # already clipped into the range (QuantizeLinear's clip): the conversions
                    # alone (vcvttps2dq, vpmovdb), no clamps
                    it = self.vtype("int32", lanes)
                    if node.dtype == "uint8":
                        saturated = self._saturated_bytes(kids[0], text, lanes)
                        if saturated is not None:
                            return saturated
                    rounded = self._rounding_conversion(kids[0], text, lanes)
                    return self.narrowed(rounded or f"__builtin_convertvector({args[0]}, {it})",
                                         node.dtype, lanes)
                kind = "satcast_" + node.value.dtype
                if not fact.nan:
                    kind = "satcast_not_nan_" + node.value.dtype
                return f"{self.helper(kind, node.dtype, lanes)}({args[0]})"
            value = args[0]
            if node.value.dtype in NARROW_DTYPES:
                # 8 and 16 bits widen to int32 first (exact; vpmovzxbd): GCC converts bytes
                # straight to floats one element at a time (a quantized residual add's bytes:
                # 16 scalar conversions a vector)
                value = f"{self.helper('widen_' + node.value.dtype, 'int32', lanes)}({value})"
                if node.dtype == "int32":
                    return value
            return f"__builtin_convertvector({value}, {self.vtype(node.dtype, lanes)})"
        if isinstance(node, E.Call) and node.name == "round":
            quotient = self._rounded_quotient(kids[0], text, lanes)
            if quotient is not None:
                return f"{self.helper('round', node.dtype, lanes)}({quotient})"
        if isinstance(node, E.Call):  # planned only for VECTOR_INTRINSICS
            operands = ", ".join(self._operand(k, a, lanes) for k, a in zip(kids, args))
            return f"{self.helper(node.name, node.dtype, lanes)}({operands})"
        raise AssertionError(f"unplanned vector node {type(node).__name__}")  # pragma: no cover


def _is_word_dot(node: E.PrimExpr) -> bool:
    return isinstance(node, E.Call) and node.name in ("dot4_u8s8", "dot2_s16")
