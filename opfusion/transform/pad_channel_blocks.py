"""PadChannelBlocks: round convolutions' output channels up to whole vectors (CPU targets).

AlterOpLayout lays channels out in blocks of the target's vector (16 float32 lanes with
AVX-512). Channel counts that no vector divides (MobileNet v3's 24, 40, 72, 120, 184, 200;
EfficientNet's 24 and 40) then run in half or quarter vectors, or split into a convolution of
whole vectors and one of the rest, concatenated. ONNX Runtime's NCHWc transformer rounds such
convolutions' output channels up to the block instead. This pass does the same on the NCHW
graph, before AlterOpLayout::

    conv2d(x, w[72, ...]) -> relu -> dwconv(., w[72, 1, 3, 3]) -> conv2d(., v[o, 72, ...])
      -> conv2d(x, pad(w)[80, ...]) -> relu -> dwconv(., pad(w)[80, 1, 3, 3], groups=80)
         -> conv2d(., pad(v)[o, 80, ...])

The added filters are zeros, and so are the added biases, so the added channels hold values
computed from zeros and zero-padded constants alone; a convolution that reads them has zero
weights on them, and every real channel is the same sum as before (0 x a finite value adds
nothing; where an earlier value is infinite, a result that is infinite in the reference may
be NaN, as under ONNX Runtime's padding).

Which values are padded: *regions* of values with the same channel count, joined by
operators that keep each channel apart and map finite values to finite ones (relu, clip,
sigmoid, tanh, leaky_relu, add, subtract, multiply, maximum, minimum, where, bias_add,
pooling, depthwise convolution; cast, round, isnan and a division by a constant with no zero
that is the same for every channel: the quantizing steps of quantized models, whose bytes
and int32 sums pad as floats do), each value made by an ungrouped convolution (whose filters
are padded; float or int32) or by such an operator of the region's values, per-channel
constants (padded with zeros) and single values. A region is padded when

* its channels round up to whole vectors at most MAX_PADDING_RATIO times (24 -> 32 on
  AVX-512, not 8 -> 16);
* every consumer outside the region either reads the padded channels as they are (an
  ungrouped convolution, its weight padded along its input channels, at compile time or,
  for a weight computed at run time, by an ``nn.pad``), or gets the channels back by a
  ``strided_slice`` that costs little: of a value of one pixel (squeeze-excitation's gates)
  or into a concatenation, which copies its parts anyway (the slice fuses into it:
  ShuffleNet v2's branches);
* and it pays for the third more work its convolutions' inputs may take: unpadded, its
  channels would run in vectors of a quarter of the lanes or less (58 in NCHW, 116 in
  blocks of 4 on AVX-512), or be split into whole vectors and a rest (AlterOpLayout's
  MIN_VECTOR_BLOCKS), or it has a depthwise convolution or a pool, which would run in half
  vectors. (EfficientNet's 24 and 40 channels, in blocks of 8 between two 1x1
  convolutions, ran 1.02x slower padded.)

Function results get their channels back the same way. ``opf.compile`` runs the pass for CPU
targets at opt_level 3 before AlterOpLayout (``compile.alter_layout``), unless AlterOpLayout is
disabled; ``disabled_pass=["PadChannelBlocks"]`` turns it off."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import get_op
from ..ir.types import TensorType
from ..ir.visitor import post_order
from ..op import nn as nn_ops
from ..target import Target, as_target
from .alter_op_layout import MIN_VECTOR_BLOCKS, power_of_two_block
from .context import PassContext
from .pass_infra import Pass, function_pass, pass_factory, register_pass

#: Most that padding may multiply a region's channels by: 24 -> 32 on AVX-512 (its
#: projections and the convolutions that read them do a third more work, in whole vectors
#: instead of half ones), not 8 -> 16.
MAX_PADDING_RATIO = 4 / 3

#: Operators of one operand that keep each channel apart and map finite values to finite
#: ones (exp would not: padded channels must stay finite, so that zero weights cancel them);
#: with cast, round and isnan, the quantizing and dequantizing steps of quantized models.
_UNARY = ("nn.relu", "clip", "sigmoid", "tanh", "nn.leaky_relu", "negative", "abs", "copy",
          "cast", "round", "isnan")
#: Broadcasting operators of that kind (divide only by a constant with no zero that is the
#: same for every channel: x / 0 on a zero channel would not be finite).
_BINARY = ("add", "subtract", "multiply", "maximum", "minimum", "where")
#: The types of the values this pass pads: floats, and the bytes, int32 sums and NaN tests
#: between quantized convolutions.
_PADDED_DTYPES = ("float32", "int32", "uint8", "int8", "bool")
#: Pooling over pixels, channel by channel.
_POOLS = ("nn.max_pool2d", "nn.avg_pool2d", "nn.global_max_pool2d", "nn.global_avg_pool2d")


@pass_factory
def PadChannelBlocks(target: Target | str | None = None) -> Pass:  # noqa: N802 - a pass name
    """Round convolutions' output channels, and the values that follow them, up to whole
    vectors of ``target`` (None: the current target, else the host); see the module
    docstring."""
    return _pad_channel_blocks_pass(target)


@function_pass(opt_level=3, name="PadChannelBlocks")
class _pad_channel_blocks_pass:  # noqa: N801 - a pass class, named like the others
    def __init__(self, target: Target | str | None = None) -> None:
        self.target = target

    def transform_function(self, func: Function, mod: IRModule, ctx: PassContext) -> Function:
        lanes = as_target(self.target).vector_lanes("float32")
        # (without AlterOpLayout the channels are not blocked: padding would only add work)
        if func.is_primitive or lanes < 4 or "AlterOpLayout" in ctx.disabled_pass:
            return func
        infer_type(func, mod)
        return pad_channel_blocks(func, lanes)


register_pass("PadChannelBlocks", PadChannelBlocks)


def padded_count(channels: int, lanes: int) -> int:
    """``channels`` rounded up to whole vectors of ``lanes``, or ``channels`` itself when
    that would multiply them by more than MAX_PADDING_RATIO."""
    rounded = -(-channels // lanes) * lanes
    return rounded if rounded <= channels * MAX_PADDING_RATIO else channels


def pad_channel_blocks(func: Function, lanes: int) -> Function:
    """``func`` (types inferred) with the regions of the module docstring padded to whole
    vectors of ``lanes`` float32 lanes."""
    order = post_order(func.body, into_functions=False)
    padded = _Regions(order, func.body, lanes).padded()
    if not padded:
        return func
    return Function(func.params, _Rewriter(padded).rewrite(order, func.body), None, func.attrs)


def _channels(expr: Expr) -> int | None:
    """The channel count of a 4-D value of a padded type, None for any other."""
    ty = expr.checked_type
    if (isinstance(ty, TensorType) and ty.ndim == 4 and ty.dtype in _PADDED_DTYPES
            and all(isinstance(d, int) for d in ty.shape)):
        return int(ty.shape[1])
    return None


def _pixels(expr: Expr) -> int:
    ty = expr.checked_type
    assert isinstance(ty, TensorType)
    return int(ty.shape[2]) * int(ty.shape[3])


def _is_plain_conv(call: Call) -> bool:
    """An ``nn.conv2d`` of NCHW data with an OIHW weight, whose channels this pass knows."""
    return (call.op_name == "nn.conv2d" and call.attrs.data_layout == "NCHW"
            and call.attrs.kernel_layout == "OIHW"
            and call.attrs.out_dtype in (None, "", "float32", "int32"))


def _is_dense_conv(call: Call) -> bool:
    """An ungrouped plain convolution: it can pad its filters and read padded channels."""
    return _is_plain_conv(call) and call.attrs.groups == 1


def _is_depthwise(call: Call) -> bool:
    channels = _channels(call.args[0])
    return (_is_plain_conv(call) and call.attrs.groups > 1
            and channels == call.attrs.groups == _channels(call)
            and _channels(call.args[1]) is not None and call.args[1].checked_type.shape[1] == 1)


def _nonzero_over_channels(divisor: Expr) -> bool:
    """Whether ``divisor`` is a constant with no zero that broadcasts over the channels (a
    quantizing step's scale): a finite value divided by it stays finite."""
    return (isinstance(divisor, Constant) and _channel_axis_of_operand(divisor) is None
            and bool(np.all(divisor.data != 0)))


def _channel_axis_of_operand(operand: Expr) -> int | None:
    """The axis of ``operand`` that broadcasts along a 4-D result's channels (its third from
    last), when it is more than one wide (None: it broadcasts over them, or it has no such
    axis)."""
    ty = operand.checked_type
    if not isinstance(ty, TensorType) or ty.ndim < 3:
        return None
    axis = ty.ndim - 3
    return axis if ty.shape[axis] != 1 else None


@dataclass
class _Region:
    """Values joined by channel-wise operators (all of one channel count: a join needs
    it): padded together or not at all."""

    channels: int
    ok: bool = True
    members: list[Expr] = field(default_factory=list)


class _Regions:
    """Which values are padded: the regions of the module docstring, by union-find."""

    def __init__(self, order: list[Expr], body: Expr, lanes: int) -> None:
        self.lanes = lanes
        self.parent: dict[Expr, Expr] = {}
        self.made: set[Expr] = set()  # members made by an operator whose result is padded
        self.blockers: set[Expr] = set()  # values whose region cannot be padded
        self.concatenated = _concatenated_tuples(order)
        for node in order:
            if isinstance(node, Call) and _channels(node) is not None:
                self._classify(node)
        for node in order:
            self._check_consumers(node)
        if body in self.parent:
            self._exit(body)

    def _find(self, value: Expr) -> Expr:
        root = value
        while self.parent[root] is not root:
            root = self.parent[root]
        while self.parent[value] is not root:  # path compression
            self.parent[value], value = root, self.parent[value]
        return root

    def _join(self, a: Expr, b: Expr) -> None:
        ra, rb = self._find(a), self._find(b)
        if ra is not rb:
            self.parent[rb] = ra

    def _add(self, value: Expr) -> None:
        if value not in self.parent:
            self.parent[value] = value

    def _classify(self, call: Call) -> None:
        """Make ``call``'s result a member when an operator this pass can pad makes it,
        joined with the operands it keeps channel by channel."""
        channels = _channels(call)
        name = call.op_name
        if _is_dense_conv(call):
            self._add(call)
            self.made.add(call)
            return
        if _is_depthwise(call) or name in _UNARY or name in _POOLS \
                or (name == "divide" and _nonzero_over_channels(call.args[1])):
            operands = [call.args[0]]
        elif name == "nn.bias_add" and call.attrs.axis % 4 == 1 \
                and isinstance(call.args[1], Constant):
            operands = [call.args[0]]
        elif name in _BINARY:
            operands = []
            for arg in call.args:
                axis = _channel_axis_of_operand(arg)
                if axis is None:
                    if not isinstance(arg, Constant):  # computed: could be infinite
                        return
                elif not isinstance(arg, Constant):
                    if _channels(arg) != channels:
                        return
                    operands.append(arg)
        else:
            return
        if name in _POOLS and call.attrs.get("layout", "NCHW") != "NCHW":
            return
        if any(_channels(arg) != channels for arg in operands):
            return
        self._add(call)
        self.made.add(call)
        for arg in operands:
            self._add(arg)
            self._join(call, arg)

    def _check_consumers(self, node: Expr) -> None:
        """Mark values that ``node`` reads but cannot read padded."""
        if isinstance(node, Call):
            args = list(node.args)
            absorbed = self._absorbed_operands(node)
        elif isinstance(node, Tuple):
            if node in self.concatenated:
                return  # the concatenation copies its parts: it crops them for free
            args, absorbed = list(node.fields), set()
        elif isinstance(node, TupleGetItem):
            args, absorbed = [node.tuple_value], set()
        else:
            return
        for index, arg in enumerate(args):
            if arg in self.parent and index not in absorbed:
                self._exit(arg)

    def _absorbed_operands(self, call: Call) -> set[int]:
        """The operand positions at which ``call`` reads a padded value as it is."""
        if _is_dense_conv(call):
            return {0}
        if call in self.made:  # its operands in the region are joined with it
            root = self._find(call)
            return {i for i, arg in enumerate(call.args)
                    if arg in self.parent and self._find(arg) is root}
        return set()

    def _pays(self, region: _Region) -> bool:
        """Whether padding ``region`` saves more than the third more work that its
        convolutions' inputs may take: its channels would otherwise run in vectors of a
        quarter of the lanes or less (ShuffleNet v2's 58 channels in NCHW, 116 in blocks of
        4 on AVX-512) or be split into whole vectors and a rest (see AlterOpLayout's
        MIN_VECTOR_BLOCKS vectors or more), or it has a depthwise convolution or a pool,
        which would run in vectors of half the lanes or less."""
        if region.channels >= MIN_VECTOR_BLOCKS * self.lanes \
                or power_of_two_block(region.channels, self.lanes) <= self.lanes // 4:
            return True
        return any(isinstance(m, Call) and (m.op_name in _POOLS or _is_depthwise(m))
                   for m in region.members)

    def _exit(self, value: Expr) -> None:
        """``value`` is read unpadded (other than into a concatenation): its region is
        padded only if that read is of one pixel (a crop that copies a few channels)."""
        if _pixels(value) != 1:
            self.blockers.add(value)

    def padded(self) -> dict[Expr, int]:
        """Every value to pad, with its padded channel count."""
        regions: dict[Expr, _Region] = {}
        for value in self.parent:
            root = self._find(value)
            region = regions.setdefault(root, _Region(_channels(value) or 0))
            region.members.append(value)
            if value in self.blockers or value not in self.made:
                region.ok = False
        result: dict[Expr, int] = {}
        for region in regions.values():
            count = padded_count(region.channels, self.lanes)
            if region.ok and count != region.channels and _has_convolution(region.members) \
                    and self._pays(region):
                result.update((value, count) for value in region.members)
        return result


def _concatenated_tuples(order: list[Expr]) -> set[Expr]:
    """The tuples that only concatenations read."""
    readers: dict[Expr, list[Expr]] = {}
    for node in order:
        args = node.args if isinstance(node, Call) else node.fields \
            if isinstance(node, Tuple) else [node.tuple_value] \
            if isinstance(node, TupleGetItem) else []
        for arg in args:
            if isinstance(arg, Tuple):
                readers.setdefault(arg, []).append(node)
    return {tup for tup, users in readers.items()
            if all(isinstance(u, Call) and u.op_name == "concatenate" for u in users)}


def _has_convolution(members: list[Expr]) -> bool:
    return any(isinstance(m, Call) and _is_dense_conv(m) for m in members)


class _Rewriter:
    """Builds the padded graph: padded values, padded constants and weights, and a crop
    wherever a padded value is read unpadded."""

    def __init__(self, padded: dict[Expr, int]) -> None:
        self.padded = padded
        self.new: dict[Expr, Expr] = {}
        self.crops: dict[Expr, Expr] = {}

    def rewrite(self, order: list[Expr], body: Expr) -> Expr:
        for node in order:
            self.new[node] = self._visit(node)
        return self.unpadded(body)

    def unpadded(self, value: Expr) -> Expr:
        """``value`` rewritten, with its real channels only."""
        new = self.new[value]
        if value not in self.padded:
            return new
        if value not in self.crops:
            channels = _channels(value)
            self.crops[value] = Call(get_op("strided_slice"), [new],
                                     {"begin": [0], "end": [channels], "axes": [1]})
        return self.crops[value]

    def _visit(self, node: Expr) -> Expr:
        if isinstance(node, Tuple):
            fields = [self.unpadded(f) for f in node.fields]
            same = all(new is old for new, old in zip(fields, node.fields))
            return node if same else Tuple(fields)
        if isinstance(node, TupleGetItem):
            value = self.unpadded(node.tuple_value)
            return node if value is node.tuple_value else TupleGetItem(value, node.index)
        if not isinstance(node, Call):
            return node
        if _is_plain_conv(node) and (node in self.padded or _is_dense_conv(node)):
            return self._conv2d(node)
        if node not in self.padded:
            args = [self.unpadded(a) for a in node.args]
        elif node.op_name == "nn.bias_add":
            data, bias = node.args
            assert isinstance(bias, Constant)
            args = [self.new[data], Constant(_zero_padded(bias.data, 0, self.padded[node]))]
        else:
            args = [self._operand(arg, self.padded[node]) for arg in node.args]
        if all(new is old for new, old in zip(args, node.args)):
            return node
        return Call(node.op, args, node.attrs, node.span)

    def _operand(self, arg: Expr, count: int) -> Expr:
        """An operand of a padded member: padded itself, a per-channel constant padded with
        zeros, or a value that broadcasts over the channels as it is."""
        if arg in self.padded:
            return self.new[arg]
        axis = _channel_axis_of_operand(arg)
        if isinstance(arg, Constant) and axis is not None:
            return Constant(_zero_padded(arg.data, axis, count))
        return self.new[arg]

    def _conv2d(self, call: Call) -> Expr:
        data, weight = call.args[:2]
        new_data = self.new[data] if call.attrs.groups == 1 or call in self.padded \
            else self.unpadded(data)
        shape = [int(d) for d in weight.checked_type.shape]
        wanted = list(shape)
        attrs = dict(call.attrs)
        if call in self.padded:  # output channels (and a depthwise one's groups)
            wanted[0] = self.padded[call]
            if attrs.get("channels") is not None:
                attrs["channels"] = wanted[0]
            if call.attrs.groups > 1:
                attrs["groups"] = wanted[0]
        if call.attrs.groups == 1 and data in self.padded:  # input channels
            wanted[1] = self.padded[data]
        new_weight = self.new[weight]
        if wanted != shape:
            new_weight = zero_padded_weight(new_weight, shape, wanted, weight.checked_type.dtype)
        if new_data is data and new_weight is weight:
            return call
        return Call(call.op, [new_data, new_weight, *call.args[2:]], attrs, call.span)


def _zero_padded(array: np.ndarray, axis: int, count: int) -> np.ndarray:
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, count - array.shape[axis])
    return np.pad(array, widths)


def zero_padded_weight(weight: Expr, shape: list[int], wanted: list[int], dtype: str) -> Expr:
    """A weight of ``shape`` with zeros after its entries up to ``wanted`` along each axis
    (an OIHW weight's filters and input channels): at compile time for a constant, by an
    ``nn.pad`` for a computed one (a weight that FoldScaleAxis scales at run time)."""
    if isinstance(weight, Constant):
        return Constant(np.pad(weight.data, [(0, w - s) for s, w in zip(shape, wanted)]))
    widths = [width for s, w in zip(shape, wanted) for width in (0, w - s)]
    return nn_ops.pad(weight, Constant(np.zeros((), dtype)), pad_width=widths)


__all__ = ["MAX_PADDING_RATIO", "PadChannelBlocks", "pad_channel_blocks", "padded_count",
           "zero_padded_weight"]
