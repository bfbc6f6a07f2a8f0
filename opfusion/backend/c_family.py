"""C code generation: one PrimFunc becomes one exported C function.

The function is ``int32_t name(T0* restrict p0, ...)``, one pointer per buffer parameter in
the PrimFunc's order (``const`` for the buffers it only reads); it returns 0 (``KERNEL_OK``),
-1 (``KERNEL_NO_MEMORY``) when a heap scratch buffer could not be allocated, or -2
(``KERNEL_CANCELLED``) when it was asked to stop: each iteration of every PARALLEL or outermost
loop that holds other loops first reads ``*opf_cancel_flag``, an ``int32_t volatile*`` that the
file exports (pointing at a zero that nothing sets); when the flag is set the iteration is
skipped and the kernel returns -2 with its outputs unfinished. The host points
the flag at one it sets on Ctrl-C (:mod:`opfusion.runtime.interrupt`, which also defines
the status codes). Loops map to C as follows:

- PARALLEL: ``#pragma omp parallel for schedule(static)`` (see ``omp_schedule``);
- VECTORIZED: straight-line code on GCC vector types when the body allows it (see
  :mod:`opfusion.codegen.c_vector`), otherwise a plain loop under ``#pragma omp simd``. Code
  generation never adds a guard inside a vectorized loop;
- UNROLLED: ``#pragma GCC unroll N``;
- SERIAL: a plain ``for``.

Local allocations become aligned stack arrays up to :attr:`CodegenOptions.stack_bytes` and
64-byte aligned heap blocks beyond. Loop variables and index arithmetic use the C type of
their IR dtype (int32 unless a buffer needs 64-bit offsets). Statements and expressions are
walked with explicit stacks, so deeply nested IR cannot exhaust Python's recursion limit, and the
output depends only on the input: the same PrimFunc always gives byte-identical source."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..backend.cpu.module import (
    DTYPE_CODES,
    KERNEL_TABLE_MAGIC,
    KERNEL_TABLE_SYMBOL,
    KERNEL_TABLE_VERSION,
    KernelParam,
)
from ..errors import BuildError
from ..ir.types import float_to_int_bounds
from ..runtime.interrupt import CANCEL_FLAG_SYMBOL, KERNEL_CANCELLED
from ..tir import expr as E
from ..tir import stmt as S
from .c_names import NameTable, c_type, sanitize_identifier
from .c_regtile import RegisterTileEmitter, RegisterTilePlan, plan_register_tile
from .c_vector import VectorEmitter, VectorPlan, plan_vector_loop

#: C spelling of intrinsics whose name differs from the IR's (before the float suffix).
_INTRINSIC_C_NAMES = {"round": "nearbyint"}

_BINARY_OPERATORS: dict[type, str] = {
    E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "/", E.EQ: "==", E.NE: "!=", E.LT: "<",
    E.LE: "<=", E.GT: ">", E.GE: ">=", E.And: "&&", E.Or: "||",
}

#: Arithmetic whose C result on a narrow integer dtype must be wrapped back to the dtype.
_ARITHMETIC = (E.Add, E.Sub, E.Mul, E.Div)

#: Integer dtypes narrower than C's int: C promotes them before any arithmetic.
_NARROW_INTS = frozenset({"int8", "int16", "uint8", "uint16"})


@dataclass(frozen=True)
class CodegenOptions:
    """Choices of the C code generator.

    ``stack_bytes``: a local allocation up to this size lives on the stack, larger ones on the
    heap. ``vector_bytes``: width of the GCC vector types used for vectorized loops (32 = AVX2).
    ``streaming_store_bytes``: vectorized stores to an output parameter at least this large,
    which the kernel never reads back, use non-temporal (streaming) stores that bypass the
    cache; 0 disables them. ``omp_schedule``: the OpenMP schedule of parallel loops ("static"
    gives each thread the same iterations on every call, which keeps its caches warm;
    "dynamic" or "guided" balance better on a machine busy with other work).
    ``register_tiles``: emit accumulation nests with named vector accumulators (see
    :mod:`opfusion.codegen.c_regtile`); False leaves them to the C compiler."""

    stack_bytes: int = 64 * 1024
    vector_bytes: int = 32
    streaming_store_bytes: int = 8 * 1024 * 1024
    omp_schedule: str = "static"
    register_tiles: bool = True


@dataclass(frozen=True)
class CSource:
    """Generated C: the text, the exported function's name and its parameters."""

    code: str
    entry_name: str
    params: tuple[KernelParam, ...]


def float_literal(value: float, dtype: str) -> str:
    """An exact C literal for a float constant of ``dtype`` (``1.5f``, ``INFINITY``, ...)."""
    if math.isnan(value):
        text = "NAN"
    elif math.isinf(value):
        text = "INFINITY" if value > 0 else "(-INFINITY)"
    else:
        text = repr(float(value))
        # repr round-trips a double. A float32 value read back from that decimal as a float
        # is the same float32, but check, and fall back to an exact hex literal.
        if dtype != "float64" and float(np.float32(text)) != value:
            text = float(value).hex()
        if dtype != "float64":
            text += "f"
        if math.copysign(1.0, value) < 0:
            text = f"({text})"
        if dtype == "float64":
            return text
    # NAN and INFINITY are float expressions; converting them to double is exact.
    return text if dtype == "float32" else f"(({c_type(dtype)}){text})"


def int_literal(value: int, dtype: str) -> str:
    """An exact C literal for an integer constant of ``dtype``."""
    if dtype == "bool":
        return "true" if value else "false"
    if dtype == "int32":
        if value == -(2**31):
            return "(-2147483647 - 1)"
        return f"({value})" if value < 0 else str(value)
    if dtype == "int64":
        if value == -(2**63):
            return "INT64_MIN"
        return f"INT64_C({value})" if value >= 0 else f"(-INT64_C({-value}))"
    if dtype == "uint32":
        return f"UINT32_C({value})"
    if dtype == "uint64":
        return f"UINT64_C({value})"
    return f"(({c_type(dtype)}){value})"


def _is_non_negative(root: E.PrimExpr, non_negative: dict[int, bool]) -> bool:
    """True when ``root`` is provably >= 0: constants, variables known to be (loop variables
    with a non-negative start), and sums, products, quotients and remainders of those."""
    known: dict[int, bool] = {}
    for e in E.post_order(root):
        if isinstance(e, E.IntImm):
            result = e.value >= 0
        elif isinstance(e, E.Var):
            result = non_negative.get(id(e), False)
        elif e.dtype.startswith("uint") or e.dtype == "bool":
            result = True
        elif isinstance(e, (E.Add, E.Mul, E.Min)):
            result = known[id(e.a)] and known[id(e.b)]
        elif isinstance(e, E.Max):
            result = known[id(e.a)] or known[id(e.b)]
        elif isinstance(e, (E.FloorDiv, E.FloorMod)):
            result = known[id(e.a)] and isinstance(e.b, E.IntImm) and e.b.value > 0
        elif isinstance(e, E.Cast) and not e.dtype.startswith("float"):
            result = not e.value.dtype.startswith("float") and known[id(e.value)]
        else:
            result = False
        known[id(e)] = result
    return known[id(root)]


class CEmitter:
    """Turns one PrimFunc into C text. Use :func:`codegen_c`; one emitter per function."""

    def __init__(self, func: S.PrimFunc, entry_name: str, options: CodegenOptions) -> None:
        self.func = func
        self.options = options
        self.names = NameTable()
        self.entry_name = self.names.fresh(entry_name)
        self.status_name = "opf_status"
        self.lines: list[str] = []
        #: Helper definitions needed by the body, by key ("0_..." types, "1_..." functions).
        self.helpers: dict[str, str] = {}
        self.includes: set[str] = {"math.h", "stdbool.h", "stdint.h"}
        self._var_names: dict[int, list[str]] = {}
        self._buffer_names: dict[int, str] = {}
        self._non_negative: dict[int, bool] = {}
        self._keep_alive: list[object] = []
        self._vector = VectorEmitter(self)
        self._plans: dict[int, VectorPlan] = {}
        self._tiles: dict[int, RegisterTilePlan] = {}
        self._fence_loops: set[int] = set()
        self._loop_depth = 0  # loops open around the statement being emitted

    # -- names ------------------------------------------------------------------------------

    def bind_var(self, var: E.Var, non_negative: bool = False) -> str:
        """Give ``var`` a fresh C name for the scope that starts now."""
        name = self.names.fresh(var.name)
        self._var_names.setdefault(id(var), []).append(name)
        self._non_negative[id(var)] = non_negative
        self._keep_alive.append(var)
        return name

    def unbind_var(self, var: E.Var) -> None:
        self._var_names[id(var)].pop()

    def var_name(self, var: E.Var) -> str:
        names = self._var_names.get(id(var))
        if not names:
            raise BuildError(
                f"kernel {self.func.name!r}: variable {var.name!r} is used but not defined by a "
                "loop or let (a kernel's only parameters are buffers)"
            )
        return names[-1]

    def buffer_name(self, buffer: E.Buffer) -> str:
        try:
            return self._buffer_names[id(buffer)]
        except KeyError:
            raise BuildError(
                f"kernel {self.func.name!r}: buffer {buffer.name!r} is used but is neither a "
                "parameter nor allocated in the kernel"
            ) from None

    def non_negative(self, e: E.PrimExpr) -> bool:
        return _is_non_negative(e, self._non_negative)

    def need_helper(self, key: str, text: str) -> str:
        """Register a helper definition (by key, so each is emitted once); return the key."""
        self.helpers.setdefault(key, text)
        return key

    # -- expressions ------------------------------------------------------------------------

    def expr(self, root: E.PrimExpr) -> str:
        """C text of a scalar expression (fully parenthesised)."""
        nodes = E.post_order(root)
        for node in nodes:
            if isinstance(node, E.Let):
                self.bind_var(node.var)
        text: dict[int, str] = {}
        for node in nodes:
            text[id(node)] = self._format(node, [text[id(c)] for c in node.children()])
        return text[id(root)]

    def offset(self, buffer: E.Buffer, indices: tuple[E.PrimExpr, ...]) -> E.PrimExpr:
        """The flat element offset of ``buffer[indices]`` as an expression."""
        if not indices:
            return E.IntImm(0, buffer.index_dtype)
        return buffer.offset_of(indices)

    def _format(self, node: E.PrimExpr, args: list[str]) -> str:
        kind = type(node)
        op = _BINARY_OPERATORS.get(kind)
        if op is not None:
            if kind in _ARITHMETIC and node.dtype in _NARROW_INTS:
                return self._narrow_arithmetic(node, op, args)
            return f"({args[0]} {op} {args[1]})"
        if kind is E.Var:
            return self.var_name(node)
        if kind is E.IntImm:
            return int_literal(node.value, node.dtype)
        if kind is E.FloatImm:
            return float_literal(node.value, node.dtype)
        if kind is E.BufferLoad:
            offset = self.expr(self.offset(node.buffer, node.indices))
            return f"{self.buffer_name(node.buffer)}[{offset}]"
        if kind is E.Cast:
            return self._cast(node, args[0])
        if kind is E.Select:
            return f"({args[0]} ? {args[1]} : {args[2]})"
        if kind is E.Not:
            return f"(!{args[0]})"
        if kind in (E.Min, E.Max):
            return f"{self._min_max_helper(kind is E.Max, node.dtype)}({args[0]}, {args[1]})"
        if kind in (E.FloorDiv, E.FloorMod):
            return self._floor_div_mod(node, args)
        if kind is E.Call:
            return self._call(node, args)
        if kind is E.Let:
            var = self.var_name(node.var)
            return f"({{ const {c_type(node.var.dtype)} {var} = {args[0]}; {args[1]}; }})"
        raise BuildError(
            f"kernel {self.func.name!r}: the C code generator cannot emit {kind.__name__} "
            f"expressions ({node})"
        )

    def _cast(self, node: E.Cast, arg: str) -> str:
        """A conversion. Float to integer goes through a helper that follows opfusion's rule
        (NaN to 0, truncate, saturate: :func:`opfusion.ir.types.cast_array`); C's own
        conversion is undefined for NaN, infinities and out-of-range values."""
        source, target = node.value.dtype, node.dtype
        if not (E.is_float(source) and E.is_int(target)):
            return f"(({c_type(target)})({arg}))"
        # float16 is compared and converted as float (exact); the bounds overflow it.
        wide = "double" if source == "float64" else "float"
        literal_dtype = "float64" if source == "float64" else "float32"
        lo, hi = float_to_int_bounds(target)
        ctype = c_type(target)
        name = f"opf_cast_{source}_{target}"
        self.need_helper(
            f"1_{name}",
            f"static inline {ctype} {name}({wide} x) {{ return x != x ? 0 : "
            f"x < {float_literal(float(lo), literal_dtype)} ? {int_literal(lo, target)} : "
            f"x >= {float_literal(float(hi), literal_dtype)} ? {int_literal(hi - 1, target)} : "
            f"({ctype})x; }}")
        return f"{name}({arg})"

    def _narrow_arithmetic(self, node: E.PrimExpr, op: str, args: list[str]) -> str:
        """``a op b`` on an 8- or 16-bit integer dtype, wrapped to that dtype as NumPy's is.

        C computes on the operands promoted to int and keeps the wide result: uint8 200 * 2 is
        400, and a division after it sees 400, not NumPy's 144; uint16 65535 * 65535 even
        overflows int (undefined). So sums, differences and products are computed in uint32
        (exact modulo 2**32, hence modulo the dtype's width) and every result is converted
        back to the dtype before anything else uses it (a two's complement wrap for signed
        dtypes, which GCC and clang define). A quotient of promoted values is exact; only
        INT8_MIN / -1 (and INT16_MIN / -1) leave the range, and wrap back."""
        ctype = c_type(node.dtype)
        if isinstance(node, E.Div):
            return f"(({ctype})({args[0]} / {args[1]}))"
        return f"(({ctype})((uint32_t)({args[0]}) {op} (uint32_t)({args[1]})))"

    def _min_max_helper(self, is_max: bool, dtype: str) -> str:
        name = f"opf_{'max' if is_max else 'min'}_{dtype}"
        ctype = c_type(dtype)
        cmp = ">" if is_max else "<"
        # Floats: NaN in either operand gives NaN, as numpy.maximum/minimum do.
        nan = " || a != a" if dtype.startswith("float") else ""
        self.need_helper(
            f"1_{name}",
            f"static inline {ctype} {name}({ctype} a, {ctype} b) "
            f"{{ return (a {cmp} b{nan}) ? a : b; }}",
        )
        return name

    def _floor_div_mod(self, node: E.PrimExpr, args: list[str]) -> str:
        is_div = isinstance(node, E.FloorDiv)
        if node.dtype.startswith("uint") or (self.non_negative(node.a)
                                             and isinstance(node.b, E.IntImm)
                                             and node.b.value > 0):
            # C's truncating division is floor division when both operands are >= 0.
            text = f"({args[0]} {'/' if is_div else '%'} {args[1]})"
            # Narrow operands are promoted to int: convert the result back to the dtype.
            return f"(({c_type(node.dtype)}){text})" if node.dtype in _NARROW_INTS else text
        ctype = c_type(node.dtype)
        name = f"opf_floor{'div' if is_div else 'mod'}_{node.dtype}"
        if is_div:
            body = (f"{ctype} q = a / b; "
                    "return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;")
        else:
            body = f"{ctype} r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;"
        self.need_helper(f"1_{name}",
                         f"static inline {ctype} {name}({ctype} a, {ctype} b) {{ {body} }}")
        return f"{name}({args[0]}, {args[1]})"

    def _call(self, node: E.Call, args: list[str]) -> str:
        self.includes.add("math.h")
        base = _INTRINSIC_C_NAMES.get(node.name, node.name)
        if node.dtype == "float64":
            return f"{base}({', '.join(args)})"
        if node.dtype == "float32":
            return f"{base}f({', '.join(args)})"
        # float16: compute in float, round the result back.
        widened = ", ".join(f"(float)({a})" for a in args)
        return f"(({c_type(node.dtype)}){base}f({widened}))"

    # -- statements -------------------------------------------------------------------------

    def emit_function(self) -> CSource:
        func = self.func
        written = _written_buffers(func.body)
        read = _read_buffers(func.body)
        params: list[KernelParam] = []
        declarations: list[str] = []
        for buffer in func.params:
            if id(buffer) in self._buffer_names:
                raise BuildError(
                    f"kernel {func.name!r}: buffer {buffer.name!r} is passed twice as a parameter"
                )
            if buffer.scope != "global":
                raise BuildError(
                    f"kernel {func.name!r}: parameter {buffer.name!r} has scope {buffer.scope!r}; "
                    "parameters are 'global' buffers"
                )
            name = self.names.fresh(buffer.name)
            self._buffer_names[id(buffer)] = name
            is_written = id(buffer) in written
            const = "" if is_written else "const "
            declarations.append(f"{const}{c_type(buffer.dtype)}* restrict {name}")
            params.append(KernelParam(buffer.name, buffer.shape, buffer.dtype, is_written))

        stream_buffers = {
            id(b) for b in func.params
            if id(b) in written and id(b) not in read and self.options.streaming_store_bytes > 0
            and b.size * np.dtype(b.dtype).itemsize >= self.options.streaming_store_bytes
        }
        self._plans, self._tiles, fence_loops, fence_at_end = _plan_loops(
            func.body, self, stream_buffers)
        self._fence_loops = fence_loops
        self.status_name = self.names.reserve("opf_status")
        self._emit_body(func.body, fence_at_end)

        signature = ", ".join(declarations) if declarations else "void"
        body = [f"int32_t {self.entry_name}({signature}) {{",
                f"  int32_t {self.status_name} = 0;", *self.lines,
                f"  return {self.status_name};", "}"]
        self.parts = CParts(self.entry_name, tuple(params), sorted(self.includes),
                            dict(self.helpers), "\n".join(body))
        header = (f"// Generated by opfusion: kernel {sanitize_identifier(func.name)!s}. "
                  "Do not edit; rebuild instead.")
        return CSource(assemble_c([self.parts], header), self.entry_name, tuple(params))

    def line(self, indent: int, text: str) -> None:
        self.lines.append("  " * indent + text)

    def _emit_body(self, body: S.Stmt, fence_at_end: bool) -> None:
        # Work items: a statement to emit, or a closure (closing brace, unbinding a name).
        stack: list[tuple[S.Stmt, int] | Callable[[], None]] = []
        if fence_at_end:
            stack.append(lambda: self._fence(1))
        stack.append((body, 1))
        while stack:
            item = stack.pop()
            if callable(item):
                item()
                continue
            stmt, indent = item
            self._emit_stmt(stmt, indent, stack)

    def _fence(self, indent: int) -> None:
        self.line(indent, "opf_stream_fence();")

    def _emit_stmt(self, stmt: S.Stmt, indent: int, stack: list) -> None:
        if isinstance(stmt, S.SeqStmt):
            for child in reversed(stmt.stmts):
                stack.append((child, indent))
        elif isinstance(stmt, S.BufferStore):
            target = self.buffer_name(stmt.buffer)
            offset = self.expr(self.offset(stmt.buffer, stmt.indices))
            self.line(indent, f"{target}[{offset}] = {self.expr(stmt.value)};")
        elif isinstance(stmt, S.For):
            self._emit_for(stmt, indent, stack)
        elif isinstance(stmt, S.IfThenElse):
            self.line(indent, f"if ({self.expr(stmt.condition)}) {{")
            stack.append(lambda: self.line(indent, "}"))
            if stmt.else_case is not None:
                stack.append((stmt.else_case, indent + 1))
                stack.append(lambda: self.line(indent, "} else {"))
            stack.append((stmt.then_case, indent + 1))
        elif isinstance(stmt, S.LetStmt):
            value = self.expr(stmt.value)
            name = self.bind_var(stmt.var, self.non_negative(stmt.value))
            self.line(indent, f"const {c_type(stmt.var.dtype)} {name} = {value};")
            stack.append(lambda: self.unbind_var(stmt.var))
            stack.append((stmt.body, indent))
        elif isinstance(stmt, S.Allocate):
            self._emit_allocate(stmt, indent, stack)
        elif isinstance(stmt, S.Evaluate):
            self.line(indent, f"(void)({self.expr(stmt.value)});")
        else:
            raise BuildError(
                f"kernel {self.func.name!r}: the C code generator cannot emit "
                f"{type(stmt).__name__} statements"
            )

    def loop_bounds(self, loop: S.For) -> tuple[str, str]:
        """C text of a loop's first value and of its (exclusive) end."""
        return self.expr(loop.min), self.expr(E.add(loop.min, loop.extent))

    def _emit_for(self, loop: S.For, indent: int, stack: list) -> None:
        tile = self._tiles.get(id(loop))
        if tile is not None:
            RegisterTileEmitter(self, tile).emit(indent)
            return
        plan = self._plans.get(id(loop))
        if plan is not None:
            self._vector.emit(loop, plan, indent)
            return
        self.open_loop(loop, indent)
        if (loop.kind is S.ForKind.PARALLEL or self._loop_depth == 0) and any(
                isinstance(inner, S.For) for inner in _walk_stmts(loop.body)):
            self._emit_cancel_check(indent + 1)
        self._loop_depth += 1
        stack.append(lambda: self.line(indent, "}"))
        stack.append(lambda: self.unbind_var(loop.loop_var))
        stack.append(lambda: setattr(self, "_loop_depth", self._loop_depth - 1))
        if id(loop) in self._fence_loops:
            stack.append(lambda: self._fence(indent + 1))
        stack.append((loop.body, indent + 1))

    def _emit_cancel_check(self, indent: int) -> None:
        """The first statement of an iteration of a parallel or outermost loop that holds other
        loops: when the host has set ``*opf_cancel_flag``, skip the iteration (``continue``,
        the only way out of an OpenMP loop) and make the kernel return ``KERNEL_CANCELLED``.
        One predictable load per iteration of a loop whose iterations are whole tasks: no
        measurable cost, and a cancelled kernel stops within one task. A loop without inner
        loops is left alone: its iterations are single elements (too cheap to be worth a
        check, and a check would keep GCC from vectorizing it)."""
        self.need_helper("0_opf_cancel_flag", (
            "static volatile int32_t opf_cancel_never = 0;\n"
            f"int32_t volatile* {CANCEL_FLAG_SYMBOL} = &opf_cancel_never;"))
        self.line(indent, f"if (__builtin_expect(*{CANCEL_FLAG_SYMBOL} != 0, 0)) {{ "
                          f"__atomic_store_n(&{self.status_name}, {KERNEL_CANCELLED}, "
                          "__ATOMIC_RELAXED); continue; }")

    def open_loop(self, loop: S.For, indent: int) -> None:
        """Emit the loop's pragma and ``for (...) {`` line and bind its variable; the caller
        emits the body, the closing brace, and unbinds the variable."""
        start, end = self.loop_bounds(loop)
        var = self.bind_var(loop.loop_var, self.non_negative(loop.min))
        kind = loop.kind
        if kind is S.ForKind.PARALLEL:
            self.line(indent, f"#pragma omp parallel for schedule({self.options.omp_schedule})")
        elif kind is S.ForKind.VECTORIZED:
            # OpenMP allows no construct inside a simd loop; a vectorized loop around other
            # loops (whose pragmas may be OpenMP ones) gets GCC's dependence hint instead.
            has_loops = any(isinstance(s, S.For) for s in _walk_stmts(loop.body))
            self.line(indent, "#pragma GCC ivdep" if has_loops else "#pragma omp simd")
        elif kind is S.ForKind.UNROLLED:
            extent = loop.extent.value if isinstance(loop.extent, E.IntImm) else 8
            self.line(indent, f"#pragma GCC unroll {max(1, min(extent, 65534))}")
        ctype = c_type(loop.loop_var.dtype)
        self.line(indent, f"for ({ctype} {var} = {start}; {var} < {end}; ++{var}) {{")

    def _emit_allocate(self, alloc: S.Allocate, indent: int, stack: list) -> None:
        buffer = alloc.buffer
        ctype = c_type(buffer.dtype)
        nbytes = buffer.size * np.dtype(buffer.dtype).itemsize
        name = self.names.fresh(buffer.name)
        self._buffer_names[id(buffer)] = name
        self._keep_alive.append(buffer)
        if nbytes <= self.options.stack_bytes:
            size = max(buffer.size, 1)  # C has no zero-length arrays
            self.line(indent, f"{ctype} {name}[{size}] __attribute__((aligned(64)));")
            stack.append((alloc.body, indent))
            return
        self.includes.add("stdlib.h")
        padded = -(-nbytes // 64) * 64
        self.line(indent, f"{ctype}* restrict {name} = ({ctype}*)aligned_alloc(64, {padded});")
        self.line(indent, f"if ({name} != NULL) {{")
        stack.append(lambda: self.line(indent, "}"))
        stack.append(lambda: self.line(
            indent + 1, f"__atomic_store_n(&{self.status_name}, -1, __ATOMIC_RELAXED);"))
        stack.append(lambda: self.line(indent, "} else {"))
        stack.append(lambda: self.line(indent + 1, f"free({name});"))
        stack.append((alloc.body, indent + 1))


def _walk_stmts(body: S.Stmt):
    """Every statement of ``body``, parents before children, in program order; iterative."""
    stack = [body]
    while stack:
        stmt = stack.pop()
        yield stmt
        if isinstance(stmt, S.SeqStmt):
            stack.extend(reversed(stmt.stmts))
        elif isinstance(stmt, S.IfThenElse):
            if stmt.else_case is not None:
                stack.append(stmt.else_case)
            stack.append(stmt.then_case)
        elif isinstance(stmt, (S.For, S.LetStmt, S.Allocate)):
            stack.append(stmt.body)


def _stmt_exprs(stmt: S.Stmt) -> list[E.PrimExpr]:
    if isinstance(stmt, S.BufferStore):
        return [stmt.value, *stmt.indices]
    if isinstance(stmt, S.For):
        return [stmt.min, stmt.extent]
    if isinstance(stmt, S.IfThenElse):
        return [stmt.condition]
    if isinstance(stmt, (S.LetStmt, S.Evaluate)):
        return [stmt.value]
    return []


def _written_buffers(body: S.Stmt) -> set[int]:
    return {id(s.buffer) for s in _walk_stmts(body) if isinstance(s, S.BufferStore)}


def _read_buffers(body: S.Stmt) -> set[int]:
    found: set[int] = set()
    for stmt in _walk_stmts(body):
        for root in _stmt_exprs(stmt):
            for node in E.post_order(root):
                if isinstance(node, E.BufferLoad):
                    found.add(id(node.buffer))
    return found


def _plan_loops(body: S.Stmt, emitter: CEmitter, stream_buffers: set[int],
                ) -> tuple[dict[int, VectorPlan], dict[int, RegisterTilePlan], set[int], bool]:
    """Decide how each vectorized loop is emitted, which nests become register tiles, and
    where streaming stores need a fence.

    Returns the vector plans and the register-tile plans by loop id, the ids of the PARALLEL
    loops whose body must end with a store fence, and whether the function must end with one
    (streaming stores outside any parallel loop)."""
    plans: dict[int, VectorPlan] = {}
    tiles: dict[int, RegisterTilePlan] = {}
    fence_loops: set[int] = set()
    fence_at_end = False
    # (statement, innermost enclosing PARALLEL loop or None)
    stack: list[tuple[S.Stmt, S.For | None]] = [(body, None)]
    while stack:
        stmt, parallel = stack.pop()
        if (emitter.options.register_tiles and isinstance(stmt, S.For)
                and stmt.kind in (S.ForKind.SERIAL, S.ForKind.UNROLLED)):
            tile = plan_register_tile(stmt, emitter.options.vector_bytes, stream_buffers)
            if tile is not None:
                tiles[id(stmt)] = tile
                continue
        if isinstance(stmt, S.For) and stmt.kind is S.ForKind.VECTORIZED:
            plan = plan_vector_loop(stmt, emitter.options.vector_bytes, stream_buffers)
            if plan is not None:
                plans[id(stmt)] = plan
                if plan.streams:
                    if parallel is None:
                        fence_at_end = True
                    else:
                        fence_loops.add(id(parallel))
                continue
        if isinstance(stmt, S.For) and stmt.kind is S.ForKind.PARALLEL:
            parallel = stmt
        if isinstance(stmt, S.SeqStmt):
            stack.extend((s, parallel) for s in reversed(stmt.stmts))
        elif isinstance(stmt, S.IfThenElse):
            if stmt.else_case is not None:
                stack.append((stmt.else_case, parallel))
            stack.append((stmt.then_case, parallel))
        elif isinstance(stmt, (S.For, S.LetStmt, S.Allocate)):
            stack.append((stmt.body, parallel))
    return plans, tiles, fence_loops, fence_at_end


@dataclass(frozen=True)
class CParts:
    """The pieces of one generated kernel, for joining several kernels into one file:
    its includes, its helper definitions (by key: equal keys hold equal text) and its
    function."""

    entry_name: str
    params: tuple[KernelParam, ...]
    includes: list[str]
    helpers: dict[str, str]
    function: str


def assemble_c(parts: list[CParts], header: str) -> str:
    """One C translation unit holding every kernel of ``parts``: includes and helpers once."""
    includes = sorted({name for part in parts for name in part.includes})
    helpers: dict[str, str] = {}
    for part in parts:
        for key, text in part.helpers.items():
            helpers.setdefault(key, text)
    out = [header]
    out += [f"#include <{name}>" for name in includes]
    out.append("")
    # Types first, then functions; within each, the order of first use (which puts a helper
    # after the helpers it calls, and is deterministic).
    for key in sorted(helpers, key=lambda k: k.split("_", 1)[0]):
        out.append(helpers[key])
    if helpers:
        out.append("")
    for part in parts:
        out.append(part.function)
        out.append("")
    out += kernel_table_c(parts)
    return "\n".join(out).rstrip("\n") + "\n"


def kernel_table_c(parts: list[CParts]) -> list[str]:
    """Lines of C defining ``opf_kernel_table()``: what the library holds, for the loader.

    The table lists every kernel of the file with its exported name, a pointer to the
    function and, per parameter, the dtype code, rank, dimensions and whether the kernel
    writes it (layout: :mod:`opfusion.backend.cpu.module`). The loader takes function pointers
    from this table and never looks a symbol up by a name it was given, so a library can only
    be asked to run its own kernels, with the shapes they were compiled for. Names are written
    with the preprocessor's ``#`` (they are plain identifiers), so the file has no string
    literal."""
    lines = [
        "#define OPF_NAME(x) #x",
        "typedef int32_t (*opf_entry_t)(void);",
        "typedef struct { int32_t dtype; int32_t rank; int32_t written; int32_t reserved; "
        "const int64_t* dims; } opf_param_info_t;",
        "typedef struct { const char* name; opf_entry_t function; int32_t num_params; "
        "int32_t reserved; const opf_param_info_t* params; } opf_kernel_info_t;",
        "typedef struct { uint32_t magic; uint32_t version; int64_t num_kernels; "
        "const opf_kernel_info_t* kernels; } opf_kernel_table_t;",
    ]
    kernels = []
    for k, part in enumerate(parts):
        infos = []
        for p, param in enumerate(part.params):
            dims = "0"
            if param.shape:
                dims = f"opf_dims_{k}_{p}"
                values = ", ".join(str(int(d)) for d in param.shape)
                lines.append(f"static const int64_t {dims}[] = {{{values}}};")
            infos.append(f"{{{DTYPE_CODES[param.dtype]}, {len(param.shape)}, "
                         f"{int(param.written)}, 0, {dims}}}")
        params = "0"
        if infos:
            params = f"opf_params_{k}"
            lines.append(f"static const opf_param_info_t {params}[] = {{{', '.join(infos)}}};")
        kernels.append(f"{{OPF_NAME({part.entry_name}), (opf_entry_t){part.entry_name}, "
                       f"{len(part.params)}, 0, {params}}}")
    table = "0"
    if kernels:
        table = "opf_kernels"
        lines.append("static const opf_kernel_info_t opf_kernels[] = {")
        lines += [f"  {entry}," for entry in kernels]
        lines.append("};")
    lines.append(f"static const opf_kernel_table_t opf_table = {{{KERNEL_TABLE_MAGIC}u, "
                 f"{KERNEL_TABLE_VERSION}u, {len(kernels)}, {table}}};")
    lines.append(f"const opf_kernel_table_t* {KERNEL_TABLE_SYMBOL}(void) {{ return &opf_table; }}")
    return lines


def codegen_c_module(funcs: list[S.PrimFunc], options: CodegenOptions | None = None,
                     header: str = "// Generated by opfusion. Do not edit; rebuild instead."
                     ) -> tuple[str, list[CParts]]:
    """One C file for several kernels; ``parts[i].entry_name`` is the C name of ``funcs[i]``.

    Exported names are handed out by one name table for the whole file, so they differ even
    when kernel names are equal or differ only beyond :data:`MAX_NAME_LENGTH` characters."""
    parts = []
    entry_names = NameTable()
    seen: dict[str, str] = {}
    for func in funcs:
        emitter = CEmitter(func, entry_names.fresh(func.name), options or CodegenOptions())
        emitter.emit_function()
        part = emitter.parts
        if part.entry_name in seen:  # the name table rules this out; a wrong build must not link
            raise BuildError(f"kernels {seen[part.entry_name]!r} and {func.name!r} both export "
                             f"the C name {part.entry_name!r}")
        seen[part.entry_name] = func.name
        parts.append(part)
    return assemble_c(parts, header), parts


def codegen_c(func: S.PrimFunc, name: str | None = None,
              options: CodegenOptions | None = None) -> CSource:
    """Generate C for ``func``; the exported function is ``name`` (default ``func.name``),
    sanitized to a safe C identifier."""
    if not isinstance(func, S.PrimFunc):
        raise BuildError(f"codegen_c needs a PrimFunc, got {type(func).__name__}")
    emitter = CEmitter(func, func.name if name is None else name, options or CodegenOptions())
    return emitter.emit_function()
