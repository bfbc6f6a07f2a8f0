"""FoldChannelShuffle: a ShuffleNet unit's shuffle becomes the grouped convolution's
``input_shuffle``; the channel-wise ops between them run on the unshuffled channels, their
constants permuted; the result is the reference's."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.compiler.compile import alter_layout
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Call, Function
from opfusion.ir.module import IRModule
from opfusion.ir.visitor import post_order
from opfusion.target import Target
from opfusion.testing import assert_close

nn = opf.op.nn
AVX2 = Target("c -mattr=+avx2,+fma")


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def shuffled(x, groups, channels, size):
    """ShuffleNet's exported shuffle: reshape, transpose, reshape."""
    y = opf.op.reshape(x, newshape=[1, groups, channels // groups, size, size])
    y = opf.op.transpose(y, axes=[0, 2, 1, 3, 4])
    return opf.op.reshape(y, newshape=[1, channels, size, size])


def unit(channels=136, groups=4, size=14, extra_reader=False, mixing=False):
    """A ShuffleNet unit: grouped 1x1, ReLU, shuffle, depthwise 3x3 and bias, grouped 1x1
    (groups of 34 channels: group windows)."""
    x = opf.var("x", shape=(1, channels, size, size))
    per = channels // groups
    a = nn.relu(nn.conv2d(x, opf.const(normal(channels, per, 1, 1) * .2), groups=groups))
    s = shuffled(a, groups, channels, size)
    d = nn.conv2d(s, opf.const(normal(channels, 1, 3, 3, seed=1) * .3), groups=channels,
                  padding=1)
    if mixing:  # a dense 1x1 convolution mixes the channels: the shuffle must stay
        d = nn.conv2d(d, opf.const(normal(channels, channels, 1, 1, seed=4) * .1))
    d = nn.relu(opf.op.add(d, opf.const(normal(channels, 1, 1, seed=2))))
    y = nn.conv2d(d, opf.const(normal(channels, per, 1, 1, seed=3) * .2), groups=groups)
    if extra_reader:
        y = opf.op.concatenate([y, s], axis=1)
    return x, IRModule.from_expr(Function([x], y))


def laid_out(mod, disabled=()):
    with AVX2, opf.transform.PassContext(opt_level=3, disabled_pass=list(disabled)):
        return alter_layout(opf.transform.InferType()(mod), None)["main"]


def calls(func, name):
    return [n for n in post_order(func.body) if isinstance(n, Call) and n.op_name == name]


def test_a_shufflenet_units_shuffle_is_read_by_its_grouped_convolution():
    _, mod = unit()
    func = laid_out(mod)
    assert not calls(func, "channel_shuffle")
    windows = [c for c in calls(func, "nn.conv2d_nchwc") if c.attrs.group_window]
    assert [c.attrs.input_shuffle for c in windows] == [0, 4]
    assert "input_shuffle=4" in str(func)
    kept = laid_out(mod, disabled=["FoldChannelShuffle"])
    assert len(calls(kept, "channel_shuffle")) == 1


@pytest.mark.parametrize("channels, groups, size", [(136, 4, 14), (96, 3, 9), (120, 4, 7)])
def test_the_folded_unit_computes_the_reference(channels, groups, size):
    x, mod = unit(channels, groups, size)
    value = normal(1, channels, size, size, seed=7)
    with AVX2:
        exe = opf.compile(mod)
        with opf.transform.PassContext(opt_level=3, disabled_pass=["FoldChannelShuffle"]):
            unfolded = opf.compile(mod)
    assert_close(exe(value), evaluate(mod, [value]), 1e-5)
    assert_close(exe(value), unfolded(value), 1e-6)


@pytest.mark.parametrize("case", ["extra_reader", "mixing"])
def test_a_shuffle_read_elsewhere_or_through_a_mixing_op_stays(case):
    _, mod = unit(**{case: True})
    func = laid_out(mod)
    assert len(calls(func, "channel_shuffle")) == 1
    assert not any(c.attrs.input_shuffle for c in calls(func, "nn.conv2d_nchwc"))
    value = normal(1, 136, 14, 14, seed=8)
    with AVX2:
        assert_close(opf.compile(mod)(value), evaluate(mod, [value]), 1e-5)
