"""AlterOpLayout: run convolutions, and the operators between them, in a blocked layout.

A convolution over NCHW data with OIHW weights becomes ``nn.conv2d_nchwc``: data in NCHW<i>c
(N, C/i, H, W, i), weights in OIHW<i>i<o>o, result in NCHW<o>c, with the blocks a vector of
the target (16 float32 lanes with AVX-512, 8 with AVX2), so that one vector register holds
one pixel's channels of a block. This is NNVM's "optimize data layout", TVM's AlterOpLayout,
and ONNX Runtime's NCHWc transformer. The operators between convolutions follow the layout
instead of going back to NCHW:

* elementwise operators (relu, clip, sigmoid, cast, ...) take the blocked tensor as it is;
* broadcasting operators (add, multiply, maximum, ...) whose other operands are the same
  NCHW shape (a residual add) or per-channel vectors ((C, 1, 1), (1, C, 1, 1): a bias or a
  folded batch-norm scale) or single values: the vectors are laid out in blocks as well;
  ``nn.bias_add`` along the channels becomes such an add;
* concatenate along the channels, when every part's channels are whole blocks;
* pooling (max, average and their global forms) of a blocked tensor, in its block;
* everything else, and the function's result, gets NCHW back.

``layout_transform`` calls are inserted only where a value changes layout, once per value and
layout (every consumer shares it), so a value never goes NCHW -> blocked -> NCHW -> blocked.
The weights' transforms are ``layout_transform`` of constants, which FoldConstant (run after
this pass in ``opf.compile``) turns into constants in the new layout: packed at compile time.
The transforms fuse like any injective operator.

Grouped and depthwise convolutions stay NCHW, as do convolutions whose output channels have
no power-of-two block of at least 4. The pass needs opt_level 3 and a target (the current
one, or the host); ``disabled_pass=["AlterOpLayout"]`` turns it off."""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op, OpPatternKind, get_op
from ..ir.types import TensorType
from ..ir.visitor import post_order
from ..target import Target
from .context import PassContext
from .pass_infra import Pass, module_pass, pass_factory, register_pass

PLAIN = 0

#: Broadcasting operators whose attributes name axes or shapes of the NCHW layout: they get
#: NCHW operands. (Every elementwise operator's attributes were checked: none names an axis.)
_BROADCAST_EXCLUDED = ("nn.bias_add", "nn.prelu", "broadcast_to")


def data_layout(block: int) -> str:
    """The layout name of NCHW data blocked by ``block`` channels (PLAIN: NCHW)."""
    return "NCHW" if block == PLAIN else f"NCHW{block}c"


@dataclass(frozen=True)
class _Form:
    """A rewritten value and the channel block of its layout (PLAIN: the original's)."""

    expr: Expr
    block: int


@pass_factory
def AlterOpLayout(target: Target | str | None = None) -> Pass:  # noqa: N802 - TVM's name
    """The AlterOpLayout pass (opt_level 3): convolutions and the operators between them in
    NCHW<x>c with x the vector lanes of ``target`` (None: the current target, else the
    host). See the module docstring."""
    return _alter_op_layout_pass(target)


@module_pass(opt_level=3, name="AlterOpLayout")
class _alter_op_layout_pass:  # noqa: N801 - a pass class, named like the others
    def __init__(self, target: Target | str | None = None) -> None:
        self.target = target

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        target = _resolve(self.target)
        lanes = target.vector_lanes("float32")
        new = IRModule()
        for name, func in mod.functions.items():
            infer_type(func, mod)
            if lanes >= 4 and isinstance(func, Function):
                func = _LayoutRewriter(lanes).rewrite(func)
            new[mod.get_global_var(name)] = func
        return new


def _resolve(target: Target | str | None) -> Target:
    if isinstance(target, Target):
        return target
    if target is not None:
        return Target(target)
    return Target.current(allow_none=True) or Target("llvm")


def _tensor(expr: Expr) -> TensorType | None:
    ty = expr.checked_type
    return ty if isinstance(ty, TensorType) else None


def _is_nchw_float(ty: TensorType | None) -> bool:
    return ty is not None and ty.ndim == 4 and ty.dtype in ("float32", "float64")


def _power_of_two_block(channels: int, lanes: int) -> int:
    """The largest power-of-two block from ``lanes`` down to 4 that divides ``channels``
    (PLAIN when none does)."""
    block = lanes
    while block >= 4:
        if channels % block == 0:
            return block
        block //= 2
    return PLAIN


def _input_block(channels: int, lanes: int) -> int:
    """The block of a convolution's input channels: a power-of-two block when one divides
    them, else all of them when they fit in a vector (an RGB image: NCHW3c), else the
    largest divisor below a vector."""
    block = _power_of_two_block(channels, lanes)
    if block:
        return block
    if channels <= lanes:
        return channels
    return max(d for d in range(1, lanes + 1) if channels % d == 0)


class _LayoutRewriter:
    """One function's rewrite: every node's form, and the layout conversions made so far."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self.forms: dict[Expr, _Form] = {}
        self.converted: dict[tuple[Expr, int], Expr] = {}

    def rewrite(self, func: Function) -> Function:
        for node in post_order(func.body, into_functions=False):
            self.forms[node] = self._visit(node)
        return Function(func.params, self.get(func.body, PLAIN), None, func.attrs)

    # -- values in a layout ------------------------------------------------------------------

    def get(self, node: Expr, block: int) -> Expr:
        """``node``'s rewritten value in layout ``block``, converting (once) if needed."""
        form = self.forms[node]
        if form.block == block:
            return form.expr
        key = (node, block)
        if key not in self.converted:
            self.converted[key] = self.transform(form.expr, data_layout(form.block),
                                                 data_layout(block))
        return self.converted[key]

    @staticmethod
    def transform(expr: Expr, src: str, dst: str) -> Expr:
        return Call(get_op("layout_transform"), [expr], {"src_layout": src, "dst_layout": dst})

    def plain_args(self, node: Call | Tuple) -> list[Expr]:
        args = node.args if isinstance(node, Call) else node.fields
        return [self.get(arg, PLAIN) for arg in args]

    # -- the rules ---------------------------------------------------------------------------

    def _visit(self, node: Expr) -> _Form:
        if isinstance(node, (Var, Constant, Function)) or not isinstance(
                node, (Call, Tuple, TupleGetItem)):
            return _Form(node, PLAIN)
        if isinstance(node, Tuple):
            return self._rebuilt(node, Tuple(self.plain_args(node)))
        if isinstance(node, TupleGetItem):
            value = self.get(node.tuple_value, PLAIN)
            rebuilt = node if value is node.tuple_value else TupleGetItem(value, node.index)
            return _Form(rebuilt, PLAIN)
        if isinstance(node.op, Op):
            form = self._blocked_call(node, node.op)
            if form is not None:
                return form
        return self._rebuilt(node, Call(node.op, self.plain_args(node), node.attrs,
                                        node.span))

    def _rebuilt(self, old: Call | Tuple, new: Call | Tuple) -> _Form:
        old_args = old.args if isinstance(old, Call) else old.fields
        new_args = new.args if isinstance(new, Call) else new.fields
        if all(a is b for a, b in zip(old_args, new_args)):
            return _Form(old, PLAIN)
        return _Form(new, PLAIN)

    def _blocked_call(self, call: Call, op: Op) -> _Form | None:
        if op.name == "nn.conv2d":
            return self._conv2d(call)
        if op.name == "concatenate":
            return self._concatenate(call)
        if op.name == "nn.bias_add":
            return self._bias_add(call)
        if op.name in ("nn.max_pool2d", "nn.avg_pool2d", "nn.global_max_pool2d",
                       "nn.global_avg_pool2d"):
            return self._pool(call)
        if op.pattern == OpPatternKind.kElemWise and len(call.args) == 1:
            block = self.forms[call.args[0]].block
            if block == PLAIN:
                return None
            return _Form(Call(op, [self.get(call.args[0], block)], call.attrs, call.span), block)
        if op.pattern == OpPatternKind.kBroadcast and op.name not in _BROADCAST_EXCLUDED:
            return self._broadcast(call, op)
        return None

    def _conv2d(self, call: Call) -> _Form | None:
        data, weight = call.args
        data_type, weight_type, out_type = _tensor(data), _tensor(weight), _tensor(call)
        attrs = call.attrs
        if (attrs.groups != 1 or not _is_nchw_float(data_type) or weight_type is None
                or out_type is None or weight_type.dtype != data_type.dtype):
            return None
        out_block = _power_of_two_block(out_type.shape[1], self.lanes)
        if out_block == PLAIN:
            return None
        current = self.forms[data].block
        in_block = current if current != PLAIN else _input_block(data_type.shape[1],
                                                                   self.lanes)
        packed = self.transform(self.get(weight, PLAIN), "OIHW",
                                f"OIHW{in_block}i{out_block}o")
        new_attrs = {key: attrs[key] for key in ("strides", "padding", "dilation", "groups",
                                                  "channels", "kernel_size", "out_dtype")}
        new_attrs.update(data_layout=data_layout(in_block),
                         kernel_layout=f"OIHW{in_block}i{out_block}o",
                         out_layout=data_layout(out_block))
        conv = Call(get_op("nn.conv2d_nchwc"), [self.get(data, in_block), packed], new_attrs,
                    call.span)
        return _Form(conv, out_block)

    def _broadcast(self, call: Call, op: Op) -> _Form | None:
        out_type = _tensor(call)
        if not _is_nchw_float(out_type):
            return None
        assert out_type is not None
        blocks = [self.forms[arg].block for arg in call.args
                  if self.forms[arg].block != PLAIN and _tensor(arg) is not None
                  and _tensor(arg).shape == out_type.shape]  # type: ignore[union-attr]
        if not blocks:
            return None
        block = blocks[0]
        args = []
        for arg in call.args:
            laid = self._operand_in_block(arg, out_type, block)
            if laid is None:
                return None
            args.append(laid)
        return _Form(Call(op, args, call.attrs, call.span), block)

    def _bias_add(self, call: Call) -> _Form | None:
        """bias_add along the channels of a blocked tensor: an add of the blocked bias."""
        data, bias = call.args
        block = self.forms[data].block
        data_type, bias_type = _tensor(data), _tensor(bias)
        if block == PLAIN or data_type is None or bias_type is None \
                or call.attrs.axis % 4 != 1 or bias_type.ndim != 1:
            return None
        vector = Call(get_op("reshape"), [self.get(bias, PLAIN)],
                      {"newshape": [1, bias_type.shape[0], 1, 1]})
        laid = self.transform(vector, "NCHW", data_layout(block))
        return _Form(Call(get_op("add"), [self.get(data, block), laid], None, call.span),
                     block)

    def _pool(self, call: Call) -> _Form | None:
        """Pooling of a blocked tensor: the same pooling in its layout (NCHW<x>c in, NCHW<x>c
        out), the window over H and W as before."""
        data = call.args[0]
        block = self.forms[data].block
        if block == PLAIN or call.attrs.layout != "NCHW":
            return None
        attrs = {**call.attrs, "layout": data_layout(block)}
        return _Form(Call(call.op, [self.get(data, block)], attrs, call.span), block)

    def _operand_in_block(self, arg: Expr, out_type: TensorType, block: int) -> Expr | None:
        """A broadcast operand laid out against a blocked result: the same shape converted,
        a per-channel vector blocked, a single value as it is; None for any other shape."""
        ty = _tensor(arg)
        if ty is None:
            return None
        if ty.shape == out_type.shape:
            return self.get(arg, block)
        shape = (1,) * (4 - ty.ndim) + tuple(ty.shape) if ty.ndim <= 4 else None
        if shape is None:
            return None
        if all(d == 1 for d in shape):
            return self.get(arg, PLAIN)  # broadcasts against any rank
        if shape[0] == 1 and shape[2] == 1 and shape[3] == 1 and shape[1] == out_type.shape[1]:
            value = self.get(arg, PLAIN)
            if ty.ndim != 4:
                value = Call(get_op("reshape"), [value], {"newshape": list(shape)})
            return self.transform(value, "NCHW", data_layout(block))
        return None

    def _concatenate(self, call: Call) -> _Form | None:
        tup = call.args[0]
        out_type = _tensor(call)
        if not isinstance(tup, Tuple) or not _is_nchw_float(out_type) \
                or call.attrs.axis not in (1, -3):
            return None
        blocks = [self.forms[f].block for f in tup.fields if self.forms[f].block != PLAIN]
        if not blocks:
            return None
        block = blocks[0]
        fields: list[Expr] = []
        for field in tup.fields:
            ty = _tensor(field)
            if ty is None or ty.ndim != 4 or ty.shape[1] % block:
                return None
            fields.append(self.get(field, block))
        return _Form(Call(call.op, [Tuple(fields)], {**call.attrs, "axis": 1}, call.span),
                     block)


def alter_op_layout(func: Function, lanes: int) -> Function:
    """``func`` (types inferred) with its convolutions in NCHW<lanes>c; see the module
    docstring."""
    return _LayoutRewriter(lanes).rewrite(func)


register_pass("AlterOpLayout", AlterOpLayout)

__all__ = ["AlterOpLayout", "alter_op_layout", "data_layout"]
