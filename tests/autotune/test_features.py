"""The tuner's cost-model features: finite, fixed-length vectors of real lowered kernels that
tell configs apart, the same for the same kernel; exact values on hand-written loop IR; and
knob values as numbers."""

import math

import numpy as np
import pytest

import opfusion as opf
from opfusion.autotune.features import (
    FEATURE_NAMES,
    candidate_features,
    knob_features,
    loop_features,
)
from opfusion.backend import get_backend
from opfusion.backend.schedule_rule import ConfigSpace, Knob, ScheduleError
from opfusion.compiler.lower_group import lower_primitive_function, schedule_space
from opfusion.ir.expr import Function
from opfusion.target import Target
from opfusion.tir import expr as E
from opfusion.tir import stmt as S
from opfusion.tir.work import kernel_work
from opfusion.topi.testing import call_over_arrays

nn = opf.op.nn
AVX2 = "c -mattr=+avx2,+fma -num-cores=2"
AVX512 = "c -mattr=+avx512f -num-cores=2"


def zeros(*shape):
    return np.zeros(shape, "float32")


def nchwc_conv(block):
    """A 3x3 blocked convolution with ``block`` channels per block, then relu."""
    layouts = {"data_layout": f"NCHW{block}c", "kernel_layout": f"OIHW{block}i{block}o",
               "out_layout": f"NCHW{block}c"}
    return (lambda x, w: nn.relu(nn.conv2d_nchwc(x, w, padding=1, **layouts)),
            (zeros(1, 2, 10, 12, block), zeros(3, 2, 3, 3, block, block)))


GROUPS = {
    "conv2d_nchwc": nchwc_conv(8),
    "dense": (nn.dense, (zeros(16, 32), zeros(32, 32))),
}


def group(name, target=AVX2):
    """(primitive function, backend, space, default config) of one of GROUPS."""
    builder, arrays = GROUPS[name] if isinstance(name, str) else name
    call, params, _ = call_over_arrays(builder, arrays, {})
    func = Function(params, call)
    backend = get_backend(target)
    _, space, default = schedule_space(func, backend)
    return func, backend, space, default


def lowered(func, backend, config):
    return lower_primitive_function(func, "k", backend, config).prim_func


def feature(vector, name):
    return vector[FEATURE_NAMES.index(name)]


# ---------------------------------------------------------------------------------------------
# real kernels


@pytest.mark.parametrize("name", list(GROUPS))
def test_real_kernels_give_finite_vectors_of_the_right_length(name):
    func, backend, space, default = group(name)
    for config in [default, *space.sample(2, seed=0)]:
        got = candidate_features(lowered(func, backend, config), config, space)
        assert got.dtype == np.float64
        assert got.shape == (len(FEATURE_NAMES) + len(space.knobs),)
        assert np.isfinite(got).all()


@pytest.mark.parametrize("name, knob", [("conv2d_nchwc", "row_block"), ("dense", "k_unroll")])
def test_a_knob_that_reshapes_the_loops_changes_the_loop_features(name, knob):
    func, backend, space, default = group(name)
    values = space.knob(knob).values
    configs = [space.config(**{**default, knob: v}) for v in (values[0], values[-1])]
    first, last = (loop_features(lowered(func, backend, c)) for c in configs)
    assert not np.array_equal(first, last)


@pytest.mark.parametrize("name", list(GROUPS))
def test_distinct_configs_give_distinct_candidate_features(name):
    func, backend, space, _ = group(name)
    configs = space.sample(6, seed=1)
    vectors = {candidate_features(lowered(func, backend, c), c, space).tobytes()
               for c in configs}
    assert len(vectors) == len(configs)


@pytest.mark.parametrize("target, block", [(AVX2, 8), (AVX512, 16)])
def test_vector_lanes_is_the_targets_vector_width(target, block):
    func, backend, space, default = group(nchwc_conv(block), target)
    assert Target(target).vector_lanes("float32") == block
    for config in [default, *space.sample(2, seed=0)]:
        assert feature(loop_features(lowered(func, backend, config)), "vector_lanes") == block


@pytest.mark.parametrize("name", list(GROUPS))
def test_executions_count_what_kernel_work_counts(name):
    func, backend, _, default = group(name)
    prim = lowered(func, backend, default)
    want = math.log2(1 + kernel_work(prim.body))
    assert feature(loop_features(prim), "executions") == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("name", list(GROUPS))
def test_features_are_deterministic(name):
    func, backend, space, default = group(name)
    once = candidate_features(lowered(func, backend, default), default, space)
    again = candidate_features(lowered(func, backend, default), default, space)
    assert np.array_equal(once, again)
    prim = lowered(func, backend, default)
    assert np.array_equal(loop_features(prim), loop_features(prim))


# ---------------------------------------------------------------------------------------------
# hand-written loop IR with known features


def tiled_kernel():
    """For each of 64 rows (parallel): zero an 8-lane accumulator, add 4 unrolled slices of
    the row times 2, store the accumulator into the row's first 8 columns."""
    a = E.Buffer("A", (64, 32))
    b = E.Buffer("B", (64, 32))
    acc = E.Buffer("acc", (8,), scope="local")
    i, j0, j1, j2, k = (E.Var(n) for n in ("i", "j0", "j1", "j2", "k"))
    zero = S.For(j0, 0, 8, S.ForKind.VECTORIZED, S.BufferStore(acc, 0.0, [j0]))
    update = S.BufferStore(acc, acc.load([j1]) + a.load([i, k * 8 + j1]) * 2.0, [j1])
    accumulate = S.For(k, 0, 4, S.ForKind.UNROLLED,
                       S.For(j1, 0, 8, S.ForKind.VECTORIZED, update))
    store = S.For(j2, 0, 8, S.ForKind.SERIAL, S.BufferStore(b, acc.load([j2]), [i, j2]))
    body = S.For(i, 0, 64, S.ForKind.PARALLEL,
                 S.Allocate(acc, S.SeqStmt([zero, accumulate, store])))
    return S.PrimFunc("tiled", [a, b], body)


def test_hand_written_kernel_has_the_expected_features():
    got = dict(zip(FEATURE_NAMES, loop_features(tiled_kernel())))
    log = lambda x: math.log2(1 + x)  # noqa: E731
    main = 64 * 4 * 8  # executions of the update, the main statement
    # work: executions x (1 + loads + float ops): 1 for the zeroing, 5 for the update, 2 for
    # the copy out (not vectorized)
    want = {
        "loops": log(5), "max_depth": 3, "ifs": 0, "variable_extents": 0, "stores": 3,
        "executions": log(64 * 8 + main + 64 * 8), "float_ops": log(2 * main),
        "loads": log(2 * main + 64 * 8), "global_bytes": log(2 * 64 * 32 * 4),
        "scratch_bytes": log(8 * 4), "parallel_loops": 1, "parallel_tasks": log(64),
        "vector_lanes": 8, "unroll_product": log(4), "main_depth": 3,
        "main_outer_extent": log(64), "inner1_extent": log(8), "inner2_extent": log(32),
        "inner3_extent": log(main), "inner_stride": log(1), "accumulator_bytes": log(32),
        "intensity": log(2 * main / (2 * 64 * 32 * 4 + 32)),
        "vectorized_share": (64 * 8 + main * 5) / (64 * 8 + main * 5 + 64 * 8 * 2),
    }
    assert {name: got[name] for name in want} == pytest.approx(want, rel=1e-12)


def test_guards_lets_and_edge_loops_are_counted():
    # for i in range(10): for j in range(min(4, 10 - i)): t = i + j; if t < 8: C[i] = C[i] + 1
    c = E.Buffer("C", (10,))
    i, j, t = E.Var("i"), E.Var("j"), E.Var("t")
    guarded = S.IfThenElse(t < 8, S.BufferStore(c, c.load([i]) + 1.0, [i]))
    body = S.For(i, 0, 10, S.ForKind.SERIAL,
                 S.For(j, 0, E.minimum(4, 10 - i), S.ForKind.SERIAL,
                       S.LetStmt(t, i + j, guarded)))
    func = S.PrimFunc("edges", [c], body)
    got = loop_features(func)
    assert feature(got, "ifs") == 1
    assert feature(got, "variable_extents") == 1
    assert feature(got, "executions") == math.log2(1 + kernel_work(body))
    assert feature(got, "inner_stride") == 0  # C[i] does not move along j
    assert np.isfinite(got).all()


def test_an_empty_kernel_has_finite_features():
    func = S.PrimFunc("empty", [E.Buffer("out", (0, 4))], S.Evaluate(E.IntImm(0)))
    got = loop_features(func)
    assert got.shape == (len(FEATURE_NAMES),)
    assert feature(got, "executions") == 1 and feature(got, "loops") == 0
    assert np.isfinite(got).all()


# ---------------------------------------------------------------------------------------------
# knobs


TOY = ConfigSpace("toy", [Knob("tile", (1, 4, 16)), Knob("shift", (-3, 0)),
                          Knob("parallel", (True, False)), Knob("order", ("ij", "ji", "kij"))])


def test_knob_features_turn_ints_bools_and_strings_into_numbers():
    config = TOY.config(tile=4, shift=-3, parallel=True, order="kij")
    assert knob_features(config, TOY).tolist() == [math.log2(5), -2.0, 1.0, 2.0]
    plain = {"tile": 1, "shift": 0, "parallel": False, "order": "ij"}
    assert knob_features(plain, TOY).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_knob_features_need_every_knob_of_the_space():
    with pytest.raises(ScheduleError, match="lacks knob 'order'"):
        knob_features({"tile": 1, "shift": 0, "parallel": False}, TOY)
