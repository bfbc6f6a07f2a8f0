"""Random schedules (splits, fuses, reorders, loop kinds, compute_at, cache_write) of small
kernels agree with NumPy when lowered and interpreted."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opfusion as opf
from opfusion import te
from opfusion.tir import interp
from opfusion.tir.verify import verify

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _random_loop_nest(data, stage, allow_parallel=True):
    """Apply a few random legal primitives to ``stage``."""
    for _ in range(data.draw(st.integers(0, 4), label="steps")):
        leaves = stage.leaf_iter_vars
        action = data.draw(st.sampled_from(["split", "nparts", "fuse", "reorder"]),
                           label="action")
        if action in ("split", "nparts"):
            var = data.draw(st.sampled_from(leaves), label="var")
            amount = data.draw(st.integers(1, 5), label="factor")
            if action == "split":
                stage.split(var, factor=amount)
            else:
                stage.split(var, nparts=amount)
        elif action == "fuse" and len(leaves) >= 2:
            pos = data.draw(st.integers(0, len(leaves) - 2), label="pos")
            a, b = leaves[pos], leaves[pos + 1]
            if a.iter_type == b.iter_type:
                stage.fuse(a, b)
        elif action == "reorder":
            stage.reorder(*data.draw(st.permutations(leaves), label="order"))
    leaves = stage.leaf_iter_vars
    data_leaves = [v for v in leaves if not v.is_reduce]
    if data_leaves and data.draw(st.booleans(), label="vectorize"):
        stage.vectorize(data_leaves[-1])
    if data.draw(st.booleans(), label="unroll"):
        stage.unroll(data.draw(st.sampled_from(leaves), label="unrolled"))
    first_reduce = next((i for i, v in enumerate(leaves) if v.is_reduce), len(leaves))
    outer_data = [v for v in leaves[:first_reduce] if stage.iter_var_attrs.get(v) is None]
    if allow_parallel and outer_data and data.draw(st.booleans(), label="parallel"):
        stage.parallel(outer_data[0])


@SETTINGS
@given(st.data(), st.integers(1, 7), st.integers(1, 7), st.integers(1, 6))
def test_random_matmul_schedule(data, m, n, k):
    a = te.placeholder((m, k), name="A")
    b = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    s = te.create_schedule(c.op)
    if data.draw(st.booleans(), label="cache_write"):
        cc = s.cache_write(c, "local")
        _random_loop_nest(data, s[c])
        at = data.draw(st.sampled_from(s[c].leaf_iter_vars), label="attach")
        s[cc].compute_at(s[c], at)
        parallel_above = any(s[c].iter_var_attrs.get(v) is not None
                             for v in s[c].leaf_iter_vars)
        _random_loop_nest(data, s[cc], allow_parallel=not parallel_above)
    else:
        _random_loop_nest(data, s[c])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((m, k)).astype("float32")
    y = rng.standard_normal((k, n)).astype("float32")
    got = np.zeros((m, n), "float32")
    try:
        func = opf.lower(s, [a, b, c])
    except opf.OpfusionError as err:
        assert "parallel" in str(err)  # nested parallel loops are refused, nothing else
        return
    verify(func)
    interp.run(func, x, y, got)
    np.testing.assert_allclose(got, x @ y, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(st.data(), st.integers(2, 9), st.integers(1, 8))
def test_random_producer_consumer_schedule(data, h, w):
    a = te.placeholder((h + 1, w), name="A")
    b = te.compute((h + 1, w), lambda i, j: a[i, j] * 2.0, name="B")
    c = te.compute((h, w), lambda i, j: b[i, j] + b[i + 1, j], name="C")
    s = te.create_schedule(c.op)
    _random_loop_nest(data, s[c])
    where = data.draw(st.sampled_from(["root", "inline", "at"]), label="where")
    if where == "inline":
        s[b].compute_inline()
    elif where == "at":
        s[b].compute_at(s[c], data.draw(st.sampled_from(s[c].leaf_iter_vars), label="at"))
        _random_loop_nest(data, s[b], allow_parallel=False)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((h + 1, w)).astype("float32")
    got = np.zeros((h, w), "float32")
    try:
        func = opf.lower(s, [a, c])
    except opf.OpfusionError as err:
        assert "parallel" in str(err)
        return
    verify(func)
    interp.run(func, x, got)
    np.testing.assert_allclose(got, 2 * x[:-1] + 2 * x[1:], rtol=1e-5, atol=1e-5)
