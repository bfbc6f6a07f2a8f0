"""Register tiles: accumulation nests emitted with named vector accumulators must compute
exactly what the loop nest computes, and nests that do not qualify must keep the plain form."""

import re

import numpy as np
import pytest
from kernel_schedules import blocked_sum_matmul, tiled_matmul

import opfusion as opf
from opfusion import te
from opfusion.backend.cpu.loop_planning import plan_loops
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.codegen import CodegenOptions, codegen_c
from opfusion.target import Target

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

rng = np.random.default_rng(11)


PLAIN = CodegenOptions(register_tiles=False)
AVX2 = Target("c -mattr=+avx2,+fma")
ACCUMULATOR = re.compile(r"opf_float32x(\d+) acc")


def run_matmul(s, args, target: Target, options: CodegenOptions | None = None):
    """(source, a, b, c) of the kernel run on random inputs (the same inputs on every call)."""
    m, k = args[0].shape
    n = args[1].shape[1]
    inputs = np.random.default_rng(m * 1000 + n + k)
    a = inputs.standard_normal((m, k)).astype("float32")
    b = inputs.standard_normal((k, n)).astype("float32")
    c = np.empty((m, n), "float32")
    kernel = opf.build(s, args, target=target, name="matmul", options=options)
    kernel(a, b, c)
    return kernel.get_source(), a, b, c


def plain_result(make, target: Target) -> np.ndarray:
    """The same nest emitted as loops (the C compiler contracts ``acc + a*b`` into a fused
    multiply-add in both forms, so NumPy's two roundings are not the reference)."""
    source, _, _, c = run_matmul(*make(), target, options=PLAIN)
    assert not ACCUMULATOR.search(source)
    return c


def accumulator_lanes(source: str) -> set[int]:
    """The lane counts of the source's register-tile accumulators."""
    return {int(lanes) for lanes in ACCUMULATOR.findall(source)}


@pytest.mark.parametrize("rows, cols", [(4, 16), (6, 8), (1, 24), (3, 32)])
def test_register_tile_is_bit_identical_to_the_loop_nest(rows, cols, cpu_target):
    source, a, b, c = run_matmul(*tiled_matmul(12, 96, 37, rows, cols), cpu_target)
    assert "OPF_PIN" in source or rows == 1  # one row: no operand is used twice
    # The widest vector of the target whose lanes divide the tile's columns.
    lanes = cpu_target.vector_lanes("float32")
    while cols % lanes:
        lanes //= 2
    assert accumulator_lanes(source) == {lanes}
    want = plain_result(lambda: tiled_matmul(12, 96, 37, rows, cols), cpu_target)
    np.testing.assert_array_equal(c, want)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5 * np.abs(a @ b).max())


def test_unrolled_reduction_loop_stays_outside_the_tile(cpu_target):
    source, _, _, c = run_matmul(*tiled_matmul(8, 32, 40, 4, 16, depth_unroll=4), cpu_target)
    assert accumulator_lanes(source) and "#pragma GCC unroll 4" in source
    np.testing.assert_array_equal(
        c, plain_result(lambda: tiled_matmul(8, 32, 40, 4, 16, depth_unroll=4), cpu_target))


def test_each_distinct_operand_is_loaded_once_per_iteration(cpu_target):
    s, args = tiled_matmul(8, 32, 16, 4, 16)
    source = opf.build(s, args, target=cpu_target, name="matmul").get_source()
    lanes = cpu_target.vector_lanes("float32")
    body = source.split("for (int32_t r")[1].split("opf_store")[0]
    # 16 // lanes vectors of B (each used by 4 rows) and 4 scalars of A, for 4 * 16 // lanes
    # accumulators (8 with AVX2, 4 with AVX-512)
    assert body.count(f"opf_load_float32x{lanes}(") == 16 // lanes
    assert body.count("OPF_PIN(") == 16 // lanes
    assert body.count(" = A[") == 4
    assert body.count("acc") >= 4 * 16 // lanes


def tile_plans(s, args):
    func = opf.lower(s, args, name="k")
    return list(plan_loops(func, AVX2).tiles.values())


def test_plan_names_reduction_and_tile_loops():
    (plan,) = tile_plans(*tiled_matmul(8, 32, 16, 4, 16))
    assert [loop.loop_var.name for loop in plan.reduce_loops] == ["r"]
    assert len(plan.tile_loops) == 1 and plan.tile_loops[0].extent.value == 4
    assert plan.vector.lanes == 8


def test_non_dividing_tile_keeps_the_plain_loop_nest():
    # 10 rows in tiles of 4: the last tile's row loop has a variable extent.
    s, args = tiled_matmul(10, 32, 16, 4, 16)
    source, a, b, c = run_matmul(s, args, AVX2)
    assert "OPF_PIN" not in source
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5 * np.abs(a @ b).max())


def test_unrolled_loop_the_index_ignores_is_not_a_tile():
    # Column sums with the row loop unrolled inside: every unrolled iteration adds into the
    # same vector, so it cannot have a register of its own.
    n, m = 32, 24
    A = te.placeholder((m, n), name="A")
    r = te.reduce_axis((0, m), name="r")
    C = te.compute((n,), lambda j: te.sum(A[r, j], axis=r), name="C")
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    jo, ji = s[C].split(C.op.axis[0], factor=8)
    s[C].vectorize(ji)
    s[CC].compute_at(s[C], jo)
    (jc,) = s[CC].op.axis
    (rc,) = s[CC].op.reduce_axis
    ro, ri = s[CC].split(rc, factor=4)
    s[CC].reorder(ro, ri, jc)
    s[CC].unroll(ri)
    s[CC].vectorize(jc)
    plans = tile_plans(s, [A, C])
    assert all(len(p.tile_loops) == 0 for p in plans)  # ri is a reduction loop here
    a = rng.standard_normal((m, n)).astype("float32")
    c = np.empty(n, "float32")
    opf.build(s, [A, C], name="colsum")(a, c)
    want = np.zeros(n, np.float32)
    for row in a:  # additions only: no contraction, so NumPy's order is the reference
        want = want + row
    np.testing.assert_array_equal(c, want)


def test_register_tile_source_is_deterministic():
    first = codegen_c(opf.lower(*tiled_matmul(8, 32, 16, 4, 16), name="k"), target=AVX2).code
    second = codegen_c(opf.lower(*tiled_matmul(8, 32, 16, 4, 16), name="k"), target=AVX2).code
    assert first == second


def test_a_k_blocked_tile_sums_each_block_from_zero(cpu_target):
    source, a, b, c = run_matmul(*blocked_sum_matmul(4, 32, 512, 4, 8, 64), cpu_target)
    assert re.search(r"acc = opf_splat_float32x\d+\(0\)", source)
    assert re.search(r"opf_load_float32x\d+\(&\w+\[[^\]]*\]\) \+ acc", source)
    want = a.astype(np.float64) @ b.astype(np.float64)
    # Block by block: the rounding of 64-term sums, not of one 512-term sum.
    assert np.abs(c - want).max() <= 4e-6 * np.abs(want).max() * np.sqrt(64)


def test_a_tile_of_the_whole_reduction_stores_its_sum_without_a_zero_fill(cpu_target):
    """The reduction's zero-fill just before a tile that sums every term is left out, and
    the tile stores its sum instead of adding it to the zeros it would load back."""
    (plan,) = tile_plans(*tiled_matmul(8, 32, 16, 4, 16))
    assert plan.fresh
    source, a, b, c = run_matmul(*tiled_matmul(8, 32, 16, 4, 16), cpu_target)
    assert not re.search(r"opf_store_float32x\d+\(&\w+\[[^\]]*\], opf_splat_float32x\d+\(0",
                         source)
    assert not re.search(r"opf_load_float32x\d+\(&\w+\[[^\]]*\]\) \+ acc", source)
    np.testing.assert_array_equal(
        c, plain_result(lambda: tiled_matmul(8, 32, 16, 4, 16), cpu_target))
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5 * np.abs(a @ b).max())


def test_a_k_blocked_tile_keeps_its_zero_fill():
    # the fill is before the loop over the blocks, not just before the tile
    (plan,) = tile_plans(*blocked_sum_matmul(4, 32, 512, 4, 8, 64))
    assert plan.partial_sum and not plan.fresh
