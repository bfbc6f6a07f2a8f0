"""A reference interpreter for PrimFuncs: runs loop IR on NumPy arrays, without a C compiler.

The function is translated to Python source once (one Python ``for`` per loop, buffers as flat
lists) and executed; every load and store checks its indices against the buffer's shape, so
a missing guard shows up as :class:`~opfusion.errors.EvaluationError`, never as a silently
wrapped negative index. Temporaries start as NaN (floats) or a sentinel (integers), so reading
an element that was never written shows up in the result. Arithmetic is done in Python
(float64; 8- and 16-bit and unsigned integers wrap after every operation, as NumPy's and the
generated C's do, int32 and int64 are unbounded), so compare float32 results with a
tolerance. It is slow: keep shapes small. Loops run serially whatever their kind.

A function with loops bound to GPU indices (``bind``) runs as a GPU would run it
(:mod:`opfusion.tir.launch`): launch after launch, block after block, and in each block
every thread runs the body with its own indices, up to a barrier, where it waits for the
others; a "shared" buffer is one per block, a "local" one per thread. Threads of a block are
run one at a time from barrier to barrier, and every access to memory other threads see
(shared buffers, the function's buffers, global temporaries) is checked: reading what another
thread of the block wrote since the last barrier, writing what another read or wrote since
then, or touching an element another block wrote, is a data race and an EvaluationError, as
are threads that do not all reach the same barriers. A tensor-core nest (``mma_tf32``) runs
as its warp runs it: each lane hands its TF32-rounded operands to the others and takes its
results from the whole warp's (:mod:`opfusion.tir.mma`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import EvaluationError, TensorExprError
from . import expr as E
from . import mma
from . import stmt as S

_UNINIT_INT = -123456789

_BINARY = {
    E.Add: "+", E.Sub: "-", E.Mul: "*", E.FloorDiv: "//", E.FloorMod: "%",
    E.EQ: "==", E.NE: "!=", E.LT: "<", E.LE: "<=", E.GT: ">", E.GE: ">=",
}

#: Integer dtypes whose arithmetic results wrap at once: those narrower than C's int (which the
#: generated C converts back after every operation) and the unsigned ones (C defines their
#: arithmetic modulo 2**bits). int32 and int64, the index dtypes, are left unbounded: their
#: overflow is the kernel's bug, not a value to reproduce.
_WRAPPING = frozenset({"int8", "int16", "uint8", "uint16", "uint32", "uint64"})


def _max(a: float, b: float) -> float:
    # NaN wins, as in NumPy and the generated C; Python's max keeps its first argument.
    return a if a != a else b if b != b else max(a, b)


def _min(a: float, b: float) -> float:
    return a if a != a else b if b != b else min(a, b)


def _fdiv(a: float, b: float) -> float:
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)


def _safe(fn: Any) -> Any:
    def wrapped(*args: float) -> float:
        try:
            return float(fn(*args))
        except OverflowError:
            return math.inf
        except ValueError:
            return math.nan

    return wrapped


def _log(x: float) -> float:
    if x == 0:
        return -math.inf
    return math.log(x) if x > 0 else math.nan


_INTRINSICS: dict[str, Any] = {
    "exp": _safe(math.exp), "exp_neg": _safe(lambda x: math.exp(-x)),
    "exp_normal": _safe(lambda x: 0.0 if x < E.EXP_NORMAL_BELOW else math.exp(x)),
    "exp2": _safe(lambda x: 2.0 ** x), "expm1": _safe(math.expm1),
    "log": _log, "log2": _safe(lambda x: _log(x) / math.log(2)),
    "log10": _safe(lambda x: _log(x) / math.log(10)), "log1p": _safe(lambda x: _log(1 + x)),
    "sqrt": _safe(math.sqrt), "tanh": math.tanh, "erf": math.erf,
    "floor": _safe(math.floor), "ceil": _safe(math.ceil), "trunc": _safe(math.trunc),
    "round": _safe(round), "fabs": math.fabs, "sin": _safe(math.sin), "cos": _safe(math.cos),
    "tan": _safe(math.tan), "asin": _safe(math.asin), "acos": _safe(math.acos),
    "atan": math.atan, "sinh": _safe(math.sinh), "cosh": _safe(math.cosh),
    "pow": _safe(math.pow), "atan2": math.atan2, "fmod": _safe(math.fmod),
    "dot4_u8s8": E.unpack_dot4_u8s8, "dot2_s16": E.unpack_dot2_s16,
}


def _cast_int(x: Any, bits: int, signed: bool) -> int:
    if isinstance(x, float):
        # NaN to 0, truncate, saturate (opfusion.ir.types.float_to_int), as the generated C.
        if x != x:
            return 0
        lo = -(1 << (bits - 1)) if signed else 0
        hi = lo + (1 << bits)
        return lo if x < lo else hi - 1 if x >= hi else math.trunc(x)
    x = int(x) & ((1 << bits) - 1)
    if signed and x >= 1 << (bits - 1):
        x -= 1 << bits
    return x


def _oob(buffer: str, dim: int, index: int, size: int) -> int:
    raise EvaluationError(
        f"index {index} out of range [0, {size}) in dimension {dim} of buffer {buffer}"
    )


class _Source:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[object, str] = {}
        self.spmd = False  # GPU semantics: bound loops read the thread's indices
        self.temporaries: set[int] = set()  # ids of a launch's global temporaries
        self.bound: dict[str, E.Var] = {}  # GPU index -> the variable of the loop bound to it
        self.tf32 = "_tf32"  # how tensor-core nests reduce their operands to TF32

    def name(self, obj: object, hint: str) -> str:
        got = self.names.get(obj)
        if got is None:
            got = f"{'b' if isinstance(obj, E.Buffer) else 'v'}{len(self.names)}_" + "".join(
                ch if ch.isalnum() else "_" for ch in hint)
            self.names[obj] = got
        return got

    def expr(self, e: E.PrimExpr) -> str:
        if isinstance(e, E.Var):
            return self.name(e, e.name)
        if isinstance(e, E.IntImm):
            return ("True" if e.value else "False") if e.dtype == "bool" else repr(e.value)
        if isinstance(e, E.FloatImm):
            return f"float({str(e.value)!r})" if not math.isfinite(e.value) else repr(e.value)
        op = _BINARY.get(type(e))
        if op is not None:
            text = f"({self.expr(e.a)} {op} {self.expr(e.b)})"
            if e.dtype in _WRAPPING:  # wraps to its dtype at once, as in the generated C
                return self.convert(text, e.dtype)
            return text
        if isinstance(e, E.Div):
            return f"_fdiv({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, E.Min):
            return f"_min({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, E.Max):
            return f"_max({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, E.And):
            return f"({self.expr(e.a)} and {self.expr(e.b)})"
        if isinstance(e, E.Or):
            return f"({self.expr(e.a)} or {self.expr(e.b)})"
        if isinstance(e, E.Not):
            return f"(not {self.expr(e.a)})"
        if isinstance(e, E.Select):
            return (f"({self.expr(e.true_value)} if {self.expr(e.condition)} "
                    f"else {self.expr(e.false_value)})")
        if isinstance(e, E.Cast):
            return self.convert(self.expr(e.value), e.dtype)
        if isinstance(e, E.Call):
            return f"_intrin[{e.name!r}]({', '.join(self.expr(a) for a in e.args)})"
        if isinstance(e, E.BufferLoad):
            name = self.name(e.buffer, e.buffer.name)
            offset = self.offset(e.buffer, e.indices)
            if self.spmd and (e.buffer.scope != "local" or id(e.buffer) in self.temporaries):
                # memory other threads see: every access checked for races
                offset = f"_read({name!r}, {offset}, {e.buffer.scope == 'shared'})"
            return f"{name}[{offset}]"
        if isinstance(e, E.Let):
            v = self.name(e.var, e.var.name)
            return f"(({v} := {self.expr(e.value)}), {self.expr(e.body)})[1]"
        raise EvaluationError(f"the interpreter cannot run {type(e).__name__} ({e}); lower first")

    def convert(self, text: str, dtype: str) -> str:
        if E.is_float(dtype):
            return f"float({text})"
        if dtype == "bool":
            return f"bool({text})"
        return f"_cast_int({text}, {E.dtype_bits(dtype)}, {dtype.startswith('int')})"

    def offset(self, buffer: E.Buffer, indices: Sequence[E.PrimExpr]) -> str:
        parts = []
        for d, (index, size, stride) in enumerate(zip(indices, buffer.shape, buffer.strides)):
            i = self.expr(index)
            checked = (f"(_i if 0 <= (_i := {i}) < {size} else "
                       f"_oob({buffer.name!r}, {d}, _i, {size}))")
            parts.append(checked if stride == 1 else f"{checked} * {stride}")
        return " + ".join(parts) or "0"

    def stmt(self, s: S.Stmt, indent: int) -> None:
        pad = "    " * indent
        if isinstance(s, S.SeqStmt):
            for child in s.stmts:
                self.stmt(child, indent)
        elif isinstance(s, S.BufferStore):
            target = self.name(s.buffer, s.buffer.name)
            value = self.convert(self.expr(s.value), s.buffer.dtype)
            offset = self.offset(s.buffer, s.indices)
            if self.spmd and (s.buffer.scope != "local" or id(s.buffer) in self.temporaries):
                offset = f"_write({target!r}, {offset}, {s.buffer.scope == 'shared'})"
            self.lines.append(f"{pad}{target}[{offset}] = {value}")
        elif isinstance(s, S.For) and s.kind.is_thread_binding and self.spmd:
            # Not a loop: this thread's (or block's) own index, if within the extent.
            v = self.name(s.loop_var, s.loop_var.name)
            self.lines.append(f"{pad}{v} = {self.expr(s.min)} + _idx[{s.kind.value!r}]")
            self.lines.append(f"{pad}if _idx[{s.kind.value!r}] < {self.expr(s.extent)}:")
            outer = self.bound.get(s.kind.value)
            self.bound[s.kind.value] = s.loop_var
            self.stmt(s.body, indent + 1)
            if outer is None:
                del self.bound[s.kind.value]
            else:
                self.bound[s.kind.value] = outer
        elif isinstance(s, S.For) and s.kind is S.ForKind.MMA_TF32 and self.spmd:
            self.warp_mma(s, pad)
        elif isinstance(s, S.Barrier):
            self.lines.append(f"{pad}yield")
        elif isinstance(s, S.AsyncCopy):
            self.async_copy(s, pad)
        elif isinstance(s, (S.AsyncCommit, S.AsyncWait)) and not self.spmd:
            self.lines.append(f"{pad}pass")  # (a plain run stored its copies at once)
        elif isinstance(s, S.AsyncCommit):
            self.lines.append(f"{pad}_async_groups.append(_async_open)")
            self.lines.append(f"{pad}_async_open = []")
        elif isinstance(s, S.AsyncWait):  # the oldest groups land, all but the newest `pending`
            self.lines.append(f"{pad}while len(_async_groups) > {s.pending}:")
            self.lines.append(f"{pad}    for _t, _o, _v in _async_groups.pop(0):")
            self.lines.append(f"{pad}        _t[_o] = _v")
        elif isinstance(s, S.For):
            v = self.name(s.loop_var, s.loop_var.name)
            lo = self.expr(s.min)
            self.lines.append(f"{pad}for {v} in range({lo}, {lo} + {self.expr(s.extent)}):")
            self.stmt(s.body, indent + 1)
        elif isinstance(s, S.IfThenElse):
            self.lines.append(f"{pad}if {self.expr(s.condition)}:")
            self.stmt(s.then_case, indent + 1)
            if s.else_case is not None:
                self.lines.append(f"{pad}else:")
                self.stmt(s.else_case, indent + 1)
        elif isinstance(s, S.LetStmt):
            v = self.name(s.var, s.var.name)
            self.lines.append(f"{pad}{v} = {self.convert(self.expr(s.value), s.var.dtype)}")
            self.stmt(s.body, indent)
        elif isinstance(s, S.Allocate):
            b = s.buffer
            fill = "math.nan" if E.is_float(b.dtype) else str(_UNINIT_INT)
            name = self.name(b, b.name)
            if b.scope == "shared" and self.spmd:  # one per block: the first thread makes it
                self.lines.append(f"{pad}{name} = _shared.get({name!r})")
                self.lines.append(f"{pad}if {name} is None:")
                self.lines.append(f"{pad}    {name} = _shared[{name!r}] = [{fill}] * {b.size}")
            else:
                self.lines.append(f"{pad}{name} = [{fill}] * {b.size}")
            self.stmt(s.body, indent)
        elif isinstance(s, S.Evaluate):
            self.lines.append(f"{pad}{self.expr(s.value)}")
        elif isinstance(s, S.Prefetch):
            # Nothing to fetch here; the element's offset is still checked, as a load's.
            self.lines.append(f"{pad}{self.offset(s.buffer, s.indices)}")
        else:
            raise EvaluationError(f"the interpreter cannot run {type(s).__name__}")

    def async_copy(self, s: S.AsyncCopy, pad: str) -> None:
        """An async copy: its source read (where its predicate holds; else zero) and its
        write checked for races now, when a GPU may start it, but the value stored only at
        the thread's wait for its group (GPU launches; a plain run stores at once). A read
        before that wait and a barrier sees the element's old value, and the result is
        wrong, as on a GPU."""
        target = self.name(s.buffer, s.buffer.name)
        value = self.convert(self.expr(s.source), s.buffer.dtype)
        if s.predicate is not None:
            zero = "0.0" if E.is_float(s.buffer.dtype) else "0"
            value = f"({value} if {self.expr(s.predicate)} else {zero})"
        offset = self.offset(s.buffer, s.indices)
        if not self.spmd:
            self.lines.append(f"{pad}{target}[{offset}] = {value}")
            return
        offset = f"_write({target!r}, {offset}, True)"
        self.lines.append(f"{pad}_async_open.append(({target}, {offset}, {value}))")

    def warp_mma(self, loop: S.For, pad: str) -> None:
        """A tensor-core nest run as the warp runs it (:mod:`opfusion.tir.mma`): each lane
        puts its TF32 operands where the others see them, waits for its warp, takes its
        four sums from the whole warp's operands, waits again (the next nest reuses the
        exchange), and adds them to its accumulators."""
        t4, g = self.bound.get("threadIdx.x"), self.bound.get("threadIdx.y")
        if t4 is None or g is None:
            raise EvaluationError("a tensor-core nest (mma_tf32) must be inside loops bound to "
                                  "threadIdx.x (4 lanes) and threadIdx.y (8)")
        try:
            fragments = mma.mma_fragments(mma.match_nest(loop, t4, g), t4, g)
        except TensorExprError as err:
            raise EvaluationError(str(err)) from None
        a = ", ".join(f"{self.tf32}({self.expr(x)})" for x in fragments.a)
        b = ", ".join(f"{self.tf32}({self.expr(x)})" for x in fragments.b)
        lanes = f"{self.expr(g)}, {self.expr(t4)}"
        self.lines.append(f"{pad}_mma_put(_shared, _idx, {lanes}, ([{a}], [{b}]))")
        self.lines.append(f"{pad}yield 'warp'")
        self.lines.append(f"{pad}_sums = _mma_sums(_shared, _idx, {lanes})")
        self.lines.append(f"{pad}yield 'warp'")
        target = self.name(fragments.buffer, fragments.buffer.name)
        for q, indices in enumerate(fragments.acc):
            offset = self.offset(fragments.buffer, indices)
            self.lines.append(f"{pad}{target}[{offset}] = float({target}[{offset}] + _sums[{q}])")


def to_python(func: S.PrimFunc) -> str:
    """The Python source the interpreter runs for ``func`` (buffers are flat lists)."""
    src = _Source()
    params = [src.name(b, b.name) for b in func.params]
    src.lines.append(f"def kernel({', '.join(params)}):")
    src.lines.append("    pass")
    src.stmt(func.body, 1)
    return "\n".join(src.lines) + "\n"


def launch_to_python(func: S.PrimFunc, buffers: Sequence[E.Buffer], body: S.Stmt) -> str:
    """The Python source of one GPU launch of ``func`` (see :mod:`opfusion.tir.launch`): a
    generator ``kernel(*buffers, _idx, _shared, _read, _write)`` run once per thread,
    yielding at each barrier; ``_idx`` maps each of :data:`~opfusion.tir.stmt.THREAD_TAGS` to
    the thread's index, ``_shared`` holds its block's shared buffers, ``_read`` and
    ``_write`` check each access to memory other threads see (:class:`_RaceTracker`)."""
    src = _Source()
    src.spmd = True
    src.temporaries = {id(b) for b in buffers[len(func.params):]}
    if mma.truncates_operands(func):
        src.tf32 = "_tf32_truncated"
    params = [src.name(b, b.name) for b in buffers]
    src.lines.append(f"def kernel({', '.join([*params, '_idx', '_shared', '_read', '_write'])}):")
    src.lines.append("    if False:")  # a generator, barrier or not
    src.lines.append("        yield")
    # the thread's async copies: its open group, and its committed groups, oldest first
    src.lines.append("    _async_open, _async_groups = [], []")
    src.stmt(body, 1)
    return "\n".join(src.lines) + "\n"


def _run_launches(func: S.PrimFunc, lists: list[list[Any]]) -> None:
    """Run ``func``'s GPU launches in order, every block and thread of each."""
    from .launch import split_launches

    temps, launches = split_launches(func)
    args = lists + [[math.nan if E.is_float(t.dtype) else _UNINIT_INT] * t.size for t in temps]
    for number, launch in enumerate(launches):
        _run_one_launch(func, [*func.params, *temps], number, launch, args)


def run_launch(func: S.PrimFunc, number: int, *arrays: np.ndarray) -> None:
    """Run launch ``number`` of ``func`` alone (as a GPU runtime launches each kernel) on
    NumPy arrays: one per parameter, then one per global temporary
    (:func:`opfusion.tir.launch.split_launches`), written in place."""
    from .launch import split_launches

    temps, launches = split_launches(func)
    buffers = [*func.params, *temps]
    if not 0 <= number < len(launches):
        raise EvaluationError(f"{func.name} has {len(launches)} launches, not {number + 1}")
    lists = _as_lists(func.name, buffers, arrays)
    _run_one_launch(func, buffers, number, launches[number], lists)
    _write_back(arrays, lists)


def _run_one_launch(func: S.PrimFunc, buffers: list[E.Buffer], number: int, launch: Any,
                    args: list[list[Any]]) -> None:
    namespace = _namespace()
    source = launch_to_python(func, buffers, launch.body)
    exec(compile(source, f"<tir {func.name} launch {number}>", "exec"), namespace)
    kernel = namespace["kernel"]
    gx, gy, gz = launch.grid
    tx, ty, tz = launch.block
    races = _RaceTracker(f"kernel {func.name}, launch {number}")
    for block in itertools.product(range(gz), range(gy), range(gx)):
        shared: dict[str, list[Any]] = {}
        races.phase = 0
        threads = []
        for t in itertools.product(range(tz), range(ty), range(tx)):
            index = {"blockIdx.x": block[2], "blockIdx.y": block[1],
                     "blockIdx.z": block[0], "threadIdx.x": t[2], "threadIdx.y": t[1],
                     "threadIdx.z": t[0], "blockDim.x": tx, "blockDim.y": ty}
            read, write = races.accessors(block, t)
            threads.append(kernel(*args, index, shared, read, write))
        _run_block(func.name, number, threads, races)


class _RaceTracker:
    """Who last wrote and last read each element of memory that threads share, in one launch:
    a thread that reads or writes an element another thread of its block wrote or read since
    the last barrier, or one that another block wrote or read at all, is a data race (a GPU
    runs them at the same time, in any order): an EvaluationError. Writes by two threads of
    the same value are races too. Only the last reader of an element is remembered, so a
    write after reads by several threads is checked against the last of them."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.phase = 0  # barriers the current block has passed
        self.cells: dict[tuple[Any, ...], list[Any]] = {}

    def accessors(self, block: tuple[int, ...], thread: tuple[int, ...]) -> tuple[Any, Any]:
        who = (block, thread)

        def conflict(other: Any, phase: int) -> bool:
            return other is not None and other != who and (other[0] != block
                                                           or phase == self.phase)

        def read(buffer: str, offset: int, shared: bool) -> int:
            key = (buffer, offset, block) if shared else (buffer, offset)
            cell = self.cells.get(key)
            if cell is None:
                self.cells[key] = [None, -1, who, self.phase]
                return offset
            if conflict(cell[0], cell[1]):
                self.fail(f"thread {who} reads element {offset} of {buffer}, which thread "
                          f"{cell[0]} wrote with no barrier between")
            cell[2], cell[3] = who, self.phase
            return offset

        def write(buffer: str, offset: int, shared: bool) -> int:
            key = (buffer, offset, block) if shared else (buffer, offset)
            cell = self.cells.get(key)
            if cell is None:
                self.cells[key] = [who, self.phase, None, -1]
                return offset
            if conflict(cell[0], cell[1]):
                self.fail(f"threads {cell[0]} and {who} both write element {offset} of "
                          f"{buffer} with no barrier between")
            if conflict(cell[2], cell[3]):
                self.fail(f"thread {who} writes element {offset} of {buffer}, which thread "
                          f"{cell[2]} read with no barrier between")
            cell[0], cell[1] = who, self.phase
            return offset

        return read, write

    def fail(self, what: str) -> None:
        raise EvaluationError(f"{self.where}: data race: {what} (block, thread indices "
                              "as (z, y, x)); a GPU would compute these in any order")


def _run_block(name: str, number: int, threads: list[Any], races: _RaceTracker) -> None:
    """Run the threads of one block from barrier to barrier, one thread at a time."""
    phase = 0
    while True:
        finished = 0
        waits = set()
        for thread in threads:
            try:
                waits.add(next(thread))
            except StopIteration:
                finished += 1
        if finished == len(threads):
            return
        if finished or len(waits) > 1:
            raise EvaluationError(
                f"kernel {name}, launch {number}: {finished} of the block's {len(threads)} "
                f"threads finished while the others wait at barrier {phase + 1}, or some wait "
                "at a barrier and others at a tensor-core nest; every thread of a block must "
                "reach the same barriers (a barrier under a condition on the thread's index "
                "hangs a GPU), and every warp the same tensor-core nests")
        if waits == {"warp"}:
            continue  # the lanes of each warp exchanged operands: no barrier for the others
        phase += 1
        races.phase = phase


def _mma_lane(index: dict[str, int], g: int, t4: int) -> tuple[int, int]:
    """(warp, lane) of the thread at ``index``, as the GPU numbers them (threads in x, then
    y, then z order, 32 to a warp), checked against the nest's tile coordinates."""
    linear = index["threadIdx.x"] + index["blockDim.x"] * (
        index["threadIdx.y"] + index["blockDim.y"] * index["threadIdx.z"])
    warp, lane = divmod(linear, mma.WARP)
    if not (0 <= t4 < mma.LANE_X and 0 <= g < mma.LANE_Y) or lane != t4 + mma.LANE_X * g:
        raise EvaluationError(
            f"a tensor-core nest's lane coordinates (g={g}, t4={t4}) are not those of the "
            f"thread's lane {lane}: bind t4 to threadIdx.x of extent 4 and g to threadIdx.y "
            "of extent 8")
    return warp, lane


def _mma_put(shared: dict[str, Any], index: dict[str, int], g: int, t4: int,
             operands: tuple[list[float], list[float]]) -> None:
    warp, lane = _mma_lane(index, g, t4)
    shared.setdefault("\0mma", {})[(warp, lane)] = operands


def _mma_sums(shared: dict[str, Any], index: dict[str, int], g: int, t4: int) -> list[float]:
    warp, _ = _mma_lane(index, g, t4)
    exchange = shared["\0mma"]
    lanes = {lane: exchange.get((warp, lane)) for lane in range(mma.WARP)}
    missing = [lane for lane, got in lanes.items() if got is None]
    if missing:
        raise EvaluationError(f"lanes {missing} of warp {warp} did not reach the tensor-core "
                              "nest with the others: a warp runs mma.sync together")
    return mma.warp_tile_sums(lanes, g, t4)  # type: ignore[arg-type]


def _namespace() -> dict[str, Any]:
    return {"math": math, "_fdiv": _fdiv, "_max": _max, "_min": _min, "_intrin": _INTRINSICS,
            "_cast_int": _cast_int, "_oob": _oob, "_tf32": mma.round_tf32,
            "_tf32_truncated": mma.truncate_tf32,
            "_mma_put": _mma_put, "_mma_sums": _mma_sums}


def run(func: S.PrimFunc, *arrays: np.ndarray) -> None:
    """Run ``func`` on NumPy arrays (one per parameter, in order), writing outputs in place.
    A function with loops bound to GPU indices runs as a GPU would (see the module
    docstring)."""
    from .launch import binds_threads

    lists = _as_lists(func.name, func.params, arrays)
    if binds_threads(func.body):
        _run_launches(func, lists)
    else:
        namespace = _namespace()
        exec(compile(to_python(func), f"<tir {func.name}>", "exec"), namespace)
        namespace["kernel"](*lists)
    _write_back(arrays, lists)


def _as_lists(name: str, buffers: Sequence[E.Buffer], arrays: Sequence[np.ndarray]
              ) -> list[list[Any]]:
    """The arrays as flat lists, each checked against its buffer's shape and dtype."""
    if len(arrays) != len(buffers):
        raise EvaluationError(
            f"{name} takes {len(buffers)} arrays "
            f"({', '.join(b.name for b in buffers)}), got {len(arrays)}"
        )
    lists = []
    for buf, arr in zip(buffers, arrays):
        if not isinstance(arr, np.ndarray):
            raise EvaluationError(f"argument {buf.name} must be a NumPy array")
        if tuple(arr.shape) != buf.shape or arr.dtype != np.dtype(buf.dtype):
            raise EvaluationError(
                f"argument {buf.name} must be {buf.dtype}{list(buf.shape)}, got "
                f"{arr.dtype}{list(arr.shape)}"
            )
        lists.append(arr.ravel().tolist())
    return lists


def _write_back(arrays: Sequence[np.ndarray], lists: list[list[Any]]) -> None:
    for arr, values in zip(arrays, lists):
        arr[...] = np.asarray(values, dtype=np.float64 if arr.dtype.kind == "f" else None
                              ).astype(arr.dtype).reshape(arr.shape)
