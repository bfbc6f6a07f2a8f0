"""The C-family emitter: the printing every C-like backend shares, and the hooks it overrides.

:class:`CFamilyEmitter` turns one PrimFunc into the text of one C function: scalar expressions
(exact literals, casts with opfusion's saturating float-to-integer rule, narrow integers
wrapped as NumPy wraps them, NaN-propagating min/max, floor division and modulo, intrinsic
calls) and the statements (SeqStmt, BufferStore, IfThenElse, LetStmt, Evaluate, plain For
loops, Allocate), with one name table per function so every identifier is safe and unique.
Helper definitions (types, inline functions) are collected by key, each emitted once.

A backend subclasses it (as tinygrad's C-style renderers do) and overrides the hooks:

- :meth:`~CFamilyEmitter.function_text`: the function's qualifiers, return type, prologue and
  epilogue (``int32_t`` and a status on the CPU; ``extern "C" __global__ void`` for CUDA);
- :meth:`~CFamilyEmitter.param_declaration`: one parameter;
- :meth:`~CFamilyEmitter.loop_pragma`: the line before a ``for`` of a given kind;
- :meth:`~CFamilyEmitter.emit_for`: a loop (a backend adds its own plans: vector types,
  register tiles, thread indices);
- :meth:`~CFamilyEmitter.emit_allocate` / :meth:`~CFamilyEmitter.local_array`: where a
  temporary lives;
- :meth:`~CFamilyEmitter.begin_body`: anything decided once per function before its body.

Nothing here assumes a CPU: the CPU emitter is :mod:`opfusion.backend.cpu.emitter`. Loop
variables and index arithmetic use the C type of their IR dtype (int32 unless a buffer needs
64-bit offsets). Statements and expressions are walked with explicit stacks, so deeply nested
IR cannot exhaust Python's recursion limit, and the output depends only on the input: the same
PrimFunc always gives byte-identical source."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..errors import BuildError
from ..ir.types import float_to_int_bounds
from ..tir import expr as E
from ..tir import stmt as S
from .c_names import NameTable, c_type

walk_stmts = S.walk_stmts  # shared by the emitters' analyses

#: C spelling of intrinsics whose name differs from the IR's (before the float suffix).
_INTRINSIC_C_NAMES = {"round": "nearbyint"}

_BINARY_OPERATORS: dict[type, str] = {
    E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "/", E.EQ: "==", E.NE: "!=", E.LT: "<",
    E.LE: "<=", E.GT: ">", E.GE: ">=", E.And: "&&", E.Or: "||",
}

#: Arithmetic whose C result on a narrow integer dtype must be wrapped back to the dtype.
_ARITHMETIC = (E.Add, E.Sub, E.Mul, E.Div)


def _unsigned_shift(node: E.PrimExpr) -> int:
    """k when ``node`` multiplies a uint32 or uint64 value by the constant 2^k (k >= 1), else
    0."""
    if not (isinstance(node, E.Mul) and node.dtype in ("uint32", "uint64")
            and isinstance(node.b, E.IntImm)):
        return 0
    value = node.b.value
    return value.bit_length() - 1 if value > 1 and value & (value - 1) == 0 else 0

#: Sums, differences and products of 32- and 64-bit signed values read from memory are
#: computed in the unsigned type and converted back: they wrap, as NumPy's (the reference's)
#: arithmetic does, where signed overflow in C is undefined and GCC may assume it away (a
#: fused ``a * 2147483647`` then a truncated division had the quotient's sign of ``a``;
#: fuzzing, seed 63008). Index arithmetic of loop variables keeps C's signed arithmetic,
#: whose undefined overflow lets GCC widen and combine addresses (``-fwrapv`` for all of it
#: made ResNet-50 1.12x slower).
_WRAPPING = {E.Add: "+", E.Sub: "-", E.Mul: "*"}
_WRAPPED_INTS = {"int32": ("int32_t", "uint32_t"), "int64": ("int64_t", "uint64_t")}


def _wrapping(node: E.PrimExpr, args: list[str]) -> str:
    """``node`` (an Add, Sub or Mul of :data:`_WRAPPED_INTS`) in the unsigned type."""
    signed, unsigned = _WRAPPED_INTS[node.dtype]
    op = _WRAPPING[type(node)]
    return f"(({signed})(({unsigned}){args[0]} {op} ({unsigned}){args[1]}))"


#: Integer dtypes narrower than C's int: C promotes them before any arithmetic.
_NARROW_INTS = frozenset({"int8", "int16", "uint8", "uint16"})


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


#: A work item of the statement printer: a statement and its indent, or a closure (a closing
#: brace, unbinding a name) run when the stack reaches it.
WorkItem = tuple[S.Stmt, int] | Callable[[], None]


class CFamilyEmitter:
    """Turns one PrimFunc into the text of one C-family function; one emitter per function.

    Subclasses override the hooks named in the module docstring; :meth:`emit_function` returns
    the function's text, and :attr:`includes` and :attr:`helpers` what it needs around it."""

    #: Headers every function's file includes.
    default_includes: tuple[str, ...] = ("math.h", "stdbool.h", "stdint.h")

    #: Scopes a parameter buffer may have ("global": memory the caller owns; a GPU backend
    #: also passes a group's intermediate results, "local" in the loop IR, as parameters).
    param_scopes: tuple[str, ...] = ("global",)

    def __init__(self, func: S.PrimFunc, entry_name: str) -> None:
        self.func = func
        self.names = NameTable()
        self.entry_name = self.names.fresh(entry_name)
        self.lines: list[str] = []
        #: Helper definitions needed by the body, by key ("0_..." types, "1_..." functions).
        self.helpers: dict[str, str] = {}
        self.includes: set[str] = set(self.default_includes)
        #: The parameters in order, each with whether the function writes it.
        self.param_buffers: list[tuple[E.Buffer, bool]] = []
        self._var_names: dict[int, list[str]] = {}
        self._buffer_names: dict[int, str] = {}
        self._non_negative: dict[int, bool] = {}
        self._keep_alive: list[object] = []
        self.loop_depth = 0  # loops open around the statement being emitted

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
        reads: dict[int, bool] = {}  # whether a node's value depends on a load
        for node in nodes:
            children = node.children()
            reads[id(node)] = (isinstance(node, E.BufferLoad)
                               or any(reads[id(c)] for c in children))
            args = [text[id(c)] for c in children]
            if reads[id(node)] and type(node) in _WRAPPING and node.dtype in _WRAPPED_INTS:
                text[id(node)] = _wrapping(node, args)
            else:
                text[id(node)] = self._format(node, args)
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
            shift = _unsigned_shift(node)
            if shift:
                # the same modulo 2^bits; GCC merges byte loads put together by shifts into
                # one wide load (a product's bytes packed into words), not by multiplications
                return f"({args[0]} << {shift})"
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
        if hi <= 1 << 16:
            # 8 and 16 bits: the bounds are exact in float, so the rule is two clamps and a
            # truncation, which GCC compiles without branches (a quantized stem's input,
            # clipped codes in a short inner loop: 0.30 -> 0.05 ms, the branches mispredicted)
            low, high = (float_literal(float(v), literal_dtype) for v in (lo, hi - 1))
            body = (f"{wide} y = x != x ? 0 : x; y = y < {low} ? {low} : y; "
                    f"y = y > {high} ? {high} : y; return ({ctype})(int32_t)y;")
        else:
            body = (f"return x != x ? 0 : "
                    f"x < {float_literal(float(lo), literal_dtype)} ? {int_literal(lo, target)} : "
                    f"x >= {float_literal(float(hi), literal_dtype)} ? "
                    f"{int_literal(hi - 1, target)} : ({ctype})x;")
        self.need_helper(f"1_{name}", f"static inline {ctype} {name}({wide} x) {{ {body} }}")
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
        # Floats: NaN in either operand gives NaN, as numpy.maximum/minimum do: the
        # comparison gives b when either is NaN, and a NaN a is then kept. Written as two
        # selects rather than one of ``a > b || a != a``, which GCC compiles to a branch per
        # call: a ReLU of random signs in scalar code mispredicted half the time (ShuffleNet
        # v2's 4-lane concatenations with a ReLU ran 2.7x slower); this form is a
        # ``vmaxss`` and a conditional move.
        body = (f"{ctype} m = (a {cmp} b) ? a : b; return (a != a) ? a : m;"
                if dtype.startswith("float") else f"return (a {cmp} b) ? a : b;")
        self.need_helper(f"1_{name}", f"static inline {ctype} {name}({ctype} a, {ctype} b) "
                                      f"{{ {body} }}")
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


    # -- the function -----------------------------------------------------------------------

    def emit_function(self) -> str:
        """The text of the whole function (see :meth:`function_text`)."""
        func = self.func
        written = S.written_buffers(func.body)
        declarations: list[str] = []
        for buffer in func.params:
            if id(buffer) in self._buffer_names:
                raise BuildError(
                    f"kernel {func.name!r}: buffer {buffer.name!r} is passed twice as a parameter"
                )
            if buffer.scope not in self.param_scopes:
                raise BuildError(
                    f"kernel {func.name!r}: parameter {buffer.name!r} has scope {buffer.scope!r}; "
                    "parameters are 'global' buffers"
                )
            name = self.bind_buffer(buffer)
            is_written = id(buffer) in written
            declarations.append(self.param_declaration(buffer, name, is_written))
            self.param_buffers.append((buffer, is_written))
        self.begin_body()
        self.emit_body(func.body, 1, after=self.end_body)
        return "\n".join(self.function_text(declarations, self.lines))

    # -- hooks --------------------------------------------------------------------------------

    def param_declaration(self, buffer: E.Buffer, name: str, is_written: bool) -> str:
        """The declaration of one pointer parameter (``const`` for one only read)."""
        const = "" if is_written else "const "
        return f"{const}{c_type(buffer.dtype)}* restrict {name}"

    def begin_body(self) -> None:
        """Called once the parameters are bound, before the body is emitted."""

    def end_body(self) -> None:
        """Called after the body is emitted, to add its last lines."""

    def function_text(self, declarations: list[str], body: list[str]) -> list[str]:
        """The lines of the function around its body's lines: a ``void`` function here."""
        signature = ", ".join(declarations) if declarations else "void"
        return [f"void {self.entry_name}({signature}) {{", *body, "}"]

    def loop_pragma(self, loop: S.For) -> str | None:
        """The line emitted before ``loop``'s ``for`` (None: none). The base knows no pragmas."""
        return None

    def local_array(self, ctype: str, name: str, size: int) -> str:
        """The declaration of a temporary array of ``size`` elements."""
        return f"{ctype} {name}[{size}];"

    def emit_allocate(self, alloc: S.Allocate, indent: int, stack: list[WorkItem]) -> None:
        """A temporary buffer for ``alloc.body``: a local array here."""
        buffer = alloc.buffer
        name = self.bind_buffer(buffer)
        size = max(buffer.size, 1)  # C has no zero-length arrays
        self.line(indent, self.local_array(c_type(buffer.dtype), name, size))
        stack.append((alloc.body, indent))

    # -- statements -------------------------------------------------------------------------

    def bind_buffer(self, buffer: E.Buffer) -> str:
        """Give ``buffer`` (a parameter or a temporary) a fresh C name."""
        name = self.names.fresh(buffer.name)
        self._buffer_names[id(buffer)] = name
        self._keep_alive.append(buffer)
        return name

    def line(self, indent: int, text: str) -> None:
        self.lines.append("  " * indent + text)

    def emit_body(self, body: S.Stmt, indent: int,
                  after: Callable[[], None] | None = None) -> None:
        """Emit ``body`` at ``indent``, then run ``after`` (if given)."""
        stack: list[WorkItem] = []
        if after is not None:
            stack.append(after)
        stack.append((body, indent))
        while stack:
            item = stack.pop()
            if callable(item):
                item()
                continue
            stmt, at = item
            self.emit_stmt(stmt, at, stack)

    def emit_stmt(self, stmt: S.Stmt, indent: int, stack: list[WorkItem]) -> None:
        """Emit one statement; its children and closing lines go on ``stack``."""
        if isinstance(stmt, S.SeqStmt):
            for child in reversed(stmt.stmts):
                stack.append((child, indent))
        elif isinstance(stmt, S.BufferStore):
            target = self.buffer_name(stmt.buffer)
            offset = self.expr(self.offset(stmt.buffer, stmt.indices))
            self.line(indent, f"{target}[{offset}] = {self.expr(stmt.value)};")
        elif isinstance(stmt, S.For):
            self.emit_for(stmt, indent, stack)
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
            self.emit_allocate(stmt, indent, stack)
        elif isinstance(stmt, S.Evaluate):
            self.line(indent, f"(void)({self.expr(stmt.value)});")
        elif isinstance(stmt, S.Prefetch):
            self.emit_prefetch(stmt, indent)
        else:
            raise BuildError(
                f"kernel {self.func.name!r}: the C code generator cannot emit "
                f"{type(stmt).__name__} statements"
            )


    def emit_prefetch(self, stmt: S.Prefetch, indent: int) -> None:
        """A prefetch hint: GCC's ``__builtin_prefetch`` of the element's address, for a read,
        into the caches below L1 (locality 2: ``prefetcht1`` on x86), since what a schedule
        prefetches is read a while later, not by the next instruction."""
        source = self.buffer_name(stmt.buffer)
        offset = self.expr(self.offset(stmt.buffer, stmt.indices))
        self.line(indent, f"__builtin_prefetch(&{source}[{offset}], 0, 2);")

    def loop_bounds(self, loop: S.For) -> tuple[str, str]:
        """C text of a loop's first value and of its (exclusive) end."""
        return self.expr(loop.min), self.expr(E.add(loop.min, loop.extent))

    def emit_for(self, loop: S.For, indent: int, stack: list[WorkItem]) -> None:
        """A plain ``for`` loop (with its :meth:`loop_pragma`) around its body."""
        self.open_loop(loop, indent)
        self.push_loop_close(loop, indent, stack)
        stack.append((loop.body, indent + 1))

    def open_loop(self, loop: S.For, indent: int) -> None:
        """Emit the loop's pragma and ``for (...) {`` line and bind its variable; the caller
        emits the body, the closing brace, and unbinds the variable."""
        start, end = self.loop_bounds(loop)
        var = self.bind_var(loop.loop_var, self.non_negative(loop.min))
        pragma = self.loop_pragma(loop)
        if pragma is not None:
            self.line(indent, pragma)
        ctype = c_type(loop.loop_var.dtype)
        self.line(indent, f"for ({ctype} {var} = {start}; {var} < {end}; ++{var}) {{")

    def push_loop_close(self, loop: S.For, indent: int, stack: list[WorkItem]) -> None:
        """Push what ends a loop opened by :meth:`open_loop` (run after its body): the
        closing brace and unbinding its variable; counts the loop in :attr:`loop_depth`."""
        self.loop_depth += 1
        stack.append(lambda: self.line(indent, "}"))
        stack.append(lambda: self.unbind_var(loop.loop_var))
        stack.append(lambda: setattr(self, "loop_depth", self.loop_depth - 1))


def has_inner_loop(loop: S.For) -> bool:
    """Whether ``loop``'s body holds another loop."""
    return any(isinstance(inner, S.For) for inner in walk_stmts(loop.body))
