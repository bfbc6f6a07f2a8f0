"""Vectorized loops as GCC vector types: explicit SIMD code that GCC and clang both accept.

A VECTORIZED loop whose body is a few stores (and lets) with unit-stride indices is emitted as a
loop over chunks of ``lanes`` iterations, each chunk one vector statement per store::

    for (int32_t yi = 0; yi < 32; yi += 8) {
      opf_store_float32x8(&C[(x * 32) + yi], opf_load_float32x8(&C[(x * 32) + yi])
                          + opf_splat_float32x8(A[k]) * opf_load_float32x8(&B[k * 32 + yi]));
    }

Why not leave it to the auto-vectorizer: with explicit vectors, GCC keeps a small local
accumulator (a cache_write buffer) in registers across the reduction loop around it, which it
does not do for the equivalent scalar loop; matmul runs about twice as fast.

A body qualifies when, for the loop variable ``v``: every store and every load that depends on
``v`` has a flat offset of the form ``base + 1 * v`` (contiguous lanes; a load that does not
depend on ``v`` is a scalar, broadcast), the element types are 4- or 8-byte numbers, the
extent is a constant multiple of the lane count, and the operations are arithmetic, min/max,
comparisons, logic, casts (not float to integer, which saturates) and selects whose branches
cannot fault (no loads, no integer division). Anything else is emitted by the caller as a
scalar loop under ``#pragma omp simd``.
Semantics match the scalar loop exactly: same operations, same rounding, same NaN rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..tir import expr as E
from ..tir import stmt as S
from .c_names import c_type

if TYPE_CHECKING:
    from .c import CEmitter

#: Element types a vector may hold, with their size in bytes.
_VECTOR_DTYPES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint32": 4, "uint64": 8}

_ARITHMETIC = {E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "/"}
_COMPARISONS = {E.EQ: "==", E.NE: "!=", E.LT: "<", E.LE: "<=", E.GT: ">", E.GE: ">="}

# The kind of a node inside a vectorized body: a scalar (same value in every lane), a vector of
# a dtype, or a mask (the result of a comparison: all-ones or zero lanes of a width in bits).
_SCALAR = ("scalar", "")


@dataclass(frozen=True)
class VectorPlan:
    """How to emit one vectorized loop: lanes per chunk, the body's stores and lets in order,
    which lets are vectors, which are affine indices (variable id and coefficient), and which
    stores (by id) stream past the cache."""

    lanes: int
    body: tuple[S.Stmt, ...]
    vector_lets: frozenset[int]
    affine_lets: tuple[tuple[int, int], ...]
    streams: frozenset[int]


def _flatten(body: S.Stmt) -> list[S.Stmt] | None:
    out: list[S.Stmt] = []
    stack = [body]
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, S.SeqStmt):
            stack.extend(reversed(stmt.stmts))
        elif isinstance(stmt, S.BufferStore):
            out.append(stmt)
        elif isinstance(stmt, S.LetStmt):
            out.append(stmt)
            stack.append(stmt.body)
        else:
            return None
    return out


def coefficient(expr: E.PrimExpr, coefficients: dict[int, int],
                dependent: set[int] | None = None) -> int | None:
    """The constant c such that ``expr`` is ``base + c * v`` for the loop variable v.

    ``coefficients`` gives c for v and for let-bound affine variables (by ``id``); variables
    in ``dependent`` but not in ``coefficients`` vary with v in unknown ways. None when
    ``expr`` is not affine (a product of two loop variables, a division, a load, ...)."""
    value: dict[int, int | None] = {}
    for node in E.post_order(expr):
        children = [value[id(c)] for c in node.children()]
        if isinstance(node, E.Var):
            c: int | None = coefficients.get(id(node), 0)
            if id(node) not in coefficients and dependent and id(node) in dependent:
                c = None
        elif isinstance(node, (E.Add, E.Sub)):
            a, b = children
            c = None if a is None or b is None else (a + b if isinstance(node, E.Add) else a - b)
        elif isinstance(node, E.Mul):
            a, b = children
            if a == 0 and b == 0:
                c = 0
            elif a == 0 and isinstance(node.a, E.IntImm) and b is not None:
                c = node.a.value * b
            elif b == 0 and isinstance(node.b, E.IntImm) and a is not None:
                c = a * node.b.value
            else:
                c = None
        elif isinstance(node, E.Cast) and not node.dtype.startswith("float"):
            # A widening (or same-width) integer cast keeps the form; anything else is opaque.
            c = children[0] if not node.value.dtype.startswith("float") else (
                0 if children[0] == 0 else None)
        else:
            c = 0 if all(x == 0 for x in children) else None
        value[id(node)] = c
    return value[id(expr)]


def _value_nodes(root: E.PrimExpr) -> list[E.PrimExpr]:
    """The nodes of a value expression, children first, without entering load indices."""
    order: list[E.PrimExpr] = []
    seen: set[int] = set()
    stack: list[tuple[E.PrimExpr, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        if not isinstance(node, E.BufferLoad):
            stack.extend((child, False) for child in reversed(node.children()))
    return order


def _has_unsafe_branch(expr: E.PrimExpr) -> bool:
    # Vector selects compute both branches: a load or an integer division there could fault.
    return any(isinstance(n, (E.BufferLoad, E.FloorDiv, E.FloorMod)) for n in E.post_order(expr))


class _Analysis:
    """Checks that a vectorized body can be emitted as vectors; records every node's kind."""

    def __init__(self, loop: S.For) -> None:
        self.loop = loop
        #: variables whose value differs between lanes (by id)
        self.dependent: set[int] = {id(loop.loop_var)}
        #: affine variables: the loop variable and integer lets of the form base + c * v
        self.coefficients: dict[int, int] = {id(loop.loop_var): 1}
        self.vector_lets: set[int] = set()
        self.sizes: set[int] = set()
        self.kinds: dict[int, tuple[str, str]] = {}

    def offset_coefficient(self, buffer: E.Buffer, indices: tuple[E.PrimExpr, ...]) -> int | None:
        if not indices:
            return 0
        return coefficient(buffer.offset_of(indices), self.coefficients, self.dependent)

    def index_depends(self, index: E.PrimExpr) -> bool:
        return any(isinstance(n, E.Var) and id(n) in self.dependent for n in E.post_order(index))

    def value(self, root: E.PrimExpr) -> tuple[str, str] | None:
        """The kind of ``root``, or None if it cannot be vectorized."""
        for node in _value_nodes(root):
            kind = self._kind(node)
            if kind is None:
                return None
            self.kinds[id(node)] = kind
            if kind[0] == "vector":
                self.sizes.add(_VECTOR_DTYPES[kind[1]])
        return self.kinds[id(root)]

    def _depends(self, node: E.PrimExpr) -> bool:
        if isinstance(node, E.Var):
            return id(node) in self.dependent
        if isinstance(node, E.BufferLoad):
            return any(self.index_depends(i) for i in node.indices)
        return any(self.kinds[id(c)] != _SCALAR for c in node.children())

    def _kind(self, node: E.PrimExpr) -> tuple[str, str] | None:
        if not self._depends(node):
            return _SCALAR
        dtype = node.dtype
        if isinstance(node, E.Var):
            if id(node) in self.vector_lets:
                return ("vector", dtype)
            if node is self.loop.loop_var and dtype in ("int32", "int64"):
                return ("vector", dtype)  # a ramp: v, v+1, ..., v+lanes-1
            return None  # an affine index variable used as a value
        if isinstance(node, E.BufferLoad):
            if dtype not in _VECTOR_DTYPES:
                return None
            if self.offset_coefficient(node.buffer, node.indices) != 1:
                return None  # a gather or a broadcast of a varying element
            return ("vector", dtype)
        kids = [self.kinds[id(c)] for c in node.children()]
        if type(node) in _ARITHMETIC or isinstance(node, (E.Min, E.Max)):
            if dtype not in _VECTOR_DTYPES or any(k[0] == "mask" for k in kids):
                return None
            if isinstance(node, E.Div) and not dtype.startswith("float"):
                return None
            return ("vector", dtype)
        if type(node) in _COMPARISONS:
            operand = node.a.dtype
            if operand not in _VECTOR_DTYPES or any(k[0] == "mask" for k in kids):
                return None
            return ("mask", str(_VECTOR_DTYPES[operand] * 8))
        if isinstance(node, (E.And, E.Or)):
            if kids[0][0] != "mask" or kids[0] != kids[1]:
                return None
            return kids[0]
        if isinstance(node, E.Not):
            return kids[0] if kids[0][0] == "mask" else None
        if isinstance(node, E.Select):
            if dtype not in _VECTOR_DTYPES or kids[1][0] == "mask" or kids[2][0] == "mask":
                return None
            if kids[0] == _SCALAR:
                return ("vector", dtype)  # a scalar condition picks one whole vector
            if kids[0] != ("mask", str(_VECTOR_DTYPES[dtype] * 8)):
                return None
            if _has_unsafe_branch(node.true_value) or _has_unsafe_branch(node.false_value):
                return None
            return ("vector", dtype)
        if isinstance(node, E.Cast):
            if kids[0][0] != "vector" or dtype not in _VECTOR_DTYPES:
                return None
            if node.value.dtype.startswith("float") and not dtype.startswith("float"):
                # Float to integer saturates (a scalar helper in c.py); a vector conversion
                # would be undefined for NaN and out-of-range lanes.
                return None
            return ("vector", dtype)
        return None  # intrinsic calls, integer division, lets: scalar loop


def plan_vector_loop(loop: S.For, vector_bytes: int,
                     stream_buffers: set[int]) -> VectorPlan | None:
    """A plan to emit ``loop`` (VECTORIZED) with vector types, or None if it does not qualify."""
    if not isinstance(loop.extent, E.IntImm) or loop.extent.value <= 0:
        return None
    body = _flatten(loop.body)
    if body is None:
        return None
    analysis = _Analysis(loop)
    for stmt in body:
        if isinstance(stmt, S.LetStmt):
            if not analysis.index_depends(stmt.value):
                continue  # the same in every lane: a scalar const
            if not stmt.var.dtype.startswith("float"):
                c = coefficient(stmt.value, analysis.coefficients, analysis.dependent)
                if c is not None:
                    # An index helper (row = v * 4 + k): a scalar at the chunk's first lane.
                    analysis.coefficients[id(stmt.var)] = c
                    analysis.dependent.add(id(stmt.var))
                    continue
            kind = analysis.value(stmt.value)
            if kind is None or kind[0] != "vector":
                return None
            analysis.dependent.add(id(stmt.var))
            analysis.vector_lets.add(id(stmt.var))
            continue
        if stmt.buffer.dtype not in _VECTOR_DTYPES:
            return None
        if analysis.offset_coefficient(stmt.buffer, stmt.indices) != 1:
            return None
        kind = analysis.value(stmt.value)
        if kind is None or kind[0] == "mask":
            return None
        analysis.sizes.add(_VECTOR_DTYPES[stmt.buffer.dtype])
    lanes = _lanes(loop.extent.value, max(analysis.sizes, default=4), vector_bytes)
    if lanes is None:
        return None
    streams = frozenset(
        id(s) for s in body
        if isinstance(s, S.BufferStore) and id(s.buffer) in stream_buffers
        and _VECTOR_DTYPES[s.buffer.dtype] == 4 and lanes == 8
    )
    affine = tuple((var, c) for var, c in analysis.coefficients.items()
                   if var != id(loop.loop_var))
    return VectorPlan(lanes, tuple(body), frozenset(analysis.vector_lets), affine, streams)


def _lanes(extent: int, element_size: int, vector_bytes: int) -> int | None:
    for width in (vector_bytes, vector_bytes // 2):
        lanes = width // element_size
        if lanes >= 2 and extent % lanes == 0:
            return lanes
    return None


class VectorEmitter:
    """Emits vectorized loops that have a :class:`VectorPlan`, into a :class:`CEmitter`."""

    def __init__(self, emitter: CEmitter) -> None:
        self.c = emitter

    # -- helper types and functions ----------------------------------------------------------

    def vtype(self, dtype: str, lanes: int) -> str:
        name = f"opf_{dtype}x{lanes}"
        nbytes = lanes * _VECTOR_DTYPES[dtype]
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
            mt = self.mask_type(str(_VECTOR_DTYPES[dtype] * 8), lanes)
            text = (f"static inline {vt} {name}({mt} m, {vt} t, {vt} f) "
                    f"{{ return ({vt})((m & ({mt})t) | (~m & ({mt})f)); }}")
        elif kind in ("max", "min"):
            select = self.helper("select", dtype, lanes)
            cmp = ">" if kind == "max" else "<"
            nan = " | (a != a)" if dtype.startswith("float") else ""
            text = (f"static inline {vt} {name}({vt} a, {vt} b) "
                    f"{{ return {select}((a {cmp} b){nan}, a, b); }}")
        elif kind == "stream":
            text = self._stream_helper(name, vt, scalar)
        else:  # pragma: no cover - internal
            raise AssertionError(kind)
        self.c.need_helper(key, text)
        return name

    def _stream_helper(self, name: str, vt: str, scalar: str) -> str:
        # Non-temporal stores write whole cache lines to memory without first reading them
        # (as memcpy does for large copies): a third less memory traffic for a pure output.
        self.c.includes.add("string.h")
        self.c.need_helper("0_include_immintrin",
                           "#if defined(__SSE__)\n#include <immintrin.h>\n#endif")
        self.c.need_helper(
            "1_opf_stream_fence",
            "static inline void opf_stream_fence(void) {\n"
            "#if defined(__SSE__)\n  _mm_sfence();\n#endif\n}",
        )
        return (
            f"static inline void {name}({scalar}* p, {vt} v) {{\n"
            "#if defined(__AVX__)\n"
            "  if (((uintptr_t)p & 31u) == 0) { _mm256_stream_ps((float*)p, (__m256)v); return; }\n"
            "#endif\n"
            "#if defined(__SSE__)\n"
            "  if (((uintptr_t)p & 15u) == 0) {\n"
            "    __m128 lo, hi;\n"
            "    memcpy(&lo, &v, 16);\n"
            "    memcpy(&hi, (const char*)&v + 16, 16);\n"
            "    _mm_stream_ps((float*)p, lo);\n"
            "    _mm_stream_ps((float*)p + 4, hi);\n"
            "    return;\n"
            "  }\n"
            "#endif\n"
            "  memcpy(p, &v, sizeof v);\n"
            "}"
        )

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
        analysis = _Analysis(loop)
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
        for v in reversed(bound):
            c.unbind_var(v)
        c.unbind_var(loop.loop_var)

    def value(self, root: E.PrimExpr, analysis: _Analysis, lanes: int) -> str:
        """C text of ``root`` as a vector of ``lanes`` (a scalar root is broadcast)."""
        kind = analysis.value(root)
        assert kind is not None, f"planned vector expression became unvectorizable: {root}"
        if kind == _SCALAR:
            return self._operand(root, None, lanes)
        text: dict[int, str] = {}
        for node in _value_nodes(root):
            if analysis.kinds[id(node)] == _SCALAR:
                continue  # printed where a vector parent needs it
            if isinstance(node, E.BufferLoad):
                args: list[str | None] = []
            else:
                args = [None if analysis.kinds[id(k)] == _SCALAR else text[id(k)]
                        for k in node.children()]
            text[id(node)] = self._format(node, args, analysis, lanes)
        return text[id(root)]

    def _operand(self, node: E.PrimExpr, text: str | None, lanes: int) -> str:
        if text is not None:
            return text
        return f"{self.helper('splat', node.dtype, lanes)}({self.c.expr(node)})"

    def _format(self, node: E.PrimExpr, args: list[str | None], analysis: _Analysis,
                lanes: int) -> str:
        c = self.c
        kids = node.children()
        if isinstance(node, E.Var):
            if id(node) in analysis.vector_lets:
                return c.var_name(node)
            return f"{self.helper('ramp', node.dtype, lanes)}({c.var_name(node)})"
        if isinstance(node, E.BufferLoad):
            offset = c.expr(c.offset(node.buffer, node.indices))
            load = self.helper("load", node.dtype, lanes)
            return f"{load}(&{c.buffer_name(node.buffer)}[{offset}])"
        op = _ARITHMETIC.get(type(node)) or _COMPARISONS.get(type(node))
        if op is not None:
            a = self._operand(kids[0], args[0], lanes)
            b = self._operand(kids[1], args[1], lanes)
            return f"({a} {op} {b})"
        if isinstance(node, (E.Min, E.Max)):
            fn = self.helper("max" if isinstance(node, E.Max) else "min", node.dtype, lanes)
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
            if args[0] is None:
                return f"({c.expr(kids[0])} ? {t} : {f})"
            return f"{self.helper('select', node.dtype, lanes)}({args[0]}, {t}, {f})"
        if isinstance(node, E.Cast):
            return f"__builtin_convertvector({args[0]}, {self.vtype(node.dtype, lanes)})"
        raise AssertionError(f"unplanned vector node {type(node).__name__}")  # pragma: no cover
