"""The loop-planning pass on its own: which loops of a PrimFunc become vector code (and how
wide), which nests become register tiles, and where streaming stores need fences, per target."""

import pytest
from kernel_schedules import tiled_matmul as tiled_matmul_schedule

import opfusion as opf
from opfusion.backend.cpu.loop_planning import max_tile_vectors, plan_loops
from opfusion.target import Target
from opfusion.tir import expr as E
from opfusion.tir import stmt as S

AVX2 = Target("c -mattr=+avx2,+fma")
AVX512 = Target("c -mattr=+avx512f")
SSE2 = Target("c -mattr=+sse2")
F = S.ForKind


def elementwise(n: int, dtype: str = "float32") -> S.PrimFunc:
    """out[i] = A[i] * 2 in one vectorized loop of ``n`` iterations."""
    A = E.Buffer("A", (n,), dtype)
    out = E.Buffer("out", (n,), dtype)
    i = E.Var("i")
    store = S.BufferStore(out, A.load([i]) * E.FloatImm(2.0, dtype), [i])
    return S.PrimFunc("scale", [A, out], S.For(i, 0, n, F.VECTORIZED, store))


def tiled_matmul(rows: int, cols: int, m: int = 48, n: int = 64, k: int = 16) -> S.PrimFunc:
    """C = A @ B, C's (rows x cols) tiles accumulated in a local buffer, lowered."""
    return opf.lower(*tiled_matmul_schedule(m, n, k, rows, cols), name="matmul")


def streaming(parallel: bool) -> S.PrimFunc:
    """out = A + 1 over 4096 floats: 16 blocks (a PARALLEL loop or a serial one) of 256
    vectorized elements."""
    n = 4096
    A = E.Buffer("A", (n,), "float32")
    out = E.Buffer("out", (n,), "float32")
    io, ii = E.Var("io"), E.Var("ii")
    index = io * 256 + ii
    inner = S.For(ii, 0, 256, F.VECTORIZED, S.BufferStore(out, A.load([index]) + 1.0, [index]))
    return S.PrimFunc("stream", [A, out],
                      S.For(io, 0, n // 256, F.PARALLEL if parallel else F.SERIAL, inner))


@pytest.mark.parametrize("target, lanes", [(AVX2, 8), (AVX512, 16), (SSE2, 4)],
                         ids=["avx2", "avx512f", "sse2"])
def test_vector_loops_are_as_wide_as_the_target(target, lanes):
    assert plan_loops(elementwise(64), target).describe() == [("i", f"vector {lanes}")]
    assert plan_loops(elementwise(64, "float64"), target).describe() == [
        ("i", f"vector {lanes // 2}")]


@pytest.mark.parametrize("extent, lanes", [(48, 16), (24, 8), (12, 4), (6, None)])
def test_a_narrower_vector_is_used_when_the_widest_does_not_divide_the_extent(extent, lanes):
    planned = plan_loops(elementwise(extent), AVX512).describe()
    assert planned == ([] if lanes is None else [("i", f"vector {lanes}")])


def test_matmul_nest_becomes_a_register_tile_of_the_targets_vectors():
    func = tiled_matmul(4, 16)
    # 4 rows x 16 columns: 8 accumulators of 8 lanes with AVX2, 4 of 16 with AVX-512; the
    # epilogue that copies the tile to C is a plain vector loop.
    assert ("r", "tile 8x8") in plan_loops(func, AVX2).describe()
    assert ("r", "tile 4x16") in plan_loops(func, AVX512).describe()
    (tile,) = plan_loops(func, AVX512).tiles.values()
    assert [loop.loop_var.name for loop in tile.reduce_loops] == ["r"]
    assert tile.vector.lanes == 16


def test_the_tile_budget_follows_the_register_count():
    assert (max_tile_vectors(AVX2), max_tile_vectors(AVX512)) == (24, 48)
    func = tiled_matmul(16, 16)  # 32 accumulators of 8 lanes, or 16 of 16
    assert not plan_loops(func, AVX2).tiles
    assert ("r", "tile 16x16") in plan_loops(func, AVX512).describe()


def test_register_tiles_can_be_turned_off():
    plans = plan_loops(tiled_matmul(4, 16), AVX512, register_tiles=False)
    assert not plans.tiles and plans.vectors  # the vector loops stay


@pytest.mark.parametrize("target, lanes", [(AVX2, 8), (AVX512, 16)], ids=["avx2", "avx512f"])
def test_streaming_stores_and_their_fences(target, lanes):
    plans = plan_loops(streaming(parallel=True), target, streaming_store_bytes=1024)
    assert plans.describe() == [("io", "fence"), ("ii", f"vector {lanes} stream")]
    assert not plans.fence_at_end
    serial = plan_loops(streaming(parallel=False), target, streaming_store_bytes=1024)
    assert serial.describe() == [("ii", f"vector {lanes} stream")] and serial.fence_at_end
    # 16 KiB is below the default threshold
    assert plan_loops(streaming(parallel=True), target).describe() == [("ii", f"vector {lanes}")]


def test_no_streaming_stores_without_32_byte_vectors():
    plans = plan_loops(streaming(parallel=True), SSE2, streaming_store_bytes=1024)
    assert plans.describe() == [("ii", "vector 4")]


def test_planning_leaves_the_function_unchanged():
    func = tiled_matmul(4, 16)
    text = str(func)
    plans = plan_loops(func, AVX512)
    assert plans.func is func and str(func) == text
