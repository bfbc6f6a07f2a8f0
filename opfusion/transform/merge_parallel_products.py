"""MergeParallelProducts: products of one operand by several constant weights become one.

A transformer's attention projects the same hidden states three times, to queries, keys and
values (BERT exports write three MatMuls of the layer's input); TVM's
CombineParallelDense does what this pass does: the products

    q = nn.matmul(x, Wq)    k = nn.matmul(x, Wk)    v = nn.matmul(x, Wv)

become one product by the weights side by side and slices of its result::

    qkv = nn.matmul(x, concatenate([Wq, Wk, Wv], axis=-1))
    q = strided_slice(qkv, begin=[0], end=[n_q], axes=[-1])   (k and v likewise)

FoldConstant (run after the pass in ``opf.compile``) makes the concatenated weight one
constant, which PackMatmulWeights then packs. One product of 3N columns reads ``x`` once and
keeps the register tiles busy over a wider panel; three are three kernels, each reading
``x``. The slices are injective and fuse with what follows (the reshapes and transposes that
split the heads); a bias added to each product moves with its slice.

A set is merged when it has two or more ``nn.matmul`` calls (no transpose flags) of the same
left operand (the same expression) by 2-D float constants of the same dtype and depth, or
``nn.dense`` calls (weights (N, K), merged along N). The merged product comes where the first
of them was; the order of the sets and of their members is the graph's post order, so the
result is deterministic.

The pass runs in ``opf.compile`` with FuseAttention, for the fusion strategies that fuse
(patterns), at opt_level 3; ``disabled_pass=["MergeParallelProducts"]`` turns it off.
``opfusion show --stage fused`` and ``explain`` show the merged product and its slices."""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op, get_op
from ..ir.types import TensorType
from ..ir.visitor import ExprMutator, post_order
from .context import PassContext
from .pass_infra import Pass, module_pass, pass_factory, register_pass

#: The products merged, and the weight axis their output columns run along.
PRODUCT_COLUMNS = {"nn.matmul": 1, "nn.dense": 0}


@pass_factory
def MergeParallelProducts() -> Pass:  # noqa: N802 - a pass name
    """Products of one operand by several constant weights become one (see the module
    docstring)."""
    return _merge_parallel_products_pass()


@module_pass(opt_level=3, name="MergeParallelProducts")
class _merge_parallel_products_pass:  # noqa: N801 - a pass class, named like the others
    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        new = IRModule()
        for name, func in mod.functions.items():
            if isinstance(func, Function) and not func.is_primitive:
                infer_type(func, mod)
                func = _ProductMerger(func).visit(func)
            new[mod.get_global_var(name)] = func
        return new


register_pass("MergeParallelProducts", MergeParallelProducts)


def _merge_key(call: Expr) -> tuple[Expr, str, int, str] | None:
    """(left operand, op, depth, dtype) of a product that may merge with others of the same
    key, or None."""
    if not (isinstance(call, Call) and isinstance(call.op, Op)
            and call.op.name in PRODUCT_COLUMNS):
        return None
    left, weight = call.args
    if not isinstance(weight, Constant) or weight.data.ndim != 2 \
            or weight.data.dtype.kind != "f" or not isinstance(call.checked_type, TensorType):
        return None
    if call.op.name == "nn.matmul" and (call.attrs.transpose_a or call.attrs.transpose_b):
        return None
    if call.attrs.out_dtype not in (None, str(weight.data.dtype)):
        return None
    columns = PRODUCT_COLUMNS[call.op.name]
    return left, call.op.name, int(weight.data.shape[1 - columns]), str(weight.data.dtype)


class _ProductMerger(ExprMutator):
    def __init__(self, func: Function) -> None:
        super().__init__()
        sets: dict[tuple[Expr, str, int, str], list[Call]] = {}
        for node in post_order(func.body, into_functions=False):
            if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
                self.memo[node.op] = node.op  # fused groups stay as they are
            key = _merge_key(node)
            if key is not None:  # (post_order yields each node once)
                sets.setdefault(key, []).append(node)
        #: each merged product's member: (the set's members, its position among them)
        self.member: dict[Expr, tuple[list[Call], int]] = {}
        for members in sets.values():
            if len(members) > 1:
                for position, call in enumerate(members):
                    self.member[call] = (members, position)
        self.merged: dict[int, Expr] = {}  # id of a set's first member -> the merged product

    def visit_call(self, call: Call) -> Expr:
        if call not in self.member:
            return super().visit_call(call)
        members, position = self.member[call]
        merged = self._merged(members)
        axis = PRODUCT_COLUMNS[call.op.name]
        widths = [int(m.args[1].data.shape[axis]) for m in members]
        begin = sum(widths[:position])
        return Call(get_op("strided_slice"), [merged],
                    {"begin": [begin], "end": [begin + widths[position]], "axes": [-1]},
                    call.span)

    def _merged(self, members: list[Call]) -> Expr:
        first = members[0]
        key = id(first)
        if key not in self.merged:
            axis = PRODUCT_COLUMNS[first.op.name]
            weight = np.concatenate([m.args[1].data for m in members], axis=axis)
            self.merged[key] = Call(first.op, [self.visit(first.args[0]), Constant(weight)],
                                    _without_units(first), first.span)
        return self.merged[key]


def _without_units(call: Call) -> dict[str, object]:
    """The product's attributes for the merged weight (nn.dense's ``units`` is the sum's)."""
    attrs = {key: call.attrs[key] for key in call.attrs}
    if "units" in attrs:
        attrs["units"] = None
    return attrs
