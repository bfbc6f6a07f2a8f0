"""FoldScaleAxis: fold a per-channel multiply into the weight of a neighbouring conv2d or dense.

Backward folding: the scale comes *after* the convolution. This is the shape batch_norm has
after SimplifyInference:

    conv2d(x, w) [+ b] [relu] * s       ->  conv2d(x, w * s) [+ b * s] [relu]

Forward folding: the scale comes *before* it, e.g. an input normalization:

    conv2d(x * s [+ b] [relu], w)       ->  conv2d(x [+ b / s] [relu], w * s)

In the words of NNVM's FoldScaleAxis (seed 003): the multiply *provides* the scale, conv2d and
dense *consume* it (multiplying their weight), and relu, leaky_relu, add, subtract, bias_add
(and, backward, another multiply) pass it through. Each direction runs in two phases, as in
TVM: a preparation that finds where a scale could travel, then a rewrite that moves it there.

The rules, TVM's:

* A scale is *per-channel* when it broadcasts into the scaled tensor without changing the
  tensor's shape and all its axes of size > 1 lie on the channel axis: ``(C, 1, 1)`` or
  ``(1, C, 1, 1)`` for NCHW data, ``(C,)`` for the last axis of a dense. ``(C,)`` against NCHW
  data lines up with W, so it is not a channel scale and nothing folds.
* Backward: every tensor between the convolution and the multiply has exactly one consumer, so
  scaling it changes nothing else. Forward: *every* consumer of the scaled tensor must take the
  scale (two convolutions reading ``x * s`` both get ``w * s``); one that cannot blocks it.
* relu(x) * s == relu(x * s) only for s > 0, so a scale passes a relu only when it is a
  constant with every entry positive. Forward through an add the bias is divided by the scale,
  which must then be a constant with no zero.
* conv2d folds for any ``groups`` (grouped and depthwise included); the layouts are read from
  its attributes. Only floating-point tensors are folded.

Constant weights and constant scales are multiplied here, in float64 and rounded once to the
weight's dtype; anything else becomes a multiply on the weight (reshaped to the weight's
channel axis), which FoldConstant folds once the weights are bound. A scale computed at run
time (a squeeze-excitation gate) folds forward only where the consumers' weights have no more
elements than the value it scales: the multiply on the weights runs at every run too.
Traversals are iterative and every container is ordered, so the result is deterministic."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op, get_op
from ..ir.types import TensorType, Type, is_float
from ..ir.visitor import children, post_order, rebuild
from .context import PassContext
from .pass_infra import Pass, module_pass, pass_factory, register_pass

# ---------------------------------------------------------------------------------------------
# passes


@pass_factory
def FoldScaleAxis() -> Pass:  # noqa: N802 - TVM's pass name
    """The FoldScaleAxis pass (opt_level 3): backward folding, then forward folding, in every
    function of the module. Run FoldConstant afterwards to fold weight * scale when the weight
    is still a parameter."""
    return _fold_scale_axis_pass


@pass_factory
def BackwardFoldScaleAxis() -> Pass:  # noqa: N802
    """Only the backward half of FoldScaleAxis: ``conv2d(x, w) * s -> conv2d(x, w * s)``."""
    return _backward_pass


@pass_factory
def ForwardFoldScaleAxis() -> Pass:  # noqa: N802
    """Only the forward half of FoldScaleAxis: ``conv2d(x * s, w) -> conv2d(x, w * s)``."""
    return _forward_pass


def fold_scale_axis(func: Function, mod: IRModule | None = None) -> Function:
    """Backward, then forward folding of one function; ``mod`` types calls of @globals."""
    return forward_fold_scale_axis(backward_fold_scale_axis(func, mod), mod)


def _each_function(mod: IRModule,
                   fold: Callable[[Function, IRModule | None], Function]) -> IRModule:
    new = IRModule()
    for name, func in mod.functions.items():
        new[mod.get_global_var(name)] = fold(func, mod)
    return new


def _has_multiply(nodes: Sequence[Expr]) -> bool:
    return any(_op_name(node) == "multiply" for node in nodes)


@module_pass(opt_level=3, name="FoldScaleAxis")
def _fold_scale_axis_pass(mod: IRModule, ctx: PassContext) -> IRModule:
    return _each_function(_each_function(mod, backward_fold_scale_axis), forward_fold_scale_axis)


@module_pass(opt_level=3, name="BackwardFoldScaleAxis")
def _backward_pass(mod: IRModule, ctx: PassContext) -> IRModule:
    return _each_function(mod, backward_fold_scale_axis)


@module_pass(opt_level=3, name="ForwardFoldScaleAxis")
def _forward_pass(mod: IRModule, ctx: PassContext) -> IRModule:
    return _each_function(mod, forward_fold_scale_axis)


# ---------------------------------------------------------------------------------------------
# per-channel scales


def _tensor(expr: Expr) -> TensorType | None:
    ty: Type = expr.checked_type
    return ty if isinstance(ty, TensorType) else None


def _elements(expr: Expr) -> int:
    """Elements of a tensor-typed expression (0 when its type is not a tensor's)."""
    value = _tensor(expr)
    return value.size if value is not None else 0


def _per_channel(value: TensorType | None, scale: TensorType | None, axis: int) -> bool:
    """Whether ``scale`` broadcasts into ``value`` without changing its shape, with every axis
    of size > 1 on ``axis`` of ``value`` (and both are floating point of one dtype)."""
    if value is None or scale is None or scale.ndim > value.ndim:
        return False
    if scale.dtype != value.dtype or not is_float(value.dtype):
        return False
    offset = value.ndim - scale.ndim
    for index, dim in enumerate(scale.shape):
        if dim != 1 and not (index + offset == axis and dim == value.shape[axis]):
            return False
    return True


def _bias_slot(operand_ndim: int, out_ndim: int, axis: int) -> tuple[int, int]:
    """(rank, axis) at which to lay a channel vector so that it lines up with ``axis`` of an
    ``out_ndim``-D result when multiplied into an operand of rank ``operand_ndim`` that
    broadcasts against that result (a bias of shape (C, 1, 1), (1, C, 1, 1) or a scalar)."""
    rank = max(operand_ndim, out_ndim - axis)
    return rank, axis - (out_ndim - rank)


@dataclass(frozen=True, eq=False)
class _Scale:
    """A per-channel scale of ``channels`` channels, in the tensor dtype ``dtype``: NumPy
    ``values`` (float64, shape (channels,)) when it is constant, else an expression ``expr``
    of shape ``shape`` whose only axis of size > 1 holds the channels (or none: uniform).
    The expressions it builds are kept, so every weight and bias it scales shares them."""

    channels: int
    dtype: str
    values: np.ndarray | None = None
    expr: Expr | None = None
    shape: tuple[int, ...] = ()
    built: dict[int, Expr] = field(default_factory=dict, repr=False)  # by trailing ones

    @staticmethod
    def of(expr: Expr, expr_type: TensorType, channels: int) -> _Scale:
        if isinstance(expr, Constant):
            flat = expr.data.astype(np.float64).reshape(-1)
            return _Scale(channels, expr_type.dtype, values=np.broadcast_to(flat, (channels,)))
        return _Scale(channels, expr_type.dtype, expr=expr, shape=expr_type.shape)

    @property
    def size(self) -> int:
        """Entries along the channel axis: ``channels``, or 1 for a uniform expression."""
        return self.channels if self.values is not None else int(np.prod(self.shape))

    @property
    def positive(self) -> bool:
        return self.values is not None and bool(np.all(self.values > 0))

    @property
    def nonzero(self) -> bool:
        return self.values is not None and bool(np.all(self.values != 0))

    def flat(self) -> Expr:
        """The scale as a 1-D expression of ``size`` entries."""
        return self.laid(1, 0)

    def laid(self, rank: int, axis: int) -> Expr:
        """The scale laid along ``axis`` of a rank-``rank`` tensor: shape (size, 1, ..., 1)."""
        trailing = (1,) * (rank - 1 - axis)
        known = self.built.get(len(trailing))
        if known is not None:
            return known
        if self.values is not None:
            made: Expr = Constant(self.values.reshape((-1,) + trailing).astype(self.dtype))
        elif self.shape == (self.size,) + trailing:
            assert self.expr is not None
            made = self.expr
        else:
            assert self.expr is not None
            made = Call(get_op("reshape"), [self.expr], {"newshape": [-1, *trailing]})
        self.built[len(trailing)] = made
        return made

    def times(self, other: _Scale) -> _Scale:
        if self.values is not None and other.values is not None:
            return _Scale(self.channels, self.dtype, values=self.values * other.values)
        product = Call(get_op("multiply"), [self.flat(), other.flat()])
        return _Scale(self.channels, self.dtype, expr=product,
                      shape=(max(self.size, other.size),))


def _scale_operand(operand: Expr, scale: _Scale, rank: int, axis: int,
                   inverse: bool = False) -> Expr:
    """``operand * scale`` (``/`` with ``inverse``), the scale laid along ``axis`` of a
    rank-``rank`` tensor. A constant operand times a constant scale is computed now, in
    float64, and rounded once."""
    if isinstance(operand, Constant) and scale.values is not None:
        factor = scale.values.reshape((-1,) + (1,) * (rank - 1 - axis))
        data = operand.data.astype(np.float64)
        out = data / factor if inverse else data * factor
        return Constant(out.astype(operand.data.dtype))
    op = get_op("divide" if inverse else "multiply")
    return Call(op, [operand, scale.laid(rank, axis)])


class _ConvAxes(NamedTuple):
    data_channel: int  # C in the data layout
    out_channel: int  # C in the output layout
    kernel_out: int  # O in the kernel layout
    kernel_in: int  # I in the kernel layout


def _conv_axes(call: Call) -> _ConvAxes | None:
    """The channel axes of a conv2d, or None when it cannot fold (a blocked layout such as
    NCHW8c, or a weight whose dtype differs from the data's)."""
    attrs = call.attrs
    data_layout = attrs.get("data_layout", "NCHW")
    kernel_layout = attrs.get("kernel_layout", "OIHW")
    out_layout = attrs.get("out_layout") or data_layout
    layouts = data_layout + kernel_layout + out_layout
    if any(letter.islower() for letter in layouts):
        return None
    data, weight, out = _tensor(call.args[0]), _tensor(call.args[1]), _tensor(call)
    if data is None or weight is None or out is None:
        return None
    if not (is_float(out.dtype) and data.dtype == weight.dtype == out.dtype):
        return None
    return _ConvAxes(data_layout.index("C"), out_layout.index("C"), kernel_layout.index("O"),
                     kernel_layout.index("I"))


def _dense_ok(call: Call) -> bool:
    data, weight, out = _tensor(call.args[0]), _tensor(call.args[1]), _tensor(call)
    return (data is not None and weight is not None and out is not None
            and is_float(out.dtype) and data.dtype == weight.dtype == out.dtype)


def _use_counts(nodes: Sequence[Expr], root: Expr) -> dict[Expr, int]:
    """How many times each node is an operand; the function's result counts as one use."""
    counts = dict.fromkeys(nodes, 0)
    counts[root] += 1
    for node in nodes:
        for child in children(node):
            counts[child] += 1
    return counts


def _rebuild(node: Expr, new: Mapping[Expr, Expr]) -> Expr:
    """``node`` over the rewritten operands (``node`` itself when none changed)."""
    return rebuild(node, new.__getitem__)


def _op_name(node: Expr) -> str | None:
    return node.op.name if isinstance(node, Call) and isinstance(node.op, Op) else None


# ---------------------------------------------------------------------------------------------
# backward folding: conv2d(x, w) * s -> conv2d(x, w * s)


@dataclass(frozen=True)
class _Offer:
    """A call whose output can take a scale along ``axis`` (TVM's backward message).

    ``through``: operands that take the scale in turn (the chain goes on below them);
    ``scaled``: (operand, rank, axis) multiplied by the scale right here (a weight, a bias);
    ``absorbed``: for a multiply on the chain, its own scale operand, which joins the scale;
    ``positive``: a relu lies below, so only a positive constant scale may come."""

    axis: int
    positive: bool = False
    through: tuple[int, ...] = ()
    scaled: tuple[tuple[int, int, int], ...] = ()
    absorbed: int | None = None


Offers = Mapping[Expr, _Offer]


def _offer_conv2d(call: Call, offers: Offers) -> _Offer | None:
    # conv2d(x, w) * s -> conv2d(x, w * s): output channel o reads only w[o], for any groups
    axes = _conv_axes(call)
    weight = _tensor(call.args[1])
    if axes is None or weight is None:
        return None
    return _Offer(axes.out_channel, scaled=((1, weight.ndim, axes.kernel_out),))


def _offer_dense(call: Call, offers: Offers) -> _Offer | None:
    # dense(x, w) * s -> dense(x, w * s[:, None]): output unit n reads only w[n]
    out = _tensor(call)
    if out is None or not _dense_ok(call):
        return None
    return _Offer(out.ndim - 1, scaled=((1, 2, 0),))


def _offer_relu(call: Call, offers: Offers) -> _Offer | None:
    # relu(e) * s -> relu(e * s)  when s > 0
    inner = offers.get(call.args[0])
    if inner is None:
        return None
    return _Offer(inner.axis, positive=True, through=(0,))


def _offer_bias_add(call: Call, offers: Offers) -> _Offer | None:
    # bias_add(e, b) * s -> bias_add(e * s, b * s)  when b lies on the channel axis
    inner = offers.get(call.args[0])
    out = _tensor(call)
    if inner is None or out is None or call.attrs.axis % out.ndim != inner.axis:
        return None
    return _Offer(inner.axis, inner.positive, through=(0,), scaled=((1, 1, 0),))


def _offer_add_sub(call: Call, offers: Offers) -> _Offer | None:
    # (e + b) * s -> e * s + b * s   (b per-channel);   (e1 + e2) * s -> e1 * s + e2 * s
    out = _tensor(call)
    types = [_tensor(arg) for arg in call.args]
    if out is None or None in types:
        return None
    inner = [offers.get(arg) for arg in call.args]
    for this, other in ((0, 1), (1, 0)):
        offer, other_type = inner[this], types[other]
        if offer is None or other_type is None or types[this] != out:
            continue
        if _per_channel(out, other_type, offer.axis):
            rank, axis = _bias_slot(other_type.ndim, out.ndim, offer.axis)
            return _Offer(offer.axis, offer.positive, through=(this,),
                          scaled=((other, rank, axis),))
    first, second = inner
    if first is not None and second is not None and first.axis == second.axis and \
            types[0] == types[1] == out:
        return _Offer(first.axis, first.positive or second.positive, through=(0, 1))
    return None


def _offer_multiply(call: Call, offers: Offers) -> _Offer | None:
    # (e * s1) * s -> e * (s1 * s)  when s1 is per-channel on the same axis
    found = _foldable_multiply(call, offers)
    if found is None:
        return None
    this, other = found
    inner = offers[call.args[this]]
    return _Offer(inner.axis, inner.positive, through=(this,), absorbed=other)


def _foldable_multiply(call: Call, offers: Offers) -> tuple[int, int] | None:
    """(operand, scale) argument positions of a multiply whose scale can fold into the chain
    below its operand, or None."""
    out = _tensor(call)
    for this, other in ((0, 1), (1, 0)):
        offer = offers.get(call.args[this])
        scale = call.args[other]
        if offer is None or _tensor(call.args[this]) != out:
            continue
        if not _per_channel(out, _tensor(scale), offer.axis):
            continue
        if offer.positive and not (isinstance(scale, Constant) and np.all(scale.data > 0)):
            continue
        return this, other
    return None


_BACKWARD_OFFERS: dict[str, Callable[[Call, Offers], _Offer | None]] = {
    "nn.conv2d": _offer_conv2d,
    "nn.dense": _offer_dense,
    "nn.relu": _offer_relu,
    "nn.leaky_relu": _offer_relu,
    "nn.bias_add": _offer_bias_add,
    "add": _offer_add_sub,
    "subtract": _offer_add_sub,
    "multiply": _offer_multiply,
}


def backward_fold_scale_axis(func: Function, mod: IRModule | None = None) -> Function:
    """Fold every multiply by a per-channel scale into the conv2d/dense that produces its
    operand (through relu, bias_add, add and subtract). Returns a new function; ``mod``
    types calls of @globals."""
    nodes = post_order(func.body)
    if not _has_multiply(nodes):
        return func
    infer_type(func, mod)  # the rules read operand types
    uses = _use_counts(nodes, func.body)

    # 1. Producers first: which calls could take a scale of their output. Only a call with a
    #    single consumer offers, so scaling it changes no other reader.
    offers: dict[Expr, _Offer] = {}
    for node in nodes:
        rule = _BACKWARD_OFFERS.get(_op_name(node) or "")
        if rule is not None and uses[node] == 1:
            offer = rule(node, offers)  # type: ignore[arg-type]
            if offer is not None:
                offers[node] = offer

    # 2. Consumers first: each multiply that can fold hands its scale down its chain.
    #    factors[n] lists the scale expressions (original nodes) that n's output absorbs.
    factors: dict[Expr, tuple[Expr, ...]] = {}
    provider_of: dict[Expr, Call] = {}
    chains: dict[Call, list[Call]] = {}
    folded_operand: dict[Call, Expr] = {}
    for node in reversed(nodes):
        if not isinstance(node, Call):
            continue
        if node in factors:
            offer = offers[node]
            provider = provider_of[node]
            chains[provider].append(node)
            passed = factors[node]
            if offer.absorbed is not None:
                passed = passed + (node.args[offer.absorbed],)
            for index in offer.through:
                factors[node.args[index]] = passed
                provider_of[node.args[index]] = provider
            continue
        found = _foldable_multiply(node, offers) if _op_name(node) == "multiply" else None
        if found is None:
            continue
        this, other = found
        operand = node.args[this]
        chains[node] = []
        folded_operand[node] = operand
        factors[operand] = (node.args[other],)
        provider_of[operand] = node

    if not chains:
        return func

    # 3. Producers first again: rebuild. A chain is rebuilt when its multiply is reached, so
    #    the (rewritten) scale expressions and every operand of the chain exist by then.
    new: dict[Expr, Expr] = {}
    scales: dict[tuple[Expr, ...], _Scale] = {}
    for node in nodes:
        if node in factors:
            continue
        if node in chains:
            for member in reversed(chains[node]):
                new[member] = _rewrite_member(member, offers[member], factors[member], new,
                                              scales)
            new[node] = new[folded_operand[node]]
        else:
            new[node] = _rebuild(node, new)
    body = new[func.body]
    return Function(func.params, body, func.ret_type, func.attrs)


def _rewrite_member(member: Call, offer: _Offer, scale_exprs: tuple[Expr, ...],
                    new: Mapping[Expr, Expr], scales: dict[tuple[Expr, ...], _Scale]) -> Expr:
    """A member of a backward chain, rebuilt to produce its output times the scale that
    ``scale_exprs`` multiply to (built once per chain, in ``scales``)."""
    if offer.absorbed is not None:
        return new[member.args[offer.through[0]]]
    scale = scales.get(scale_exprs)
    if scale is None:
        out = _tensor(member)
        assert out is not None
        for expr in scale_exprs:
            expr_type = _tensor(expr)
            assert expr_type is not None
            part = _Scale.of(new[expr], expr_type, out.shape[offer.axis])
            scale = part if scale is None else scale.times(part)
        assert scale is not None
        scales[scale_exprs] = scale
    args = [new[arg] for arg in member.args]
    for index, rank, axis in offer.scaled:
        args[index] = _scale_operand(args[index], scale, rank, axis)
    return Call(member.op, args, member.attrs, member.span)


# ---------------------------------------------------------------------------------------------
# forward folding: conv2d(x * s, w) -> conv2d(x, w * s)


@dataclass(frozen=True)
class _Demand:
    """Every consumer of a value can take a scale of it along ``axis`` (TVM's forward
    message); ``positive``: only a positive constant scale (a relu lies on the way)."""

    axis: int
    positive: bool = False
    #: Weight elements the consumers would multiply by a scale computed at run time.
    weights: int = 0


@dataclass(frozen=True)
class _Scaled:
    """A value known as ``value * scale`` along ``axis``, the multiply not yet applied."""

    value: Expr
    scale: _Scale
    axis: int


Scaled = Mapping[Expr, _Scaled]


def _prep_conv2d(call: Call, demand: _Demand | None) -> list[_Demand | None]:
    axes = _conv_axes(call)
    return [None if axes is None else _Demand(axes.data_channel, weights=_elements(call.args[1])),
            None]


def _prep_dense(call: Call, demand: _Demand | None) -> list[_Demand | None]:
    data = _tensor(call.args[0])
    if data is None or not _dense_ok(call):
        return [None, None]
    return [_Demand(data.ndim - 1, weights=_elements(call.args[1])), None]


def _prep_relu(call: Call, demand: _Demand | None) -> list[_Demand | None]:
    return [None if demand is None else replace(demand, positive=True)]


def _prep_bias_add(call: Call, demand: _Demand | None) -> list[_Demand | None]:
    out = _tensor(call)
    if demand is None or out is None or call.attrs.axis % out.ndim != demand.axis:
        return [None, None]
    return [demand, None]


def _prep_add_sub(call: Call, demand: _Demand | None) -> list[_Demand | None]:
    out = _tensor(call)
    lhs, rhs = (_tensor(arg) for arg in call.args)
    if demand is None or out is None:
        return [None, None]
    if lhs == out and _per_channel(out, rhs, demand.axis):
        return [demand, None]
    if rhs == out and _per_channel(out, lhs, demand.axis):
        return [None, demand]
    return [None, None]


_FORWARD_PREPS: dict[str, Callable[[Call, _Demand | None], list[_Demand | None]]] = {
    "nn.conv2d": _prep_conv2d,
    "nn.dense": _prep_dense,
    "nn.relu": _prep_relu,
    "nn.leaky_relu": _prep_relu,
    "nn.bias_add": _prep_bias_add,
    "add": _prep_add_sub,
    "subtract": _prep_add_sub,
}


def _forward_demands(nodes: Sequence[Expr], root: Expr) -> dict[Expr, _Demand | None]:
    """Consumers first: the scale each node's consumers can all take (None: at least one
    consumer, or the function's result, takes none)."""
    demands: dict[Expr, _Demand | None] = {root: None}

    def merge(node: Expr, demand: _Demand | None) -> None:
        if node not in demands:
            demands[node] = demand
            return
        known = demands[node]
        if known is None or demand is None or known.axis != demand.axis:
            demands[node] = None
        else:
            demands[node] = _Demand(known.axis, known.positive or demand.positive,
                                    known.weights + demand.weights)

    for node in reversed(nodes):
        prep = _FORWARD_PREPS.get(_op_name(node) or "")
        if prep is not None:
            assert isinstance(node, Call)
            for arg, demand in zip(node.args, prep(node, demands.get(node))):
                merge(arg, demand)
        else:
            for child in children(node):
                merge(child, None)
    return demands


Rewrite = Callable[[Call, Mapping[Expr, Expr], Scaled, _Demand | None], Expr | _Scaled | None]


def _forward_multiply(call: Call, new: Mapping[Expr, Expr], scaled: Scaled,
                      demand: _Demand | None) -> Expr | _Scaled | None:
    # x * s  ->  x, with s pending, when every consumer takes s
    out = _tensor(call)
    if demand is None or out is None:
        return None
    for this, other in ((0, 1), (1, 0)):
        scale_type = _tensor(call.args[other])
        if _tensor(call.args[this]) != out or not _per_channel(out, scale_type, demand.axis):
            continue
        assert scale_type is not None
        scale = _Scale.of(new[call.args[other]], scale_type, out.shape[demand.axis])
        if demand.positive and not scale.positive:
            continue
        values = _elements(call)
        if scale.values is None and values and demand.weights > values:
            # A scale known only at run time multiplies the weights at every run: that
            # costs more than multiplying the value itself once the weights are the larger
            # (EfficientNet's squeeze-excitation gates on its 7x7 layers: 221k weights for
            # 56k values; a SiLU on the gate's 48 hidden values folded into 55k weights).
            return None
        return _Scaled(new[call.args[this]], scale, demand.axis)
    return None


def _forward_relu(call: Call, new: Mapping[Expr, Expr], scaled: Scaled,
                  demand: _Demand | None) -> Expr | _Scaled | None:
    # relu(x * s)  ->  relu(x) * s   (s > 0)
    inner = scaled.get(call.args[0])
    if inner is None or demand is None or not inner.scale.positive:
        return None
    return _Scaled(Call(call.op, [inner.value], call.attrs, call.span), inner.scale, inner.axis)


def _forward_add_sub(call: Call, new: Mapping[Expr, Expr], scaled: Scaled,
                     demand: _Demand | None) -> Expr | _Scaled | None:
    # x * s + b  ->  (x + b / s) * s   (s a constant with no zero)
    out = _tensor(call)
    if demand is None or out is None:
        return None
    for this, other in ((0, 1), (1, 0)):
        inner = scaled.get(call.args[this])
        other_type = _tensor(call.args[other])
        if inner is None or call.args[other] in scaled or other_type is None:
            continue
        if _tensor(call.args[this]) != out or not _per_channel(out, other_type, inner.axis):
            continue
        if not inner.scale.nonzero:
            return None
        rank, axis = _bias_slot(other_type.ndim, out.ndim, inner.axis)
        bias = _scale_operand(new[call.args[other]], inner.scale, rank, axis, inverse=True)
        args = [inner.value, bias] if this == 0 else [bias, inner.value]
        return _Scaled(Call(call.op, args, call.attrs, call.span), inner.scale, inner.axis)
    return None


def _forward_bias_add(call: Call, new: Mapping[Expr, Expr], scaled: Scaled,
                      demand: _Demand | None) -> Expr | _Scaled | None:
    # bias_add(x * s, b)  ->  bias_add(x, b / s) * s   (s a constant with no zero)
    inner = scaled.get(call.args[0])
    if inner is None or demand is None or not inner.scale.nonzero:
        return None
    bias = _scale_operand(new[call.args[1]], inner.scale, 1, 0, inverse=True)
    value = Call(call.op, [inner.value, bias], call.attrs, call.span)
    return _Scaled(value, inner.scale, inner.axis)


def _forward_conv2d(call: Call, new: Mapping[Expr, Expr], scaled: Scaled,
                    demand: _Demand | None) -> Expr | _Scaled | None:
    # conv2d(x * s, w)  ->  conv2d(x, w * s along the input channels)
    inner = scaled.get(call.args[0])
    axes = _conv_axes(call)
    weight_type = _tensor(call.args[1])
    if inner is None or axes is None or weight_type is None or inner.axis != axes.data_channel:
        return None
    weight = _scale_conv_inputs(new[call.args[1]], weight_type, axes, call.attrs.groups,
                                inner.scale)
    return Call(call.op, [inner.value, weight], call.attrs, call.span)


def _forward_dense(call: Call, new: Mapping[Expr, Expr], scaled: Scaled,
                   demand: _Demand | None) -> Expr | _Scaled | None:
    # dense(x * s, w)  ->  dense(x, w * s[None, :])
    inner = scaled.get(call.args[0])
    data = _tensor(call.args[0])
    if inner is None or data is None or inner.axis != data.ndim - 1:
        return None
    weight = _scale_operand(new[call.args[1]], inner.scale, 2, 1)
    return Call(call.op, [inner.value, weight], call.attrs, call.span)


_FORWARD_REWRITES: dict[str, Rewrite] = {
    "multiply": _forward_multiply,
    "nn.relu": _forward_relu,
    "nn.leaky_relu": _forward_relu,
    "add": _forward_add_sub,
    "subtract": _forward_add_sub,
    "nn.bias_add": _forward_bias_add,
    "nn.conv2d": _forward_conv2d,
    "nn.dense": _forward_dense,
}


def _scale_conv_inputs(weight: Expr, weight_type: TensorType, axes: _ConvAxes, groups: int,
                       scale: _Scale) -> Expr:
    """The conv2d weight with input channel c multiplied by scale[c]."""
    rank = weight_type.ndim
    out_channels = weight_type.shape[axes.kernel_out]
    per_group = weight_type.shape[axes.kernel_in]
    if groups == 1 or scale.size == 1:
        return _scale_operand(weight, scale, rank, axes.kernel_in)
    if per_group == 1 and out_channels == groups:  # depthwise: output c reads input c
        return _scale_operand(weight, scale, rank, axes.kernel_out)
    # grouped: w[o, i] reads input channel (o // outputs per group) * per_group + i
    index = ((np.arange(out_channels) // (out_channels // groups))[:, None] * per_group
             + np.arange(per_group)[None, :])
    if axes.kernel_out > axes.kernel_in:
        index = index.T
    shape = [1] * rank
    shape[axes.kernel_out], shape[axes.kernel_in] = out_channels, per_group
    index = index.reshape(shape)
    if scale.values is not None:
        factor = scale.values[index]
        if isinstance(weight, Constant):
            return Constant((weight.data.astype(np.float64) * factor).astype(weight.data.dtype))
        return Call(get_op("multiply"), [weight, Constant(factor.astype(scale.dtype))])
    gathered = Call(get_op("take"), [scale.flat(), Constant(index.astype(np.int64))],
                    {"axis": 0})
    return Call(get_op("multiply"), [weight, gathered])


def forward_fold_scale_axis(func: Function, mod: IRModule | None = None) -> Function:
    """Fold every multiply by a per-channel scale into the conv2d/dense layers that consume
    it (through relu, bias_add, add and subtract), when every consumer can take it. Returns a
    new function; ``mod`` types calls of @globals."""
    nodes = post_order(func.body)
    if not _has_multiply(nodes):
        return func
    infer_type(func, mod)  # the rules read operand types
    demands = _forward_demands(nodes, func.body)
    if not any(demand is not None for demand in demands.values()):
        return func
    new: dict[Expr, Expr] = {}
    scaled: dict[Expr, _Scaled] = {}
    for node in nodes:
        rule = _FORWARD_REWRITES.get(_op_name(node) or "")
        result = None
        if rule is not None:
            assert isinstance(node, Call)
            result = rule(node, new, scaled, demands.get(node))
        if isinstance(result, _Scaled):
            # Kept pending for the consumers; the plain form serves any that cannot fold.
            scaled[node] = result
            result = None
        new[node] = result if result is not None else _rebuild(node, new)
    body = new[func.body]
    if body is func.body:
        return func
    return Function(func.params, body, func.ret_type, func.attrs)


register_pass("FoldScaleAxis", FoldScaleAxis)
register_pass("BackwardFoldScaleAxis", BackwardFoldScaleAxis)
register_pass("ForwardFoldScaleAxis", ForwardFoldScaleAxis)

__all__ = [
    "BackwardFoldScaleAxis", "FoldScaleAxis", "ForwardFoldScaleAxis",
    "backward_fold_scale_axis", "fold_scale_axis", "forward_fold_scale_axis",
]
