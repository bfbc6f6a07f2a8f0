"""SimplifyInference: rewrite the operators that only make sense in training into plain
arithmetic for inference.

    nn.batch_norm(x, gamma, beta, mean, var)  ->  x * scale + shift
        scale = gamma / sqrt(var + epsilon),  shift = beta - mean * scale  (along ``axis``)
    nn.dropout(x)                             ->  x
    nn.layer_norm(x, gamma, beta)             ->  (x - mean(x)) * rsqrt(variance(x) + epsilon)
                                                  * gamma + beta
        only when the config key ``SimplifyInference.decompose_layer_norm`` is true

When the batch-norm parameters are constants, scale and shift are computed here with NumPy in
float64 (as the operator's reference computes) and rounded once to the tensor's dtype, so the
result is ``x * c1 + c2`` with two constants laid along ``axis``. Parameters that are not
constants give the same formula as expressions, with every constant-only piece still folded,
so FoldConstant finishes the job once the parameters are bound. The multiply-then-add shape is
what FoldScaleAxis looks for: after a convolution the multiply folds into its weight.

opfusion has no instance_norm, group_norm or l2_normalize operators (TVM's SimplifyInference
also rewrites those); a new inference-only operator gets a line in ``_RULES``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..ir.expr import Call, Constant, Expr
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import get_op
from ..ir.types import TensorType
from ..ir.visitor import ExprMutator
from .context import PassContext, register_pass_config
from .pass_infra import Pass, module_pass, pass_factory, register_pass

DECOMPOSE_LAYER_NORM = "SimplifyInference.decompose_layer_norm"
register_pass_config(
    DECOMPOSE_LAYER_NORM, bool, False,
    "SimplifyInference rewrites nn.layer_norm into mean, variance, rsqrt, multiply and add. Off "
    "by default: a layer_norm kept whole can become one row-wise kernel.")


@pass_factory
def SimplifyInference() -> Pass:  # noqa: N802 - TVM's pass name
    """The SimplifyInference pass (opt_level 0): batch_norm becomes a multiply and an add,
    dropout disappears, and layer_norm is decomposed when the pass context's
    ``SimplifyInference.decompose_layer_norm`` is true."""
    return _SIMPLIFY_INFERENCE


@module_pass(opt_level=0, name="SimplifyInference")
def _simplify_inference_pass(mod: IRModule, ctx: PassContext) -> IRModule:
    decompose = bool(ctx.get_config(DECOMPOSE_LAYER_NORM))
    new = IRModule()
    for name, func in mod.functions.items():
        infer_type(func, mod)  # the rules read operand types; calls of @globals need the module
        new[mod.get_global_var(name)] = simplify_inference(func, decompose)
    return new


_SIMPLIFY_INFERENCE = _simplify_inference_pass


def simplify_inference(expr: Expr, decompose_layer_norm: bool = False) -> Expr:
    """``expr`` (typically a Function) with batch_norm and dropout rewritten, and layer_norm
    too if asked. Returns a new expression; ``expr`` is not changed. Operand types must be
    inferable (run InferType through the module first when the body calls @globals)."""
    return _InferenceSimplifier(decompose_layer_norm).visit(expr)


class _InferenceSimplifier(ExprMutator):
    def __init__(self, decompose_layer_norm: bool) -> None:
        super().__init__()
        self.rules = dict(_RULES)
        if not decompose_layer_norm:
            del self.rules["nn.layer_norm"]

    def visit_call(self, call: Call) -> Expr:
        rule = self.rules.get(call.op_name) if call.op_name else None
        if rule is None:
            return super().visit_call(call)
        return rule(call, [self.visit(arg) for arg in call.args])


# ---------------------------------------------------------------------------------------------
# Values under construction: a float64 NumPy array while everything it depends on is constant,
# an expression once a non-constant enters. Arrays become constants of the tensor's dtype only
# when they meet an expression (or at the end), so a constant-only formula is rounded once.

Value = np.ndarray | Expr


class _Builder:
    """Arithmetic on Values in the dtype of one tensor."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype

    def value(self, expr: Expr) -> Value:
        if isinstance(expr, Constant):
            return expr.data.astype(np.float64)
        return expr

    def expr(self, value: Value) -> Expr:
        if isinstance(value, np.ndarray):
            return Constant(value.astype(self.dtype))
        return value

    def binary(self, op_name: str, lhs: Value, rhs: Value,
               numpy_fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Value:
        if isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray):
            return numpy_fn(lhs, rhs)
        return Call(get_op(op_name), [self.expr(lhs), self.expr(rhs)])

    def add(self, lhs: Value, rhs: Value) -> Value:
        return self.binary("add", lhs, rhs, np.add)

    def subtract(self, lhs: Value, rhs: Value) -> Value:
        return self.binary("subtract", lhs, rhs, np.subtract)

    def multiply(self, lhs: Value, rhs: Value) -> Value:
        return self.binary("multiply", lhs, rhs, np.multiply)

    def divide(self, lhs: Value, rhs: Value) -> Value:
        return self.binary("divide", lhs, rhs, np.divide)

    def unary(self, op_name: str, value: Value,
              numpy_fn: Callable[[np.ndarray], np.ndarray]) -> Value:
        if isinstance(value, np.ndarray):
            return numpy_fn(value)
        return Call(get_op(op_name), [value])

    def along(self, vector: Value, ndim: int, axis: int) -> Expr:
        """A 1-D vector laid along ``axis`` of an ``ndim``-D tensor: (C,) followed by size-1
        axes, which broadcasts against the tensor from the right."""
        trailing = ndim - 1 - axis
        if isinstance(vector, np.ndarray):
            return self.expr(vector.reshape((-1,) + (1,) * trailing))
        if trailing == 0:
            return vector
        return Call(get_op("expand_dims"), [vector], {"axis": 1, "num_newaxis": trailing})


def _tensor_type(expr: Expr) -> TensorType:
    ty = expr.checked_type
    assert isinstance(ty, TensorType), f"expected a tensor, got {ty!r}"
    return ty


# ---------------------------------------------------------------------------------------------
# the rules: (original call, rewritten operands) -> replacement


def _batch_norm(call: Call, args: Sequence[Expr]) -> Expr:
    # x * scale + shift, scale = gamma / sqrt(var + eps), shift = beta - mean * scale
    data, gamma, beta, mean, var = args
    data_type = _tensor_type(call.args[0])
    attrs = call.attrs
    axis = attrs.axis % data_type.ndim
    b = _Builder(data_type.dtype)
    std = b.unary("sqrt", b.add(b.value(var), np.array(attrs.epsilon)), np.sqrt)
    if attrs.scale:
        scale = b.divide(b.value(gamma), std)
    else:
        scale = b.divide(np.array(1.0), std)
    shift = b.multiply(b.value(mean), scale)
    if attrs.center:
        shift = b.subtract(b.value(beta), shift)
    else:
        shift = b.unary("negative", shift, np.negative)
    scaled = Call(get_op("multiply"), [data, b.along(scale, data_type.ndim, axis)])
    return Call(get_op("add"), [scaled, b.along(shift, data_type.ndim, axis)])


def _dropout(call: Call, args: Sequence[Expr]) -> Expr:
    # dropout(x) -> x: inference keeps every activation, unscaled (inverted dropout)
    return args[0]


def _layer_norm(call: Call, args: Sequence[Expr]) -> Expr:
    # (x - mean(x)) * rsqrt(variance(x) + eps) [* gamma] [+ beta], reduced along axis
    data, gamma, beta = args
    data_type = _tensor_type(call.args[0])
    attrs = call.attrs
    ndim = data_type.ndim
    axis = attrs.axis % ndim
    b = _Builder(data_type.dtype)
    reduce_attrs = {"axis": [axis], "keepdims": True}
    mean = Call(get_op("mean"), [data], reduce_attrs)
    var = Call(get_op("variance"), [data], reduce_attrs)
    inv_std = Call(get_op("rsqrt"), [b.expr(b.add(var, np.array(attrs.epsilon)))])
    out: Expr = Call(get_op("multiply"), [Call(get_op("subtract"), [data, mean]), inv_std])
    if attrs.scale:
        out = Call(get_op("multiply"), [out, b.along(b.value(gamma), ndim, axis)])
    if attrs.center:
        out = Call(get_op("add"), [out, b.along(b.value(beta), ndim, axis)])
    return out


_RULES: dict[str, Callable[[Call, Sequence[Expr]], Expr]] = {
    "nn.batch_norm": _batch_norm,
    "nn.dropout": _dropout,
    "nn.layer_norm": _layer_norm,
}

register_pass("SimplifyInference", SimplifyInference)

__all__ = ["DECOMPOSE_LAYER_NORM", "SimplifyInference", "simplify_inference"]

