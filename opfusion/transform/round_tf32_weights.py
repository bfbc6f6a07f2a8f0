"""RoundTF32Weights: round the constant operands of products to TF32 once, at compile time.

With ``-tf32=1`` a CUDA target's float32 products run on tensor cores, whose instruction
takes its operands rounded to TF32 (10 bits of mantissa, ``cvt.rna``): the kernels round
each operand they copy into shared memory, or each one they read, three instructions a
value (:mod:`opfusion.tir.mma`). A constant operand, a layer's weights, rounds the same way
at every call, so this pass rounds it here instead::

    conv2d(x, W)  ->  conv2d(x, round_tf32(W))
    dense(x, W)   ->  dense(x, round_tf32(W))

Rounding is idempotent, so a tensor-core kernel's numbers are the same bit for bit; its
kernel, told that the operand's values are TF32 already (the ``tf32`` of the call's
:class:`~opfusion.tir.nan_free.Fact`), copies them as they are: a plain copy into shared
memory, or an async one (``cp.async``) whose values the instruction then takes unrounded.
A product that runs in float32 tiles instead (a shape the tensor-core tiles do not divide)
sees its weights rounded too: ``-tf32=1`` allows every float32 product TF32's precision,
and this is that precision. A constant that other operators also read keeps its values
there (the product gets a rounded copy).

It applies to ``nn.conv2d``, ``nn.dense``, ``nn.matmul`` and ``nn.batch_matmul`` with a
float32 constant operand; ``opf.compile`` runs it for CUDA targets with ``-tf32=1`` only
(``compile.alter_layout``); ``disabled_pass=["RoundTF32Weights"]`` turns it off."""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function
from ..ir.module import IRModule
from ..ir.visitor import ExprMutator
from ..target import Target, as_target
from ..tir.mma import round_tf32_array, tf32_exact_array
from .context import PassContext
from .pass_infra import Pass, function_pass, pass_factory, register_pass

#: The products whose constant operands are rounded.
PRODUCTS = ("nn.conv2d", "nn.dense", "nn.matmul", "nn.batch_matmul")


@pass_factory
def RoundTF32Weights(target: Target | str | None = None) -> Pass:  # noqa: N802 - a pass name
    """Round the constant float32 operands of products to TF32 (see the module docstring);
    nothing unless ``target`` allows TF32."""
    return _round_tf32_weights_pass(target)


@function_pass(opt_level=3, name="RoundTF32Weights")
class _round_tf32_weights_pass:  # noqa: N801 - a pass class, named like the others
    def __init__(self, target: Target | str | None = None) -> None:
        self.target = target

    def transform_function(self, func: Function, mod: IRModule, ctx: PassContext) -> Function:
        if func.is_primitive or not as_target(self.target).allow_tf32:
            return func
        return _Rounder().visit(func)


register_pass("RoundTF32Weights", RoundTF32Weights)


class _Rounder(ExprMutator):
    def __init__(self) -> None:
        super().__init__()
        # each constant rounded once, however many products read it (by identity: the
        # constant is held by the function being rewritten)
        self.rounded: dict[int, Constant] = {}

    def visit_call(self, call: Call) -> Expr:
        new = super().visit_call(call)
        if not isinstance(new, Call) or call.op_name not in PRODUCTS:
            return new
        args = [self._rounded(arg) if i < 2 else arg for i, arg in enumerate(new.args)]
        if all(a is b for a, b in zip(args, new.args)):
            return new
        return Call(new.op, args, new.attrs, new.span)

    def _rounded(self, arg: Expr) -> Expr:
        if not (isinstance(arg, Constant) and arg.data.dtype == np.float32 and arg.data.size):
            return arg
        found = self.rounded.get(id(arg))
        if found is None:
            if tf32_exact_array(arg.data):
                found = arg
            else:
                values = round_tf32_array(arg.data).reshape(arg.data.shape)
                values.setflags(write=False)  # (a Constant then holds it without a copy)
                found = Constant(values)
            self.rounded[id(arg)] = found
        return found


__all__ = ["PRODUCTS", "RoundTF32Weights"]
