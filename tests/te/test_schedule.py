"""Schedules: stages, IterVar relations and leaf bookkeeping, and clear errors for illegal
requests."""

import pytest

import opfusion as opf
from opfusion import te
from opfusion.errors import LoweringError, ScheduleError


def _vecadd(n=1024):
    a = te.placeholder((n,), name="A")
    b = te.placeholder((n,), name="B")
    c = te.compute(a.shape, lambda i: a[i] + b[i], name="C")
    return a, b, c


def _matmul(m=16, n=16, k=16):
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return a, b, c, r


def test_one_stage_per_operation_in_post_dfs_order():
    a, b, c = _vecadd()
    s = te.create_schedule(c.op)
    assert [st.name for st in s.stages] == ["A", "B", "C"]
    assert s[c] is s[c.op] and s[c].op is c.op


def test_split_records_relation_and_leaves():
    *_, c = _vecadd()
    s = te.create_schedule(c.op)
    (i,) = c.op.axis
    xo, xi = s[c].split(i, factor=64)
    rel = s[c].relations[0]
    assert isinstance(rel, te.Split) and rel.parent is i and rel.outer is xo and rel.inner is xi
    assert s[c].leaf_iter_vars == [xo, xi]
    assert s[c].all_iter_vars == [i, xo, xi]
    assert (xo.dom.extent, xi.dom.extent) == (16, 64)


def test_split_by_nparts():
    *_, c = _vecadd(1000)
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], nparts=8)
    assert (xo.dom.extent, xi.dom.extent) == (8, 125)


def test_tile_returns_four_loops_in_tile_order():
    *_, c, r = _matmul()
    s = te.create_schedule(c.op)
    xo, yo, xi, yi = s[c].tile(c.op.axis[0], c.op.axis[1], 4, 8)
    assert s[c].leaf_iter_vars == [xo, yo, xi, yi, r]


def test_reorder_fills_the_positions_of_the_given_loops():
    *_, c, r = _matmul()
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    s[c].reorder(r, i)
    assert s[c].leaf_iter_vars == [r, j, i]


def test_fuse_adjacent_loops():
    *_, c, r = _matmul()
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    f = s[c].fuse(i, j)
    assert f.dom.extent == 256 and s[c].leaf_iter_vars == [f, r]
    assert isinstance(s[c].relations[0], te.Fuse)


def test_loop_kinds_are_recorded():
    *_, c = _vecadd()
    s = te.create_schedule(c.op)
    xo, xi = s[c].split(c.op.axis[0], factor=8)
    s[c].parallel(xo)
    s[c].vectorize(xi)
    assert s[c].iter_var_attrs[xo].value == "parallel"
    assert s[c].iter_var_attrs[xi].value == "vectorized"
    assert "i_outer:parallel" in repr(s[c])


def test_cache_write_inserts_a_stage_and_keeps_the_axes():
    *_, c, r = _matmul()
    s = te.create_schedule(c.op)
    cc = s.cache_write(c, "local")
    assert [st.name for st in s.stages] == ["A", "B", "C.local", "C"]
    assert s[c].op.axis == c.op.axis  # the copy keeps the original axes
    assert s[cc].op.reduce_axis == (r,)
    assert s[c].op.input_tensors == [cc]


# -- illegal requests ----------------------------------------------------------------------------


def test_split_of_a_var_that_is_no_longer_a_leaf():
    *_, c = _vecadd()
    s = te.create_schedule(c.op)
    (i,) = c.op.axis
    s[c].split(i, factor=8)
    with pytest.raises(ScheduleError, match=r"stage C: cannot split i: it is no longer a loop.*"
                                            r"split into i_outer, i_inner"):
        s[c].split(i, factor=4)


def test_split_of_a_var_from_another_stage():
    a, b, c = _vecadd()
    d = te.compute(c.shape, lambda i: c[i] * 2.0, name="D")
    s = te.create_schedule(d.op)
    with pytest.raises(ScheduleError, match="stage D: cannot split i: it does not belong"):
        s[d].split(c.op.axis[0], factor=4)


@pytest.mark.parametrize("kwargs", [{}, {"factor": 4, "nparts": 2}, {"factor": 0},
                                    {"nparts": -1}, {"factor": 2.5}])
def test_split_needs_one_positive_factor(kwargs):
    *_, c = _vecadd()
    s = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match="stage C: split of i"):
        s[c].split(c.op.axis[0], **kwargs)


def test_vectorize_a_reduction_axis():
    *_, c, r = _matmul()
    s = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match="stage C: cannot vectorize k: it is a reduction"):
        s[c].vectorize(r)


def test_parallel_on_a_reduction_axis():
    *_, c, r = _matmul()
    s = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match="cannot parallel k: it is a reduction"):
        s[c].parallel(r)


def test_parallel_inside_a_reduction():
    *_, c, r = _matmul()
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    s[c].reorder(r, i)
    with pytest.raises(ScheduleError, match="cannot parallelize j: it is inside the reduction"):
        s[c].parallel(j)


def test_parallel_moved_inside_a_reduction_afterwards_fails_at_lowering():
    a, b, c, r = _matmul()
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    s[c].parallel(j)
    s[c].reorder(r, j)
    with pytest.raises(ScheduleError, match="parallel loop j is inside the reduction loop k"):
        opf.lower(s, [a, b, c])


def test_fuse_non_adjacent_loops():
    *_, c, r = _matmul()
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    with pytest.raises(ScheduleError, match="cannot fuse i and k: fused loops must be adjacent"):
        s[c].fuse(i, r)


def test_fuse_in_the_wrong_order():
    *_, c, r = _matmul()
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    with pytest.raises(ScheduleError, match="outermost first"):
        s[c].fuse(j, i)


def test_fuse_a_reduction_with_a_data_loop():
    *_, c, r = _matmul()
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    with pytest.raises(ScheduleError, match="one is a reduction loop"):
        s[c].fuse(j, r)


def test_reorder_with_a_repeated_loop():
    *_, c, r = _matmul()
    s = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match="twice"):
        s[c].reorder(r, r)


def test_compute_inline_of_a_reduction():
    a, b, c, r = _matmul()
    d = te.compute(c.shape, lambda i, j: c[i, j] + 1.0, name="D")
    s = te.create_schedule(d.op)
    with pytest.raises(ScheduleError, match="stage C: cannot compute_inline a reduction"):
        s[c].compute_inline()


def test_compute_inline_of_an_output():
    *_, c = _vecadd()
    s = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match="output"):
        s[c].compute_inline()


def test_primitives_on_a_placeholder():
    a, b, c = _vecadd()
    s = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match="stage A: compute_inline on a placeholder"):
        s[a].compute_inline()


def test_compute_at_a_var_not_in_the_parent():
    a, b, c = _vecadd()
    d = te.compute(c.shape, lambda i: c[i] * 2.0, name="D")
    s = te.create_schedule(d.op)
    with pytest.raises(ScheduleError, match="stage C: cannot compute_at D's loop i: it is not "
                                            "one of D's current loops"):
        s[c].compute_at(s[d], c.op.axis[0])


def test_compute_at_a_stage_that_does_not_read_it():
    a, b, c = _vecadd()
    d = te.compute(a.shape, lambda i: a[i] * 2.0, name="D")
    e = te.compute(a.shape, lambda i: c[i] + d[i], name="E")
    s = te.create_schedule(e.op)
    with pytest.raises(ScheduleError, match="D does not read C"):
        s[c].compute_at(s[d], d.op.axis[0])


def test_compute_at_a_loop_split_afterwards_fails_at_lowering():
    a, b, c = _vecadd()
    d = te.compute(c.shape, lambda i: c[i] * 2.0, name="D")
    s = te.create_schedule(d.op)
    (i,) = d.op.axis
    s[c].compute_at(s[d], i)
    s[d].split(i, factor=4)
    with pytest.raises(LoweringError, match="no longer a loop of D"):
        opf.lower(s, [a, b, d])


def test_compute_at_a_stage_with_another_reader_fails_at_lowering():
    a, b, c = _vecadd()
    d = te.compute(c.shape, lambda i: c[i] * 2.0, name="D")
    e = te.compute(c.shape, lambda i: c[i] + d[i], name="E")
    s = te.create_schedule(e.op)
    s[c].compute_at(s[d], d.op.axis[0])
    with pytest.raises(LoweringError, match="read by E there too"):
        opf.lower(s, [a, b, e])


def test_compute_at_an_inlined_parent_fails_at_lowering():
    a, b, c = _vecadd()
    d = te.compute(c.shape, lambda i: c[i] * 2.0, name="D")
    e = te.compute(c.shape, lambda i: d[i] + 1.0, name="E")
    s = te.create_schedule(e.op)
    s[c].compute_at(s[d], d.op.axis[0])
    s[d].compute_inline()
    with pytest.raises(LoweringError, match="which is inlined"):
        opf.lower(s, [a, b, e])


def test_cache_write_after_other_primitives():
    *_, c = _vecadd()
    s = te.create_schedule(c.op)
    s[c].split(c.op.axis[0], factor=4)
    with pytest.raises(ScheduleError, match="cache_write must come before"):
        s.cache_write(c, "local")


def test_nested_parallel_loops_fail_at_lowering():
    a, b, c, r = _matmul()
    s = te.create_schedule(c.op)
    i, j = c.op.axis
    s[c].parallel(i)
    s[c].parallel(j)
    with pytest.raises(ScheduleError, match="inside another parallel loop"):
        opf.lower(s, [a, b, c])


def test_lowering_needs_every_placeholder_in_args():
    a, b, c = _vecadd()
    s = te.create_schedule(c.op)
    with pytest.raises(LoweringError, match="placeholder B is read by C but is not in the"):
        opf.lower(s, [a, c])


def test_lowering_needs_the_outputs_in_args():
    a, b, c = _vecadd()
    s = te.create_schedule(c.op)
    with pytest.raises(LoweringError, match="output C"):
        opf.lower(s, [a, b])


def test_lowering_refuses_duplicate_args():
    a, b, c = _vecadd()
    s = te.create_schedule(c.op)
    with pytest.raises(LoweringError, match="twice"):
        opf.lower(s, [a, a, b, c])


def test_stage_of_a_foreign_tensor():
    *_, c = _vecadd()
    other = te.placeholder((3,), name="X")
    s = te.create_schedule(c.op)
    with pytest.raises(ScheduleError, match="X is not part of this schedule"):
        _ = s[other]
