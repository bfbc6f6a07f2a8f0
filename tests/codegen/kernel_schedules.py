"""Schedules the code-generation tests share."""

from opfusion import te


def _cached_matmul(m: int, n: int, k: int):
    """A, B, C = A @ B, its schedule and C's local cache (the accumulator)."""
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = te.create_schedule(C.op)
    return A, B, C, s, s.cache_write(C, "local")


def tiled_matmul(m: int, n: int, k: int, rows: int, cols: int, depth_unroll: int = 1,
                 parallel: bool = False):
    """C = A @ B with C's (rows x cols) tiles accumulated in a local buffer: the depth loop
    outside (split by ``depth_unroll`` and the inner part unrolled), ``rows`` unrolled,
    ``cols`` vectorized; the row tiles in parallel with ``parallel``. Returns the schedule
    and its tensors."""
    A, B, C, s, CC = _cached_matmul(m, n, k)
    io, jo, ii, ji = s[C].tile(C.op.axis[0], C.op.axis[1], rows, cols)
    s[C].vectorize(ji)
    if parallel:
        s[C].parallel(io)
    s[CC].compute_at(s[C], jo)
    ic, jc = s[CC].op.axis
    (rc,) = s[CC].op.reduce_axis
    if depth_unroll > 1:
        ro, ri = s[CC].split(rc, factor=depth_unroll)
        s[CC].reorder(ro, ri, ic, jc)
        s[CC].unroll(ri)
    else:
        s[CC].reorder(rc, ic, jc)
    s[CC].unroll(ic)
    s[CC].vectorize(jc)
    return s, [A, B, C]


def blocked_sum_matmul(m: int, n: int, k: int, rows: int, cols: int, block: int):
    """C = A @ B whose depth loop is split by ``block``, the block loop outside the columns'
    outer loop: each register tile sums one block of the depth, then the next."""
    A, B, C, s, CC = _cached_matmul(m, n, k)
    io, _ = s[C].split(C.op.axis[0], factor=rows)
    s[CC].compute_at(s[C], io)
    ic, jc = s[CC].op.axis
    (rc,) = s[CC].op.reduce_axis
    ro, ri = s[CC].split(rc, factor=block)
    jo, ji = s[CC].split(jc, factor=cols)
    s[CC].reorder(ro, jo, ri, ic, ji)
    s[CC].unroll(ic)
    s[CC].vectorize(ji)
    return s, [A, B, C]
