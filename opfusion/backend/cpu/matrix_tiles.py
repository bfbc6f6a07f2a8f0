"""Matrix tiles: a register tile of products of bytes run on AMX's tile registers.

A blocked convolution of 4-byte words (:mod:`opfusion.transform.word_convolutions`) ends in
the register tile nest of :mod:`.regtile`::

    for rc, ry, rx:                     # reduction loops
      for rk in 0..4:                   # the words of one input channel block
        for o in 0..b (unrolled):       # channel blocks    } the tile
          for x in 0..u (unrolled):     # output columns    }
            for c in 0..16 (vectorized):
              acc[o, x, c] += dot4_u8s8(in[rc, ry, x + rx, rk], w[o, rc, ry, rx, rk, c])

With VNNI each point of the tile is a vector of sums that one ``vpdpbusd`` per word updates.
AMX's ``tdpbusd`` computes a whole tile of such sums at once: up to 16 rows (here: output
columns) of 16 int32 sums (output channels), each adding up to 16 words' products (a row of 64
bytes) in the time of about 16 ``vpdpbusd``. The nest maps onto it when:

- the tile's variables split into those of the rows (the data's offset moves with them, at
  a constant stride) and those of the channel blocks (the weight's offset moves with them);
- the innermost reduction loops read consecutive words of the data and consecutive rows of
  16 words of the weight: they become the contraction of one product (``k_loops``). A 3x3
  convolution of stride 1 folds its column taps in too: ``rx`` and ``rk`` read the 12 words of
  three neighbouring pixels (48 bytes), and each product does three times the work;
- the sums are ``acc + dot4_u8s8(data, weight)`` in int32, a vector of 16 lanes a point.

Each tile of sums is loaded from the accumulator before the reduction loops and stored after
them; inside, each step loads the data's and the weight's tiles and runs one ``tdpbusd`` per
tile of sums. The tiles' shapes are set by a tile configuration (``ldtilecfg``, 64 bytes),
which a thread loads before its first tile when its record of the configuration it loaded
(per library, per thread) names another; at the end of the kernel every thread of the team
releases it (``tilerelease``, in one parallel region), so that no kernel leaves a
configuration behind for another library's kernel (on a Xeon a configuration costs 0.1 us
or more; a release per parallel task made ShuffleNet's small convolutions, 64 tasks each,
1.2x the model's time).

The sums are exact int32 (no saturation), the same as VNNI's and the reference's. Linux
enables the tiles' state for a process on request (:func:`opfusion.target.host.os_grants_amx`,
which host detection makes; the kernels ask again once per library)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ...target import Target
from ...tir import expr as E
from ...tir import stmt as S
from .loop_planning import tile_coefficients


@dataclass(frozen=True)
class MatrixTilePlan:
    """How a register tile runs on matrix tiles (see the module docstring). Points are
    indices into the tile's points (:func:`.loop_planning.tile_points`, in its order)."""

    #: the reduction loops that form each product's contraction, outermost first (their
    #: variables at their start in every address)
    k_loops: tuple[S.For, ...]
    #: the reduction loops emitted as loops, outermost first
    loops: tuple[S.For, ...]
    data: E.BufferLoad
    weight: E.BufferLoad
    #: per tile of sums: the points of its rows, in row order
    sums: tuple[tuple[int, ...], ...]
    #: per tile of sums: its run of rows (data tile) and its channel block (weight tile)
    runs: tuple[int, ...]
    blocks: tuple[int, ...]
    rows: int
    k_bytes: int
    #: bytes between consecutive rows of the data, the sums and the weight
    data_stride: int
    sum_stride: int
    weight_stride: int

    @property
    def run_count(self) -> int:
        return max(self.runs) + 1

    @property
    def block_count(self) -> int:
        return max(self.blocks) + 1


def _dot4_operands(store: S.BufferStore, self_load: E.BufferLoad
                   ) -> tuple[E.BufferLoad, E.BufferLoad] | None:
    """(data, weight) of an update ``acc + dot4_u8s8(data, weight)`` of int32 loads."""
    value = store.value
    if not isinstance(value, E.Add) or store.buffer.dtype != "int32":
        return None
    product = value.b if value.a is self_load else value.a if value.b is self_load else None
    if not (isinstance(product, E.Call) and product.name == "dot4_u8s8"):
        return None
    data, weight = product.args
    if not (isinstance(data, E.BufferLoad) and isinstance(weight, E.BufferLoad)
            and data.buffer.dtype == weight.buffer.dtype == "int32"):
        return None
    return data, weight


def _arithmetic(values: list[int]) -> int | None:
    """The common step of ``values`` (0 for one value), None when they are not evenly
    spaced."""
    if len(values) == 1:
        return 0
    step = values[1] - values[0]
    if any(b - a != step for a, b in zip(values, values[1:])):
        return None
    return step


def plan_matrix_tile(reduce_loops: list[S.For], tile_loops: list[S.For], vector_loop: S.For,
                     lanes: int, points: list[dict[E.Var, int]], store: S.BufferStore,
                     self_load: E.BufferLoad, target: Target) -> MatrixTilePlan | None:
    """The matrix-tile plan of a register tile on ``target``, or None where it has no
    matrix tiles or the nest does not map onto them (see the module docstring)."""
    if not target.matrix_tiles or lanes * 4 != target.matrix_tile_bytes:
        return None
    if not (isinstance(vector_loop.extent, E.IntImm) and vector_loop.extent.value % lanes == 0):
        return None
    operands = _dot4_operands(store, self_load)
    if operands is None:
        return None
    data, weight = operands
    tile_vars = [t.loop_var for t in tile_loops]
    reduce_vars = [r.loop_var for r in reduce_loops]
    lane = vector_loop.loop_var
    data_coefs = _coefficients(data.buffer.offset_of(data.indices), [*tile_vars, lane],
                               reduce_vars)
    weight_offset = weight.buffer.offset_of(weight.indices)
    weight_coefs = _coefficients(weight_offset, [lane], reduce_vars)
    sum_coefs = tile_coefficients(store.buffer.offset_of(store.indices), [*tile_vars, lane])
    if data_coefs is None or weight_coefs is None or sum_coefs is None:
        return None
    if data_coefs.get(id(lane), 0) or weight_coefs.get(id(lane)) != 1 \
            or sum_coefs.get(id(lane)) != 1:
        return None
    # The tile's variables: a row's (the data moves with it) or a channel block's (the
    # weight does), not both.
    weight_vars = {id(v) for v in E.free_vars(weight_offset)}
    row_vars = [v for v in tile_vars if data_coefs.get(id(v), 0)]
    block_vars = [v for v in tile_vars if id(v) in weight_vars]
    if any((v in row_vars) == (v in block_vars) for v in tile_vars):
        return None
    # (the lanes' variable tells a point's vector of 16 columns apart: a block's)
    return _layout(reduce_loops, points, data, weight, data_coefs, weight_coefs, sum_coefs,
                   row_vars, [*block_vars, lane], target)


def _coefficients(offset: E.PrimExpr, variables: list[E.Var], reduce_vars: list[E.Var]
                  ) -> dict[int, int] | None:
    """The coefficients (by id) of ``variables`` in ``offset`` (None where one is inside a
    non-linear term), and of each reduction variable that it is linear in: the reduction
    loops need be linear only where they form the contraction (a strided convolution's
    phase loops, ``ry % 2``, stay outside it)."""
    coefs = tile_coefficients(offset, variables)
    if coefs is None:
        return None
    for var in reduce_vars:
        found = tile_coefficients(offset, [var])
        if found is not None and id(var) in found:
            coefs[id(var)] = found[id(var)]
    return coefs


def _linear_in(load: E.BufferLoad, var: E.Var) -> bool:
    """Whether ``load``'s offset is linear in ``var`` (or free of it)."""
    return tile_coefficients(load.buffer.offset_of(load.indices), [var]) is not None


def _layout(reduce_loops: list[S.For], points: list[dict[E.Var, int]], data: E.BufferLoad,
            weight: E.BufferLoad, data_coefs: dict[int, int], weight_coefs: dict[int, int],
            sum_coefs: dict[int, int], row_vars: list[E.Var], block_vars: list[E.Var],
            target: Target) -> MatrixTilePlan | None:
    """The tiles of sums, their rows and the contraction of a tile whose variables are
    classified (see :func:`plan_matrix_tile`)."""
    rows_of: dict[tuple[int, ...], dict[tuple[int, ...], int]] = {}
    for index, point in enumerate(points):
        block = tuple(point[v] for v in block_vars)
        rows_of.setdefault(block, {})[tuple(point[v] for v in row_vars)] = index
    row_keys = list(next(iter(rows_of.values())))
    if any(list(r) != row_keys for r in rows_of.values()):
        return None
    lanes = target.matrix_tile_bytes // 4

    def delta(coefs: dict[int, int], key: tuple[int, ...]) -> int:
        return sum(coefs.get(id(v), 0) * value for v, value in zip(row_vars, key))

    data_step = _arithmetic([delta(data_coefs, k) for k in row_keys])
    sum_step = _arithmetic([delta(sum_coefs, k) for k in row_keys])
    if data_step is None or sum_step is None or (len(row_keys) > 1 and (
            data_step <= 0 or sum_step < lanes)):
        return None
    count = len(row_keys)
    runs = -(-count // target.matrix_tile_rows)
    if count % runs:
        return None
    rows = count // runs
    if len(rows_of) * runs + 2 > target.matrix_tiles:
        return None
    # The contraction: the innermost reduction loops that read consecutive words of the data
    # and evenly spaced rows of the weight (a row: the 16 words of one vector; 16-word rows
    # of a convolution's blocked weight, a product's panels' wider ones), up to a tile row's
    # bytes.
    words = 1
    folded = 0
    weight_row = 0
    for loop in reversed(reduce_loops):
        if not (isinstance(loop.min, E.IntImm) and loop.min.value == 0
                and isinstance(loop.extent, E.IntImm)):
            break
        extent = loop.extent.value
        if not (_linear_in(data, loop.loop_var) and _linear_in(weight, loop.loop_var)):
            break
        weight_row = weight_row or weight_coefs.get(id(loop.loop_var), 0)
        if (data_coefs.get(id(loop.loop_var), 0) != words or weight_row < lanes
                or weight_coefs.get(id(loop.loop_var), 0) != weight_row * words
                or words * extent * 4 > target.matrix_tile_bytes):
            break
        words *= extent
        folded += 1
    if not folded or words < 2:
        return None
    split = len(reduce_loops) - folded
    sums, run_of, block_of = [], [], []
    for block_index, by_row in enumerate(rows_of.values()):
        ordered = list(by_row.values())
        for run in range(runs):
            sums.append(tuple(ordered[run * rows:(run + 1) * rows]))
            run_of.append(run)
            block_of.append(block_index)
    return MatrixTilePlan(
        k_loops=tuple(reduce_loops[split:]), loops=tuple(reduce_loops[:split]), data=data,
        weight=weight, sums=tuple(sums), runs=tuple(run_of), blocks=tuple(block_of),
        rows=rows, k_bytes=words * 4, data_stride=(data_step if count > 1 else words) * 4,
        sum_stride=(sum_step if count > 1 else lanes) * 4, weight_stride=weight_row * 4)


def resident_operands(plan: MatrixTilePlan, target: Target) -> bool:
    """Whether every data and weight tile of a step has a tile register of its own (each
    loaded once a step); else one data tile at a time, the weights reloaded per product."""
    return len(plan.sums) + plan.run_count + plan.block_count <= target.matrix_tiles


def tile_registers(plan: MatrixTilePlan, target: Target
                   ) -> tuple[list[int], list[int], list[int]]:
    """The tile registers of the sums, of the data tiles (per run) and of the weight tiles
    (per block; without :func:`resident_operands`, the registers the weights take turns
    in)."""
    sums = list(range(len(plan.sums)))
    first = len(sums)
    if resident_operands(plan, target):
        data = list(range(first, first + plan.run_count))
        weights = list(range(first + plan.run_count,
                             first + plan.run_count + plan.block_count))
        return sums, data, weights
    spare = list(range(first + 1, target.matrix_tiles))
    return sums, [first], spare[:2]


def tile_config(plan: MatrixTilePlan, target: Target) -> tuple[tuple[int, int], ...]:
    """(rows, bytes a row) of each tile register the plan uses, by register."""
    sums, data, weights = tile_registers(plan, target)
    shapes: dict[int, tuple[int, int]] = {}
    for register in sums:
        shapes[register] = (plan.rows, target.matrix_tile_bytes)
    for register in data:
        shapes[register] = (plan.rows, plan.k_bytes)
    for register in weights:
        shapes[register] = (plan.k_bytes // 4, target.matrix_tile_bytes)
    return tuple(shapes[r] for r in range(max(shapes) + 1))


#: The tile configuration's layout (Intel SDM, LDTILECFG: palette 1), the record of the one
#: this thread loaded, and loading and releasing it; the first load asks Linux for the
#: tiles' state (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``) in case the host
#: detection did not run in this process.
TILES_HELPER = """typedef struct {
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} opf_tile_config;
static __thread const opf_tile_config* opf_tiles_loaded;
static int opf_tiles_permitted;
static inline void opf_tiles_configure(const opf_tile_config* config) {
  if (__builtin_expect(opf_tiles_loaded != config, 0)) {
    if (!opf_tiles_permitted) {
      syscall(SYS_arch_prctl, 0x1023, 18);
      opf_tiles_permitted = 1;
    }
    _tile_loadconfig(config);
    opf_tiles_loaded = config;
  }
}
static inline void opf_tiles_release(void) {
  if (opf_tiles_loaded) {
    _tile_release();
    opf_tiles_loaded = 0;
  }
}"""

TILES_HELPER_KEY = "0_opf_tiles"


def config_helper(shapes: tuple[tuple[int, int], ...]) -> tuple[str, str, str]:
    """(helper key, C name, definition) of the tile configuration of ``shapes`` (see
    :func:`tile_config`), named by its content."""
    digest = hashlib.sha256(repr(shapes).encode()).hexdigest()[:12]
    name = f"opf_tile_config_{digest}"
    colsb = ", ".join(str(b) for _, b in shapes)
    rows = ", ".join(str(r) for r, _ in shapes)
    text = (f"static const opf_tile_config {name} __attribute__((aligned(64))) = "
            f"{{1, 0, {{0}}, {{{colsb}}}, {{{rows}}}}};")
    return f"1_{name}", name, text
