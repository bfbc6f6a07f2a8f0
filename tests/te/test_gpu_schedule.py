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


def _barriers_in_loop(func, name):
    loop = next(n for n in S.walk_stmts(func.body)
                if isinstance(n, S.For) and n.loop_var.name.startswith(name))
    return sum(isinstance(n, S.Barrier) for n in S.walk_stmts(loop.body))


def test_copies_of_both_operands_share_their_barriers():
    # One barrier before the two copies (the last step's readers done), one after both: the
    # copy of B reads nothing the copy of A wrote. The interpreter checks there is no race.
    s, args = tiled_matmul(8, 16, 8, tile=4, k_step=4)
    func = lower(s, args, "matmul")
    assert _barriers_in_loop(func, "k_outer") == 2
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(shape).astype("float32") for shape in ((8, 16), (16, 8)))
    c = np.zeros((8, 8), "float32")
    run(func, a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def _row_sums_of_shared_stages(out, stages, step):
    """A schedule of ``out``'s row sums (one thread a row) whose ``stages`` are shared and
    computed at each ``step`` of the sum: (schedule, its accumulator's stage)."""
    s = te.create_schedule([out.op])
    acc = s.cache_write(out, "local")
    s[out].bind(out.op.axis[0], "threadIdx.x")
    s[acc].compute_at(s[out], out.op.axis[0])
    ro, _ = s[acc].split(s[acc].op.reduce_axis[0], factor=step)
    for stage in stages:
        s[stage].set_scope("shared")
        s[stage].compute_at(s[acc], ro)
        s[stage].bind(s[stage].op.axis[0], "threadIdx.x")
    return s, s[acc]


def test_a_shared_stage_that_reads_the_one_before_waits_for_it():
    a = te.placeholder((4, 8), "float32", name="A")
    twice = te.compute((4, 8), lambda i, k: a[i, k] * 2.0, name="twice")
    more = te.compute((4, 8), lambda i, k: twice[i, (k + 1) % 8] + 1.0, name="more")
    r = te.reduce_axis((0, 8), name="r")
    out = te.compute((4,), lambda i: te.sum(more[i, r], axis=r), name="out")
    s, _ = _row_sums_of_shared_stages(out, (twice, more), 4)
    func = lower(s, [a, out], "chain")
    assert _barriers_in_loop(func, "r_outer") == 3
    x = np.random.default_rng(2).standard_normal((4, 8)).astype("float32")
    got = np.zeros(4, "float32")
    run(func, x, got)
    np.testing.assert_allclose(got, (2 * x + 1).sum(axis=1), rtol=1e-5)


@pytest.mark.parametrize("shape", [(8, 12, 8), (13, 7, 10), (4, 33, 9)])
def test_double_buffered_copies_load_the_next_step_while_this_one_computes(shape):
    m, k, n = shape
    s, args = tiled_matmul(m, k, n, tile=4, k_step=4)
    for stage in s.stages:
        if stage.scope == "shared":
            stage.double_buffer()
    func = lower(s, args, "matmul")
    tiles = {a.buffer.name: a.buffer.shape for a in S.walk_stmts(func.body)
             if isinstance(a, S.Allocate)}
    assert tiles["A_shared"] == (2, 4, 4) and tiles["B_shared"] == (2, 4, 4)
    assert tiles["A_shared_next"] == (1,)  # a thread's share of a step: one element each
    assert _barriers_in_loop(func, "k_outer") == 1
    rng = np.random.default_rng(4)
    a = rng.standard_normal((m, k)).astype("float32")
    b = rng.standard_normal((k, n)).astype("float32")
    c = np.zeros((m, n), "float32")
    run(func, a, b, c)  # (with its check that no thread reads a tile another is writing)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def _async_matmul(shape, stages):
    m, k, n = shape
    s, args = tiled_matmul(m, k, n, tile=4, k_step=4)
    for stage in s.stages:
        if stage.scope == "shared":
            stage.async_pipeline(stages)
    return lower(s, args, "matmul")


def _run_matmul(func, shape, seed=5):
    m, k, n = shape
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype("float32")
    b = rng.standard_normal((k, n)).astype("float32")
    c = np.zeros((m, n), "float32")
    run(func, a, b, c)
    return c, a @ b


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("shape", [(8, 12, 8), (13, 7, 10), (4, 33, 9)])
def test_async_copies_fill_tiles_steps_ahead(shape, stages):
    """Each tile in ``stages`` copies filled by async copies ``stages - 1`` steps ahead: a
    step waits for all but the newest ``stages - 2`` groups, then at one barrier; the
    interpreter lands each copy only at its thread's wait, so the numbers say the waits
    are right, and its race check that no copy overwrites a tile being read."""
    func = _async_matmul(shape, stages)
    tiles = {a.buffer.name: a.buffer.shape for a in S.walk_stmts(func.body)
             if isinstance(a, S.Allocate)}
    assert tiles["A_shared"] == (stages, 4, 4) and "A_shared_next" not in tiles
    loop = next(n for n in S.walk_stmts(func.body)
                if isinstance(n, S.For) and n.loop_var.name.startswith("k_outer"))
    inside = list(S.walk_stmts(loop.body))
    assert sum(isinstance(n, S.Barrier) for n in inside) == 1
    assert [n.pending for n in inside if isinstance(n, S.AsyncWait)] == [stages - 2]
    steps = -(-shape[1] // 4)  # copies in the loop only for steps past the first ones
    assert sum(isinstance(n, S.AsyncCopy) for n in inside) == (2 if steps >= stages else 0)
    assert sum(isinstance(n, S.AsyncCommit) for n in S.walk_stmts(func.body)) == stages
    got, want = _run_matmul(func, shape)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_tile_read_before_its_async_copy_is_waited_for_is_wrong():
    """Waiting for one group fewer reads a step's tile before its copy lands: the
    interpreter, like a GPU, gives the tile's old contents (here never written: NaN)."""
    from opfusion.tir.simplify import map_nested

    func = _async_matmul((8, 12, 8), 3)
    early = map_nested(func.body, lambda st: S.AsyncWait(st.pending + 1)
                       if isinstance(st, S.AsyncWait) else None)
    got, want = _run_matmul(S.PrimFunc(func.name, func.params, early, func.attrs), (8, 12, 8))
    assert not np.allclose(got, want, equal_nan=False)


def test_async_copies_need_a_load_and_shared_tiles():
    """A tile of computed values (twice a load) cannot be copied asynchronously: it stays a
    plain shared stage, with the same numbers; async_pipeline refuses a local stage and
    fewer than two stages."""
    a = te.placeholder((4, 8), "float32", name="A")
    twice = te.compute((4, 8), lambda i, k: a[i, k] * 2.0, name="twice")
    r = te.reduce_axis((0, 8), name="r")
    out = te.compute((4,), lambda i: te.sum(twice[i, r], axis=r), name="out")
    s, acc = _row_sums_of_shared_stages(out, (twice,), 2)
    s[twice].async_pipeline(2)
    func = lower(s, [a, out], "computed")
    assert not any(isinstance(n, S.AsyncCopy) for n in S.walk_stmts(func.body))
    x = np.random.default_rng(6).standard_normal((4, 8)).astype("float32")
    got = np.zeros(4, "float32")
    run(func, x, got)
    np.testing.assert_allclose(got, 2 * x.sum(axis=1), rtol=1e-5)
    with pytest.raises(ScheduleError, match="2 or more stages"):
        s[twice].async_pipeline(1)
    with pytest.raises(ScheduleError, match="async_pipeline needs a shared stage"):
        acc.async_pipeline(2)


def test_a_loop_of_one_step_keeps_its_copies_plain():
    s, args = tiled_matmul(8, 4, 8, tile=4, k_step=4)  # one step: nothing to overlap
    for stage in s.stages:
        if stage.scope == "shared":
            stage.double_buffer()
    func = lower(s, args, "matmul")
    shapes = [a.buffer.shape for a in S.walk_stmts(func.body) if isinstance(a, S.Allocate)
              and a.buffer.scope == "shared"]
    assert shapes == [(4, 4), (4, 4)]
    with pytest.raises(ScheduleError, match="double_buffer needs a shared stage"):
        s[s.stages[-1].op].double_buffer()


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
