"""SimplifyInference: batch_norm becomes a multiply and an add, dropout disappears, layer_norm is
decomposed only when the config asks; every rewrite keeps the reference's numbers."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir import assert_structural_equal, evaluate
from opfusion.testing import assert_close
from opfusion.transform import PassContext, Sequential, get_pass, list_pass_configs
from opfusion.transform.simplify_inference import (
    DECOMPOSE_LAYER_NORM,
    SimplifyInference,
    simplify_inference,
)

rng = np.random.default_rng(20240611)
EPS = 1e-3


def _bn_params(channels, dtype=np.float32):
    gamma = rng.standard_normal(channels).astype(dtype)
    beta = rng.standard_normal(channels).astype(dtype)
    mean = rng.standard_normal(channels).astype(dtype)
    var = rng.uniform(0.25, 2.0, channels).astype(dtype)
    return gamma, beta, mean, var


def _folded_scale_shift(gamma, beta, mean, var, center=True, scale=True, eps=EPS):
    """scale and shift as the pass documents them: float64, rounded once at the end."""
    g, b, m, v = (a.astype(np.float64) for a in (gamma, beta, mean, var))
    s = (g if scale else 1.0) / np.sqrt(v + eps)
    shift = b - m * s if center else -(m * s)
    return s, shift


def _module(params, body):
    return opf.IRModule.from_expr(opf.Function(params, body))


def _check_numbers(before, after, inputs):
    assert_close(evaluate(after, inputs), evaluate(before, inputs), rtol=1e-5)


def _ops(mod):
    return [node.op.name for node in opf.ir.post_order(mod["main"])
            if isinstance(node, opf.ir.Call) and isinstance(node.op, opf.ir.Op)]


# ---------------------------------------------------------------------------------------------
# batch_norm


@pytest.mark.parametrize("center,scale", [(True, True), (False, True), (True, False),
                                          (False, False)])
def test_constant_batch_norm_becomes_multiply_add_of_two_constants(center, scale):
    dtype = np.float32
    x = opf.var("x", shape=(2, 4, 5, 6))
    gamma, beta, mean, var = _bn_params(4)
    out = opf.op.nn.batch_norm(x, opf.const(gamma), opf.const(beta), opf.const(mean),
                               opf.const(var), axis=1, epsilon=EPS, center=center,
                               scale=scale)
    before = _module([x], out)
    after = SimplifyInference()(before)

    s, shift = _folded_scale_shift(gamma, beta, mean, var, center, scale)
    x2 = opf.var("x", shape=(2, 4, 5, 6))
    want = opf.op.add(opf.op.multiply(x2, opf.const(s.reshape(4, 1, 1).astype(dtype))),
                      opf.const(shift.reshape(4, 1, 1).astype(dtype)))
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after, [rng.standard_normal((2, 4, 5, 6)).astype(dtype)])


def test_batch_norm_on_the_last_axis_uses_plain_vectors():
    # NHWC: the channel is the last axis, so scale and shift broadcast as they are.
    x = opf.var("x", shape=(2, 5, 6, 3))
    gamma, beta, mean, var = _bn_params(3)
    out = opf.op.nn.batch_norm(x, opf.const(gamma), opf.const(beta), opf.const(mean),
                               opf.const(var), axis=-1, epsilon=EPS)
    before = _module([x], out)
    after = SimplifyInference()(before)

    s, shift = _folded_scale_shift(gamma, beta, mean, var)
    x2 = opf.var("x", shape=(2, 5, 6, 3))
    want = opf.op.add(opf.op.multiply(x2, opf.const(s.astype(np.float32))),
                      opf.const(shift.astype(np.float32)))
    assert_structural_equal(after, _module([x2], want))
    _check_numbers(before, after, [rng.standard_normal((2, 5, 6, 3)).astype(np.float32)])


@pytest.mark.parametrize("axis,shape", [(0, (3, 4)), (1, (2, 3, 7)), (2, (2, 2, 3, 4)),
                                        (-2, (2, 3, 4))])
def test_batch_norm_along_other_axes_matches_the_reference(axis, shape):
    channels = shape[axis]
    x = opf.var("x", shape=shape)
    gamma, beta, mean, var = _bn_params(channels)
    out = opf.op.nn.batch_norm(x, opf.const(gamma), opf.const(beta), opf.const(mean),
                               opf.const(var), axis=axis, epsilon=EPS)
    before = _module([x], out)
    after = SimplifyInference()(before)
    assert "nn.batch_norm" not in _ops(after)
    _check_numbers(before, after, [rng.standard_normal(shape).astype(np.float32)])


def test_variable_batch_norm_parameters_become_an_expression():
    shape = (2, 4, 3, 3)
    names = ("gamma", "beta", "mean", "var")
    x = opf.var("x", shape=shape)
    params = [opf.var(name, shape=(4,)) for name in names]
    before = _module([x, *params], opf.op.nn.batch_norm(x, *params, epsilon=EPS))
    after = SimplifyInference()(before)

    x2 = opf.var("x", shape=shape)
    gamma, beta, mean, var = (opf.var(name, shape=(4,)) for name in names)
    std = opf.op.sqrt(opf.op.add(var, opf.const(np.float32(EPS))))
    scale = opf.op.divide(gamma, std)
    shift = opf.op.subtract(beta, opf.op.multiply(mean, scale))
    want = opf.op.add(
        opf.op.multiply(x2, opf.op.expand_dims(scale, axis=1, num_newaxis=2)),
        opf.op.expand_dims(shift, axis=1, num_newaxis=2))
    assert_structural_equal(after, _module([x2, gamma, beta, mean, var], want))

    values = [rng.standard_normal(shape).astype(np.float32), *_bn_params(4)]
    _check_numbers(before, after, values)


@pytest.mark.parametrize("center,scale", [(False, True), (True, False), (False, False)])
def test_variable_batch_norm_respects_center_and_scale(center, scale):
    shape = (2, 3, 4, 4)
    x = opf.var("x", shape=shape)
    params = [opf.var(name, shape=(3,)) for name in ("gamma", "beta", "mean", "var")]
    out = opf.op.nn.batch_norm(x, *params, epsilon=EPS, center=center, scale=scale)
    before = _module([x, *params], out)
    after = SimplifyInference()(before)
    ops = _ops(after)
    assert "nn.batch_norm" not in ops
    assert ("negative" in ops) == (not center)
    values = [rng.standard_normal(shape).astype(np.float32), *_bn_params(3)]
    _check_numbers(before, after, values)


def test_mixed_constant_and_variable_parameters_fold_the_constant_part():
    # mean and var constant: 1 / sqrt(var + eps) is computed now; only gamma stays symbolic.
    shape = (2, 3, 4)
    x = opf.var("x", shape=shape)
    gamma = opf.var("gamma", shape=(3,))
    _, beta, mean, var = _bn_params(3)
    out = opf.op.nn.batch_norm(x, gamma, opf.const(beta), opf.const(mean), opf.const(var),
                               epsilon=EPS)
    before = _module([x, gamma], out)
    after = SimplifyInference()(before)
    assert "sqrt" not in _ops(after)
    values = [rng.standard_normal(shape).astype(np.float32), _bn_params(3)[0]]
    _check_numbers(before, after, values)


def test_float64_batch_norm_keeps_its_dtype():
    x = opf.var("x", shape=(2, 3, 4), dtype="float64")
    gamma, beta, mean, var = _bn_params(3, np.float64)
    out = opf.op.nn.batch_norm(x, opf.const(gamma), opf.const(beta), opf.const(mean),
                               opf.const(var), epsilon=EPS)
    before = _module([x], out)
    after = SimplifyInference()(before)
    constants = [n for n in opf.ir.post_order(after["main"]) if isinstance(n, opf.ir.Constant)]
    assert constants and all(c.data.dtype == np.float64 for c in constants)
    _check_numbers(before, after, [rng.standard_normal((2, 3, 4))])


def test_shared_batch_norm_is_rewritten_once():
    x = opf.var("x", shape=(1, 2, 3))
    gamma, beta, mean, var = _bn_params(2)
    bn = opf.op.nn.batch_norm(x, opf.const(gamma), opf.const(beta), opf.const(mean),
                              opf.const(var), epsilon=EPS)
    before = _module([x], opf.op.add(bn, opf.op.nn.relu(bn)))
    after = SimplifyInference()(before)
    assert _ops(after).count("multiply") == 1
    _check_numbers(before, after, [rng.standard_normal((1, 2, 3)).astype(np.float32)])


# ---------------------------------------------------------------------------------------------
# dropout


def test_dropout_becomes_its_input():
    x = opf.var("x", shape=(2, 8))
    w = opf.var("w", shape=(4, 8))
    before = _module([x, w], opf.op.nn.relu(opf.op.nn.dense(opf.op.nn.dropout(x, rate=0.3), w)))
    after = SimplifyInference()(before)
    x2, w2 = opf.var("x", shape=(2, 8)), opf.var("w", shape=(4, 8))
    assert_structural_equal(after, _module([x2, w2], opf.op.nn.relu(opf.op.nn.dense(x2, w2))))
    _check_numbers(before, after, [rng.standard_normal((2, 8)).astype(np.float32),
                                   rng.standard_normal((4, 8)).astype(np.float32)])


def test_dropout_as_the_result_returns_the_input():
    x = opf.var("x", shape=(3,))
    after = SimplifyInference()(_module([x], opf.op.nn.dropout(opf.op.nn.dropout(x))))
    x2 = opf.var("x", shape=(3,))
    assert_structural_equal(after, _module([x2], x2))


# ---------------------------------------------------------------------------------------------
# layer_norm


def _layer_norm_module(shape, axis=-1, center=True, scale=True):
    x = opf.var("x", shape=shape)
    size = shape[axis]
    gamma = opf.const(rng.standard_normal(size).astype(np.float32))
    beta = opf.const(rng.standard_normal(size).astype(np.float32))
    out = opf.op.nn.layer_norm(x, gamma, beta, axis=axis, epsilon=EPS, center=center,
                               scale=scale)
    return _module([x], out), gamma, beta


def test_layer_norm_is_kept_by_default():
    before, _, _ = _layer_norm_module((2, 3, 8))
    after = SimplifyInference()(before)
    assert_structural_equal(after, before)
    assert after["main"] is before["main"]


def test_layer_norm_is_decomposed_when_the_config_asks():
    before, gamma, beta = _layer_norm_module((2, 3, 8))
    with PassContext(config={DECOMPOSE_LAYER_NORM: True}):
        after = SimplifyInference()(before)

    x = opf.var("x", shape=(2, 3, 8))
    mean = opf.op.mean(x, axis=[2], keepdims=True)
    var = opf.op.variance(x, axis=[2], keepdims=True)
    normed = opf.op.multiply(opf.op.subtract(x, mean),
                             opf.op.rsqrt(opf.op.add(var, opf.const(np.float32(EPS)))))
    want = opf.op.add(opf.op.multiply(normed, gamma), beta)
    assert_structural_equal(after, _module([x], want))
    _check_numbers(before, after, [rng.standard_normal((2, 3, 8)).astype(np.float32)])


@pytest.mark.parametrize("axis,center,scale", [(1, True, True), (0, False, True),
                                               (-1, True, False), (-2, False, False)])
def test_decomposed_layer_norm_matches_the_reference(axis, center, scale):
    before, _, _ = _layer_norm_module((3, 5, 4), axis, center, scale)
    with PassContext(config={DECOMPOSE_LAYER_NORM: True}):
        after = SimplifyInference()(before)
    assert "nn.layer_norm" not in _ops(after)
    _check_numbers(before, after, [rng.standard_normal((3, 5, 4)).astype(np.float32)])


def test_simplify_inference_function_takes_the_flag():
    before, _, _ = _layer_norm_module((2, 6))
    func = before["main"]
    assert simplify_inference(func) is func
    assert "nn.layer_norm" not in _ops(opf.IRModule.from_expr(simplify_inference(func, True)))


# ---------------------------------------------------------------------------------------------
# the pass itself


def test_the_config_key_is_declared_with_a_false_default():
    option = list_pass_configs()[DECOMPOSE_LAYER_NORM]
    assert option.type is bool and option.default is False
    assert DECOMPOSE_LAYER_NORM == "SimplifyInference.decompose_layer_norm"


def test_pass_info_and_registration():
    info = SimplifyInference().info
    assert (info.name, info.opt_level) == ("SimplifyInference", 0)
    assert get_pass("SimplifyInference").info.name == "SimplifyInference"


def test_runs_in_a_sequential_at_opt_level_0():
    x = opf.var("x", shape=(2, 3))
    before = _module([x], opf.op.nn.dropout(x))
    with PassContext(opt_level=0):
        after = Sequential([SimplifyInference()])(before)
    assert _ops(after) == []


def test_the_input_module_is_not_changed():
    x = opf.var("x", shape=(2, 4, 5, 5))
    gamma, beta, mean, var = _bn_params(4)
    bn = opf.op.nn.batch_norm(x, opf.const(gamma), opf.const(beta), opf.const(mean),
                              opf.const(var))
    before = _module([x], opf.op.nn.dropout(opf.op.nn.relu(bn)))
    text, func = before.astext(), before["main"]
    after = SimplifyInference()(before)
    assert before["main"] is func and before.astext() == text
    assert after is not before and after["main"] is not func


def test_nested_functions_and_other_globals_are_rewritten():
    x = opf.var("x", shape=(2, 3))
    inner_x = opf.var("p", shape=(2, 3))
    inner = opf.Function([inner_x], opf.op.nn.dropout(opf.op.nn.relu(inner_x)))
    helper_x = opf.var("h", shape=(2, 3))
    mod = opf.IRModule({"main": opf.Function([x], inner(x)),
                        "helper": opf.Function([helper_x], opf.op.nn.dropout(helper_x))})
    after = SimplifyInference()(mod)
    for name in ("main", "helper"):
        calls = [n for n in opf.ir.post_order(after[name]) if isinstance(n, opf.ir.Call)]
        assert all(getattr(c.op, "name", "") != "nn.dropout" for c in calls)
    value = rng.standard_normal((2, 3)).astype(np.float32)
    _check_numbers(mod, after, [value])


def test_a_deep_graph_does_not_recurse():
    x = opf.var("x", shape=(1, 4))
    gamma, beta, mean, var = (opf.const(a) for a in _bn_params(4))
    out = x
    for _ in range(3000):
        out = opf.op.nn.dropout(opf.op.nn.batch_norm(out, gamma, beta, mean, var))
    after = SimplifyInference()(_module([x], out))
    ops = _ops(after)
    assert "nn.batch_norm" not in ops and "nn.dropout" not in ops
    assert ops.count("multiply") == 3000
