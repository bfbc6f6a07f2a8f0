"""GPU launches in the loop IR: thread-bound loops, shared buffers and barriers, the launch
split, and the interpreter that runs them block by block and thread by thread."""

import numpy as np
import pytest

from opfusion.errors import EvaluationError, LoweringError, TensorExprError
from opfusion.tir import expr as E
from opfusion.tir import stmt as S
from opfusion.tir.interp import run
from opfusion.tir.launch import binds_threads, split_launches


def _lt(a, b):
    return E.compare("LT", a, b)


def reverse_in_blocks(barrier: bool) -> S.PrimFunc:
    """out[i] = 2 * x[block start + 3 - lane] within blocks of 4, through a shared buffer (10
    elements: in the last block, half full, no lane has its mirror)."""
    x, out = E.Buffer("x", (10,), "float32"), E.Buffer("out", (10,), "float32")
    bx, tx = E.Var("bx", "int32"), E.Var("tx", "int32")
    tile = E.Buffer("tile", (4,), "float32", "shared")
    i = bx * 4 + tx
    body = [S.IfThenElse(_lt(i, 10), S.BufferStore(tile, E.BufferLoad(x, [i]) * 2.0, [tx]))]
    if barrier:
        body.append(S.Barrier())
    mirror = bx * 4 + 3 - tx
    body.append(S.IfThenElse(_lt(mirror, 10), S.IfThenElse(
        _lt(i, 10), S.BufferStore(out, E.BufferLoad(tile, [3 - tx]), [i]))))
    nest = S.For(bx, 0, 3, S.ForKind.BLOCK_X,
                 S.Allocate(tile, S.For(tx, 0, 4, S.ForKind.THREAD_X, S.SeqStmt(body))))
    return S.PrimFunc("reverse", [x, out], nest)


def test_threads_of_a_block_share_a_buffer_across_a_barrier():
    x = np.arange(10, dtype="float32")
    out = np.full(10, -1, "float32")
    run(reverse_in_blocks(barrier=True), x, out)
    np.testing.assert_array_equal(out, [6, 4, 2, 0, 14, 12, 10, 8, -1, -1])


def test_a_missing_barrier_is_a_data_race():
    # Thread 1 reads lane 2 of the tile, then thread 2 writes it: on a GPU they run at once.
    x = np.arange(10, dtype="float32")
    with pytest.raises(EvaluationError, match="data race: .*b\\d*_?tile"):
        run(reverse_in_blocks(barrier=False), x, np.zeros(10, "float32"))


def test_two_threads_writing_one_element_is_a_data_race():
    out = E.Buffer("out", (4,), "float32")
    tx = E.Var("tx", "int32")
    body = S.For(tx, 0, 8, S.ForKind.THREAD_X,
                 S.BufferStore(out, E.FloatImm(1.0, "float32"), [tx % 4]))
    with pytest.raises(EvaluationError, match="both write element"):
        run(S.PrimFunc("clash", [out], body), np.zeros(4, "float32"))


def test_a_barrier_some_threads_skip_is_an_error():
    x, out = E.Buffer("x", (8,), "float32"), E.Buffer("out", (8,), "float32")
    tx = E.Var("tx", "int32")
    body = S.For(tx, 0, 8, S.ForKind.THREAD_X, S.SeqStmt([
        S.IfThenElse(_lt(tx, 4), S.Barrier()),
        S.BufferStore(out, E.BufferLoad(x, [tx]), [tx])]))
    with pytest.raises(EvaluationError, match="same barriers"):
        run(S.PrimFunc("diverge", [x, out], body), np.ones(8, "float32"), np.zeros(8, "float32"))


def test_launch_sizes_are_the_largest_bound_extents_and_root_temporaries_are_global():
    x, out = E.Buffer("x", (6, 5), "float32"), E.Buffer("out", (6, 5), "float32")
    tmp = E.Buffer("tmp", (6, 5), "float32", "local")
    by, tx, tx2 = E.Var("by", "int32"), E.Var("tx", "int32"), E.Var("tx2", "int32")
    first = S.For(by, 0, 6, S.ForKind.BLOCK_Y, S.For(tx, 0, 5, S.ForKind.THREAD_X,
                  S.BufferStore(tmp, E.BufferLoad(x, [by, tx]) + 1.0, [by, tx])))
    second = S.For(tx2, 0, 30, S.ForKind.THREAD_X, S.BufferStore(
        out, E.BufferLoad(tmp, [tx2 // 5, tx2 % 5]) * 3.0, [tx2 // 5, tx2 % 5]))
    func = S.PrimFunc("two", [x, out], S.Allocate(tmp, S.SeqStmt([first, second])))
    temps, launches = split_launches(func)
    assert temps == [tmp]
    assert [(launch.grid, launch.block) for launch in launches] == [
        ((1, 6, 1), (5, 1, 1)), ((1, 1, 1), (30, 1, 1))]
    data = np.random.default_rng(0).standard_normal((6, 5)).astype("float32")
    got = np.zeros((6, 5), "float32")
    run(func, data, got)
    np.testing.assert_allclose(got, (data + 1) * 3, rtol=1e-6)
    assert "bind[threadIdx.x](30)" in str(func)


def test_a_bound_loop_of_variable_extent_is_refused():
    out = E.Buffer("out", (8,), "float32")
    bx, tx = E.Var("bx", "int32"), E.Var("tx", "int32")
    body = S.For(bx, 0, 2, S.ForKind.BLOCK_X,
                 S.For(tx, 0, E.sub(8, bx * 4), S.ForKind.THREAD_X,
                       S.BufferStore(out, E.FloatImm(1.0, "float32"), [bx * 4 + tx])))
    func = S.PrimFunc("var", [out], body)
    assert binds_threads(func.body)
    with pytest.raises(LoweringError, match="not a constant"):
        split_launches(func)


def test_shared_is_a_temporary_scope_and_printed():
    tile = E.Buffer("tile", (4,), "float32", "shared")
    stmt = S.Allocate(tile, S.SeqStmt([S.Barrier(), S.BufferStore(tile, 1.0, [0])]))
    text = str(stmt)
    assert "shared" in text and "sync_threads()" in text
    with pytest.raises(TensorExprError, match="scope"):
        E.Buffer("bad", (4,), "float32", "texture")


def reverse_async(wait: bool) -> S.PrimFunc:
    """out[i] = x[block start + 3 - lane] within blocks of 4 (10 elements), the tile filled
    by async copies whose predicate zero-fills the lanes past the end (``wait``: with the
    thread's wait for its group before the barrier)."""
    x, out = E.Buffer("x", (10,), "float32"), E.Buffer("out", (10,), "float32")
    bx, tx = E.Var("bx", "int32"), E.Var("tx", "int32")
    tile = E.Buffer("tile", (4,), "float32", "shared")
    i = bx * 4 + tx
    inside = E.Min(i, E.IntImm(9, "int32"))  # (a clamped index: in bounds either way)
    body = [S.AsyncCopy(tile, [tx], E.BufferLoad(x, [inside]), _lt(i, 10)), S.AsyncCommit(),
            *([S.AsyncWait(0)] if wait else []), S.Barrier()]
    body.append(S.IfThenElse(_lt(i, 10), S.BufferStore(out, E.BufferLoad(tile, [3 - tx]),
                                                       [i])))
    nest = S.For(bx, 0, 3, S.ForKind.BLOCK_X,
                 S.Allocate(tile, S.For(tx, 0, 4, S.ForKind.THREAD_X, S.SeqStmt(body))))
    return S.PrimFunc("reverse_async", [x, out], nest)


def test_async_copies_land_at_the_wait_and_their_predicate_fills_zeros():
    """The interpreter lands a thread's async copies at its wait for their group: with the
    wait the lanes read the mirrored values, the last block's missing ones zero; without
    it the tile is still unwritten (NaN), as on a GPU. The CUDA is ``cp.async`` with the
    predicate as the source size, and NVRTC builds it."""
    x = np.arange(1, 11, dtype="float32")
    out = np.full(10, -1, "float32")
    run(reverse_async(wait=True), x, out)
    np.testing.assert_array_equal(out, [4, 3, 2, 1, 8, 7, 6, 5, 0, 0])
    early = np.full(10, -1, "float32")
    run(reverse_async(wait=False), x, early)
    assert np.isnan(early).all()
    from opfusion.backend.cuda.emitter import cuda_module
    from opfusion.backend.cuda.nvrtc import compile_cuda, nvrtc_available
    from opfusion.target import Target

    code = cuda_module([reverse_async(wait=True)], target=Target("cuda -arch=sm_80")).code
    assert "cp.async.ca.shared.global [%0], [%1], 4, %2;" in code
    assert "cp.async.commit_group" in code and "cp.async.wait_group 0" in code
    if nvrtc_available() is None:
        assert "cp.async.ca.shared.global" in compile_cuda(code, "compute_80").decode()


def test_an_async_copy_goes_from_a_load_into_a_shared_buffer():
    x, local = E.Buffer("x", (4,), "float32"), E.Buffer("t", (4,), "float32", "local")
    shared = E.Buffer("s", (4,), "float32", "shared")
    with pytest.raises(TensorExprError, match="into a shared buffer"):
        S.AsyncCopy(local, [0], E.BufferLoad(x, [0]))
    with pytest.raises(TensorExprError, match="converts nothing"):
        S.AsyncCopy(E.Buffer("i", (4,), "int32", "shared"), [0], E.BufferLoad(x, [0]))
    with pytest.raises(TensorExprError, match="int >= 0"):
        S.AsyncWait(-1)
    copy = S.AsyncCopy(shared, [1], E.BufferLoad(x, [2]), _lt(E.IntImm(1, "int32"), 2))
    assert "async_copy(s[1], x[2], if=" in str(copy)
