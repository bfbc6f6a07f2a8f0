"""Tensor-core products in the loop IR: one warp's ``mma.sync.aligned.m16n8k8`` in TF32.

A loop of kind :attr:`~opfusion.tir.stmt.ForKind.MMA_TF32` heads the per-thread form of one
tensor-core multiply-add (:meth:`opfusion.te.Stage.tensorize` makes it)::

    for k in mma_tf32(8):        # 8 contraction steps
        for h in range(2):       # the lane's tile row g + 8 h
            for c in range(2):   # the lane's tile column 2 t4 + c
                acc[..h..c..] = acc[..h..c..] + a(h, k) * b(c, k)

inside loops bound to ``threadIdx.x`` (``t4``, extent 4) and ``threadIdx.y`` (``g``, extent 8),
so that a thread's lane in its warp is ``t4 + 4 g`` and a warp is one ``threadIdx.z``. Per
thread, the nest computes its own four elements of the warp's 16 x 8 tile, which the PTX ISA
places (the accumulator fragment of ``mma.m16n8k8``) at tile row ``g + 8 h`` and tile column
``2 t4 + c``. Which rows and columns of the product those are is the schedule's choice; the
intrinsic needs only that ``a`` reads neither ``t4`` nor ``c``, and ``b`` neither ``g`` nor ``h``.
The tile's operands are then ``A[r][k] = a(h = r // 8, k)`` at ``g = r % 8`` and
``B[k][n] = b(c = n % 2, k)`` at ``t4 = n // 2``.

The tensor core computes the whole tile from operands spread over the lanes. Lane (g, t4)
holds, each rounded to TF32 (``cvt.rna``: 10 bits of mantissa, to nearest, ties away from
zero)::

    a0 = A[g][t4]      a1 = A[g + 8][t4]      a2 = A[g][t4 + 4]      a3 = A[g + 8][t4 + 4]
    b0 = B[t4][g]      b1 = B[t4 + 4][g]

(PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32); or, in a PrimFunc built for
``-tf32=fast`` (:func:`truncates_operands`), as they are, float32 values of which the
tensor cores read the top 19 bits: truncated (PyTorch's notes on TF32: "only the first 10
bits of the input mantissa are read"; what cuBLAS and cuDNN give them).
:func:`mma_fragments` gives these six values as the nest's own expressions with its
variables substituted: ``a`` at ``h = 0, 1`` and ``k = t4, t4 + 4``; ``b`` at ``t4 := g // 2``,
``c := g % 2`` and the same ``k``. The CUDA emitter loads them and issues the instruction;
the loop-IR interpreter exchanges the same values between the lanes of a simulated warp
(:func:`warp_tile_sums`), so a schedule whose mapping disagrees with the hardware's computes
wrong numbers in its interpreter check, not only on a GPU. On a CPU the nest is an ordinary loop."""

from __future__ import annotations

import collections
import math
import struct
from dataclasses import dataclass

import numpy as np

from ..errors import TensorExprError
from . import expr as E
from . import stmt as S
from .simplify import structural_equal

#: The warp's tile: rows, columns and contraction steps of one instruction.
TILE_ROWS, TILE_COLS, TILE_STEPS = 16, 8, 8
#: Threads of a warp; the lane of ``(g, t4)`` is ``t4 + 4 g``.
WARP = 32
#: Extents of the two thread loops a nest sits in: ``t4`` on threadIdx.x, ``g`` on threadIdx.y.
LANE_X, LANE_Y = 4, 8
#: The instruction, as the CUDA emitter issues it.
INSTRUCTION = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"


@dataclass(frozen=True)
class MmaNest:
    """A nest headed by an MMA_TF32 loop, taken apart: its loop variables (``k`` the
    contraction step, ``h`` the tile-row half, ``c`` the column of the pair), the
    accumulator's store and the two factors of the update (``a`` reads ``h``, ``b`` reads
    ``c``)."""

    k: E.Var
    h: E.Var
    c: E.Var
    store: S.BufferStore
    a: E.PrimExpr
    b: E.PrimExpr


@dataclass(frozen=True)
class MmaFragments:
    """What lane (g, t4) contributes and receives: its four ``a`` and two ``b`` operands
    (float32 expressions, before the TF32 rounding) and the accumulator indices of its four
    results d0..d3 (tile (g, 2 t4), (g, 2 t4 + 1), (g + 8, 2 t4), (g + 8, 2 t4 + 1))."""

    a: tuple[E.PrimExpr, E.PrimExpr, E.PrimExpr, E.PrimExpr]
    b: tuple[E.PrimExpr, E.PrimExpr]
    acc: tuple[tuple[E.PrimExpr, ...], ...]
    buffer: E.Buffer


def _const(value: E.PrimExpr) -> int | None:
    return value.value if isinstance(value, E.IntImm) else None


def _loop(stmt: S.Stmt, extent: int, what: str) -> S.For:
    if not (isinstance(stmt, S.For) and _const(stmt.min) == 0 and _const(stmt.extent) == extent):
        raise TensorExprError(f"a tensor-core nest needs {what}: a loop of {extent} from 0, "
                              f"found {type(stmt).__name__}")
    return stmt


def _reads(expr: E.PrimExpr, var: E.Var) -> bool:
    return any(v is var for v in E.free_vars(expr))


def match_nest(loop: S.For, t4: E.Var, g: E.Var) -> MmaNest:
    """Take apart the nest ``loop`` heads (see the module docstring) for lanes ``t4`` and ``g``;
    a TensorExprError says what does not fit."""
    k = _loop(loop, TILE_STEPS, "the contraction steps").loop_var
    inner = _loop(loop.body, 2, "the tile-row halves")
    h = inner.loop_var
    innermost = _loop(inner.body, 2, "the column pairs")
    c = innermost.loop_var
    store = innermost.body
    if not isinstance(store, S.BufferStore) or store.buffer.scope != "local":
        raise TensorExprError("a tensor-core nest must update one local accumulator element")
    value = store.value
    if not isinstance(value, E.Add):
        raise TensorExprError(f"a tensor-core nest must add a product, not compute {value}")
    old, product = value.a, value.b
    if not _is_element(old, store):
        old, product = product, old
    if not _is_element(old, store) or not isinstance(product, E.Mul):
        raise TensorExprError(f"a tensor-core nest must add a product to its accumulator "
                              f"({store.buffer.name}), not compute {value}")
    x, y = product.a, product.b
    if _reads(x, c) or _reads(x, t4):
        x, y = y, x
    for factor, own, others in ((x, "h, g", (c, t4)), (y, "c, t4", (h, g))):
        if any(_reads(factor, v) for v in others) or factor.dtype != "float32":
            raise TensorExprError(
                f"a tensor-core nest's factors must be float32 and each read one side of "
                f"the tile: {factor} should read {own} only (t4 bound to threadIdx.x, g to "
                f"threadIdx.y)")
    if any(_reads(i, k) or _reads(i, t4) or _reads(i, g) for i in store.indices):
        raise TensorExprError("a tensor-core nest's accumulator index must not read the "
                              "contraction step or the lane")
    return MmaNest(k, h, c, store, x, y)


def _is_element(expr: E.PrimExpr, store: S.BufferStore) -> bool:
    return (isinstance(expr, E.BufferLoad) and expr.buffer is store.buffer
            and all(structural_equal(a, b) for a, b in zip(expr.indices, store.indices)))


def mma_fragments(nest: MmaNest, t4: E.Var, g: E.Var) -> MmaFragments:
    """Lane (g, t4)'s operands and result indices, from the nest's expressions (module
    docstring)."""
    four = E.IntImm(4, t4.dtype)

    def step(second: bool) -> E.PrimExpr:
        return E.add(t4, four) if second else t4

    def zero_or_one(v: E.Var, one: bool) -> E.PrimExpr:
        return E.IntImm(int(one), v.dtype)

    a = tuple(E.substitute(nest.a, {nest.h: zero_or_one(nest.h, half), nest.k: step(upper)})
              for upper in (False, True) for half in (False, True))
    two = E.IntImm(2, g.dtype)
    column = {t4: E.floordiv(g, two), nest.c: E.floormod(g, two)}
    b = tuple(E.substitute(nest.b, {**column, nest.k: step(upper)}) for upper in (False, True))
    acc = tuple(tuple(E.substitute(i, {nest.h: zero_or_one(nest.h, half),
                                       nest.c: zero_or_one(nest.c, odd)})
                      for i in nest.store.indices)
                for half in (False, True) for odd in (False, True))
    return MmaFragments(a, b, acc, nest.store.buffer)  # type: ignore[arg-type]


#: The PrimFunc attribute (True) of a kernel built for ``-tf32=fast``: its tensor-core nests
#: give the instruction float32 operands to truncate, rounding none.
TRUNCATES_ATTR = "tf32_truncates"


def truncates_operands(func: S.PrimFunc) -> bool:
    """Whether ``func``'s tensor-core nests truncate their operands (``-tf32=fast``) rather
    than round them to nearest: see :data:`TRUNCATES_ATTR`."""
    return bool(func.attrs.get(TRUNCATES_ATTR, False))


def tf32_exact_params(func: S.PrimFunc) -> frozenset[int]:
    """Ids of ``func``'s parameters that every call passes as constants TF32 holds exactly
    (the ``tf32`` of their facts in ``func.attrs["constant_facts"]``: a product's weights
    that RoundTF32Weights rounded at compile time)."""
    facts = func.attrs.get("constant_facts", {})
    return frozenset(id(func.params[i]) for i, fact in facts.items()
                     if getattr(fact, "tf32", False) and 0 <= i < len(func.params))


def tf32_operand_buffers(func: S.PrimFunc) -> frozenset[int]:
    """Ids of ``func``'s shared buffers that only tensor-core operands read: every load of
    one is a whole factor of a tensor-core nest, or a branch of a selection that is (the
    other branch another such load or a constant TF32 holds exactly, as a padding test's
    zero). Rounding is idempotent, so such a buffer may hold its values rounded to TF32 when
    they are stored, and the instruction then takes its operands as they are: each value is
    rounded once per copy rather than once per use, which is once per warp and tile that
    reads it. The numbers are the same either way. A tile filled by async copies
    (``cp.async``) holds its values as loaded, and is one only when they are loads of
    parameters TF32 holds exactly (:func:`tf32_exact_params`). None in a function whose
    nests truncate their operands (:func:`truncates_operands`): nothing is rounded."""
    if truncates_operands(func):
        return frozenset()
    exact = tf32_exact_params(func)
    loads: collections.Counter[int] = collections.Counter()
    as_operands: collections.Counter[int] = collections.Counter()
    shared: set[int] = set()
    copied: set[int] = set()
    lanes: dict[str, list[E.Var]] = {"threadIdx.x": [], "threadIdx.y": []}
    work: list[S.Stmt | tuple[str]] = [func.body]
    while work:
        item = work.pop()
        if isinstance(item, tuple):  # leaving a loop bound to a lane index
            lanes[item[0]].pop()
            continue
        for root in S.stmt_exprs(item):
            for node in E.post_order(root):
                if isinstance(node, E.BufferLoad):
                    loads[id(node.buffer)] += 1
        if isinstance(item, S.Allocate) and item.buffer.scope == "shared":
            shared.add(id(item.buffer))
        if isinstance(item, S.AsyncCopy) and id(item.source.buffer) not in exact:
            copied.add(id(item.buffer))  # stored as loaded: an async copy rounds nothing
        if isinstance(item, S.For) and item.kind is S.ForKind.MMA_TF32:
            try:
                nest = match_nest(item, lanes["threadIdx.x"][-1], lanes["threadIdx.y"][-1])
            except (IndexError, TensorExprError):
                pass  # not an instruction: the emitter says why
            else:
                for factor in (nest.a, nest.b):
                    for load in _selected_loads(factor) or ():
                        as_operands[id(load.buffer)] += 1
        if isinstance(item, S.For) and item.kind.value in lanes:
            lanes[item.kind.value].append(item.loop_var)
            work.append((item.kind.value,))
        work.extend(reversed(S.stmt_children(item)))
    return frozenset(b for b in shared
                     if as_operands[b] and as_operands[b] == loads[b] and b not in copied)


def holds_tf32(expr: E.PrimExpr, buffers: frozenset[int]) -> bool:
    """Whether ``expr`` is already a TF32 value: a load of one of ``buffers`` (see
    :func:`tf32_operand_buffers`; :func:`tf32_exact_params`), a selection of such, or a
    constant TF32 holds exactly."""
    loads = _selected_loads(expr)
    return loads is not None and all(id(load.buffer) in buffers for load in loads)


def _selected_loads(expr: E.PrimExpr) -> list[E.BufferLoad] | None:
    """The loads a factor selects among (a load; a Select of loads and exact constants);
    None for any other expression."""
    found: list[E.BufferLoad] = []
    work = [expr]
    while work:
        node = work.pop()
        if isinstance(node, E.BufferLoad) and node.dtype == "float32":
            found.append(node)
        elif isinstance(node, E.Select):
            work.extend((node.true_value, node.false_value))
        elif not (isinstance(node, E.FloatImm) and round_tf32(node.value) == node.value):
            return None
    return found


def round_tf32(x: float) -> float:
    """``x`` (a float32 value) rounded as ``cvt.rna.tf32.f32`` does: to 10 bits of mantissa,
    to nearest, ties away from zero; NaN and infinities unchanged."""
    if not math.isfinite(x):
        return x
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    bits = (bits + 0x1000) & 0xFFFFE000  # the magnitude rounds; the sign bit is untouched
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def truncate_tf32(x: float) -> float:
    """``x`` (a float32 value) as the tensor cores read a float32 operand: its low 13
    mantissa bits dropped (toward zero); NaN and infinities unchanged."""
    if not math.isfinite(x):
        return x
    bits = struct.unpack("<I", struct.pack("<f", x))[0] & 0xFFFFE000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def truncate_tf32_array(values: np.ndarray) -> np.ndarray:
    """:func:`truncate_tf32` of every value of a float32 array (a new array)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32) & np.uint32(0xFFFFE000)
    return np.where(np.isfinite(values), bits.view(np.float32), values)


def round_tf32_array(values: np.ndarray) -> np.ndarray:
    """:func:`round_tf32` of every value of a float32 array (a new array)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = (values.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)
    return np.where(np.isfinite(values), bits.view(np.float32), values)


def tf32_exact_array(values: np.ndarray) -> bool:
    """Whether TF32 holds every value of a float32 array exactly (its low 13 mantissa bits
    clear; NaN and infinities count as held): :func:`round_tf32_array` would keep it."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    inexact = (bits & np.uint32(0x1FFF)) != 0
    return not bool(np.any(inexact & np.isfinite(values)))


def warp_tile_sums(fragments: dict[int, tuple[list[float], list[float]]], g: int, t4: int
                   ) -> list[float]:
    """What the tensor core adds to lane (g, t4)'s four results, from every lane's
    fragments (lane -> (a0..a3, b0..b1), TF32-rounded): sum over k of A[r][k] * B[k][n] at
    its tile positions, with ``A`` and ``B`` gathered from the lanes that hold them."""
    sums = []
    for q in range(4):
        row, col = g + 8 * (q >> 1), 2 * t4 + (q & 1)
        total = 0.0
        for k in range(TILE_STEPS):
            a = fragments[(row % 8) * 4 + k % 4][0][(row >= 8) + 2 * (k >= 4)]
            b = fragments[col * 4 + k % 4][1][int(k >= 4)]
            total += a * b
        sums.append(total)
    return sums


__all__ = ["INSTRUCTION", "LANE_X", "LANE_Y", "TILE_COLS", "TILE_ROWS", "TILE_STEPS", "WARP",
           "MmaFragments", "MmaNest", "holds_tf32", "match_nest", "mma_fragments",
           "TRUNCATES_ATTR", "round_tf32", "round_tf32_array", "tf32_exact_array",
           "tf32_exact_params", "tf32_operand_buffers", "truncate_tf32", "truncate_tf32_array",
           "truncates_operands",
           "warp_tile_sums"]
