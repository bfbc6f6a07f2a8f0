"""GPU schedule primitives: bind, thread_axis, set_scope and cache_read, lowered to loop IR
with shared buffers and barriers, and run by the interpreter as a GPU runs them."""

import numpy as np
import pytest

from opfusion import te
from opfusion.errors import EvaluationError, ScheduleError
from opfusion.te.lower import lower
from opfusion.tir import stmt as S
from opfusion.tir.interp import run
from opfusion.tir.launch import split_launches


def tiled_matmul(m: int, k: int, n: int, tile: int, k_step: int):
    """C = A @ B with tile x tile blocks, one thread per element, both operands staged in
    shared memory k_step columns/rows at a time."""
    a = te.placeholder((m, k), "float32", name="A")
    b = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    s = te.create_schedule([c.op])
    a_shared = s.cache_read(a, "shared", [c])
    b_shared = s.cache_read(b, "shared", [c])
    acc = s.cache_write(c, "local")
    i, j = s[c].op.axis
    io, jo, ii, ji = s[c].tile(i, j, tile, tile)
    s[c].bind(io, te.thread_axis("blockIdx.y"))
    s[c].bind(jo, "blockIdx.x")
    s[c].bind(ii, "threadIdx.y")
    s[c].bind(ji, "threadIdx.x")
    s[acc].compute_at(s[c], ji)
    ko, _ = s[acc].split(s[acc].op.reduce_axis[0], factor=k_step)
    for copy in (a_shared, b_shared):
        s[copy].compute_at(s[acc], ko)
        rows, cols = s[copy].op.axis
        fused = s[copy].fuse(rows, cols)
        _, inside = s[copy].split(fused, factor=tile * tile)
        ty, tx = s[copy].split(inside, factor=tile)
        s[copy].bind(ty, "threadIdx.y")
        s[copy].bind(tx, "threadIdx.x")
    return s, [a, b, c]


@pytest.mark.parametrize("shape", [(8, 12, 8), (13, 7, 10), (4, 33, 9)])
def test_shared_memory_tiles_compute_the_product(shape):
    m, k, n = shape
    s, args = tiled_matmul(m, k, n, tile=4, k_step=4)
    func = lower(s, args, "matmul")
    text = str(func)
    assert "shared" in text and "sync_threads()" in text and "bind[threadIdx.y]" in text
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype("float32")
    b = rng.standard_normal((k, n)).astype("float32")
    c = np.zeros((m, n), "float32")
    run(func, a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    _, launches = split_launches(func)
    assert len(launches) == 1 and launches[0].block == (4, 4, 1)


def test_shared_copies_cover_every_thread_of_the_block():
    # The copy's region is relaxed over every thread index: 4 rows of A per block, not 1.
    s, args = tiled_matmul(8, 8, 8, tile=4, k_step=8)
    func = lower(s, args, "matmul")
    allocs = [n for n in S.walk_stmts(func.body) if isinstance(n, S.Allocate)]
    shapes = {a.buffer.name: (a.buffer.scope, a.buffer.shape) for a in allocs}
    assert shapes["A_shared"] == ("shared", (4, 8))
    assert shapes["B_shared"] == ("shared", (8, 4))


def test_a_bound_loop_of_one_runs_on_the_first_thread_only():
    # C's loop of one, bound to threadIdx.x, stays a loop: in a launch of 8 threads (B's),
    # only thread 0 runs its body. That body holds the barriers around B's computation, so
    # this schedule is wrong, and the interpreter says so rather than computing anything.
    a = te.placeholder((8,), "float32", name="A")
    b = te.compute((8,), lambda i: a[i] * 2.0, name="B")
    r = te.reduce_axis((0, 8), name="r")
    c = te.compute((1,), lambda i: te.sum(b[r], axis=r), name="C")
    s = te.create_schedule([c.op])
    s[b].set_scope("shared")
    s[b].compute_at(s[c], c.op.axis[0])
    s[b].bind(b.op.axis[0], "threadIdx.x")
    s[c].bind(c.op.axis[0], "threadIdx.x")
    func = lower(s, [a, c], "one")
    assert "bind[threadIdx.x](1)" in str(func)
    with pytest.raises(EvaluationError, match="same barriers"):
        run(func, np.arange(8, dtype="float32"), np.zeros(1, "float32"))


def test_bind_refuses_reductions_unknown_axes_and_a_second_binding():
    a = te.placeholder((8, 8), "float32", name="A")
    r = te.reduce_axis((0, 8), name="k")
    c = te.compute((8,), lambda i: te.sum(a[i, r], axis=r), name="C")
    s = te.create_schedule([c.op])
    with pytest.raises(ScheduleError, match="reduction loop"):
        s[c].bind(r, "threadIdx.x")
    with pytest.raises(ScheduleError, match="unknown thread axis"):
        te.thread_axis("warpIdx.x")
    io, ii = s[c].split(c.op.axis[0], factor=4)
    s[c].bind(ii, "threadIdx.x")
    with pytest.raises(ScheduleError, match="already is"):
        s[c].bind(io, "threadIdx.x")
    with pytest.raises(ScheduleError, match="scope"):
        s[c].set_scope("texture")
    with pytest.raises(ScheduleError, match="does not read it"):
        s.cache_read(c, "shared", [c])
