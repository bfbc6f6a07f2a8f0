"""Loop planning: how each loop of a PrimFunc is emitted on a CPU target, decided before printing.

:func:`plan_loops` walks a PrimFunc's loops once and returns a :class:`LoopPlans`, a side table
keyed by loop: which VECTORIZED loops become GCC vector code (:class:`VectorPlan`: lanes per
chunk, which stores stream past the cache), which accumulation nests become register tiles
(:class:`RegisterTilePlan`) and which PARALLEL loops must end with a store fence. The widths
come from the :class:`~opfusion.target.Target` (64-byte vectors with AVX-512, 32 with AVX2)
and the register-tile budget from its vector register count. The printer
(:mod:`opfusion.backend.cpu.emitter`) only reads the table.

Why a side table and not annotations on ``For``: a plan refers to statements inside the loop
(the stores that stream, a tile's reduction loops and its store) by identity, is only
meaningful for one target, and is not loop IR (printing, structural equality and the
interpreter would have to skip it); the same PrimFunc can be planned for two targets.

Vectorized loops (GCC vector types; emitted by :mod:`.vector`). A body qualifies when, for the
loop variable ``v``: every store and every load that depends on ``v`` has a flat offset of the
form ``base + 1 * v`` (contiguous lanes; a load that does not depend on ``v`` is a scalar,
broadcast), the element types are 4- or 8-byte numbers, the extent is a constant multiple of
the lane count, and the operations are arithmetic, min/max, comparisons, logic, casts (not
float to integer, which saturates) and selects whose branches cannot fault (no loads, no
integer division). Anything else is emitted as a scalar loop under ``#pragma omp simd``.

Register tiles (emitted by :mod:`.regtile`). A nest qualifies when, walking down from a loop:
no select guards a load (a tile loads its operands before computing);
the loops are perfectly nested; the innermost is a VECTORIZED loop that can be planned, whose
body is one store ``buf[i] = f(buf[i], ...)`` (its only read of ``buf``, at the same indices);
the loops just above it are UNROLLED with constant bounds (the tile), and above those at least
one SERIAL or UNROLLED loop (the reduction) whose variable ``i`` does not use; ``i`` is linear
in the tile's variables, distinct tile points store to disjoint vectors, and the tile holds at
most :func:`max_tile_vectors` accumulator vectors."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...target import Target
from ...tir import expr as E
from ...tir import stmt as S
from ...tir.shared_values import evaluated_on_every_path
from ...tir.simplify import linear_form, simplify, structural_key
from ...tir.stmt import read_buffers, written_buffers
from ...tir.work import kernel_work
from ...topi.nn import MATRIX_MIN_MACS
from ..c_family import walk_stmts
from .vector_math import VECTOR_INTRINSICS

if TYPE_CHECKING:
    from .matrix_tiles import MatrixTilePlan

#: Element types a vector may hold, with their size in bytes.
VECTOR_DTYPES = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "uint32": 4, "uint64": 8}
#: 8- and 16-bit integers, which vector code only loads to widen, and stores converted from
#: float32 by a saturating cast: a quantized tensor's codes (NumPy's wrapping arithmetic on
#: them is not the C vector extension's).
NARROW_DTYPES = {"int8": 1, "uint8": 1, "int16": 2, "uint16": 2}
#: Bytes of an element of every dtype a vector may hold.
ELEMENT_SIZES = {**VECTOR_DTYPES, **NARROW_DTYPES}

ARITHMETIC = {E.Add: "+", E.Sub: "-", E.Mul: "*", E.Div: "/"}
COMPARISONS = {E.EQ: "==", E.NE: "!=", E.LT: "<", E.LE: "<=", E.GT: ">", E.GE: ">="}

#: The kind of a node inside a vectorized body: a scalar (same value in every lane), a vector
#: of a dtype, or a mask (the result of a comparison: all-ones or zero lanes of a width in bits).
SCALAR = ("scalar", "")

#: Smallest vector the planner uses, in bytes (one SSE or NEON register).
MIN_VECTOR_BYTES = 16

#: Smallest streaming store, in bytes: a 16-byte one would write less than half a cache line.
MIN_STREAM_BYTES = 32


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


@dataclass(frozen=True)
class RegisterTilePlan:
    """An accumulation nest to emit as a register tile (see the module docstring)."""

    reduce_loops: tuple[S.For, ...]
    tile_loops: tuple[S.For, ...]
    vector_loop: S.For
    vector: VectorPlan
    store: S.BufferStore
    self_load: E.BufferLoad
    #: the update is ``acc + x`` (x not reading acc): the tile sums its reduction loops from
    #: zero and adds that partial sum to the accumulator after them (see
    #: :func:`partial_sum_update`)
    partial_sum: bool = False
    #: per reduction loop, the prefetch hints its body starts with (see
    #: :meth:`opfusion.te.Stage.prefetch`)
    prefetches: tuple[tuple[S.Prefetch, ...], ...] = ()
    #: a partial-sum tile whose accumulator the statement just before it only set to zero:
    #: that statement is skipped and the tile stores its sum (see :func:`fresh_tiles`)
    fresh: bool = False
    #: products of bytes run on the target's matrix tiles (see :mod:`.matrix_tiles`)
    matrix: MatrixTilePlan | None = None


@dataclass(frozen=True)
class LoopPlans:
    """The plans of one PrimFunc's loops, by loop (see :func:`plan_loops`). Holds ``func``
    so that the loops it is keyed by (by identity) stay alive."""

    func: S.PrimFunc
    target: Target
    vectors: dict[int, VectorPlan]
    tiles: dict[int, RegisterTilePlan]
    fence_loops: frozenset[int]
    fence_at_end: bool
    #: statements (by id) not emitted: the zero-fills that a fresh tile's store replaces
    skipped: frozenset[int] = frozenset()

    def vector(self, loop: S.For) -> VectorPlan | None:
        """The vector plan of ``loop`` (None: a plain loop)."""
        return self.vectors.get(id(loop))

    @property
    def matrix_tiles(self) -> bool:
        """Whether a register tile runs on matrix tiles (the kernel then releases them)."""
        return any(tile.matrix is not None for tile in self.tiles.values())

    def tile(self, loop: S.For) -> RegisterTilePlan | None:
        """The register tile whose outermost reduction loop is ``loop`` (None: not one)."""
        return self.tiles.get(id(loop))

    def skips(self, stmt: S.Stmt) -> bool:
        """Whether ``stmt`` is left out: a zero-fill a fresh register tile makes redundant."""
        return id(stmt) in self.skipped

    def fences(self, loop: S.For) -> bool:
        """Whether each iteration of ``loop`` (PARALLEL) ends with a store fence."""
        return id(loop) in self.fence_loops

    def describe(self) -> list[tuple[str, str]]:
        """``(loop variable, plan)`` for every planned loop in program order, for reports
        and tests: ``"tile 4x16"`` (accumulator vectors x lanes), ``"vector 16"``,
        ``"vector 16 stream"``, ``"fence"`` (a parallel loop whose iterations end with one)."""
        out: list[tuple[str, str]] = []
        for stmt in walk_stmts(self.func.body):
            if not isinstance(stmt, S.For):
                continue
            name = stmt.loop_var.name
            tile, vector = self.tile(stmt), self.vector(stmt)
            if tile is not None:
                points = tile_points(tile.tile_loops, tile.vector_loop, tile.vector.lanes)
                out.append((name, f"tile {len(points)}x{tile.vector.lanes}"))
            elif vector is not None:
                out.append((name, f"vector {vector.lanes}" + (" stream" if vector.streams
                                                               else "")))
            if self.fences(stmt):
                out.append((name, "fence"))
        return out


def max_tile_vectors(target: Target) -> int:
    """Most accumulator vectors a register tile may hold: one and a half times the target's
    vector registers (24 with AVX2's 16, the budget tuned there; 48 with AVX-512's 32). The
    few that do not fit spill to the stack, which costs less than a smaller tile."""
    return target.vector_registers * 3 // 2


def streaming_threshold(target: Target) -> int:
    """Bytes of output from which stores stream past the cache by default: a quarter of the
    target's last-level cache (8 MiB with the 32 MiB L3 this was measured on), where an output
    written once no longer stays there for whoever reads it next."""
    return target.cache_bytes(3) // 4


def plan_loops(func: S.PrimFunc, target: Target, *, register_tiles: bool = True,
               streaming_store_bytes: int | None = None) -> LoopPlans:
    """Plan every loop of ``func`` for ``target``: vector loops, register tiles, and where
    streaming stores need a fence (each iteration of the innermost PARALLEL loop around one,
    or the end of the function when none is).

    ``register_tiles``: plan accumulation nests as register tiles. ``streaming_store_bytes``:
    vectorized stores to an output parameter at least this large, which the kernel never reads
    back, stream past the cache (0: never; None: :func:`streaming_threshold`); only on
    targets with SSE."""
    if streaming_store_bytes is None:
        streaming_store_bytes = streaming_threshold(target)
    written = written_buffers(func.body)
    read = read_buffers(func.body)
    stream_buffers: set[int] = set()
    if streaming_store_bytes > 0 and target.has("sse"):
        stream_buffers = {
            id(b) for b in func.params
            if id(b) in written and id(b) not in read
            and b.size * np.dtype(b.dtype).itemsize >= streaming_store_bytes
        }
    vectors: dict[int, VectorPlan] = {}
    tiles: dict[int, RegisterTilePlan] = {}
    # Matrix tiles of rows shorter than a tile's only for a kernel of enough products of
    # words (see MATRIX_MIN_MACS: its schedule chose tiles for them); its work counts a
    # product of words (4 multiply-adds a lane) once, its epilogue too, hence the margin.
    matrix = bool(target.matrix_tiles) and \
        kernel_work(func.body) * 4 >= MATRIX_MIN_MACS * 3 // 4
    fence_loops: set[int] = set()
    fence_at_end = False
    # (statement, innermost enclosing PARALLEL loop or None)
    stack: list[tuple[S.Stmt, S.For | None]] = [(func.body, None)]
    while stack:
        stmt, parallel = stack.pop()
        if (register_tiles and isinstance(stmt, S.For)
                and stmt.kind in (S.ForKind.SERIAL, S.ForKind.UNROLLED)):
            tile = plan_register_tile(stmt, target, stream_buffers, matrix)
            if tile is not None:
                tiles[id(stmt)] = tile
                continue
        if isinstance(stmt, S.For) and stmt.kind is S.ForKind.VECTORIZED:
            plan = plan_vector_loop(stmt, target, stream_buffers)
            if plan is not None:
                vectors[id(stmt)] = plan
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
    skipped = fresh_tiles(func.body, tiles)
    return LoopPlans(func, target, vectors, tiles, frozenset(fence_loops), fence_at_end,
                     skipped)


def fresh_tiles(body: S.Stmt, tiles: dict[int, RegisterTilePlan]) -> frozenset[int]:
    """Mark the partial-sum tiles that follow a zero-fill of exactly their accumulator's
    elements as fresh (``tiles`` is updated) and return the fills' ids. A reduction lowers
    to a fill of zeros and an update; a tile that sums its whole reduction in registers then
    loaded the zeros back to add them: three memory operations per accumulator vector where
    one store does. For a depthwise 3x3 convolution (9 multiply-adds per vector) or a 1x1
    one of 16 input channels that is a quarter or more of the work."""
    skipped: set[int] = set()
    for stmt in walk_stmts(body):
        if not isinstance(stmt, S.SeqStmt):
            continue
        for before, after in zip(stmt.stmts, stmt.stmts[1:]):
            plan = tiles.get(id(after))
            if plan is not None and plan.partial_sum and _fills_accumulator(before, plan):
                tiles[id(after)] = dataclasses.replace(plan, fresh=True)
                skipped.add(id(before))
    return frozenset(skipped)


#: Most elements a zero-fill is compared element by element with a tile's accumulator.
MAX_FILL_ELEMENTS = 1 << 14


def _fills_accumulator(stmt: S.Stmt, plan: RegisterTilePlan) -> bool:
    """Whether ``stmt`` is a nest of constant loops that stores zeros to exactly the
    elements ``plan``'s tile accumulates into (relative to the same outer variables), and
    the tile reads its accumulator nowhere but in its own update."""
    if not isinstance(stmt, S.For):
        return False
    chain = _chain(stmt)
    if not chain or any(not _is_const_loop(loop) or loop.kind is S.ForKind.PARALLEL
                        for loop in chain):
        return False
    body = flatten_body(chain[-1].body)
    if body is None or len(body) != 1 or not isinstance(body[0], S.BufferStore):
        return False
    fill = body[0]
    if (fill.buffer is not plan.store.buffer
            or not isinstance(fill.value, (E.FloatImm, E.IntImm)) or fill.value.value != 0):
        return False
    if any(isinstance(n, E.BufferLoad) and n.buffer is plan.store.buffer
           and n is not plan.self_load for n in value_nodes(plan.store.value)):
        return False
    filled = _elements(fill, chain)
    stored = _elements(plan.store, [*plan.tile_loops, plan.vector_loop])
    return filled is not None and filled == stored


def _elements(store: S.BufferStore, loops: list[S.For]
              ) -> tuple[dict[Any, int], frozenset[int]] | None:
    """The elements ``store`` writes over constant ``loops``: its offset's terms in other
    variables, and the set of the rest's values; None when a loop variable is not linear
    in it or there are too many."""
    offset = store.buffer.offset_of(store.indices)
    variables = [loop.loop_var for loop in loops]
    coefs = tile_coefficients(offset, variables)
    if coefs is None or math.prod(loop.extent.value for loop in loops) > MAX_FILL_ELEMENTS:
        return None
    lin = linear_form(offset)
    ids = {id(v) for v in variables}
    outer = {key: coef for key, (coef, atom) in lin.terms.items()
             if not (isinstance(atom, E.Var) and id(atom) in ids)}
    ranges = [range(loop.min.value, loop.min.value + loop.extent.value) for loop in loops]
    steps = [coefs.get(id(v), 0) for v in variables]
    values = frozenset(lin.const + sum(c * v for c, v in zip(steps, point))
                       for point in itertools.product(*ranges))
    return outer, values


# -- vectorized loops -------------------------------------------------------------------------


def flatten_body(body: S.Stmt) -> list[S.Stmt] | None:
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


def value_nodes(root: E.PrimExpr) -> list[E.PrimExpr]:
    """The nodes of a value expression, children first, without entering load indices."""
    return E.post_order(root, enter=lambda node: not isinstance(node, E.BufferLoad))


def _has_unsafe_branch(expr: E.PrimExpr, always: set[int] | frozenset[int] = frozenset(),
                       always_loads: set[Any] | frozenset[Any] = frozenset()) -> bool:
    # Vector selects compute both branches: a load or an integer division there could fault,
    # unless the value evaluates that very node on every path anyway (``always``, by id: the
    # load of ``x != x ? 0 : x`` that QuantizeLinear's NaN rule compares and keeps), or, for
    # a load, the same element (``always_loads``, structural keys: the inlined copies of a
    # quantized convolution's accumulator load are distinct nodes).
    for n in E.post_order(expr):
        if isinstance(n, E.BufferLoad):
            if id(n) not in always and structural_key(n) not in always_loads:
                return True
        elif isinstance(n, (E.FloorDiv, E.FloorMod)) and id(n) not in always:
            return True
    return False


def loads_on_every_path(root: E.PrimExpr, always: set[int]) -> set[Any]:
    """Structural keys of the loads that evaluating ``root`` always evaluates (``always``:
    :func:`evaluated_on_every_path`'s ids)."""
    return {structural_key(n) for n in E.post_order(root)
            if isinstance(n, E.BufferLoad) and id(n) in always}


class VectorAnalysis:
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
        #: ids of the nodes the value being analyzed evaluates on every path, and the
        #: structural keys of its loads among them
        self.always: set[int] = set()
        self.always_loads: set[Any] = set()
        #: the loads that gather each lane's element at a vector of indices (by id)
        self.gathers: set[int] = set()

    def offset_coefficient(self, buffer: E.Buffer, indices: tuple[E.PrimExpr, ...]) -> int | None:
        if not indices:
            return 0
        offset = buffer.offset_of(indices)
        if any(isinstance(n, (E.FloorDiv, E.FloorMod)) for n in E.post_order(offset)):
            # a flat offset split into a block and a lane (``buf[x // 8, x % 8]``, LRN's
            # blocked squares) is affine again once the two parts merge
            offset = simplify(offset)
        return coefficient(offset, self.coefficients, self.dependent)

    def _gathers(self, load: E.BufferLoad) -> bool:
        """Whether ``load`` reads a 4-byte element of a one-dimensional buffer at an index
        that vectorizes (its value nodes' kinds are recorded): a table lookup, one gather
        of the lanes' elements. (The index is the load's own node, so its kinds stay valid
        for the emitter; the lowering clamps such an index into the buffer.)"""
        if len(load.indices) != 1 or ELEMENT_SIZES.get(load.dtype) != 4:
            return False
        index = load.indices[0]
        if index.dtype != "int32":
            return False
        for node in value_nodes(index):
            kind = self._kind(node)
            if kind is None:
                return False
            self.kinds[id(node)] = kind
        return self.kinds[id(index)] == ("vector", "int32")

    def index_depends(self, index: E.PrimExpr) -> bool:
        return any(isinstance(n, E.Var) and id(n) in self.dependent for n in E.post_order(index))

    def value(self, root: E.PrimExpr) -> tuple[str, str] | None:
        """The kind of ``root``, or None if it cannot be vectorized."""
        self.always = evaluated_on_every_path(root)
        self.always_loads = loads_on_every_path(root, self.always)
        for node in value_nodes(root):
            kind = self._kind(node)
            if kind is None:
                return None
            self.kinds[id(node)] = kind
            if kind[0] == "vector":
                self.sizes.add(ELEMENT_SIZES[kind[1]])
        return self.kinds[id(root)]

    def _depends(self, node: E.PrimExpr) -> bool:
        if isinstance(node, E.Var):
            return id(node) in self.dependent
        if isinstance(node, E.BufferLoad):
            return any(self.index_depends(i) for i in node.indices)
        return any(self.kinds[id(c)] != SCALAR for c in node.children())

    def _kind(self, node: E.PrimExpr) -> tuple[str, str] | None:
        if not self._depends(node):
            return SCALAR
        dtype = node.dtype
        if isinstance(node, E.Var):
            if id(node) in self.vector_lets:
                return ("vector", dtype)
            if node is self.loop.loop_var and dtype in ("int32", "int64"):
                return ("vector", dtype)  # a ramp: v, v+1, ..., v+lanes-1
            return None  # an affine index variable used as a value
        if isinstance(node, E.BufferLoad):
            # (8- and 16-bit loads too: every operator but a widening cast refuses them, so
            # they are only ever widened: a quantized residual read as bytes)
            if dtype not in ELEMENT_SIZES:
                return None
            step = self.offset_coefficient(node.buffer, node.indices)
            if step is None and self._gathers(node):
                self.gathers.add(id(node))
                return ("vector", dtype)
            if step != 1:
                return None  # a broadcast of a varying element, a strided or other gather
            return ("vector", dtype)
        kids = [self.kinds[id(c)] for c in node.children()]
        if type(node) in ARITHMETIC or isinstance(node, (E.Min, E.Max)):
            if dtype not in VECTOR_DTYPES or any(k[0] == "mask" for k in kids):
                return None
            if isinstance(node, E.Div) and not dtype.startswith("float"):
                return None
            return ("vector", dtype)
        if type(node) in COMPARISONS:
            operand = node.a.dtype
            if operand not in VECTOR_DTYPES or any(k[0] == "mask" for k in kids):
                return None
            return ("mask", str(VECTOR_DTYPES[operand] * 8))
        if isinstance(node, (E.And, E.Or)):
            if kids[0][0] != "mask" or kids[0] != kids[1]:
                return None
            return kids[0]
        if isinstance(node, E.Not):
            return kids[0] if kids[0][0] == "mask" else None
        if isinstance(node, E.Select):
            if dtype not in VECTOR_DTYPES or kids[1][0] == "mask" or kids[2][0] == "mask":
                return None
            if kids[0] == SCALAR:
                return ("vector", dtype)  # a scalar condition picks one whole vector
            if kids[0] != ("mask", str(VECTOR_DTYPES[dtype] * 8)):
                return None
            if (_has_unsafe_branch(node.true_value, self.always, self.always_loads)
                    or _has_unsafe_branch(node.false_value, self.always, self.always_loads)):
                return None
            return ("vector", dtype)
        if isinstance(node, E.Cast):
            if kids[0][0] != "vector":
                return None
            if dtype in NARROW_DTYPES:
                # float32 codes to 8 or 16 bits: the saturating helper in vectors (exact
                # bounds; 32-bit ones are not exact in float32)
                return ("vector", dtype) if node.value.dtype == "float32" else None
            if dtype not in VECTOR_DTYPES:
                return None
            if node.value.dtype.startswith("float") and not dtype.startswith("float"):
                # Float to integer saturates (a scalar helper of the C emitter); a plain vector
                # conversion would be undefined for NaN and out-of-range lanes. float32 to int32
                # has a saturating vector helper (a table lookup's index).
                return ("vector", dtype) if (node.value.dtype, dtype) == ("float32",
                                                                           "int32") else None
            return ("vector", dtype)
        if isinstance(node, E.Call) and dtype in VECTOR_INTRINSICS.get(node.name, ()):
            # (scalar operands of a two-operand intrinsic, dot4_u8s8's, are broadcast)
            return ("vector", dtype) if all(k[0] != "mask" for k in kids) else None
        return None  # other intrinsic calls, integer division, lets: scalar loop


def plan_vector_loop(loop: S.For, target: Target,
                     stream_buffers: set[int]) -> VectorPlan | None:
    """A plan to emit ``loop`` (VECTORIZED) with vector types as wide as ``target``'s, or None
    if it does not qualify. Stores to the buffers of ``stream_buffers`` (by id) stream."""
    if not isinstance(loop.extent, E.IntImm) or loop.extent.value <= 0:
        return None
    body = flatten_body(loop.body)
    if body is None:
        return None
    analysis = VectorAnalysis(loop)
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
        if stmt.buffer.dtype not in VECTOR_DTYPES and not (
                stmt.buffer.dtype in NARROW_DTYPES and isinstance(stmt.value, E.Cast)):
            return None
        if analysis.offset_coefficient(stmt.buffer, stmt.indices) != 1:
            return None
        kind = analysis.value(stmt.value)
        if kind is None or kind[0] == "mask":
            return None
        analysis.sizes.add(ELEMENT_SIZES[stmt.buffer.dtype])
    lanes = _lanes(loop.extent.value, max(analysis.sizes, default=4), target.vector_bytes)
    if lanes is None:
        return None
    # Streaming stores exist for vectors of 4-byte elements, 32 bytes and more (see .vector).
    streams = frozenset(
        id(s) for s in body
        if isinstance(s, S.BufferStore) and id(s.buffer) in stream_buffers
        and ELEMENT_SIZES[s.buffer.dtype] == 4 and lanes * 4 >= MIN_STREAM_BYTES
    )
    affine = tuple((var, c) for var, c in analysis.coefficients.items()
                   if var != id(loop.loop_var))
    return VectorPlan(lanes, tuple(body), frozenset(analysis.vector_lets), affine, streams)


def _lanes(extent: int, element_size: int, vector_bytes: int) -> int | None:
    """Lanes per chunk: the widest vector, from the target's width halving down to
    :data:`MIN_VECTOR_BYTES`, whose lane count (at least 2) divides ``extent``."""
    width = vector_bytes
    while width >= MIN_VECTOR_BYTES:
        lanes = width // element_size
        if lanes >= 2 and extent % lanes == 0:
            return lanes
        width //= 2
    return None


# -- register tiles ---------------------------------------------------------------------------


def _chain(loop: S.For) -> list[S.For]:
    """The perfectly nested loops from ``loop`` down to the first VECTORIZED one (a loop's
    body may start with prefetch hints: :func:`_leading_prefetches`)."""
    chain: list[S.For] = []
    stmt: S.Stmt = loop
    while isinstance(stmt, S.For):
        chain.append(stmt)
        if stmt.kind is S.ForKind.VECTORIZED:
            return chain
        stmt = _leading_prefetches(stmt.body)[1]
    return []


def _leading_prefetches(body: S.Stmt) -> tuple[tuple[S.Prefetch, ...], S.Stmt]:
    """The prefetch hints a loop body starts with, and the one statement after them (the
    body itself when it has none, or more than one other statement)."""
    if not isinstance(body, S.SeqStmt):
        return (), body
    *first, last = body.stmts
    if all(isinstance(s, S.Prefetch) for s in first):
        return tuple(first), last  # type: ignore[arg-type]
    return (), body


def _is_const_loop(loop: S.For) -> bool:
    return isinstance(loop.min, E.IntImm) and isinstance(loop.extent, E.IntImm)


def _uses(expr: E.PrimExpr, variables: list[E.Var]) -> bool:
    ids = {id(v) for v in variables}
    return any(id(v) in ids for v in E.free_vars(expr))


def _self_load(store: S.BufferStore) -> E.BufferLoad | None:
    """The value's one read of the stored buffer, if it reads it exactly once at the store's
    indices (None otherwise)."""
    found: list[E.BufferLoad] = []
    for node in E.post_order(store.value):
        if isinstance(node, E.BufferLoad) and node.buffer is store.buffer:
            found.append(node)
    if len(found) != 1:
        return None
    load = found[0]
    if len(load.indices) != len(store.indices):
        return None
    for a, b in zip(load.indices, store.indices):
        if a is not b:
            difference = simplify(E.sub(a, b))
            if not (isinstance(difference, E.IntImm) and difference.value == 0):
                return None
    return load


def tile_coefficients(offset: E.PrimExpr, tile_vars: list[E.Var]) -> dict[int, int] | None:
    """The coefficient of each tile variable (by id) in ``offset``, or None when a tile
    variable appears inside a non-linear term."""
    ids = {id(v) for v in tile_vars}
    coefs: dict[int, int] = {}
    for coef, atom in linear_form(offset).terms.values():
        if isinstance(atom, E.Var) and id(atom) in ids:
            coefs[id(atom)] = coefs.get(id(atom), 0) + coef
        elif _uses(atom, tile_vars):
            return None
    return coefs


def _disjoint_vectors(offset: E.PrimExpr, tile_vars: list[E.Var],
                      points: list[dict[E.Var, int]], lanes: int) -> bool:
    """Whether every tile point stores to its own ``lanes`` elements: ``offset`` linear in the
    tile variables, and the points' offsets at least ``lanes`` apart."""
    coefs = tile_coefficients(offset, tile_vars)
    if coefs is None:
        return False
    starts = sorted(sum(coefs.get(id(v), 0) * value for v, value in point.items())
                    for point in points)
    return all(b - a >= lanes for a, b in zip(starts, starts[1:]))


def plan_register_tile(loop: S.For, target: Target, stream_buffers: set[int],
                       matrix_tiles: bool = True) -> RegisterTilePlan | None:
    """A register-tile plan for the nest starting at ``loop`` on ``target``, or None if it
    does not qualify; on the target's matrix tiles where it maps onto them, with rows
    shorter than a tile's only where ``matrix_tiles``."""
    chain = _chain(loop)
    if len(chain) < 2:
        return None
    # The cheap structural checks first: every loop of a nest down to a vectorized one is
    # offered here, outermost first, and only the first qualifying one is planned.
    vector_loop = chain[-1]
    body = flatten_body(vector_loop.body)
    if body is None or len(body) != 1 or not isinstance(body[0], S.BufferStore):
        return None
    store = body[0]
    offset = store.buffer.offset_of(store.indices)
    # The tile: the unrolled constant loops just above the vector loop whose variables the
    # stored index uses; every loop above them is a reduction loop and must not be used.
    split = len(chain) - 1
    while split > 0 and chain[split - 1].kind is S.ForKind.UNROLLED and _is_const_loop(
            chain[split - 1]) and _uses(offset, [chain[split - 1].loop_var]):
        split -= 1
    reduce_loops, tile_loops = chain[:split], chain[split:-1]
    if not reduce_loops or any(r.kind not in (S.ForKind.SERIAL, S.ForKind.UNROLLED)
                               for r in reduce_loops):
        return None
    # Prefetch hints stay at the head of their reduction loop; inside the tile they would
    # run once per accumulator.
    if any(_leading_prefetches(t.body)[0] for t in tile_loops):
        return None
    if _uses(offset, [r.loop_var for r in reduce_loops]):
        return None
    # The lanes' variable may appear only inside load indices (a ramp value would be lost).
    if any(n is vector_loop.loop_var or isinstance(n, E.Let)
           for n in value_nodes(store.value)):
        return None
    # A tile loads every operand once, before the arithmetic: a load a select guards (an
    # index checked against the edge) would then run unguarded.
    if any(isinstance(n, E.Select) and (_has_unsafe_branch(n.true_value)
                                        or _has_unsafe_branch(n.false_value))
           for n in value_nodes(store.value)):
        return None
    self_load = _self_load(store)
    if self_load is None:
        return None
    vector = plan_vector_loop(vector_loop, target, stream_buffers)
    if vector is None or vector.streams:
        return None
    points = tile_points(tile_loops, vector_loop, vector.lanes)
    from .matrix_tiles import plan_matrix_tile  # (it reads this module's tile_coefficients)

    matrix = plan_matrix_tile(reduce_loops, tile_loops, vector_loop, vector.lanes, points,
                              store, self_load, target)
    if matrix is not None and not matrix_tiles and matrix.k_bytes < target.matrix_tile_bytes:
        matrix = None  # (a small kernel whose products take less than a whole tile row)
    if matrix is None and len(points) > max_tile_vectors(target):
        return None
    tile_vars = [t.loop_var for t in tile_loops] + [vector_loop.loop_var]
    if not _disjoint_vectors(offset, tile_vars, points, vector.lanes):
        return None
    return RegisterTilePlan(tuple(reduce_loops), tuple(tile_loops), vector_loop, vector, store,
                            self_load, partial_sum_update(store, self_load),
                            tuple(_leading_prefetches(r.body)[0] for r in reduce_loops),
                            matrix=matrix)


def partial_sum_update(store: S.BufferStore, self_load: E.BufferLoad) -> bool:
    """Whether a register tile may sum its reduction loops from zero and add the result to
    the accumulator once after them: the update is a floating-point ``acc + x`` whose ``x``
    does not read the accumulator. A K-blocked nest (the reduction split, its outer part
    outside the tile) then adds one block's partial sum at a time instead of running one
    sum through every term: pairwise at the block level, whose rounding error grows with
    the block's length rather than the whole reduction's (K-blocked direct convolutions of
    resnet50's 3x3 shapes: 0.7-1.4e-6 of the largest output per layer before, about 2e-7
    after, ``benchmarks/winograd.py``). Sums of integers (products of bytes in words) are
    the same in any order; a fresh one starts its matrix tiles at zero (``tilezero``) rather
    than loading the zeros just stored."""
    value = store.value
    if not isinstance(value, E.Add) or not (E.is_float(value.dtype) or E.is_int(value.dtype)):
        return False
    if value.a is self_load:
        rest = value.b
    elif value.b is self_load:
        rest = value.a
    else:
        return False
    return all(n is not self_load for n in E.post_order(rest))


def tile_points(tile_loops: list[S.For] | tuple[S.For, ...], vector_loop: S.For,
                 lanes: int) -> list[dict[E.Var, int]]:
    """Every (tile loop values, first lane of a vector chunk) of the tile, in loop order; the
    vector loop's value is relative to its start."""
    ranges = [range(t.min.value, t.min.value + t.extent.value) for t in tile_loops]
    ranges.append(range(0, vector_loop.extent.value, lanes))
    variables = [t.loop_var for t in tile_loops] + [vector_loop.loop_var]
    return [dict(zip(variables, values)) for values in itertools.product(*ranges)]
