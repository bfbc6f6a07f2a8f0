"""FuseAttention: the attention chains ONNX exporters write (BERT's divide by sqrt(d), GPT's
causal mask, a vision transformer's pre-scaled q and k, multiply by a constant on either side)
become one nn.attention with the right scale and the same numbers; chains whose scores or
probabilities have other users, a softmax along another axis, transposed products or a
non-constant divisor are left alone; opf.compile runs it for the fusing strategies only."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Call, Function
from opfusion.ir.module import IRModule
from opfusion.ir.visitor import post_order
from opfusion.testing import assert_close
from opfusion.transform import FuseAttention, PassContext

nn = opf.op.nn
HEADS, TOKENS, HEAD, HIDDEN = 2, 10, 8, 16


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def const(value):
    return opf.const(np.asarray(value, "float32"))


def heads(y, axes):
    return opf.op.transpose(opf.op.reshape(y, newshape=[1, TOKENS, HEADS, HEAD]), axes=axes)


def block(scores_fn, seed=0):
    """x -> three projections split into heads -> scores_fn(q, k_t) -> softmax -> @ v ->
    merged heads; returns the module."""
    x = opf.var("x", shape=(1, TOKENS, HIDDEN))
    proj = [opf.op.nn.matmul(x, const(normal(HIDDEN, HIDDEN, seed=seed + i) / 4))
            for i in range(3)]
    q, k_t, v = heads(proj[0], [0, 2, 1, 3]), heads(proj[1], [0, 2, 3, 1]), heads(
        proj[2], [0, 2, 1, 3])
    probs = nn.softmax(scores_fn(q, k_t), axis=-1)
    out = opf.op.transpose(nn.matmul(probs, v), axes=[0, 2, 1, 3])
    return IRModule.from_expr(Function([x], opf.op.reshape(out, newshape=[1, TOKENS, HIDDEN])))


def attention_calls(mod):
    return [n for n in post_order(mod["main"].body)
            if isinstance(n, Call) and getattr(n.op, "name", None) == "nn.attention"]


def fused_and_checked(mod):
    x = normal(1, TOKENS, HIDDEN, seed=9)
    with PassContext(opt_level=3):
        new = FuseAttention()(mod)
    assert_close(evaluate(new, [x]), evaluate(mod, [x]), 1e-5)
    return attention_calls(new)


CAUSAL = np.triu(np.full((TOKENS, TOKENS), -10000.0, "float32"), k=1).reshape(
    1, 1, TOKENS, TOKENS)
FORMS = {
    "bert divide": (lambda q, k: opf.op.divide(nn.matmul(q, k), const(np.sqrt(HEAD))),
                    1 / np.sqrt(HEAD), False),
    "gpt causal mask": (lambda q, k: opf.op.add(opf.op.divide(nn.matmul(q, k), const(2.0)),
                                                const(CAUSAL)), 0.5, True),
    "mask first": (lambda q, k: opf.op.add(const(CAUSAL), opf.op.multiply(nn.matmul(q, k),
                                                                          const(0.25))),
                   0.25, True),
    "scale on the left": (lambda q, k: opf.op.multiply(const([0.3]), nn.matmul(q, k)), 0.3,
                          False),
    "swin bias and mask": (lambda q, k: opf.op.add(
        opf.op.add(opf.op.multiply(nn.matmul(q, k), const(0.25)),
                   const(normal(1, HEADS, TOKENS, TOKENS, seed=5))),
        const(np.where(CAUSAL < 0, -100.0, 0.0))), 0.25, True),
    "vit pre-scaled": (lambda q, k: nn.matmul(opf.op.multiply(q, const([0.5])),
                                              opf.op.multiply(k, const([0.5]))), 1.0, False),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_exporter_forms_become_one_attention(form):
    scores_fn, scale, masked = FORMS[form]
    (call,) = fused_and_checked(block(scores_fn))
    assert call.attrs.scale == pytest.approx(scale, rel=1e-6)
    assert (call.args[3].checked_type.ndim > 0) == masked
    remaining = {getattr(n.op, "name", None) for n in post_order(call)
                 if isinstance(n, Call)}
    assert "nn.softmax" not in remaining


def test_tvm_style_batch_matmul_attention_with_transposed_keys():
    """nn.batch_matmul(q, k) reads k as (B, Sk, D): the rewrite transposes it for the op."""
    x = opf.var("x", shape=(4, TOKENS, HEAD))
    k, v = const(normal(4, TOKENS + 3, HEAD, seed=1)), const(normal(4, TOKENS + 3, 6, seed=2))
    scores = nn.batch_matmul(x, k) * const(0.25)
    out = nn.batch_matmul(nn.softmax(scores, axis=-1), v, transpose_b=False)
    mod = IRModule.from_expr(Function([x], out))
    with PassContext(opt_level=3):
        new = FuseAttention()(mod)
    (call,) = attention_calls(new)
    assert call.attrs.scale == 0.25 and call.args[1].checked_type.shape == (4, HEAD, TOKENS + 3)
    value = normal(4, TOKENS, HEAD, seed=3)
    want = evaluate(mod, [value])
    assert_close(evaluate(new, [value]), want, 1e-5)
    assert_close(opf.compile(mod).run([value])[0], want, 1e-5)


@pytest.mark.parametrize("scores_fn", [
    lambda q, k: nn.matmul(opf.op.transpose(q, axes=[0, 1, 3, 2]), k, transpose_a=True),
    lambda q, k: opf.op.divide(nn.matmul(q, k), opf.op.sqrt(opf.op.abs(nn.matmul(q, k)))),
])
def test_transposed_queries_and_computed_divisors_stay(scores_fn):
    assert fused_and_checked(block(scores_fn)) == []


@pytest.mark.parametrize("extra", ["bias", "scale"])
def test_a_bias_or_scale_that_adds_axes_stays(extra):
    x = opf.var("x", shape=(6, 5))
    k, v = const(normal(5, 6)), const(normal(6, 4, seed=1))
    scores = nn.matmul(x, k)
    if extra == "bias":  # (6, 6) + (2, 6, 6): the scores gain a batch axis q, k, v lack
        scores = opf.op.add(scores, const(normal(2, 6, 6, seed=2)))
    else:
        scores = opf.op.multiply(scores, const(np.full((1, 1, 1), 0.5)))
    mod = IRModule.from_expr(Function([x], nn.matmul(nn.softmax(scores, axis=-1), v)))
    with PassContext(opt_level=3):
        new = FuseAttention()(mod)
    assert attention_calls(new) == []
    value = normal(6, 5, seed=3)
    assert_close(evaluate(new, [value]), evaluate(mod, [value]), 1e-6)


def test_softmax_along_another_axis_stays():
    x = opf.var("x", shape=(2, 6, 5))
    k = const(normal(2, 5, 6))
    v = const(normal(2, 6, 4, seed=1))
    out = nn.matmul(nn.softmax(nn.matmul(x, k), axis=1), v)
    mod = IRModule.from_expr(Function([x], out))
    with PassContext(opt_level=3):
        assert attention_calls(FuseAttention()(mod)) == []


@pytest.mark.parametrize("shared", ["scores", "probs"])
def test_chains_with_other_users_stay(shared):
    x = opf.var("x", shape=(2, 6, 5))
    k, v = const(normal(2, 5, 6)), const(normal(2, 6, 4, seed=1))
    scores = nn.matmul(x, k)
    probs = nn.softmax(scores, axis=-1)
    out = nn.matmul(probs, v)
    extra = scores if shared == "scores" else probs
    mod = IRModule.from_expr(Function([x], opf.Tuple([out, extra])))
    with PassContext(opt_level=3):
        assert attention_calls(FuseAttention()(mod)) == []


def test_compile_fuses_attention_unless_the_strategy_fuses_nothing():
    mod = block(FORMS["gpt causal mask"][0])
    x = normal(1, TOKENS, HIDDEN, seed=3)
    want = evaluate(mod, [x])
    kernels = {}
    for fusion in ("tvm", "cinn", "none"):
        exe = opf.compile(mod, fusion=fusion)
        assert_close(exe.run([x])[0], want, 1e-5)
        kernels[fusion] = [op for step in exe.steps for op in step.group.op_names]
    assert "nn.attention" in kernels["tvm"] and "nn.attention" in kernels["cinn"]
    assert "nn.attention" not in kernels["none"] and "nn.softmax" in kernels["none"]
    with PassContext(opt_level=3, disabled_pass=["FuseAttention"]):
        exe = opf.compile(mod)
    assert "nn.attention" not in [op for step in exe.steps for op in step.group.op_names]


def test_shifted_windows_take_their_bias_and_mask_in_one_attention():
    """Swin's shifted-window attention: windows as the batch, a relative position bias by
    head, then the windows' mask added through a reshape that splits the batch into images
    and windows (which SimplifyExpr removes): one attention over the biases' sum, compiled
    and checked against the reference; no weight is subnormal even where the mask of -100
    makes it so in the reference."""
    windows = 4
    x = opf.var("x", shape=(windows, HEADS, TOKENS, HEAD))
    k, v = const(normal(windows, HEADS, HEAD, TOKENS, seed=1)), const(
        normal(windows, HEADS, TOKENS, HEAD, seed=2))
    scores = opf.op.add(nn.matmul(opf.op.multiply(x, const(0.35)), k),
                        const(normal(1, HEADS, TOKENS, TOKENS, seed=3)))
    mask = np.zeros((1, windows, 1, TOKENS, TOKENS), "float32")
    mask[0, 1:, :, :, : TOKENS // 2] = -100.0
    split = opf.op.reshape(scores, newshape=[1, windows, HEADS, TOKENS, TOKENS])
    merged = opf.op.reshape(opf.op.add(split, const(mask)),
                            newshape=[-1, HEADS, TOKENS, TOKENS])
    mod = IRModule.from_expr(Function([x], nn.matmul(nn.softmax(merged, axis=-1), v)))
    exe = opf.compile(mod)
    assert "attention" in exe.source() and "softmax" not in exe.source()
    value = normal(windows, HEADS, TOKENS, HEAD, seed=4)
    assert_close(exe.run([value])[0], evaluate(mod, [value]), 1e-5)
