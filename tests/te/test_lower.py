"""Lowering checked against NumPy: every schedule primitive on shapes that divide and do not
divide the factors, run by the loop-IR interpreter."""

import numpy as np
import pytest

import opfusion as opf
from opfusion import te
from opfusion.tir import interp
from opfusion.tir import stmt as S
from opfusion.tir.verify import verify

RNG = np.random.default_rng(0)


def run(s, args, *inputs, name="main"):
    """Lower, run on ``inputs`` (arrays for the leading args), return the remaining args."""
    func = opf.lower(s, args, name=name)
    verify(func)
    arrays = list(inputs)
    for t in args[len(inputs):]:
        arrays.append(np.zeros(t.shape, dtype=t.dtype))
    interp.run(func, *arrays)
    outs = arrays[len(inputs):]
    return outs[0] if len(outs) == 1 else outs


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def assert_close(got, want):
    scale = max(float(np.abs(want).max()), 1.0)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)


def loops(func):
    """Every For statement of a PrimFunc, outermost first."""
    out, stack = [], [func.body]
    while stack:
        node = stack.pop()
        if isinstance(node, S.For):
            out.append(node)
            stack.append(node.body)
        elif isinstance(node, S.SeqStmt):
            stack.extend(reversed(node.stmts))
        elif isinstance(node, S.IfThenElse):
            stack.append(node.then_case)
            if node.else_case is not None:
                stack.append(node.else_case)
        elif isinstance(node, (S.Allocate, S.LetStmt)):
            stack.append(node.body)
    return out


def contains_if(stmt):
    return "if " in str(stmt)


# -- vecadd (seed 001) ---------------------------------------------------------------------------


def vecadd(n):
    a = te.placeholder((n,), name="A")
    b = te.placeholder((n,), name="B")
    c = te.compute(a.shape, lambda i: a[i] + b[i], name="C")
    return a, b, c


@pytest.mark.parametrize("n", [1024, 1000])
def test_vecadd_default_schedule(n):
    a, b, c = vecadd(n)
    s = te.create_schedule(c.op)
    x, y = rand(n), rand(n)
    assert_close(run(s, [a, b, c], x, y), x + y)


@pytest.mark.parametrize("n", [1024, 1000, 17])
def test_vecadd_split_parallel(n):
    a, b, c = vecadd(n)
    s = te.create_schedule(c.op)
    outer, inner = s[c].split(c.op.axis[0], factor=64)
    s[c].parallel(outer)
    x, y = rand(n), rand(n)
    assert_close(run(s, [a, b, c], x, y), x + y)


def test_vecadd_lowered_text():
    a, b, c = vecadd(1024)
    s = te.create_schedule(c.op)
    outer, inner = s[c].split(c.op.axis[0], factor=64)
    s[c].parallel(outer)
    s[c].vectorize(inner)
    assert str(opf.lower(s, [a, b, c], name="vecadd")) == (
        "def vecadd(A: float32[1024], B: float32[1024], C: float32[1024]):\n"
        "  for i_outer in parallel(16):\n"
        "    for i_inner in vectorized(64):\n"
        "      C[i_outer*64 + i_inner] = A[i_outer*64 + i_inner] + B[i_outer*64 + i_inner]"
    )


def test_non_dividing_split_shortens_the_vectorized_loop_instead_of_guarding():
    a, b, c = vecadd(1000)
    s = te.create_schedule(c.op)
    outer, inner = s[c].split(c.op.axis[0], factor=64)
    s[c].vectorize(inner)
    func = opf.lower(s, [a, b, c])
    inner_loop = loops(func)[-1]
    assert inner_loop.kind == S.ForKind.VECTORIZED
    assert str(inner_loop.extent) == "min(64, 1000 - i_outer*64)"
    assert not contains_if(func.body)


# -- every primitive, dividing and non-dividing -------------------------------------------------


def elementwise_2d(m, n):
    a = te.placeholder((m, n), name="A")
    b = te.compute((m, n), lambda i, j: a[i, j] * 2.0 + 1.0, name="B")
    return a, b


@pytest.mark.parametrize("shape", [(8, 12), (7, 13)])
@pytest.mark.parametrize("primitive", ["split", "split_nparts", "tile", "reorder", "fuse",
                                       "fuse_split", "split_fuse", "parallel", "vectorize",
                                       "unroll", "split_twice"])
def test_primitive_matches_numpy(primitive, shape):
    a, b = elementwise_2d(*shape)
    s = te.create_schedule(b.op)
    i, j = b.op.axis
    st = s[b]
    if primitive == "split":
        st.split(j, factor=4)
    elif primitive == "split_nparts":
        st.split(i, nparts=3)
    elif primitive == "tile":
        st.tile(i, j, 3, 4)
    elif primitive == "reorder":
        st.reorder(j, i)
    elif primitive == "fuse":
        st.fuse(i, j)
    elif primitive == "fuse_split":
        f = st.fuse(i, j)
        fo, fi = st.split(f, factor=16)
        st.parallel(fo)
        st.vectorize(fi)
    elif primitive == "split_fuse":
        jo, ji = st.split(j, factor=5)
        st.reorder(jo, i, ji)
        st.fuse(i, ji)
    elif primitive == "parallel":
        st.parallel(i)
    elif primitive == "vectorize":
        st.vectorize(j)
    elif primitive == "unroll":
        jo, ji = st.split(j, factor=4)
        st.unroll(ji)
    elif primitive == "split_twice":
        jo, ji = st.split(j, factor=6)
        jio, jii = st.split(ji, factor=4)
        st.vectorize(jii)
    x = rand(*shape)
    assert_close(run(s, [a, b], x), x * 2 + 1)


def test_fuse_then_split_has_no_guard_in_the_vectorized_loop():
    a, b = elementwise_2d(7, 13)
    s = te.create_schedule(b.op)
    f = s[b].fuse(*b.op.axis)
    fo, fi = s[b].split(f, factor=16)
    s[b].vectorize(fi)
    func = opf.lower(s, [a, b])
    assert not contains_if(func.body)
    assert "min(16, 91 - i_j_fused_outer*16)" in str(func)


# -- matmul with a reduction axis ---------------------------------------------------------------


def matmul(m, n, k):
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return a, b, c, r


MATMUL_SHAPES = [(16, 16, 8), (13, 11, 7)]


@pytest.mark.parametrize("shape", MATMUL_SHAPES)
def test_matmul_default(shape):
    m, n, k = shape
    a, b, c, r = matmul(m, n, k)
    s = te.create_schedule(c.op)
    x, y = rand(m, k), rand(k, n)
    assert_close(run(s, [a, b, c], x, y), x @ y)


def test_matmul_default_lowered_text():
    a, b, c, r = matmul(4, 5, 6)
    s = te.create_schedule(c.op)
    assert str(opf.lower(s, [a, b, c])) == (
        "def main(A: float32[4, 6], B: float32[6, 5], C: float32[4, 5]):\n"
        "  for i in range(4):\n"
        "    for j in range(5):\n"
        "      C[i, j] = 0.0f\n"
        "      for k in range(6):\n"
        "        C[i, j] = C[i, j] + A[i, k]*B[k, j]"
    )


@pytest.mark.parametrize("shape", MATMUL_SHAPES)
def test_matmul_tile_reorder_vectorize_unroll(shape):
    m, n, k = shape
    a, b, c, r = matmul(m, n, k)
    s = te.create_schedule(c.op)
    io, jo, ii, ji = s[c].tile(c.op.axis[0], c.op.axis[1], 4, 8)
    ko, ki = s[c].split(r, factor=4)
    s[c].reorder(io, jo, ko, ii, ki, ji)
    s[c].vectorize(ji)
    s[c].unroll(ki)
    s[c].parallel(io)
    x, y = rand(m, k), rand(k, n)
    assert_close(run(s, [a, b, c], x, y), x @ y)


@pytest.mark.parametrize("shape", MATMUL_SHAPES)
def test_matmul_reduction_outside_data_loops_initialises_before_it(shape):
    m, n, k = shape
    a, b, c, r = matmul(m, n, k)
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    s[c].reorder(i, r, j)
    s[c].vectorize(j)
    func = opf.lower(s, [a, b, c])
    text = str(func)
    assert text.index("j_init") < text.index("for k ")
    x, y = rand(m, k), rand(k, n)
    assert_close(run(s, [a, b, c], x, y), x @ y)


@pytest.mark.parametrize("shape", MATMUL_SHAPES + [(37, 29, 19)])
def test_matmul_cache_write_compute_at_register_blocking(shape):
    m, n, k = shape
    a, b, c, r = matmul(m, n, k)
    s = te.create_schedule(c.op)
    cc = s.cache_write(c, "local")
    io, jo, ii, ji = s[c].tile(c.op.axis[0], c.op.axis[1], 4, 8)
    s[cc].compute_at(s[c], jo)
    ci, cj = s[cc].op.axis
    ko, ki = s[cc].split(r, factor=4)
    s[cc].reorder(ko, ki, ci, cj)
    s[cc].vectorize(cj)
    s[cc].unroll(ki)
    s[c].vectorize(ji)
    s[c].parallel(io)
    func = opf.lower(s, [a, b, c])
    local = [b for b in _allocations(func)]
    assert [(buf.name, buf.shape) for buf in local] == [("C_local", (4, 8))]
    x, y = rand(m, k), rand(k, n)
    assert_close(run(s, [a, b, c], x, y), x @ y)
    for loop in loops(func):
        if loop.kind == S.ForKind.VECTORIZED:
            assert not contains_if(loop.body)


def _allocations(func):
    out, stack = [], [func.body]
    while stack:
        node = stack.pop()
        if isinstance(node, S.Allocate):
            out.append(node.buffer)
        for attr in ("body", "then_case", "else_case"):
            child = getattr(node, attr, None)
            if child is not None:
                stack.append(child)
        if isinstance(node, S.SeqStmt):
            stack.extend(node.stmts)
    return out


def test_matmul_register_blocking_text():
    a, b, c, r = matmul(64, 64, 64)
    s = te.create_schedule(c.op)
    cc = s.cache_write(c, "local")
    io, jo, ii, ji = s[c].tile(c.op.axis[0], c.op.axis[1], 4, 16)
    s[cc].compute_at(s[c], jo)
    ci, cj = s[cc].op.axis
    s[cc].reorder(r, ci, cj)
    s[cc].vectorize(cj)
    s[c].vectorize(ji)
    s[c].parallel(io)
    assert str(opf.lower(s, [a, b, c], name="matmul")) == (
        "def matmul(A: float32[64, 64], B: float32[64, 64], C: float32[64, 64]):\n"
        "  for i_outer in parallel(16):\n"
        "    for j_outer in range(4):\n"
        "      with allocate(C_local: float32[4, 16]):\n"
        "        for i_init in range(4):\n"
        "          for j_init in vectorized(16):\n"
        "            C_local[i_init, j_init] = 0.0f\n"
        "        for k in range(64):\n"
        "          for i in range(4):\n"
        "            for j in vectorized(16):\n"
        "              C_local[i, j] = C_local[i, j] + A[i_outer*4 + i, k]*B[k, j_outer*16 + j]\n"
        "        for i_inner in range(4):\n"
        "          for j_inner in vectorized(16):\n"
        "            C[i_outer*4 + i_inner, j_outer*16 + j_inner] = C_local[i_inner, j_inner]"
    )


@pytest.mark.parametrize("shape", MATMUL_SHAPES)
def test_matmul_split_reduction_non_dividing(shape):
    m, n, k = shape
    a, b, c, r = matmul(m, n, k)
    s = te.create_schedule(c.op)
    ko, ki = s[c].split(r, factor=3)
    x, y = rand(m, k), rand(k, n)
    assert_close(run(s, [a, b, c], x, y), x @ y)


# -- reductions ------------------------------------------------------------------------------------


def test_max_and_min_reductions():
    a = te.placeholder((5, 7), name="A")
    k = te.reduce_axis((0, 7), name="k")
    mx = te.compute((5,), lambda i: te.max(a[i, k], axis=k), name="mx")
    k2 = te.reduce_axis((0, 7), name="k2")
    mn = te.compute((5,), lambda i: te.min(a[i, k2], axis=k2), name="mn")
    s = te.create_schedule([mx.op, mn.op])
    x = rand(5, 7)
    got_max, got_min = run(s, [a, mx, mn], x)
    assert_close(got_max, x.max(axis=1))
    assert_close(got_min, x.min(axis=1))


def test_reduction_over_two_axes_to_a_scalar():
    a = te.placeholder((4, 6), name="A")
    k1 = te.reduce_axis((0, 4), name="k1")
    k2 = te.reduce_axis((0, 6), name="k2")
    total = te.compute((), lambda: te.sum(a[k1, k2], axis=[k1, k2]), name="total")
    s = te.create_schedule(total.op)
    x = rand(4, 6)
    assert_close(run(s, [a, total], x), x.sum())


def test_reduce_axis_with_nonzero_start():
    a = te.placeholder((4, 10), name="A")
    k = te.reduce_axis((3, 8), name="k")
    c = te.compute((4,), lambda i: te.sum(a[i, k], axis=k), name="C")
    s = te.create_schedule(c.op)
    ko, ki = s[c].split(k, factor=2)
    x = rand(4, 10)
    assert_close(run(s, [a, c], x), x[:, 3:8].sum(axis=1))


def test_custom_comm_reducer():
    product = te.comm_reducer(lambda x, y: x * y, lambda t: te.const(1, t), name="product")
    a = te.placeholder((3, 4), name="A")
    k = te.reduce_axis((0, 4), name="k")
    c = te.compute((3,), lambda i: product(a[i, k], axis=k), name="C")
    s = te.create_schedule(c.op)
    x = rand(3, 4)
    assert_close(run(s, [a, c], x), x.prod(axis=1))


# -- inlining and compute_at ------------------------------------------------------------------


def fused_elementwise(n):
    x = te.placeholder((n,), name="x")
    mul = te.compute((n,), lambda i: x[i] * 3.0, name="mul")
    add = te.compute((n,), lambda i: mul[i] + 1.0, name="add")
    relu = te.compute((n,), lambda i: te.max(add[i], 0.0), name="relu")
    out = te.compute((n,), lambda i: relu[i] * 0.5 + x[i], name="out")
    return x, mul, add, relu, out


@pytest.mark.parametrize("n", [64, 50])
def test_compute_inline_of_elementwise_producers(n):
    x, mul, add, relu, out = fused_elementwise(n)
    s = te.create_schedule(out.op)
    for t in (mul, add, relu):
        s[t].compute_inline()
    xo, xi = s[out].split(out.op.axis[0], factor=16)
    s[out].parallel(xo)
    s[out].vectorize(xi)
    func = opf.lower(s, [x, out])
    assert len(loops(func)) == 2 and "allocate" not in str(func)
    assert "max(x[i_outer*16 + i_inner]*3.0f + 1.0f, 0.0f)*0.5f" in str(func)
    v = rand(n)
    assert_close(run(s, [x, out], v), np.maximum(v * 3 + 1, 0) * 0.5 + v)


def test_root_intermediates_are_allocated():
    x, mul, add, relu, out = fused_elementwise(10)
    s = te.create_schedule(out.op)
    func = opf.lower(s, [x, out])
    assert [b.name for b in _allocations(func)] == ["mul", "add", "relu"]
    v = rand(10)
    assert_close(run(s, [x, out], v), np.maximum(v * 3 + 1, 0) * 0.5 + v)


@pytest.mark.parametrize("n", [32, 30])
def test_compute_at_of_a_producer_into_a_consumer_loop(n):
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((n,), lambda i: b[i] + 1.0, name="C")
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=8)
    s[b].compute_at(s[c], xo)
    func = opf.lower(s, [a, c])
    assert [(buf.name, buf.shape) for buf in _allocations(func)] == [("B", (8,))]
    assert not contains_if(func.body)
    v = rand(n)
    assert_close(run(s, [a, c], v), v * 2 + 1)


@pytest.mark.parametrize("n", [32, 30])
def test_compute_at_with_a_stencil_consumer_computes_the_halo(n):
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((n - 2,), lambda i: b[i] + b[i + 1] + b[i + 2], name="C")
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=8)
    s[b].compute_at(s[c], xo)
    func = opf.lower(s, [a, c])
    assert [buf.shape for buf in _allocations(func)] == [(10,)]
    v = rand(n)
    b_ref = v * 2
    assert_close(run(s, [a, c], v), b_ref[:-2] + b_ref[1:-1] + b_ref[2:])


def test_compute_at_with_guarded_padding_read():
    n = 20
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] + 1.0, name="B")
    c = te.compute((n,), lambda i: te.if_then_else(i > 0, b[i - 1], 0.0) + b[i], name="C")
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=6)
    s[b].compute_at(s[c], xo)
    func = opf.lower(s, [a, c])
    # the producer's "index >= 0" guard became the start of its loop
    assert not contains_if(func.body)
    assert "for i in range(max(0, 1 - i_outer*6), min(7, 21 - i_outer*6)):" in str(func)
    v = rand(n)
    ref = v + 1
    want = ref + np.concatenate([[0.0], ref[:-1]])
    assert_close(run(s, [a, c], v), want)


@pytest.mark.parametrize("n", [16, 13])
def test_a_stage_read_by_two_siblings_is_computed_at_their_loop(n):
    """B is read by C and D, both computed at E's loop after it (softmax's exponentials, read
    by the row sum and the product): B is computed there too, sized for both readers."""
    a = te.placeholder((n, 8), name="A")
    b = te.compute((n, 8), lambda i, j: a[i, j] * 2.0, name="B")
    r = te.reduce_axis((0, 8), name="r")
    c = te.compute((n,), lambda i: te.sum(b[i, r], axis=r), name="C")
    d = te.compute((n, 8), lambda i, j: b[i, j] + 1.0, name="D")
    e = te.compute((n, 8), lambda i, j: d[i, j] / c[i], name="E")
    s = te.create_schedule(e.op)
    io, ii = s[e].split(e.op.axis[0], factor=4)
    for stage in (b, c, d):
        s[stage].compute_at(s[e], io)
    func = opf.lower(s, [a, e])
    assert sorted((buf.name, buf.shape) for buf in _allocations(func)) == [
        ("B", (4, 8)), ("C", (4,)), ("D", (4, 8))]
    v = rand(n, 8)
    assert_close(run(s, [a, e], v), (v * 2 + 1) / (v * 2).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("n", [24, 22])
def test_a_stage_read_by_a_sibling_at_an_inner_loop_covers_its_iterations(n):
    """B (a padded row, say) is computed at E's outer loop and read by C, computed at E's
    inner loop (a register tile's sums, whose epilogue E then runs at once): B holds what
    every inner iteration of C reads, halo included, and is computed once per outer one."""
    a = te.placeholder((n + 2,), name="A")
    b = te.compute((n + 2,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((n,), lambda i: b[i] + b[i + 1] + b[i + 2], name="C")
    e = te.compute((n,), lambda i: c[i] * 0.5, name="E")
    s = te.create_schedule(e.op)
    outer, inner = s[e].split(e.op.axis[0], factor=8)
    tile, _ = s[e].split(inner, factor=4)
    s[c].compute_at(s[e], tile)
    s[b].compute_at(s[e], outer)
    func = opf.lower(s, [a, e])
    assert sorted((buf.name, buf.shape) for buf in _allocations(func)) == [
        ("B", (10,)), ("C", (4,))]
    v = rand(n + 2)
    assert_close(run(s, [a, e], v), (v[:-2] + v[1:-1] + v[2:]) * 2 * 0.5)


def test_a_stage_read_outside_its_attachment_is_an_error():
    a = te.placeholder((8,), name="A")
    b = te.compute((8,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((8,), lambda i: b[i] + 1.0, name="C")
    d = te.compute((8,), lambda i: c[i] + b[i], name="D")
    s = te.create_schedule(d.op)
    xo, _ = s[c].split(c.op.axis[0], factor=4)
    s[b].compute_at(s[c], xo)
    with pytest.raises(opf.errors.LoweringError, match="read by D there too"):
        opf.lower(s, [a, d])


@pytest.mark.parametrize("shape", [(12, 16), (11, 13)])
def test_compute_at_2d_box_filter(shape):
    h, w = shape
    a = te.placeholder((h, w), name="A")
    b = te.compute((h, w), lambda i, j: a[i, j] * 0.5, name="B")
    di = te.reduce_axis((0, 3), name="di")
    dj = te.reduce_axis((0, 3), name="dj")
    c = te.compute((h - 2, w - 2), lambda i, j: te.sum(b[i + di, j + dj], axis=[di, dj]),
                   name="C")
    s = te.create_schedule(c.op)
    io, jo, ii, ji = s[c].tile(c.op.axis[0], c.op.axis[1], 4, 4)
    s[b].compute_at(s[c], jo)
    func = opf.lower(s, [a, c])
    assert [buf.shape for buf in _allocations(func)] == [(6, 6)]
    v = rand(h, w)
    bb = v * 0.5
    want = sum(bb[x:x + h - 2, y:y + w - 2] for x in range(3) for y in range(3))
    assert_close(run(s, [a, c], v), want)


def test_compute_at_a_reduction_loop():
    a = te.placeholder((6, 10), name="A")
    b = te.compute((6, 10), lambda i, j: a[i, j] * a[i, j], name="B")
    k = te.reduce_axis((0, 10), name="k")
    c = te.compute((6,), lambda i: te.sum(b[i, k], axis=k), name="C")
    s = te.create_schedule(c.op)
    s[b].compute_at(s[c], k)
    func = opf.lower(s, [a, c])
    assert [buf.shape for buf in _allocations(func)] == [(1, 1)]
    v = rand(6, 10)
    assert_close(run(s, [a, c], v), (v * v).sum(axis=1))


def test_nested_compute_at_chain():
    n = 26
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] + 1.0, name="B")
    c = te.compute((n - 1,), lambda i: b[i] * b[i + 1], name="C")
    d = te.compute((n - 2,), lambda i: c[i] - c[i + 1], name="D")
    s = te.create_schedule(d.op)
    xo, xi = s[d].split(d.op.axis[0], factor=5)
    s[c].compute_at(s[d], xo)
    co, ci = s[c].split(s[c].op.axis[0], factor=3)
    s[b].compute_at(s[c], co)
    v = rand(n)
    bb = v + 1
    cc = bb[:-1] * bb[1:]
    assert_close(run(s, [a, d], v), cc[:-1] - cc[1:])


def test_compute_at_mixed_with_inline():
    n = 18
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((n,), lambda i: b[i] + 1.0, name="C")  # inlined into D
    d = te.compute((n,), lambda i: c[i] * c[i], name="D")
    s = te.create_schedule(d.op)
    s[c].compute_inline()
    xo, xi = s[d].split(d.op.axis[0], factor=4)
    s[b].compute_at(s[d], xo)
    v = rand(n)
    assert_close(run(s, [a, d], v), (v * 2 + 1) ** 2)


def test_cache_write_of_an_elementwise_stage():
    a, b = elementwise_2d(6, 10)
    s = te.create_schedule(b.op)
    bl = s.cache_write(b, "local")
    io, jo, ii, ji = s[b].tile(*b.op.axis, 4, 4)
    s[bl].compute_at(s[b], jo)
    x = rand(6, 10)
    assert_close(run(s, [a, b], x), x * 2 + 1)


def test_output_that_is_also_read_by_another_output():
    a = te.placeholder((9,), name="A")
    b = te.compute((9,), lambda i: a[i] + 1.0, name="B")
    c = te.compute((9,), lambda i: b[i] * 2.0, name="C")
    s = te.create_schedule([b.op, c.op])
    x = rand(9)
    got_b, got_c = run(s, [a, b, c], x)
    assert_close(got_b, x + 1)
    assert_close(got_c, (x + 1) * 2)


def test_integer_and_mixed_dtypes():
    a = te.placeholder((7,), dtype="int32", name="A")
    b = te.compute((7,), lambda i: (a[i] * 3 + i) // 2 % 5, name="B")
    c = te.compute((7,), lambda i: te.cast(b[i], "float32") * 0.5, name="C")
    s = te.create_schedule(c.op)
    x = RNG.integers(-50, 50, size=7).astype("int32")
    got = run(s, [a, c], x)
    want = (((x * 3 + np.arange(7)) // 2) % 5).astype("float32") * 0.5
    assert_close(got, want)


def test_names_in_lowered_ir_are_unique_c_identifiers():
    a = te.placeholder((8,), name="in.put")
    b = te.compute((8,), lambda i: a[i] + 1.0, name="my-op")
    c = te.compute((8,), lambda i: b[i] * 2.0, name="my-op")
    s = te.create_schedule(c.op)
    s[b].compute_at(s[c], c.op.axis[0])
    text = str(opf.lower(s, [a, c]))
    assert "def main(in_put: float32[8], my_op: float32[8]):" in text
    assert "allocate(my_op_1: float32[1])" in text


def test_lowering_is_deterministic():
    def build():
        a, b, c, r = matmul(13, 11, 7)
        s = te.create_schedule(c.op)
        cc = s.cache_write(c, "local")
        io, jo, ii, ji = s[c].tile(c.op.axis[0], c.op.axis[1], 4, 8)
        s[cc].compute_at(s[c], jo)
        return str(opf.lower(s, [a, b, c]))

    assert build() == build()


def test_long_inlined_chain_lowers_and_prints():
    # graph-level fusion inlines long elementwise chains: nothing may recurse per stage
    x = te.placeholder((64,), name="x")
    t, chain = x, []
    for n in range(400):
        t = te.compute(t.shape, lambda i, p=t: te.max(p[i] * 1.5 + 0.25, 0.0), name=f"t{n}")
        chain.append(t)
    s = te.create_schedule(t.op)
    for stage in chain[:-1]:
        s[stage].compute_inline()
    func = opf.lower(s, [x, t])
    assert str(func).count("max(") == 400


def test_repeated_reads_of_an_inlined_tensor_share_one_expansion():
    x = te.placeholder((8,), name="x")
    t = x
    for n in range(40):  # each level reads the previous one twice: 2**40 reads unshared
        t = te.compute(t.shape, lambda i, p=t: p[i] * p[i] + 1.0, name=f"t{n}")
    s = te.create_schedule(t.op)
    for stage in s.stages[1:-1]:
        stage.compute_inline()
    func = opf.lower(s, [x, t])
    store = func.body.body
    from opfusion.tir.expr import post_order
    assert len(post_order(store.value)) < 200
