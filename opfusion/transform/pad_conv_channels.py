"""PadConvChannels: zero input channels so that a convolution's contraction fits tensor cores.

A tensor-core convolution (``gpu_conv2d_mma``, for a CUDA target with ``-tf32=1``) contracts
over input channels 8 at a time, so it takes only convolutions whose input channels are a
multiple of 8. ResNet-50's stem has 3: in float32 tiles it is the slowest convolution of
the network on a GPU (1.2-2.1 ms of resnet50's 33.6 ms at batch 32 on an H200). This pass
gives such a convolution zero input channels up to the next multiple of 8, on its input (an
``nn.pad``) and on its weight (padded at compile time when it is a constant)::

    conv2d(x[n, 3, h, w], w[o, 3, kh, kw])
      -> conv2d(pad(x)[n, 8, h, w], pad(w)[o, 8, kh, kw])

Every added product is 0 x 0, so the sums are the same, bit for bit before TF32's
rounding. It applies to ungrouped float32 convolutions of a batch the tensor-core tiles
divide (a multiple of 8 images); the others keep their channels. ``opf.compile`` runs it
for CUDA targets with ``-tf32=1`` only (``compile.alter_layout``);
``disabled_pass=["PadConvChannels"]`` turns it off."""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.visitor import ExprMutator
from ..op import nn as nn_ops
from ..target import Target, as_target
from ..tir.mma import TILE_STEPS
from .context import PassContext
from .pad_channel_blocks import zero_padded_weight
from .pass_infra import Pass, function_pass, pass_factory, register_pass


@pass_factory
def PadConvChannels(target: Target | str | None = None) -> Pass:  # noqa: N802 - a pass name
    """Zero input channels up to a multiple of 8 for the convolutions tensor cores take
    (see the module docstring); nothing unless ``target`` allows TF32."""
    return _pad_conv_channels_pass(target)


@function_pass(opt_level=3, name="PadConvChannels")
class _pad_conv_channels_pass:  # noqa: N801 - a pass class, named like the others
    def __init__(self, target: Target | str | None = None) -> None:
        self.target = target

    def transform_function(self, func: Function, mod: IRModule, ctx: PassContext) -> Function:
        if func.is_primitive or not as_target(self.target).allow_tf32:
            return func
        infer_type(func, mod)
        return _Padder().visit(func)


register_pass("PadConvChannels", PadConvChannels)


def padded_channels(call: Call) -> int:
    """The input channels ``call`` gets (its own when it is no convolution to pad)."""
    data, weight = (arg.checked_type for arg in call.args[:2])
    channels = int(data.shape[1])
    if (call.op_name != "nn.conv2d" or call.attrs.groups != 1 or data.dtype != "float32"
            or weight.dtype != "float32" or int(data.shape[0]) % TILE_STEPS
            or channels % TILE_STEPS == 0):
        return channels
    return -(-channels // TILE_STEPS) * TILE_STEPS


class _Padder(ExprMutator):
    def visit_call(self, call: Call) -> Expr:
        new = super().visit_call(call)
        if not isinstance(new, Call) or call.op_name != "nn.conv2d":
            return new
        channels = int(call.args[0].checked_type.shape[1])
        extra = padded_channels(call) - channels
        if extra == 0:
            return new
        data, weight = new.args[:2]
        widths = [0, 0, 0, extra, 0, 0, 0, 0]  # (before, after) per axis: channels after
        data = nn_ops.pad(data, Constant(np.zeros((), "float32")), pad_width=widths)
        shape = [int(d) for d in call.args[1].checked_type.shape]
        weight = zero_padded_weight(weight, shape, [shape[0], channels + extra, *shape[2:]],
                                    "float32")
        return Call(new.op, [data, weight, *new.args[2:]], new.attrs, new.span)


__all__ = ["PadConvChannels", "padded_channels"]
