"""GPU products on tensor cores (nn.dense, nn.matmul, nn.batch_matmul in float32, TF32
arithmetic): warp tiles of ``mma.sync`` m16n8k8, operands staged in shared memory.

Taken only for a target with ``-tf32=1`` (:attr:`opfusion.target.Target.allow_tf32`): the
products' operands are rounded to TF32, 10 bits of mantissa, as PyTorch's ``allow_tf32``
and cuDNN's default convolutions round theirs. Elsewhere, and for shapes whose rows, columns
or contraction the tiles do not divide, products take :mod:`.matmul`'s float32 tiles.

A block computes ``warps_m * tiles_m * 16`` rows x ``warps_n * tiles_n * 8`` columns of the
result (``blockIdx.y``, ``blockIdx.x``; batches on ``blockIdx.z``) with ``warps_m * warps_n``
warps (``threadIdx.z``), each ``tiles_m x tiles_n`` tensor-core tiles of 16 x 8. In a warp,
lane ``t4 + 4 g`` (``threadIdx.x`` = t4 of 4, ``threadIdx.y`` = g of 8) owns the
``2 tiles_m`` consecutive rows from ``2 tiles_m g`` and the ``2 tiles_n`` consecutive columns
from ``2 tiles_n t4`` of its warp's tile: in tile ``(mi, ni)``, the instruction's row ``g + 8 h``
is the warp's row ``2 tiles_m g + 2 mi + h`` and its column ``2 t4 + c`` the warp's column
``2 tiles_n t4 + 2 ni + c`` (:mod:`opfusion.tir.mma`: any such mapping is one the
instruction can compute, and a lane's results are then one register tile). The contraction
runs in steps of ``k_step``: the block copies its rows of the left operand and columns of
the right one for the step into shared memory together, waits at a barrier, and each warp
issues ``k_step / 8`` instructions per tile. The elementwise epilogue runs on each lane's
registers before the store.

With ``double_buffer`` the block keeps two of each tile: each thread loads its share of the
next step's tiles into registers before this step's instructions and stores it into the
other tiles after them, so the loads' latency hides behind the instructions and a step
waits at one barrier instead of two (:mod:`opfusion.tir.pipeline`).

With ``async_stages`` (2 or 3) the block keeps that many of each tile instead, filled by
async copies (``cp.async``) up to ``async_stages - 1`` steps ahead of the step it computes
with, global to shared memory without the threads' registers
(:func:`opfusion.tir.pipeline.async_pipeline_loop`); such a tile holds its values as loaded,
so the instruction rounds them as it reads them, unless they are a constant rounded to TF32
when the model was built (``RoundTF32Weights``).

Knobs: ``warps_m``, ``warps_n`` (1, 2, 4), ``tiles_m`` (1, 2, 4), ``tiles_n`` (1, 2, 4, 8),
``k_step`` (8, 16, 32), ``shared``, ``double_buffer``, ``async_stages`` (0, 2, 3); a point must
tile the product exactly, with blocks of at most the target's threads and tiles that fit the
shared memory a block may opt in to (``Target.max_dynamic_shared_memory_per_block``: past 48
KiB a kernel takes dynamic shared memory) as lowering lays them out
(:func:`shared_tile_floats`). The heuristic keeps to 48 KiB (:func:`_measured_budget`)."""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

from .... import te
from ....target import Target
from ....tir import expr as E
from ....tir import mma
from ....tir.mma import LANE_X, LANE_Y, TILE_COLS, TILE_ROWS, TILE_STEPS
from ...schedule_rule import Config, ConfigSpace, Knob, KnobValue, ScheduleError, ScheduleRule
from .default import DEFAULT_THREADS, accumulator_and_owner, arrange_elementwise
from .matmul import MAX_GRID_Z, _batch, _operands, _takes


class GPUMmaRule(ScheduleRule):
    """Tensor-core products: see the module docstring."""

    name = "gpu_mma"
    ops = ("nn.dense", "nn.matmul", "nn.batch_matmul")

    def space(self, anchor: Any, output: Any, target: Target) -> ConfigSpace | None:
        if not target.allow_tf32 or not _takes(anchor, output) or not _float32(anchor):
            return None
        rows, cols = (int(d) for d in anchor.shape[-2:])
        depth = int(anchor.op.reduce_axis[0].dom.extent)
        limit = target.max_threads_per_block
        shared_bytes = target.max_dynamic_shared_memory_per_block
        copy_floats = shared_copies(anchor)

        def fits(c: dict[str, KnobValue]) -> bool:
            block_rows, block_cols = _block(c)
            threads = LANE_X * LANE_Y * int(c["warps_m"]) * int(c["warps_n"])
            tiles = 4 * copy_floats(c)
            return (rows % block_rows == 0 and cols % block_cols == 0
                    and depth % int(c["k_step"]) == 0 and threads <= limit
                    and rows // block_rows <= MAX_GRID_Z
                    and pipelines_once(c)
                    and (not c["shared"] or tiles <= shared_bytes))

        fits.__doc__ = "tiles that divide the product, blocks and shared tiles the GPU allows"
        space = ConfigSpace(self.name, [
            Knob("warps_m", (1, 2, 4), "warps along the rows of a block"),
            Knob("warps_n", (1, 2, 4), "warps along the columns of a block"),
            Knob("tiles_m", (1, 2, 4), "16-row tensor-core tiles of each warp"),
            Knob("tiles_n", (1, 2, 4, 8), "8-column tensor-core tiles of each warp"),
            Knob("k_step", (8, 16, 32), "contraction steps per shared-memory stage"),
            Knob("shared", (True, False), "stage the operands' tiles in shared memory"),
            DOUBLE_BUFFER,
            ASYNC_STAGES,
        ], fits)
        return None if space.is_empty() else space

    def default_config(self, anchor: Any, output: Any, target: Target) -> Config:
        space = self.space(anchor, output, target)
        assert space is not None
        rows, cols = (int(d) for d in anchor.shape[-2:])
        batch = _batch(anchor)
        fitting = [space.config(**t) for t in _TILES
                   if _in(space, t) and _measured_budget(t, target)]
        if not fitting:  # a small or oddly sized product: the first point of the space
            return next(iter(space))
        # The largest tile that still gives every multiprocessor a block, else the one
        # that gives the most blocks (double-buffered where it fits: it comes first).
        for config in fitting:
            block_rows, block_cols = _block(config)
            if batch * (rows // block_rows) * (cols // block_cols) >= target.multiprocessors:
                return config
        return next(c for c in fitting if _block(c) == _block(fitting[-1]))

    def apply(self, s: te.Schedule, anchor: Any, output: Any, target: Target,
              config: Config) -> None:
        arrange_mma_product(s, anchor, output, int(config["warps_m"]), int(config["warps_n"]),
                            int(config["tiles_m"]), int(config["tiles_n"]),
                            int(config["k_step"]), bool(config["shared"]),
                            bool(config["double_buffer"]), int(config["async_stages"]))
        arrange_elementwise(s, DEFAULT_THREADS)


#: Both tensor-core rules' knob for two of each shared tile (:func:`stage_in_shared`).
DOUBLE_BUFFER = Knob("double_buffer", (True, False),
                     "load the next step's tiles while this step computes (two of each tile)")

#: Both tensor-core rules' knob for tiles filled by async copies, steps ahead
#: (:func:`stage_in_shared`); every TF32 target (sm_80 and later) has them.
ASYNC_STAGES = Knob("async_stages", (0, 2, 3),
                    "steps of shared tiles in flight, filled by async copies (cp.async) up "
                    "to stages - 1 steps ahead; 0: copies through registers")


def tile_copies(c: Mapping[str, KnobValue]) -> int:
    """How many of each shared tile a config keeps: its async stages, two double-buffered,
    else one."""
    return max(int(c["async_stages"]), 2 if c["double_buffer"] else 1)


def pipelines_once(c: Mapping[str, KnobValue]) -> bool:
    """Whether a config asks for at most one way of pipelining its copies, and only with
    shared tiles."""
    double, stages = bool(c["double_buffer"]), int(c["async_stages"])
    if double and stages:
        return False
    return bool(c["shared"]) or not (double or stages)

#: The heuristic's tiles, largest first: blocks of 4 warps from 128 x 128 down, each double
#: buffered where two of its tiles fit; the small ones take 32 steps a stage where the
#: contraction allows, so that a stage has four instructions a warp to hide the next one's
#: loads behind, not one (untuned; on an H200 the 4096-row products took 2 x 2 x 2 x 4 with 32
#: steps and ran at 64-72 TFLOP/s, a fifth of cuBLAS in TF32).
_TILES = tuple(
    {"warps_m": wm, "warps_n": wn, "tiles_m": tm, "tiles_n": tn, "k_step": k, "shared": True,
     "double_buffer": double, "async_stages": 0}
    for wm, wn, tm, tn, k in ((2, 2, 4, 8, 16), (2, 2, 2, 4, 32), (2, 2, 2, 4, 16),
                              (2, 2, 1, 2, 16), (2, 2, 1, 1, 16), (2, 1, 1, 1, 32),
                              (2, 1, 1, 1, 16), (1, 1, 1, 1, 32), (1, 1, 1, 1, 8))
    for double in (True, False))


def _measured_budget(c: Mapping[str, KnobValue], target: Target) -> bool:
    """Whether a config fits the shared memory the heuristic budgets for it: its tiles with
    31 words of padding a row and step, the most bank alignment adds. The space admits the
    tiles that fit as laid out (less padding), larger ones among them; the heuristic keeps
    to the budget under which its tiles were measured (an H200, 2026-11-29)."""
    return not c["shared"] or _budget_bytes(c) <= target.max_shared_memory_per_block


def shared_copies(anchor: Any) -> Callable[[Mapping[str, KnobValue]], int]:
    """For a product the rule takes: the elements of a config's shared copies of the two
    operands' tiles, as lowering lays them out (:func:`shared_tile_floats`; an operand read
    otherwise than by rows, columns and steps, as the heuristic budgets it)."""
    roles = [operand_roles(anchor, t) for t in list(anchor.op.input_tensors)[:2]]

    def floats(c: Mapping[str, KnobValue]) -> int:
        if any(r is None for r in roles):
            return _budget_bytes(c) // 4
        rows, cols = _block(c)
        block = {"rows": rows, "cols": cols, "k": int(c["k_step"])}
        tiles = (int(c["tiles_m"]), int(c["tiles_n"]))
        return sum(shared_tile_floats(r, tiles, [block.get(role, 1) for role in r], None,
                                      tile_copies(c)) for r in roles)  # type: ignore[union-attr]

    return floats


def _budget_bytes(c: Mapping[str, KnobValue]) -> int:
    """The shared bytes of a config's tiles with 31 words of padding a row and step."""
    block_rows, block_cols = _block(c)
    k_step = int(c["k_step"])
    return ((block_rows + block_cols) * k_step
            + (BANKS - 1) * (block_rows + block_cols + k_step)) * 4 * tile_copies(c)


def _in(space: ConfigSpace, values: dict[str, KnobValue]) -> bool:
    try:
        space.check(values)
    except ScheduleError:
        return False
    return True


def _block(config: Any) -> tuple[int, int]:
    """(rows, columns) of a block's tile."""
    return (int(config["warps_m"]) * int(config["tiles_m"]) * TILE_ROWS,
            int(config["warps_n"]) * int(config["tiles_n"]) * TILE_COLS)


def _float32(anchor: Any) -> bool:
    return anchor.dtype == "float32" and all(t.dtype == "float32"
                                             for t in anchor.op.input_tensors)


def arrange_mma_product(s: te.Schedule, anchor: Any, output: Any, warps_m: int, warps_n: int,
                        tiles_m: int, tiles_n: int, k_step: int, shared: bool,
                        double_buffer: bool = False, async_stages: int = 0) -> None:
    """The tiling of the module docstring with explicit knobs (they must divide the
    product: see the space)."""
    acc, owner = accumulator_and_owner(s, anchor, output)
    *batch, i, j = owner.op.axis
    io, ii = owner.split(i, factor=warps_m * tiles_m * TILE_ROWS)
    wi, i1 = owner.split(ii, factor=tiles_m * TILE_ROWS)
    g, rows = owner.split(i1, factor=tiles_m * 2)  # lane row g: 2 tiles_m consecutive rows
    jo, ji = owner.split(j, factor=warps_n * tiles_n * TILE_COLS)
    wj, j1 = owner.split(ji, factor=tiles_n * TILE_COLS)
    t4, cols = owner.split(j1, factor=tiles_n * 2)
    owner.reorder(*batch, io, jo, wi, wj, g, t4, rows, cols)
    if batch:
        owner.bind(owner.fuse(*batch) if len(batch) > 1 else batch[0], "blockIdx.z")
    owner.bind(io, "blockIdx.y")
    owner.bind(jo, "blockIdx.x")
    owner.bind(owner.fuse(wi, wj), "threadIdx.z")
    owner.bind(g, "threadIdx.y")
    owner.bind(t4, "threadIdx.x")
    stage = s[acc]
    stage.compute_at(owner, t4)
    *_, ai, aj = stage.op.axis
    (k,) = stage.op.reduce_axis
    ko = tensorize_tiles(stage, ai, aj, k, k_step)
    if shared:
        block = {"rows": warps_m * tiles_m * TILE_ROWS, "cols": warps_n * tiles_n * TILE_COLS,
                 "k": k_step}
        stage_in_shared(s, acc, _operands(acc), stage, ko, warps_m * warps_n,
                        (tiles_m, tiles_n), lambda _, role, __: block.get(role, 1),
                        double_buffer=double_buffer, async_stages=async_stages)


def tensorize_tiles(stage: te.Stage, rows: Any, cols: Any, k: Any, k_step: int,
                    outer_reduce: tuple[Any, ...] = ()) -> Any:
    """A lane's accumulating stage (computed at its ``t4`` loop, ``rows`` and ``cols`` its
    2 tiles_m rows and 2 tiles_n columns) as tensor-core instructions: pairs of rows and of
    columns inside the 8-step contraction loop, tensorized; the contraction ``k`` in steps
    of ``k_step`` (outside them any ``outer_reduce`` loops, a window's). Returns the step
    loop (where shared copies go)."""
    mi, h = stage.split(rows, factor=2)
    ni, c = stage.split(cols, factor=2)
    ko, kr = stage.split(k, factor=k_step)
    kk, k8 = stage.split(kr, factor=TILE_STEPS)
    stage.reorder(ko, *outer_reduce, kk, mi, ni, k8, h, c)
    for loop in (kk, mi, ni):  # constant register indices: the accumulators stay registers
        stage.unroll(loop)
    stage.tensorize(k8, "mma_tf32")
    return ko


def stage_in_shared(s: te.Schedule, acc: Any, operands: list[Any], stage: te.Stage,
                    step: Any, warps: int, tiles: tuple[int, int],
                    extent: Callable[[Any, str, int], int],
                    axes: tuple[int, int] = (-2, -1), double_buffer: bool = False,
                    async_stages: int = 0, aligned: tuple[Any, ...] = ()) -> None:
    """Copy each of ``operands``' tiles that ``acc`` reads in a contraction step into shared
    memory at ``step``, by the whole block together, each tile's rows spaced so that a
    warp's operand loads meet the fewest bank conflicts (:func:`bank_offset`). ``tiles``:
    (tiles_m, tiles_n); ``extent(operand, role, dim)``: the tile's extent along a dimension
    of an operand with a role (``rows``, ``cols``, ``k`` or ``other``); ``axes``: which of
    ``acc``'s axes are the tile's rows and columns; ``double_buffer``: two of each tile,
    the next step's loaded while this one's computes (:meth:`te.Stage.double_buffer`);
    ``async_stages`` (2 or more): that many of each tile, filled by async copies up to
    ``async_stages - 1`` steps ahead (:meth:`te.Stage.async_pipeline`); ``aligned``: the
    operands whose tile's innermost dimension of role ``other`` starts at a multiple of 4
    elements (a 1x1 convolution's pixels), copied in vectors where it is whole vectors
    long (:func:`copy_vector`)."""
    for operand in operands:
        # before the copy replaces the operand in the accumulating stage
        roles = operand_roles(s[acc].op.output(0), operand, axes)
        copy = s.cache_read(operand, "shared", [acc])
        s[copy].compute_at(stage, step)
        vector = 1
        if roles is not None:
            extents = [extent(operand, r, d) for d, r in enumerate(roles)]
            align_rows(s[copy], roles, tiles, extents)
            vector = copy_vector(roles, extents, [int(d) for d in operand.shape],
                                 any(operand is a for a in aligned))
        warp_copy(s[copy], warps, vector=vector)
        if async_stages:
            s[copy].async_pipeline(async_stages)
        elif double_buffer:
            s[copy].double_buffer()


#: Shared memory's banks, 4 bytes each: a warp's loads of different words of one bank
#: are served one after another.
BANKS = 32


def operand_roles(acc: Any, operand: Any, axes: tuple[int, int] = (-2, -1)
                  ) -> list[str] | None:
    """What each dimension of ``operand`` stands for in the accumulating stage ``acc`` (its
    ``axes`` the tile's rows and columns, its first reduction axis the contraction):
    ``rows``, ``cols``, ``k`` or ``other``, from the one read of it; None when it is read
    otherwise."""
    op = acc.op
    rows, cols = op.axis[axes[0]], op.axis[axes[1]]
    k = op.reduce_axis[0]
    loads = te.reads_of(op, operand)
    if len(loads) != 1:
        return None
    roles = []
    for index in loads[0].indices:
        used = E.free_vars(index)
        found = [role for role, axis in (("k", k), ("rows", rows), ("cols", cols))
                 if any(v is axis.var for v in used)]
        roles.append(found[0] if len(found) == 1 else "other")
    return roles if roles.count("k") == 1 and roles.count("other") < len(roles) - 1 else None


def align_rows(stage: te.Stage, roles: list[str], tiles: tuple[int, int],
               extents: list[int]) -> None:
    """Pad the outer of a shared tile's two dimensions that a warp's loads vary along (the
    tile's row or column, and its contraction step) to the stride of :func:`bank_offset`."""
    found = row_alignment(tuple(roles), tiles, tuple(extents))
    if found is not None:
        outer, offset = found
        stage.storage_align(stage.op.axis[outer], BANKS, offset)


@functools.lru_cache(maxsize=4096)
def row_alignment(roles: tuple[str, ...], tiles: tuple[int, int], extents: tuple[int, ...]
                  ) -> tuple[int, int] | None:
    """(the dimension :func:`align_rows` pads, its stride modulo :data:`BANKS`) for a
    shared tile of these ``roles`` and ``extents``; None when it pads none."""
    if "rows" in roles:
        side, dim = "rows", roles.index("rows")
    elif "cols" in roles:
        side, dim = "cols", roles.index("cols")
    else:
        return None
    k = roles.index("k")
    outer, inner = min(dim, k), max(dim, k)
    coords, steps = lane_coordinates(side, tiles[0] if side == "rows" else tiles[1])
    a, b = (coords, steps) if outer == dim else (steps, coords)
    inner_stride = math.prod(extents[inner + 1:])
    dense = math.prod(extents[outer + 1:])
    return outer, bank_offset(tuple(a), tuple(b), inner_stride, dense)


def shared_tile_floats(roles: list[str] | None, tiles: tuple[int, int], extents: list[int],
                       shape: list[int] | None = None, copies: int = 1) -> int:
    """Elements a shared tile takes as lowering lays it out, padded by :func:`align_rows`
    for these ``roles``, ``tiles`` and ``extents`` (``roles`` None: unpadded): ``shape`` its
    buffer's shape where bound inference makes it smaller than ``extents`` (a window
    clamped to the image), ``copies`` the steps a pipeline keeps. The padded dimension's
    stride is the smallest at least its dense one with the bank offset; a step's copies
    follow each other at its padded span; the last element ends the tile."""
    shape = list(extents) if shape is None else shape
    found = None if roles is None else row_alignment(tuple(roles), tiles, tuple(extents))
    if found is None:
        return math.prod(shape) * copies
    outer, offset = found
    dense = math.prod(shape[outer + 1:])
    stride = dense + (offset - dense) % BANKS
    rows = math.prod(shape[:outer + 1])
    return (copies - 1) * rows * stride + (rows - 1) * stride + dense


def lane_coordinates(side: str, tiles: int) -> tuple[list[int], list[int]]:
    """Each lane's coordinate along its side of the tile and its contraction step, in its
    first operand load of a tensor-core step: the rows side (the left operand) row
    ``2 tiles g`` and step ``t4``; the columns side column ``2 tiles (g // 2) + g % 2``
    and step ``t4`` (:mod:`opfusion.tir.mma`, with this module's lane mapping)."""
    lanes = [(lane >> 2, lane & 3) for lane in range(mma.WARP)]
    if side == "rows":
        coords = [2 * tiles * g for g, _ in lanes]
    else:
        coords = [2 * tiles * (g // 2) + g % 2 for g, _ in lanes]
    return coords, [t4 for _, t4 in lanes]


@functools.lru_cache(maxsize=256)
def bank_offset(outer: tuple[int, ...], inner: tuple[int, ...], inner_stride: int,
                dense: int) -> int:
    """The stride modulo :data:`BANKS` for a tile's outer dimension under which the lanes'
    words (``outer`` and ``inner`` coordinates, the inner dimension's stride
    ``inner_stride``) fall on the fewest words per bank; of those, the one that pads the
    dense stride ``dense`` least. A [rows x 16] tile read by rows 2 g apart and steps t4:
    a dense stride of 16 puts all eight rows on the same four banks (8 loads a bank), 18
    puts each lane on its own."""
    best: tuple[tuple[int, int], int] | None = None
    for offset in range(BANKS):
        banks = collections.Counter((a * offset + b * inner_stride) % BANKS
                                    for a, b in zip(outer, inner))
        key = (max(banks.values()), (offset - dense) % BANKS)
        if best is None or key < best[0]:
            best = (key, offset)
    assert best is not None
    return best[1]


#: float32 elements of one 16-byte access: a copy's vector.
VECTOR = 4


def copy_vector(roles: list[str], extents: list[int], shape: list[int],
                aligned_other: bool = False) -> int:
    """How many consecutive elements a thread copies of a shared tile (``roles`` and
    ``extents`` of its dimensions) from an operand of ``shape``: :data:`VECTOR`, one
    16-byte load, where the tile's innermost dimension longer than one is a contraction
    step, row or column run (starting at a multiple of 8; with ``aligned_other``, a
    dimension of role ``other`` too, which the caller knows to start at a multiple of 4),
    whole vectors long and contiguous in the operand, whose rows are whole vectors too;
    else 1. The CUDA emitter checks the alignment again and loads element by element where
    it cannot prove it."""
    inner = max((d for d, e in enumerate(extents) if e > 1), default=None)
    if inner is None or roles[inner] not in ("k", "rows", "cols", *(("other",) * aligned_other)):
        return 1
    contiguous = all(d == 1 for d in shape[inner + 1:])
    whole = extents[inner] % VECTOR == 0 and shape[inner] % VECTOR == 0
    return VECTOR if contiguous and whole else 1


def warp_copy(stage: te.Stage, warps: int, axes: list[Any] | None = None,
              vector: int = 1) -> Any:
    """The block's threads copy a tile together, its elements in order, thread after thread
    (lanes in x, then y, then warps in z), as many rounds as it takes; ``axes``: the
    stage's loops that span the tile (default: all its axes); ``vector``: each thread
    copies that many consecutive elements at a time (a vectorized loop: one 16-byte load
    of 4, :func:`copy_vector`), the tile's size a multiple of it. Returns the loop bound
    to ``threadIdx.x``, inside which a thread's step is."""
    axes = list(stage.op.axis) if axes is None else axes
    lanes = None
    if vector > 1 and int(axes[-1].dom.extent) % vector == 0:
        # the vector a split of the last axis itself, so that a stage computed inside a
        # thread's step (a staged epilogue's registers) is bounded to the vector's elements
        outer, lanes = stage.split(axes[-1], factor=vector)
        axes = [*axes[:-1], outer]
    fused = stage.fuse(*axes) if len(axes) > 1 else axes[0]
    if vector > 1 and lanes is None:
        fused, lanes = stage.split(fused, factor=vector)
    _, inside = stage.split(fused, factor=warps * LANE_X * LANE_Y)  # the rounds, serial
    tz, lane = stage.split(inside, factor=LANE_X * LANE_Y)
    ty, tx = stage.split(lane, factor=LANE_X)
    stage.bind(tz, "threadIdx.z")
    stage.bind(ty, "threadIdx.y")
    stage.bind(tx, "threadIdx.x")
    if lanes is not None:
        stage.vectorize(lanes)
    return tx
