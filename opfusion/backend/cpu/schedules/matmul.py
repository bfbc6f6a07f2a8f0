"""The matrix-product rules (nn.dense, nn.matmul, nn.batch_matmul), one per form of the
compute (see :mod:`opfusion.topi.nn`):

- ``matmul_dot``: both operands run along the contraction; ``rows`` x ``cols`` tiles of
  lane-interleaved partial sums (rows*cols vectors) over the whole depth, then the lanes
  summed;
- ``matmul_plain``: ``rows`` rows x ``cols`` columns of the result in vectors (outer
  products), the reduction outside, unrolled by ``k_unroll``; the right operand read from
  column panels when the compute packed it or PackMatmulWeights packed it at compile time
  (``nn.matmul_packed``; ``cols`` is then the panel width).

In both, column tiles go in blocks of ``block`` that keep their part of the right operand in
L2 while every row tile passes. A product without a reduction (depth 0) takes neither: the
default schedule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .... import te
from ....target import Target
from ....topi.nn import (
    MATMUL,
    MATMUL_CROP,
    MATMUL_DOT,
    MATMUL_PACK,
    MATMUL_PARTIAL,
    matrix_tile_runs,
)
from ...schedule_rule import Config, ConfigSpace, Knob, ScheduleRule
from .common import (
    accumulators,
    arrange_rest,
    divisor,
    divisors,
    is_reduction,
    itemsize,
    l2_fraction,
    owner_of,
    parallel_outer,
    powers_of_two_and,
    producer,
    tensor_size,
)

PRODUCTS = ("nn.dense", "nn.matmul", "nn.batch_matmul", "nn.matmul_packed")


def block_bytes(target: Target) -> int:
    """Bytes of right-operand rows a block of column tiles keeps in the per-core L2: 3/16 of
    it (192 KiB of a 1 MiB L2)."""
    return l2_fraction(target, 3)


def product_accumulators(target: Target) -> int:
    """Twice the rows of a product's default register tile: half the vector registers (8
    with AVX2's 16, so 4 rows; 16 with AVX-512's 32, so 8 rows). The tile's columns are a
    packed panel's (:func:`opfusion.topi.nn.panel_vectors`: three vectors where they divide
    the columns, else two), so 4 x 3 = 12 sums with AVX2 and 8 x 3 = 24 with AVX-512. Unlike
    a convolution's tile, whose wider forms ran slower on Zen 4, a product's 8 x 2 tile loads
    8 broadcasts and 2 weight vectors for 16 multiply-adds; ``opf.tune`` chose it for every
    product of the BERT layer on a Xeon with AVX-512 (1.794 -> 1.528 ms for the 768 x 2304
    one), and ``benchmarks/ab_checkouts.py`` timed bert_layer 0.879x, gpt_block 0.908x and
    the transformer_encoder workload 0.888x the time of 4 x 2; 8 x 3: vit_b_16 0.952x,
    bert_layer 0.975x, gpt_block 0.957x the time of 8 x 2. AVX2 code on the same Xeon: 4 x 3
    tiles 0.875x the BERT layer's time of 4 x 2, 6 x 2 level with 4 x 2."""
    return max(accumulators(target), target.vector_registers // 2)


def _rows_cols(anchor: te.Tensor) -> tuple[int | None, int]:
    """The result's row count (None for a rank-1 result) and column count."""
    shape = [int(d) for d in anchor.shape]
    m = shape[-2] if len(shape) >= 2 else None
    n = shape[-1] if shape else 1
    return m, n


def _whole_blocks(n: int, cols: int, fit: int) -> int:
    """Column tiles per block: at most ``fit`` (what L2 holds), and a divisor of the row's
    tiles, so that no block is partial (a partial one guards its tiles' columns, which then
    run without a register tile: BERT-large's 1024 columns in blocks of 3 ran at 25-35
    GFLOP/s instead of 160)."""
    return divisor(-(-n // cols), max(1, fit))


def _block_knob(n: int, default: int) -> Knob:
    return Knob("block", powers_of_two_and(n, default),
                "column tiles per block that every row tile passes while it is in L2")


class MatmulDotRule(ScheduleRule):
    """The dot form: tiles of lane-interleaved partial sums, the lanes summed last."""

    name = "matmul_dot"
    ops = PRODUCTS

    def space(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> ConfigSpace | None:
        if anchor.op.tag != MATMUL_DOT or producer(anchor, MATMUL_PARTIAL) is None:
            return None
        m, n = _rows_cols(anchor)
        registers = target.vector_registers

        def fits(config: Mapping[str, Any]) -> bool:
            """rows*cols partial-sum vectors fit the vector registers"""
            return config["rows"] * config["cols"] <= registers

        return ConfigSpace(self.name, [
            Knob("rows", divisors(m, registers) if m is not None and anchor.shape else (1,),
                 "result rows of a tile (unrolled)"),
            Knob("cols", divisors(n, registers) if anchor.shape else (1,),
                 "result columns of a tile (unrolled)"),
            _block_knob(n, self._defaults(anchor, target)[2]),
        ], fits)

    def _defaults(self, anchor: te.Tensor, target: Target) -> tuple[int, int, int]:
        partial = producer(anchor, MATMUL_PARTIAL)
        assert partial is not None
        m, n = _rows_cols(anchor)
        if not anchor.shape:
            return 1, 1, 1
        depth = int(partial.op.reduce_axis[0].dom.extent) * int(partial.shape[-1])
        budget = accumulators(target)  # rows*cols vectors of partial sums
        rows = divisor(m, budget // 2) if m is not None else 1
        cols = divisor(n, budget // rows)
        block = _whole_blocks(n, cols,
                              block_bytes(target) // (depth * itemsize(partial) * cols))
        return rows, cols, block

    def default_config(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> Config:
        rows, cols, block = self._defaults(anchor, target)
        space = self.space(anchor, output, target)
        assert space is not None
        return space.config(rows=rows, cols=cols, block=block)

    def apply(self, s: te.Schedule, anchor: te.Tensor, output: te.Tensor, target: Target,
              config: Config) -> None:
        dot_tiles(s, anchor, output, int(config["rows"]), int(config["cols"]),
                  int(config["block"]))
        arrange_rest(s)


class MatmulPlainRule(ScheduleRule):
    """The plain form: outer products into a register tile of result vectors."""

    name = "matmul_plain"
    ops = PRODUCTS

    def space(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> ConfigSpace | None:
        anchor = product_of(anchor)
        if anchor.op.tag == MATMUL_DOT or not is_reduction(anchor):
            return None
        m, n = _rows_cols(anchor)
        lanes = target.vector_lanes(anchor.dtype)
        registers = target.vector_registers
        panels = panel_columns(anchor)
        if not anchor.shape:
            rows, cols = (1,), (1,)
        else:
            rows = divisors(m, registers) if m is not None else (1,)
            # Packed panels fix the tile's columns (a tile reads one panel).
            cols = (panels,) if panels else divisors(n, registers * lanes)

        matrix = on_matrix_tiles(anchor, target)

        def fits(config: Mapping[str, Any]) -> bool:
            """rows x cols result vectors fit the vector registers (on matrix tiles: its
            tiles of sums, with one tile of each operand, fit the tiles)"""
            vectors = -(-config["cols"] // lanes)
            if matrix:
                runs = matrix_tile_runs(config["rows"], target.matrix_tile_rows)
                return runs > 0 and runs * vectors + 2 <= target.matrix_tiles
            return config["rows"] * vectors <= registers

        return ConfigSpace(self.name, [
            Knob("rows", rows, "result rows of a tile (unrolled)"),
            Knob("cols", cols, "result columns of a tile (vectorized)"),
            Knob("k_unroll", (1, 2, 4, 8, 16) if matrix else (1, 2, 4, 8),
                 "steps of the reduction unrolled (on matrix tiles: words a product takes)"),
            _block_knob(n, self._defaults(anchor, target)[2]),
            Knob("prefetch", (0, 1) if _constant_panels(anchor) is not None else (0,),
                 "prefetch the next block of weight panels into L2 while this one runs"),
        ], fits)

    def _defaults(self, anchor: te.Tensor, target: Target) -> tuple[int, int, int]:
        anchor = product_of(anchor)
        m, n = _rows_cols(anchor)
        if not anchor.shape:
            return 1, 1, 1
        lanes = target.vector_lanes(anchor.dtype)
        depth = int(anchor.op.reduce_axis[0].dom.extent)
        panels = panel_columns(anchor)
        if panels:  # the tiles are the panels' columns
            cols = panels
        elif n % (2 * lanes) == 0:
            cols = 2 * lanes
        else:
            cols = lanes if n % lanes == 0 else divisor(n, 2 * lanes)
        # budget/2 rows x 2 vectors of columns (see :func:`product_accumulators`), and no
        # more rows than leave a panel's vectors in the registers: a few rows' panels are as
        # wide as the budget (:func:`opfusion.topi.nn.few_rows_panel_width`: 8 vectors for a
        # tile of one row, which 5 rows on AVX-512 have), and 5 x 8 sums did not fit.
        vectors = -(-cols // lanes)
        most = min(product_accumulators(target) // 2, target.vector_registers // vectors)
        rows = divisor(m, max(1, most)) if m is not None else 1
        if rows == 1 and not panels and n % lanes == 0:
            # One row (a matrix-vector product): the whole budget along the columns, or its
            # 2 chains of sums wait on the multiply-add latency (1 x 768 x 3072, timed alone:
            # 14 -> 36 GFLOP/s with 8 vectors).
            cols = lanes * divisor(n // lanes, accumulators(target))
        block = _whole_blocks(n, cols,
                              block_bytes(target) // (max(depth, 1) * itemsize(anchor) * cols))
        return rows, cols, block

    def default_config(self, anchor: te.Tensor, output: te.Tensor, target: Target) -> Config:
        rows, cols, block = self._defaults(anchor, target)
        space = self.space(anchor, output, target)
        assert space is not None
        # 8-row tiles unroll the contraction by 8 (the tuner's choice for BERT's products on
        # AVX-512: bert_layer 0.92-0.94x the time of an unroll by 4).
        prefetch = space.knob("prefetch").values[-1]
        if prefetch:
            # Panels packed at compile time, prefetched a block ahead: blocks of one panel.
            # The panel stays in L2 while the row tiles pass over it, and the next one (a
            # panel, not a block of several) arrives in L2 while they do. Found by opf.tune
            # with cold caches on ViT-B/16 (its 768 -> 3072 product 3.14 -> 2.88 ms), then
            # timed in the models (Xeon, AVX-512): vit_b_16 0.964x, bert_layer 0.951x,
            # gpt_block 0.914x the time of the L2-sized blocks.
            block = 1
        k_unroll = 8 if rows >= 8 else 4
        if on_matrix_tiles(anchor, target):
            # A tile of 16 rows (the matrix tiles' own), each product over 16 words (a tile
            # row's 64 bytes).
            m, _ = _rows_cols(product_of(anchor))
            rows = divisor(m, target.matrix_tile_rows) if m is not None else 1
            k_unroll = 16
        return space.config(rows=rows, cols=cols, k_unroll=k_unroll, block=block,
                            prefetch=prefetch)

    def apply(self, s: te.Schedule, anchor: te.Tensor, output: te.Tensor, target: Target,
              config: Config) -> None:
        plain_tiles(s, anchor, output, int(config["rows"]), int(config["cols"]),
                    int(config["block"]), int(config["k_unroll"]),
                    target if config["prefetch"] else None)
        arrange_rest(s)


def on_matrix_tiles(anchor: te.Tensor, target: Target) -> bool:
    """Whether a product's register tiles run on the target's matrix tiles (AMX): a product
    of 4-byte words (see :mod:`opfusion.backend.cpu.matrix_tiles`) of at least half a tile's
    rows. A product of fewer rows (a classifier's one) streams its weights whatever the
    tiles, and keeps VNNI's register tiles."""
    product = product_of(anchor)
    if not (target.matrix_tiles > 0 and int(product.op.attrs.get("words") or 0) == 4):
        return False
    m, _ = _rows_cols(product)
    return m is not None and m >= target.matrix_tile_rows // 2


def product_of(anchor: te.Tensor) -> te.Tensor:
    """The product itself: the anchor, or the product a crop stage keeps the rows of (a
    packed product whose rows were rounded up to whole register tiles)."""
    if anchor.op.tag == MATMUL_CROP:
        found = producer(anchor, MATMUL)
        assert found is not None
        return found
    return anchor


def _constant_panels(anchor: te.Tensor) -> te.Tensor | None:
    """The right operand of a product that reads it in column panels packed at compile time
    (``nn.matmul_packed``: a parameter of the kernel, ``(N/c, K, c)``), else None."""
    product = product_of(anchor)
    cols = int(product.op.attrs.get("panels", 0))
    if not cols or producer(product, MATMUL_PACK) is not None:
        return None
    depth = int(product.op.reduce_axis[0].dom.extent)
    for tensor in product.op.input_tensors:
        shape = [int(d) for d in tensor.shape]
        if (isinstance(tensor.op, te.PlaceholderOp) and len(shape) == 3
                and shape[1:] == [depth, cols]):
            return tensor
    return None


def panel_columns(anchor: te.Tensor) -> int:
    """Columns per panel of a right operand packed in column panels: by the compute (its
    MATMUL_PACK stage) or at compile time (nn.matmul_packed's ``panels``); 0 when neither."""
    pack = producer(anchor, MATMUL_PACK)
    if pack is not None:
        return int(pack.shape[-1])
    return int(anchor.op.attrs.get("panels", 0))


def _tile_last_two(stage: te.Stage, rows: int, cols: int) -> tuple[list[Any], list[Any]]:
    """Split the last two axes into (outer, inner) and order the loops ``batch..., row outer,
    column outer, row inner, column inner``; returns the outer and the inner loops (a rank-1
    tensor has only a column axis)."""
    axes = list(stage.op.axis)
    if len(axes) == 1:
        co, ci = stage.split(axes[0], factor=cols)
        return [co], [ci]
    ro, co, ri, ci = stage.tile(axes[-2], axes[-1], rows, cols)
    return [*axes[:-2], ro, co], [ri, ci]


def dot_tiles(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, rows: int, cols: int,
              block: int) -> None:
    """The dot-form schedule with explicit sizes: ``rows`` x ``cols`` output tiles, each
    accumulating rows*cols vectors of lane-interleaved partial sums over the whole depth
    (its rows and columns unrolled, the lanes vectorized); when the data has several row
    tiles, ``block`` column tiles (weight rows, sized for L2) are outermost, so that every
    row tile reuses a block while it is cached."""
    partial = producer(anchor, MATMUL_PARTIAL)
    assert partial is not None
    owner = owner_of(s, anchor, output)
    part = s[partial]
    axes = list(part.op.axis)
    part.vectorize(axes[-1])
    shape = [int(d) for d in anchor.shape]
    if not shape:  # a single dot product
        return
    depth = int(part.op.reduce_axis[0].dom.extent) * int(partial.shape[-1])
    stage = s[owner]
    outer, inner = _tile_last_two(stage, rows, cols)
    tile = _block_columns(stage, outer, anchor, rows, cols, block,
                          tensor_size(owner) * depth // 16)
    parent, loop = stage, tile
    lane_sum = s[anchor]
    if owner is not anchor:
        # The lane sum is computed at the tile; the partial sums just before it, at an outer
        # loop of one iteration (they are read by the lane sum only).
        lane_sum.compute_at(stage, tile)
        loop, _ = lane_sum.split(lane_sum.op.axis[0], nparts=1)
        parent = lane_sum
        inner = [v for v in lane_sum.leaf_iter_vars if v is not loop and not v.is_reduce]
    # Lanes outermost: the tile's rows*cols sums are independent chains, not one chain of
    # additions per output.
    (lane,) = lane_sum.op.reduce_axis
    lane_sum.reorder(lane, *inner)
    for axis in inner:
        lane_sum.unroll(axis)
    part.compute_at(parent, loop)
    (ko,) = part.op.reduce_axis
    part.reorder(ko, *axes)
    for axis in axes[-3:-1]:
        part.unroll(axis)


def plain_tiles(s: te.Schedule, anchor: te.Tensor, output: te.Tensor, rows: int, cols: int,
                block: int, k_unroll: int = 4, prefetch_for: Target | None = None) -> None:
    """The plain-form schedule with explicit sizes: ``rows`` x ``cols`` output tiles
    accumulated as ``rows`` x ``cols/lanes`` vectors (outer products of a column of the left
    operand and a row piece of the right one), the reduction outside (unrolled by
    ``k_unroll``), the tile's rows unrolled, its columns vectorized; column tiles in blocks of
    ``block`` as in :func:`dot_tiles`. With ``prefetch_for`` (the target), a product of
    panels packed at compile time prefetches the next block's panels while the row tiles
    pass over this one (:func:`prefetch_next_block`)."""
    owner = owner_of(s, anchor, output)
    if anchor.op.tag == MATMUL_CROP:
        # The product has whole tiles of rows; the owner's rows (the real ones) are tiled,
        # its last tile guarded, and the product is computed at each tile, whole.
        acc = product_of(anchor)
    else:
        acc = s.cache_write(anchor, "local") if owner is anchor else anchor
    pack = producer(acc, MATMUL_PACK)
    if pack is not None:
        pack_stage = s[pack]
        axes = list(pack.op.axis)
        parallel_outer(pack_stage, axes[:-1], tensor_size(pack))
        pack_stage.vectorize(axes[-1])
    if not anchor.shape:
        return
    stage = s[owner]
    outer, inner = _tile_last_two(stage, rows, cols)
    depth = int(acc.op.reduce_axis[0].dom.extent)
    tile = _block_columns(stage, outer, anchor, rows, cols, block,
                          tensor_size(owner) * depth // 16)
    stage.vectorize(inner[-1])
    acc_stage = s[acc]
    acc_stage.compute_at(stage, tile)
    axes = list(acc_stage.op.axis)
    (k,) = acc_stage.op.reduce_axis
    ko, ki = acc_stage.split(k, factor=k_unroll)
    acc_stage.reorder(ko, ki, *axes)
    acc_stage.unroll(ki)
    if len(axes) >= 2:
        acc_stage.unroll(axes[-2])
    acc_stage.vectorize(axes[-1])
    panels = _constant_panels(anchor)
    if (prefetch_for is not None and panels is not None and len(axes) >= 2
            and _blocked(anchor, rows, cols, block)):
        prefetch_next_block(acc_stage, panels, ko, rows, block, k_unroll, prefetch_for)


#: Most prefetch hints per step of a product's reduction loop (each a load slot).
MAX_PREFETCHES_PER_STEP = 4


def prefetch_next_block(acc_stage: te.Stage, panels: te.Tensor, ko: Any, rows: int,
                        block: int, k_unroll: int, target: Target) -> None:
    """Every step ``ko`` of a register tile's reduction prefetches a few cache lines of the
    panel ``block`` panels on (the same panel of the next block of column tiles; the last
    panel past the end), so that the next block is in L2 when the row tiles reach it.

    Why: the row tiles pass over a block of panels one after the other; the first pass reads
    the panels from L3 or memory at the rate the multiply-adds consume them (two vectors of
    weights per 16 multiply-adds), which the hardware prefetchers, stopping at each 4 KiB
    page, do not sustain. Row tile ``t`` of ``T`` prefetches lines ``ko * T + t`` (times
    the lines per step), so the tiles of a block fetch the next block's panels between them,
    a few lines per step. A ViT-B/16 768 -> 3072 product with its weights out of L2 (timed
    in C, two threads, a Xeon with AVX-512): 2.88 -> 2.65 ms; with them in L2, 2.49."""
    rows_axis, cols_axis = acc_stage.op.axis[-2], acc_stage.op.axis[-1]
    panel_count, depth, cols = (int(d) for d in panels.shape)
    line = max(1, target.cache_line_bytes // itemsize(panels))
    lines = -(-depth * cols // line)
    tiles = -(-int(acc_stage.op.output(0).shape[-2]) // rows)  # row tiles of the result
    steps = -(-depth // k_unroll)
    per_step = min(MAX_PREFETCHES_PER_STEP, -(-lines // (tiles * steps)))
    panel = te.min((cols_axis // cols) + block, panel_count - 1)
    for part in range(per_step):
        element = te.min(((ko * tiles + rows_axis // rows) * per_step + part) * line,
                         depth * cols - line)
        acc_stage.prefetch(panels, ko, (panel, element // cols, element % cols))


def _blocked(result: te.Tensor, rows: int, cols: int, block: int) -> bool:
    """Whether :func:`_block_columns` puts the column tiles in blocks (several row tiles
    and more than ``block`` column tiles)."""
    shape = [int(d) for d in result.shape]
    return (len(shape) >= 2 and -(-shape[-2] // rows) > 1
            and -(-shape[-1] // cols) > block)


def _block_columns(stage: te.Stage, outer: list[Any], result: te.Tensor, rows: int, cols: int,
                   block: int, work: int) -> Any:
    """Parallelize the tile loops ``outer`` (``batch..., row tiles, column tiles``) and return
    the loop a tile is computed at. With several row tiles and more than ``block`` column
    tiles, the column tiles go in blocks, outermost, so that all row tiles pass over a block
    of the right operand while it is in L2."""
    if len(outer) >= 2 and _blocked(result, rows, cols, block):
        bo, bi = stage.split(outer[-1], factor=block)
        stage.reorder(bo, outer[-2])
        parallel_outer(stage, [*outer[:-2], bo, outer[-2]], work)
        return bi
    return parallel_outer(stage, outer, work)
