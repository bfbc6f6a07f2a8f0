"""FuseAttention: scaled dot-product attention as one ``nn.attention`` call.

ONNX exporters write attention as separate operators, which FuseOps cannot join (two matrix
products, each an anchor of its own, and a softmax between them)::

    nn.matmul(nn.softmax(add(divide(nn.matmul(q, k_t), c), bias), axis=-1), v)

(or the same with ``nn.batch_matmul``, as TVM-style graphs write it; a scores' product with
``transpose_b``, which reads the keys as (..., Sk, D), gets a transpose of them, which fuses
with their producer) with the scale as ``divide`` by a constant (BERT: sqrt of the head
size), ``multiply`` by one (either side), or absent (a vision transformer that scales q and
k before the product), and the ``add`` of a mask or bias optional (GPT's causal mask), or
several in turn, summed into one (Swin's relative position bias, then its shifted windows'
mask). This
pass replaces each such chain by ``nn.attention(q, k_t, v, bias, scale=...)`` (bias a scalar
0 when there is none), which the CPU backend computes a block of queries at a time with the
block's scores in cache (see :mod:`opfusion.topi.nn_attention`). The reshapes and
transposes that split and merge the heads stay outside: they are injective and fuse with
their neighbours as before.

Only a chain whose intermediate results have no other user is replaced (else the scores or
probabilities would be computed twice), float32 throughout, products without transpose
flags (but the scores' transpose_b) and a softmax along the keys. A scale ``divide(s, c)``
becomes the factor ``1/c``: the scores then differ from the reference's by at most an ulp
before the softmax.

The pass runs in ``opf.compile`` for the fusion strategies that fuse (``"tvm"``, ``"cinn"``;
not ``"none"``, which keeps every operator its own kernel), before the layout passes, at
opt_level 3; ``disabled_pass=["FuseAttention"]`` turns it off. ``opfusion show --stage fused``
and ``explain`` show the ``nn.attention`` calls."""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op, get_op
from ..ir.types import TensorType
from ..ir.visitor import ExprMutator, children, post_order
from .context import PassContext
from .pass_infra import Pass, module_pass, pass_factory, register_pass


@pass_factory
def FuseAttention() -> Pass:  # noqa: N802 - a pass name
    """Attention chains become ``nn.attention`` calls (see the module docstring)."""
    return _fuse_attention_pass()


@module_pass(opt_level=3, name="FuseAttention")
class _fuse_attention_pass:  # noqa: N801 - a pass class, named like the others
    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        new = IRModule()
        for name, func in mod.functions.items():
            if isinstance(func, Function) and not func.is_primitive:
                infer_type(func, mod)
                func = _AttentionFuser(func).visit(func)
            new[mod.get_global_var(name)] = func
        return new


register_pass("FuseAttention", FuseAttention)

#: Biases an attention chain may add to its scores one after another (Swin's shifted windows
#: add two: the relative position bias and the windows' mask).
MAX_BIASES = 4

#: The products an attention chain is made of: ONNX's MatMul imports nn.matmul, TVM-style
#: graphs use nn.batch_matmul (whose key is (B, Sk, D) by default: transpose_b).
PRODUCTS = ("nn.matmul", "nn.batch_matmul")


def _op_name(expr: Expr) -> str | None:
    return expr.op.name if isinstance(expr, Call) and isinstance(expr.op, Op) else None


def _scalar(expr: Expr) -> float | None:
    """The value of a constant with one element (a scalar or a 1-element tensor), else None."""
    if isinstance(expr, Constant) and expr.data.size == 1 and expr.data.dtype.kind == "f":
        value = float(expr.data.reshape(()))
        return value if np.isfinite(value) and value != 0 else None
    return None


def _broadcasts_into(small: Expr, big: Expr) -> bool:
    """Whether ``small`` broadcasts to ``big``'s shape without changing it."""
    shape = big.checked_type.shape
    return np.broadcast_shapes(small.checked_type.shape, shape) == shape


def _float32(*exprs: Expr) -> bool:
    return all(isinstance(e.checked_type, TensorType) and e.checked_type.dtype == "float32"
               for e in exprs)


class _AttentionFuser(ExprMutator):
    def __init__(self, func: Function) -> None:
        super().__init__()
        self.uses: dict[Expr, int] = {}
        for node in post_order(func.body, into_functions=False):
            if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
                self.memo[node.op] = node.op  # fused groups stay as they are
            for operand in children(node, into_functions=False):
                self.uses[operand] = self.uses.get(operand, 0) + 1

    def _only_use(self, expr: Expr) -> bool:
        return self.uses.get(expr, 0) == 1

    def visit_call(self, call: Call) -> Expr:
        match = self._match(call)
        if match is None:
            return super().visit_call(call)
        query, key, value, bias, scale, keys_last = match
        bias_arg = bias if bias is not None else Constant(np.zeros((), "float32"))
        key_arg = self.visit(key)
        if not keys_last:  # (..., Sk, D): the op reads (..., D, Sk); the transpose fuses
            rank = key.checked_type.ndim  # with the key's producer
            axes = [*range(rank - 2), rank - 1, rank - 2]
            key_arg = Call(get_op("transpose"), [key_arg], {"axes": axes})
        return Call(get_op("nn.attention"),
                    [self.visit(query), key_arg, self.visit(value), bias_arg],
                    {"scale": scale}, call.span)

    def _match(self, call: Call) -> tuple[Expr, Expr, Expr, Expr | None, float, bool] | None:
        """(query, key, value, bias or None, scale, whether the key has its keys last) of an
        attention chain ending at ``call``, or None."""
        if _op_name(call) not in PRODUCTS or not self._plain_product(call):
            return None
        probs, value = call.args
        if _op_name(probs) != "nn.softmax" or not self._only_use(probs):
            return None
        scores = probs.args[0]
        rank = scores.checked_type.ndim
        if probs.attrs.axis not in (-1, rank - 1):
            return None
        biases: list[Expr] = []  # outermost first
        while _op_name(scores) == "add" and self._only_use(scores):
            first, second = scores.args
            if self._leads_to_scores(first):
                scaled, bias = first, second
            elif self._leads_to_scores(second):
                scaled, bias = second, first
            else:
                return None
            if not _broadcasts_into(bias, scaled):
                return None
            biases.append(bias)
            scores = scaled
        scale = 1.0
        if _op_name(scores) in ("divide", "multiply") and self._only_use(scores):
            base, factor = scores.args[0], _scalar(scores.args[1])
            if factor is None and _op_name(scores) == "multiply":
                base, factor = scores.args[1], _scalar(scores.args[0])
            if factor is None or scores.checked_type.shape != base.checked_type.shape:
                return None  # (a factor of higher rank would add axes to the scores)
            scale = 1.0 / factor if _op_name(scores) == "divide" else factor
            scores = base
        if (_op_name(scores) not in PRODUCTS or not self._only_use(scores)
                or not self._plain_product(scores, key_transposed=True)):
            return None
        query, key = scores.args
        if min(query.checked_type.ndim, key.checked_type.ndim, value.checked_type.ndim) < 2:
            return None
        if not _float32(query, key, value, *biases):
            return None
        return query, key, value, self._summed(biases), scale, not scores.attrs.transpose_b

    def _summed(self, biases: list[Expr]) -> Expr | None:
        """One bias from the ones added to the scores in turn (outermost first), summed
        innermost first: Swin's relative position bias, then its shifted windows' mask. The
        scores then take their sum in one addition rather than one at a time (they differ
        by an ulp of the score where both are nonzero; a mask's zeros change nothing)."""
        total: Expr | None = None
        for bias in reversed(biases):
            bias = self.visit(bias)
            total = bias if total is None else Call(get_op("add"), [total, bias])
        return total

    def _leads_to_scores(self, expr: Expr) -> bool:
        """Whether ``expr`` is the scores' product, a divide/multiply of it, or a chain of
        adds (each with no other user) down to one of those: the side of an add that is not
        a bias."""
        work = [(expr, 0)]
        while work:
            node, depth = work.pop()
            if self._scores_or_scaled(node):
                return True
            if _op_name(node) == "add" and self._only_use(node) and depth < MAX_BIASES:
                work.extend((arg, depth + 1) for arg in node.args)
        return False

    def _scores_or_scaled(self, expr: Expr) -> bool:
        """Whether ``expr`` is the scores' product, or a divide/multiply of it."""
        if _op_name(expr) in ("divide", "multiply"):
            return any(_op_name(arg) in PRODUCTS for arg in expr.args)
        return _op_name(expr) in PRODUCTS

    @staticmethod
    def _plain_product(call: Call, key_transposed: bool = False) -> bool:
        """A float32 product whose left operand is not transposed, nor its right one unless
        ``key_transposed`` (the scores' product may read the keys as (..., Sk, D))."""
        attrs = call.attrs
        return (not attrs.transpose_a and (key_transposed or not attrs.transpose_b)
                and attrs.get("out_dtype") in (None, "float32") and _float32(call))

