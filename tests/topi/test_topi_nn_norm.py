"""The TE computes of softmax, log_softmax, layer_norm, batch_norm (inference), lrn agree with
their NumPy references, run by the loop-IR interpreter."""

import numpy as np
import pytest

import opfusion as opf
from opfusion import te
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule
from opfusion.te.lower import lower
from opfusion.testing import assert_close
from opfusion.tir.interp import run
from opfusion.topi import get_compute
from opfusion.topi.testing import call_over_arrays, check_compute
from opfusion.transform import InferType

nn = opf.op.nn


def normal(*shape, dtype="float32", seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def check_unread_inputs(builder, *arrays, **attrs):
    """check_compute for a call whose compute ignores some inputs (gamma without ``scale``,
    beta without ``center``): ``lower`` rejects an argument the schedule never reads, so only
    the inputs the compute reads become arguments."""
    call, params, values = call_over_arrays(builder, arrays, attrs)
    want = evaluate(IRModule.from_expr(Function(params, call)), values)
    holders = [te.placeholder(p.type_annotation.shape, p.type_annotation.dtype) for p in params]
    out = get_compute(call.op.name)(holders, call.attrs, call.checked_type)
    schedule = te.create_schedule(out.op)
    read = [i for i, h in enumerate(holders) if h.op in schedule.stage_map]
    got = np.empty(want.shape, want.dtype)
    run(lower(schedule, [holders[i] for i in read] + [out]), *[values[i] for i in read], got)
    assert_close(got, want)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, axis", [((3, 10), -1), ((2, 3, 4), 0), ((2, 3, 4), 1),
                                         ((2, 3, 4), 2), ((7,), 0), ((1, 3, 2, 2), 1)])
def test_softmax(name, shape, axis):
    check_compute(getattr(nn, name), normal(*shape) * 3, axis=axis)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's inf - inf
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_rows_with_infinities(name):
    x = normal(4, 5)
    x[0, 1] = -np.inf  # an ordinary row with one -inf
    x[1, :] = -np.inf  # a row of -inf: NaN, as in the reference
    x[2, 3] = np.inf  # a row whose maximum is +inf is not shifted
    check_compute(getattr(nn, name), x)


def test_softmax_float64():
    check_compute(nn.softmax, normal(3, 6, dtype="float64"), rtol=1e-12)


@pytest.mark.parametrize("shape, axis", [((3, 10), -1), ((2, 3, 4), 1), ((2, 3, 4), 0),
                                         ((4, 16), 1)])
@pytest.mark.parametrize("center, scale", [(True, True), (False, True), (True, False),
                                           (False, False)])
def test_layer_norm(shape, axis, center, scale):
    size = shape[axis]
    check_unread_inputs(nn.layer_norm, normal(*shape) + 2.0, normal(size, seed=1),
                        normal(size, seed=2), axis=axis, center=center, scale=scale,
                        epsilon=1e-3)


@pytest.mark.parametrize("shape, axis", [((2, 3, 4, 4), 1), ((2, 3, 4), -1), ((5, 3), 1)])
@pytest.mark.parametrize("center, scale", [(True, True), (False, False)])
def test_batch_norm(shape, axis, center, scale):
    size = shape[axis]
    variance = np.abs(normal(size, seed=4)) + 0.1
    check_unread_inputs(nn.batch_norm, normal(*shape), normal(size, seed=1),
                        normal(size, seed=2), normal(size, seed=3), variance, axis=axis,
                        center=center, scale=scale)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("shape, axis", [((1, 6, 2, 3), 1), ((2, 3, 7), -1)])
def test_lrn(size, shape, axis):
    check_compute(nn.lrn, normal(*shape), size=size, axis=axis, bias=1.5, alpha=0.3,
                  beta=0.6)


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
@pytest.mark.parametrize("size", [1, 2, 5, 8])
@pytest.mark.parametrize("shape, axis", [((1, 9, 3, 20), 1), ((2, 3, 11), -1)])
def test_lrn_in_float32_with_beta_three_quarters(size, shape, axis, compiled):
    # AlexNet's and GoogLeNet's beta: computed in float32 (see nn_norm._lrn_float32)
    check_compute(nn.lrn, normal(*shape) * 3, size=size, axis=axis, bias=2.0, alpha=1e-3,
                  beta=0.75, compiled=compiled)


def _lrn_by_definition(x, size, bias, alpha, beta):
    """LRN along axis 1 as ONNX defines it, channel by channel (float64)."""
    squares = np.square(x.astype(np.float64))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    sums = np.stack([squares[:, max(0, c - before):c + after + 1].sum(axis=1)
                     for c in range(x.shape[1])], axis=1)
    return (x / np.power(bias + alpha / size * sums, beta)).astype(x.dtype)


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
@pytest.mark.parametrize("beta", [0.75, 0.6], ids=["float32-ranges", "float64-sums"])
@pytest.mark.parametrize("size", [9, 2**16, 2**62])
def test_an_lrn_window_wider_than_twice_the_channels_sums_them_all(size, beta, compiled):
    """A window past 2 C - 1 channels reaches every channel from every channel: the compute
    and the reference sum the C of them (a hostile size of 2^16 wrote 2^17 terms, and 2^62
    made the reference pad 2^61 channels), the scale still alpha / size."""
    x = normal(1, 4, 2, 3) * 3
    attrs = {"size": size, "axis": 1, "bias": 2.0, "alpha": 1e-3 * size, "beta": beta}
    call, params, values = call_over_arrays(nn.lrn, (x,), attrs)
    want = evaluate(IRModule.from_expr(Function(params, call)), values)
    assert_close(want, _lrn_by_definition(x, size, 2.0, 1e-3 * size, beta), 1e-6)
    check_compute(nn.lrn, x, compiled=compiled, **attrs)


def overflowing_squares():
    """Six channels of 2 x 3 pixels, some whose squares (or whose windows' sums, with a large
    alpha) overflow float32, beside ordinary ones."""
    x = normal(1, 6, 2, 3)
    x[0, :, 0, 0] = [-1e30, 1e30, 3e25, -1e20, 2.5, -3e38]
    x[0, 1, 1, 2] = 2e19
    x[0, 3, 1, 1] = 3e15
    x[0, 4, 0, 1] = 4e9
    return x


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
@pytest.mark.parametrize("alpha", [1e-4, 30.0, 1e12], ids=["small", "large", "huge"])
def test_lrn_in_float32_of_values_whose_squares_overflow(alpha, compiled):
    # windows whose squares (or whose base, with a large alpha) overflow float32 take the
    # second range; windows of ordinary values beside them keep the first
    x = overflowing_squares()
    attrs = {"size": 3, "axis": 1, "bias": 1.0, "alpha": alpha, "beta": 0.75}
    call, params, values = call_over_arrays(nn.lrn, (x,), attrs)
    mod = IRModule.from_expr(Function(params, call))
    want = evaluate(mod, values)
    assert np.all(np.isfinite(want))
    check_compute(nn.lrn, x, compiled=compiled, **attrs)
    if compiled:
        # every element to its own precision, the tiny ones too; where even the second
        # range's base overflows (alpha / size above 1.26), the result is +-0 for an exact
        # one below 2.4e-20 in magnitude
        got = opf.compile(mod)(*values)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=0 if alpha < 1 else 2.4e-20)


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
def test_lrn_in_float32_propagates_nan_and_infinity_as_the_reference(compiled):
    x = normal(1, 5, 2, 2)
    x[0, 1, 0, 0], x[0, 3, 1, 1] = np.nan, np.inf
    check_compute(nn.lrn, x, size=3, axis=1, bias=1.0, alpha=1e-4, beta=0.75,
                  compiled=compiled)


def test_lrn_of_values_whose_squares_overflow_float32():
    # 1e30 squared is inf in float32: the compute sums squares in float64, as the reference,
    # so both give the finite result (fuzz case 242 seed 1 gave -0 against -1.5e-12).
    x = normal(1, 4, 2, 3)
    x[0, :, 0, 0] = [-1e30, 1e30, 3e25, -1e20]
    x[0, 1, 1, 2] = 2e19
    attrs = {"size": 3, "axis": 1, "bias": 1.0, "alpha": 1e-4, "beta": 0.75}
    check_compute(nn.lrn, x, **attrs)
    call, params, values = call_over_arrays(nn.lrn, (x,), attrs)
    mod = IRModule.from_expr(Function(params, call))
    want = evaluate(mod, values)
    assert np.all(np.isfinite(want)) and np.all(want[0, :, 0, 0] != 0)
    got = opf.compile(mod).run({params[0].name_hint: x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=0)  # 1e-12 is not 0 here


@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
@pytest.mark.parametrize("beta", [0.75, 0.6], ids=["float32-ranges", "float64-sums"])
@pytest.mark.parametrize("size", [1, 2, 5, 8, 20])
@pytest.mark.parametrize("shape, layout", [((1, 3, 4, 5, 8), "NCHW8c"),
                                           ((2, 2, 3, 2, 16), "NCHW16c"),
                                           ((1, 1, 2, 3, 4), "NCHW4c")])
def test_lrn_of_channel_blocked_data(shape, layout, size, beta, compiled):
    # the window crosses the blocks (and, size 20 over blocks of 4 or 8, more than one
    # block past each edge); the reference computes it in NCHW
    check_compute(nn.lrn, normal(*shape) * 3, size=size, axis=1, bias=2.0, alpha=1e-3,
                  beta=beta, layout=layout, compiled=compiled)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's inf / inf
@pytest.mark.parametrize("compiled", [False, True], ids=["interpreted", "compiled"])
@pytest.mark.parametrize("alpha", [1e-4, 30.0, 1e12], ids=["small", "large", "huge"])
def test_lrn_of_channel_blocked_data_whose_squares_overflow(alpha, compiled):
    # as test_lrn_in_float32_of_values_whose_squares_overflow, the channels in blocks of 4
    x = overflowing_squares()
    x[0, 5, 1, 0], x[0, 2, 0, 2] = np.nan, np.inf
    blocked = np.ascontiguousarray(
        np.pad(x, ((0, 0), (0, 2), (0, 0), (0, 0))).reshape(1, 2, 4, 2, 3).transpose(
            0, 1, 3, 4, 2))
    attrs = {"size": 3, "axis": 1, "bias": 1.0, "alpha": alpha, "beta": 0.75,
             "layout": "NCHW4c"}
    check_compute(nn.lrn, blocked, compiled=compiled, **attrs)
    call, params, values = call_over_arrays(nn.lrn, (blocked,), attrs)
    want = evaluate(IRModule.from_expr(Function(params, call)), values)
    v = opf.var("x", shape=x.shape)
    plain = evaluate(IRModule.from_expr(Function([v], nn.lrn(v, size=3, bias=1.0,
                                                              alpha=alpha))), [x])
    # the blocked reference is the NCHW one, the padding channels zeros
    np.testing.assert_array_equal(
        want.transpose(0, 1, 4, 2, 3).reshape(1, 8, 2, 3)[:, :6], plain)


def test_lrn_of_channel_blocked_data_checks_its_layout():
    with pytest.raises(opf.OpfusionError, match="axis"):
        nn.lrn(opf.var("x", shape=(1, 2, 3, 3, 8)), axis=2, layout="NCHW8c")
    with pytest.raises(opf.OpfusionError, match="blocks them by 8"):
        x = opf.var("x", shape=(1, 2, 3, 3, 4))
        InferType()(IRModule.from_expr(Function([x], nn.lrn(x, layout="NCHW8c"))))
