"""AlterOpLayout and pooling: a pool whose input is blocked runs in that block (NCHW<x>c in
and out, no layout_transform on either side); a pool of NCHW data stays NCHW, unless a blocked
convolution wants its result; the compiled model computes what the reference interpreter
does."""

import shutil

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir import Call, Op, evaluate, post_order
from opfusion.target import Target
from opfusion.testing import assert_close
from opfusion.transform import InferType
from opfusion.transform.alter_op_layout import AlterOpLayout

nn = opf.op.nn
rng = np.random.default_rng(7)
POOLS = ("nn.max_pool2d", "nn.avg_pool2d", "nn.global_max_pool2d", "nn.global_avg_pool2d")
AVX2, AVX512 = "c -mattr=+avx2,+fma", "c -mattr=+avx512f"


@pytest.fixture(autouse=True)
def private_kernel_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


def weight(*shape):
    return opf.const((rng.standard_normal(shape) * 0.3).astype("float32"))


def conv_relu(x, channels, in_channels, kernel=3, padding=1):
    return nn.relu(nn.conv2d(x, weight(channels, in_channels, kernel, kernel),
                             padding=padding))


def conv_pool_conv():
    """conv (3.2M multiply-adds: enough to block an NCHW input) -> max_pool 3x3 s2 p1 -> conv
    -> avg_pool 2x2 s2 ceil_mode (odd size) -> conv ->
    global max pool -> conv: every pool between two convolutions."""
    x = opf.var("x", shape=(1, 3, 61, 61))
    y = conv_relu(x, 32, 3)
    y = nn.max_pool2d(y, pool_size=3, strides=2, padding=1)
    y = conv_relu(y, 16, 32)
    y = nn.avg_pool2d(y, pool_size=2, strides=2, ceil_mode=True)
    y = conv_relu(y, 32, 16)
    y = nn.global_max_pool2d(y)
    y = nn.conv2d(y, weight(8, 32, 1, 1))
    return opf.IRModule.from_expr(opf.Function([x], y))


def calls(mod):
    return [node for node in post_order(mod["main"].body)
            if isinstance(node, Call) and isinstance(node.op, Op)]


def altered(mod, target):
    return InferType()(AlterOpLayout(target)(InferType()(mod)))


@pytest.mark.parametrize("target, block", [(AVX2, 8), (AVX512, 16)])
def test_pools_of_blocked_data_run_in_the_block(target, block):
    mod = altered(conv_pool_conv(), Target(target))
    nodes = calls(mod)
    pools = [c for c in nodes if c.op.name in POOLS]
    assert len(pools) == 3
    for pool in pools:
        assert pool.attrs.layout == f"NCHW{block}c"
        assert pool.args[0].op.name == "nn.relu"  # the convolution's blocked result
        users = [c.op.name for c in nodes if any(a is pool for a in c.args)]
        # a blocked convolution: direct, or Winograd for the 3x3 ones with 16+ channels
        assert users in (["nn.conv2d_nchwc"], ["nn.conv2d_winograd_nchwc"])
    # The only conversions of data: the RGB input into one block of its 3 channels, the
    # result (8 channels) back to NCHW.
    transforms = [c for c in nodes if c.op.name == "layout_transform"
                  and c.attrs.src_layout.startswith("NCHW")]
    assert [(t.attrs.src_layout, t.attrs.dst_layout) for t in transforms] == [
        ("NCHW", "NCHW3c"), ("NCHW8c", "NCHW")]


def test_the_altered_model_computes_the_same():
    mod = conv_pool_conv()
    x = rng.standard_normal((1, 3, 61, 61)).astype("float32")
    assert_close(evaluate(altered(mod, Target(AVX2)), [x]), evaluate(mod, [x]))


def test_pools_of_nchw_data_stay_nchw():
    x = opf.var("x", shape=(1, 16, 9, 9))
    mod = opf.IRModule.from_expr(opf.Function([x], nn.max_pool2d(nn.relu(x), pool_size=2)))
    pool = [c for c in calls(altered(mod, Target(AVX2))) if c.op.name in POOLS][0]
    assert pool.attrs.layout == "NCHW"


def lrn_pool_conv():
    """conv -> LRN across the rows (which runs NCHW; one across the channels keeps the
    blocks) -> max_pool 3x3 s2 -> conv and, beside it, a 3x3 s1 max pool of the first pool
    -> conv (the shape of GoogLeNet's stem and first pool branch)."""
    x = opf.var("x", shape=(1, 3, 67, 67))
    y = nn.lrn(conv_relu(x, 32, 3), size=5, axis=2, alpha=1e-4, beta=0.75, bias=1.0)
    y = nn.max_pool2d(y, pool_size=3, strides=2, ceil_mode=True)  # 33 x 33
    branch = nn.max_pool2d(y, pool_size=3, padding=1)
    # 1x1 convolutions of 2.2M multiply-adds: enough to block an NCHW input
    return opf.IRModule.from_expr(opf.Function([x], opf.op.add(
        conv_relu(y, 64, 32, kernel=1, padding=0), conv_relu(branch, 64, 32, kernel=1,
                                                             padding=0))))


@pytest.mark.parametrize("target, block", [(AVX2, 8), (AVX512, 16)])
def test_pools_of_nchw_data_a_blocked_convolution_wants_are_blocked(target, block):
    original = lrn_pool_conv()
    mod = altered(original, Target(target))
    nodes = calls(mod)
    pools = [c for c in nodes if c.op.name in POOLS]
    assert [p.attrs.layout for p in pools] == [f"NCHW{block}c"] * 2
    # the NCHW result of the LRN converted once, before the first pool
    (lrn,) = [c for c in nodes if c.op.name == "nn.lrn"]
    converted = pools[0].args[0]
    assert converted.op.name == "layout_transform" and converted.args[0] is lrn
    assert converted.attrs.dst_layout == f"NCHW{block}c"
    x = rng.standard_normal((1, 3, 67, 67)).astype("float32")
    assert_close(evaluate(mod, [x]), evaluate(original, [x]))


@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="no C compiler")
def test_compiled_pools_of_nchw_data_compute_the_reference():
    mod = lrn_pool_conv()
    x = rng.standard_normal((1, 3, 67, 67)).astype("float32")
    assert_close(opf.compile(mod)(x), evaluate(mod, [x]), rtol=1e-4)


@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="no C compiler")
def test_compiled_model_has_no_layout_transform_around_its_pools():
    mod = conv_pool_conv()
    x = rng.standard_normal((1, 3, 61, 61)).astype("float32")
    exe = opf.compile(mod, target=AVX2)
    assert_close(exe(x), evaluate(mod, [x]), rtol=1e-4)
    kernels = [step.group.op_names for step in exe.steps]
    pooling = [ops for ops in kernels if any(name in POOLS for name in ops)]
    assert len(pooling) == 3 and not [ops for ops in pooling if "layout_transform" in ops]
    # The input's and the result's conversions are the only layout kernels.
    assert sum("layout_transform" in ops for ops in kernels) == 2


def conv_pool_lrn_conv():
    """GoogLeNet's stem: conv -> max_pool 3x3 s2 -> LRN -> conv (blocked from the first
    convolution on)."""
    x = opf.var("x", shape=(1, 3, 61, 61))
    y = nn.max_pool2d(conv_relu(x, 32, 3), pool_size=3, strides=2, padding=1)
    y = nn.lrn(y, size=5, alpha=1e-4, beta=0.75, bias=1.0)
    return opf.IRModule.from_expr(opf.Function([x], conv_relu(y, 16, 32, kernel=1,
                                                              padding=0)))


@pytest.mark.parametrize("target, block", [(AVX2, 8), (AVX512, 16)])
def test_lrn_of_blocked_data_runs_in_the_block(target, block):
    original = conv_pool_lrn_conv()
    mod = altered(original, Target(target))
    nodes = calls(mod)
    (lrn,) = [c for c in nodes if c.op.name == "nn.lrn"]
    assert lrn.attrs.layout == f"NCHW{block}c" and lrn.attrs.axis == 1
    assert lrn.args[0].op.name == "nn.max_pool2d"
    assert [c.op.name for c in nodes if any(a is lrn for a in c.args)] == ["nn.conv2d_nchwc"]
    # the RGB input in and the result out are the only conversions of data
    assert [(t.attrs.src_layout, t.attrs.dst_layout) for t in nodes
            if t.op.name == "layout_transform" and t.attrs.src_layout.startswith("NCHW")] == [
        ("NCHW", "NCHW3c"), (f"NCHW{block}c", "NCHW")]
    x = rng.standard_normal((1, 3, 61, 61)).astype("float32")
    assert_close(evaluate(mod, [x]), evaluate(original, [x]))


@pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")), reason="no C compiler")
def test_compiled_blocked_lrn_computes_the_reference_in_vectors():
    mod = conv_pool_lrn_conv()
    x = rng.standard_normal((1, 3, 61, 61)).astype("float32") * 30  # some squares large
    exe = opf.compile(mod, target=AVX2)
    assert_close(exe(x), evaluate(mod, [x]), rtol=1e-4)
    (step,) = [s for s in exe.steps if "nn.lrn" in s.group.op_names]
    assert "layout_transform" not in step.group.op_names
    source = exe.source()
    start = source.index(f"kernel {step.group.name}\n")
    kernel = source[start:source.index("//@opfusion-section", start)]
    # both stages a block's 8 lanes at a time: the squares, and the quotients
    assert kernel.count("opf_store_float32x8(") >= 2
