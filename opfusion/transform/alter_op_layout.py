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
* split along the channels into parts of whole blocks: each part a ``strided_slice`` of the
  blocks (ShuffleNet v2's units split their shuffled channels in two);
* ShuffleNet's channel shuffle (reshape to (N, g, C/g, H, W), transpose, reshape back)
  becomes one ``channel_shuffle`` of the blocked tensor: a permutation of its channels;
* pooling (max, average and their global forms) of a blocked tensor, in its block;
* local response normalization along the channels of a blocked tensor, in its block;
* everything else, and the function's result, gets NCHW back.

A broadcast or concatenation whose operands come in both layouts goes blocked only when its
result is on the way to a blocked convolution (or every operand is at hand blocked already);
otherwise it runs in NCHW, so a value does not go in and out of the blocked layout around
each NCHW convolution.

``layout_transform`` calls are inserted only where a value changes layout, once per value and
layout (every consumer shares it), so a value never goes NCHW -> blocked -> NCHW -> blocked.
The weights' transforms are ``layout_transform`` of constants, which FoldConstant (run after
this pass in ``opf.compile``) turns into constants in the new layout: packed at compile time.
The transforms fuse like any injective operator.

Grouped convolutions are blocked when every block lies inside one group, depthwise ones with
the weight in OIHW1i<x>o (one input channel per output); a convolution of a few groups whose
channels no block divides (ShuffleNet's 34 a group) runs as a ``group_window`` one, each group
summing its own input channels into the output blocks its outputs touch (a block across a
group boundary adds two groups' sums), or, where a group touches every output block, as a
dense one with a block-diagonal weight (MAX_DENSIFIED_GROUPS).
Convolutions stay NCHW when their channels have no power-of-two block of at least 4 (per
group), and small ones (MIN_BLOCKED_MACS) whose input would have to be transformed. Float
convolutions are blocked, and int32 ones of bytes that WordConvolutions computes in words
(QLinearConv's); the values between them follow the layout whatever their type (the bytes
and int32 sums of quantized models). On a target with matrix tiles (AMX), a quantized
convolution of one group takes blocks of 64 channels (a tile row of bytes,
``Target.matrix_tile_bytes``) where its channels allow, for its output too unless a grouped or
depthwise convolution reads it: each of its products then takes 64 input channels. 3x3
stride-1 convolutions with enough channels become ``nn.conv2d_winograd_nchwc`` of a weight
transformed by ``nn.winograd_weight_transform``
(folded at compile time like the layout transforms): see ``AlterOpLayout.winograd`` for
which, and :mod:`opfusion.opdefs._winograd` for the algorithm and its rounding. A grouped
one whose groups are whole blocks and would each take Winograd alone (AlexNet's), each with
enough work for a kernel of its own (WINOGRAD_MIN_GROUP_MACS), becomes one
Winograd convolution per group, each on a ``strided_slice`` of its group's input blocks,
concatenated along the blocks.

The pass needs opt_level 3 and a target (the current one, or the host);
``disabled_pass=["AlterOpLayout"]`` turns it off."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op, OpPatternKind, get_op
from ..ir.types import TensorType, TupleType
from ..ir.visitor import post_order
from ..opdefs.nn import group_local_blocks, group_window_weight
from ..target import Target, as_target
from .context import PassContext, register_pass_config
from .int8_products import word_values
from .pass_infra import Pass, module_pass, pass_factory, register_pass
from .word_convolutions import (
    float_exact_weight,
    integer_convolution,
    quantized_convolution,
    takes_words,
)

PLAIN = 0

#: Multiply-adds below which a convolution whose input is still NCHW stays NCHW: the two
#: layout transforms around a lone small convolution cost more than blocking saves (a
#: 3->8 channel 3x3 convolution on 16x16 pixels is 55k). One whose input is already blocked
#: is always blocked: that costs no transform.
MIN_BLOCKED_MACS = 1 << 20

WINOGRAD = "AlterOpLayout.winograd"
register_pass_config(
    WINOGRAD, str, "auto",
    "Which 3x3 stride-1 convolutions AlterOpLayout computes by Winograd's F(m x m, 3 x 3): "
    "'auto' (F(2x2) for those with at least 16 input and output channels and an output of "
    "at least 8x8), 'never', 'f2' (the same as auto) or 'f4' (F(4x4): 1.0-1.7x faster than "
    "F(2x2) from 14x14 outputs up, slower at 7x7, but it rounds 5-10x worse per layer: 1.7e-4 "
    "to 5.3e-4 of the largest output on resnet50 over five inputs, against 1.0e-4 to 1.9e-4 "
    "with F(2x2), past the 3e-4 that model is held to).",
    choices=("auto", "never", "f2", "f4"))

#: Smallest output side, and channels in and out, for which Winograd is chosen. Below 8
#: the products it saves cost less than reading its weights, 16/9 the direct convolution's,
#: which a model's run streams from memory: on a Xeon with AVX-512 (one thread, each layer
#: timed in its model's sequence), ResNet-50's 512-channel 7 x 7 layers took 3.55-3.63 ms by
#: F(2x2) (16.8 MB of weights) and 1.91-2.06 ms direct; its 14 x 14 ones 1.31-1.42 ms and
#: 1.40-1.48 (level), its 28 x 28 and 56 x 56 ones 1.4-1.7x faster by F(2x2). Whole models
#: with the 7 x 7 layers direct (``benchmarks/ab_checkouts.py``, 2 threads): ResNet-50 0.93x
#: the time, Inception-v2 0.92x, Inception-v1 0.95-1.02x, DenseNet-121 0.99-1.02x. (On a Zen
#: 3, whose 7 x 7 layers by F(2x2) ran level with ONNX Runtime's direct ones, it changes
#: little.)
WINOGRAD_MIN_SIZE = 8
WINOGRAD_MIN_CHANNELS = 16
#: Multiply-adds of one group below which a grouped convolution stays one direct kernel
#: rather than one Winograd kernel per group (``_grouped_winograd``): each kernel is a
#: parallel region of its own, and a group of 16 channels at 14 x 14 (RegNet's, ResNeXt's:
#: 0.45 million) took 16 us, two thirds of it not arithmetic, 20-32 times a layer.
WINOGRAD_MIN_GROUP_MACS = 1 << 20
#: Whole vectors of output channels from which a convolution whose channels no vector
#: divides is split in two (see ``_split_vector_channels``): SqueezeNet's 1000-channel
#: classifier in blocks of 8 on AVX-512 took 0.82-0.89 ms, ONNX Runtime's in 1008 channels
#: of blocks of 16 0.41 ms.
MIN_VECTOR_BLOCKS = 4
#: The tile of 'auto': F(2x2). Measured on AVX-512 (Zen 4, benchmarks/winograd.py) against
#: direct blocked convolution: F(2x2) is 1.7-2.1x faster at 56, 28, 14 and 7 pixels, F(4x4)
#: 2.5-3x at 56 to 14 (slower at 7), but F(4x4) rounds 5-10x worse per layer, past the
#: tolerance deep networks are held to, even with the points of
#: :mod:`opfusion.opdefs._winograd`, which round 2.5-3x better per layer than Lavin's.
WINOGRAD_AUTO_TILE = 2

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
        target = as_target(self.target)  # None: the current target, else the host
        lanes = target.vector_lanes("float32")
        winograd = str(ctx.get_config(WINOGRAD))
        # (quantized 3x3 convolutions that will take words stay direct: see takes_words)
        words = "WordConvolutions" not in ctx.disabled_pass
        direct_quantized = takes_words(target) and words
        # int32 convolutions of bytes are blocked where they take words (of any width: the
        # int32 multiplies they replace take ten cycles), and stay NCHW elsewhere
        integer_words = words and word_values(target) > 0
        # (quantized convolutions on matrix tiles take blocks of a tile row's bytes: a
        # product then takes 64 input channels, not one block of 16)
        matrix_block = target.matrix_tile_bytes if words and target.matrix_tiles else 0
        new = IRModule()
        for name, func in mod.functions.items():
            infer_type(func, mod)
            if lanes >= 4 and isinstance(func, Function):
                func = _LayoutRewriter(lanes, winograd, direct_quantized, integer_words,
                                       matrix_block).rewrite(func)
            new[mod.get_global_var(name)] = func
        return new


def _tensor(expr: Expr) -> TensorType | None:
    ty = expr.checked_type
    return ty if isinstance(ty, TensorType) else None


def _is_nchw_float(ty: TensorType | None) -> bool:
    return ty is not None and ty.ndim == 4 and ty.dtype in ("float32", "float64")


def _is_nchw(ty: TensorType | None) -> bool:
    """Whether ``ty`` is 4-D: (N, C, H, W) data of any type (the bytes and int32 sums of
    quantized convolutions follow the layout as floats do)."""
    return ty is not None and ty.ndim == 4


def power_of_two_block(channels: int, lanes: int) -> int:
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
    block = power_of_two_block(channels, lanes)
    if block:
        return block
    if channels <= lanes:
        return channels
    return max(d for d in range(1, lanes + 1) if channels % d == 0)


#: Pooling operators, which run in any NCHW<x>c layout.
_POOLS = ("nn.max_pool2d", "nn.avg_pool2d", "nn.global_max_pool2d", "nn.global_avg_pool2d")


#: Most groups a grouped convolution whose blocks do not fit its groups is densified for
#: (its work grows by the group count; blocked kernels run 5-8x faster than NCHW grouped ones).
MAX_DENSIFIED_GROUPS = 4


def _densifiable(weight: Expr, groups: int, weight_type: TensorType,
                 data_type: TensorType | None) -> bool:
    """Whether a grouped convolution can run as a dense one with a block-diagonal weight:
    a constant weight, 2 to MAX_DENSIFIED_GROUPS groups, not depthwise."""
    return (isinstance(weight, Constant) and 1 < groups <= MAX_DENSIFIED_GROUPS
            and data_type is not None and weight_type.shape[1] * groups == data_type.shape[1]
            and weight_type.shape[1] > 1)


def _block_diagonal(weight: np.ndarray, groups: int) -> np.ndarray:
    """The OIHW weight of a grouped convolution as a dense one: group g's filters on its
    own input channels, zeros elsewhere."""
    out_channels, per_group = weight.shape[:2]
    dense = np.zeros((out_channels, per_group * groups, *weight.shape[2:]), weight.dtype)
    per_out = out_channels // groups
    for g in range(groups):
        dense[g * per_out:(g + 1) * per_out, g * per_group:(g + 1) * per_group] = \
            weight[g * per_out:(g + 1) * per_out]
    return dense


def _keeps_layout(op: Op) -> bool:
    """Whether ``op`` can run in the layout of its operands (see the module docstring)."""
    if op.name in ("concatenate", "split", "nn.bias_add", "reshape", "transpose", *_POOLS):
        return True  # (reshape and transpose: the pieces of a channel shuffle)
    if op.pattern == OpPatternKind.kElemWise:
        return True
    return op.pattern == OpPatternKind.kBroadcast and op.name not in _BROADCAST_EXCLUDED


def _macs(out_type: TensorType, weight_type: TensorType) -> int:
    """Multiply-adds of a convolution: every output element times one filter's taps."""
    size = 1
    for dim in (*out_type.shape, *weight_type.shape[1:]):
        size *= int(dim)
    return size


class _LayoutRewriter:
    """One function's rewrite: every node's form, and the layout conversions made so far."""

    def __init__(self, lanes: int, winograd: str = "auto",
                 direct_quantized: bool = False, integer_words: bool = False,
                 matrix_block: int = 0) -> None:
        self.lanes = lanes
        #: the channel block of quantized convolutions on matrix tiles (0: the lanes')
        self.matrix_block = matrix_block
        self.winograd = winograd
        self.direct_quantized = direct_quantized
        self.integer_words = integer_words
        self.forms: dict[Expr, _Form] = {}
        self.converted: dict[tuple[Expr, int], Expr] = {}
        #: values a blocked convolution reads, directly or through operators that keep the
        #: layout (see :meth:`_find_wanted`)
        self.wanted: set[Expr] = set()
        #: each node's readers (see :meth:`_find_users`)
        self.users: dict[Expr, list[Expr]] = {}
        self.matrix_words: dict[Expr, bool] = {}

    def rewrite(self, func: Function) -> Function:
        order = post_order(func.body, into_functions=False)
        self._find_users(order)
        self._find_wanted(order)
        for node in order:
            self.forms[node] = self._visit(node)
        return Function(func.params, self.get(func.body, PLAIN), None, func.attrs)

    def _find_wanted(self, order: list[Expr]) -> None:
        """Mark, consumers before producers, the values that would reach a blocked
        convolution through layout-keeping operators. A broadcast or a concatenation whose
        operands come in both layouts goes blocked only if its result is wanted so: else
        it converts the blocked operands to NCHW once, instead of converting the NCHW ones
        in and the result out again (ShuffleNet's residual adds between NCHW convolutions)."""
        for node in reversed(order):
            if isinstance(node, TupleGetItem) and node in self.wanted:
                self.wanted.add(node.tuple_value)  # a part of a split (see _split_part)
                continue
            if not isinstance(node, Call) or not isinstance(node.op, Op):
                continue
            if node.op.name == "nn.conv2d":
                if self._would_block(node):
                    self.wanted.add(node.args[0])
            elif node in self.wanted and _keeps_layout(node.op):
                for arg in node.args:
                    self.wanted.add(arg)
                    if isinstance(arg, Tuple):
                        self.wanted.update(arg.fields)

    def _find_users(self, order: list[Expr]) -> None:
        """Each node's users (calls and tuples reading it), in post order."""
        for node in order:
            if isinstance(node, Call):
                operands = list(node.args)
            elif isinstance(node, Tuple):
                operands = list(node.fields)
            elif isinstance(node, TupleGetItem):
                operands = [node.tuple_value]
            else:
                continue
            for operand in operands:
                self.users.setdefault(operand, []).append(node)

    def _only_wide_readers(self, conv: Call) -> bool:
        """Whether every convolution that reads ``conv``'s result, through operators that keep
        the layout, is one of one group: a grouped or depthwise one (MobileNet's, float)
        would run in the wide block too, its register tiles of four vectors a point spilling
        (its 5 x 5 depthwise layers 1.5x slower in blocks of 64 than of 16)."""
        stack = [conv]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            for user in self.users.get(node, ()):
                if id(user) in seen:
                    continue
                seen.add(id(user))
                if not isinstance(user, Call):
                    stack.append(user)
                elif isinstance(user.op, Op) and user.op.name == "nn.conv2d":
                    if user.attrs.groups != 1:
                        return False
                elif isinstance(user.op, Op) and _keeps_layout(user.op):
                    stack.append(user)
        return True

    def _would_block(self, conv: Call) -> bool:
        """Whether a convolution would be blocked when its input is NCHW."""
        return self._conv_choice(conv, PLAIN) is not None

    def _conv_choice(self, call: Call, current: int) -> tuple[tuple[int, int, int], bool] | None:
        """How a convolution whose data has block ``current`` (PLAIN: NCHW) is blocked: its
        (data, weight input, output) blocks and whether its groups are densified (see
        MAX_DENSIFIED_GROUPS); None when it stays NCHW."""
        data, weight = call.args
        data_type, weight_type, out_type = _tensor(data), _tensor(weight), _tensor(call)
        if (not (_is_nchw_float(data_type) or self._takes_integer_words(call))
                or weight_type is None or out_type is None
                or weight_type.dtype != data_type.dtype):
            return None
        assert data_type is not None
        channels, out_channels = data_type.shape[1], out_type.shape[1]
        groups = call.attrs.groups
        wide = groups == 1 and self.matrix_block and self._takes_matrix_words(call)
        blocks = self._conv_blocks(channels, weight_type.shape[1], out_channels, groups, current,
                                   self.matrix_block if wide else 0,
                                   wide and self._only_wide_readers(call))
        densify = blocks is None and _densifiable(weight, groups, weight_type, data_type)
        if densify:
            blocks = self._conv_blocks(channels, channels, out_channels, 1, current)
        if blocks is None:
            return None
        # (densified, the work is the dense convolution's: groups x the grouped one's)
        work = _macs(out_type, weight_type) * (groups if densify else 1)
        if current == PLAIN and work < MIN_BLOCKED_MACS:
            return None
        return blocks, densify

    def _takes_matrix_words(self, conv: Call) -> bool:
        """Whether WordConvolutions will make ``conv`` (one group) a convolution of words:
        of dequantized codes by an int8 weight, or an int32 one of bytes (asked once a
        convolution: it reads the whole weight)."""
        found = self.matrix_words.get(conv)
        if found is None:
            found = self.matrix_words[conv] = (
                quantized_convolution(conv.args[0], conv.args[1], 0) is not None
                or self._takes_integer_words(conv))
        return found

    def _takes_integer_words(self, conv: Call) -> bool:
        """Whether ``conv`` is an int32 convolution of bytes that WordConvolutions will
        compute in words (one group: :func:`integer_convolution`) or in float32, exactly
        (several: :func:`float_exact_weight`)."""
        data, weight = conv.args
        data_type, weight_type = _tensor(data), _tensor(weight)
        if not (self.integer_words and data_type is not None and weight_type is not None
                and data_type.ndim == 4 and data_type.dtype == "int32"):
            return False
        if conv.attrs.groups == 1:
            return integer_convolution(data, weight, 0) is not None
        return float_exact_weight(data, weight, weight_type.shape[0]) is not None

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

    def has_block(self, node: Expr, block: int) -> bool:
        """Whether ``node`` is already at hand in layout ``block`` (its form, or a
        conversion made for another consumer)."""
        return self.forms[node].block == block or (node, block) in self.converted

    @staticmethod
    def transform(expr: Expr, src: str, dst: str) -> Expr:
        return Call(get_op("layout_transform"), [expr], {"src_layout": src, "dst_layout": dst})

    def channel_vector(self, node: Expr, ty: TensorType, block: int) -> Expr:
        """A per-channel vector ((C,), (C, 1, 1) or (1, C, 1, 1)) as (1, C/block, 1, 1, block),
        which broadcasts against a blocked NCHW tensor (a constant one folds at compile
        time)."""
        value = self.get(node, PLAIN)
        if ty.ndim != 4:
            value = Call(get_op("reshape"), [value],
                         {"newshape": [1, int(np.prod(ty.shape)), 1, 1]})
        return self.transform(value, "NCHW", data_layout(block))

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
            part = self._split_part(node)
            if part is not None:
                return part
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
        if op.name == "reshape":
            return self._channel_shuffle(call)
        if op.name in _POOLS:
            return self._pool(call)
        if op.name == "nn.lrn":
            return self._lrn(call)
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
        choice = self._conv_choice(call, self.forms[data].block)
        if choice is None:
            return None
        blocks, densify = choice
        data_type, out_type = _tensor(data), _tensor(call)
        assert data_type is not None and out_type is not None
        attrs = call.attrs
        groups = attrs.groups
        weight_value = self.get(weight, PLAIN)
        in_block, kernel_block, out_block = blocks
        kernel_layout = f"OIHW{kernel_block}i{out_block}o"
        if groups > 1 and not densify:
            split = self._grouped_winograd(call, weight_value, in_block, out_block)
            if split is not None:
                return split
        if groups == 1 and not densify:
            split = self._split_vector_channels(call, weight_value, in_block, out_block)
            if split is not None:
                return split
        window = False
        if densify:
            # A few groups whose channels no block divides (ShuffleNet's 34 a group): each
            # group sums its own input channels into the output blocks its outputs touch
            # (a block across a group boundary adds two groups' sums), or, where a group
            # touches every output block, a dense convolution with a block-diagonal weight.
            assert isinstance(weight_value, Constant)
            out_channels = out_type.shape[1]
            window = group_local_blocks(out_channels, groups, out_block) \
                < out_channels // out_block
            if window:
                packed: Expr = Constant(group_window_weight(weight_value.data, groups,
                                                            out_block))
                kernel_layout = f"OIHW{data_type.shape[1] // groups}i{out_block}o"
            else:
                weight_value = Constant(_block_diagonal(weight_value.data, groups))
                groups = 1
        if not window:
            packed = self.transform(weight_value, "OIHW", kernel_layout)
        tile = self._winograd_tile(call, data_type, out_type)
        if tile:
            transformed = Call(get_op("nn.winograd_weight_transform"), [packed],
                               {"tile_size": tile})
            conv = Call(get_op("nn.conv2d_winograd_nchwc"), [self.get(data, in_block),
                                                             transformed],
                        {"tile_size": tile, "padding": attrs.padding,
                         "channels": attrs.channels, "out_dtype": attrs.out_dtype,
                         "data_layout": data_layout(in_block),
                         "out_layout": data_layout(out_block)}, call.span)
            return _Form(conv, out_block)
        conv = self._blocked_conv(call, packed, in_block, kernel_layout, out_block, groups,
                                  window, out_type.shape[1] if window else None)
        return _Form(conv, out_block)

    def _blocked_conv(self, call: Call, packed: Expr, in_block: int, kernel_layout: str,
                      out_block: int, groups: int = 1, window: bool = False,
                      channels: int | None = None) -> Call:
        """``nn.conv2d_nchwc`` of ``call``'s data in ``in_block`` and the ``packed`` weight,
        with ``call``'s strides, padding and dilation (and ``channels`` when given)."""
        attrs = {key: call.attrs[key] for key in ("strides", "padding", "dilation",
                                                  "channels", "kernel_size", "out_dtype")}
        if channels is not None:
            attrs["channels"] = channels
        attrs.update(groups=groups, data_layout=data_layout(in_block),
                     kernel_layout=kernel_layout, out_layout=data_layout(out_block),
                     group_window=window)
        return Call(get_op("nn.conv2d_nchwc"), [self.get(call.args[0], in_block), packed],
                    attrs, call.span)

    def _split_vector_channels(self, call: Call, weight_value: Expr, in_block: int,
                               out_block: int) -> _Form | None:
        """A convolution whose output channels no whole vector divides, but that has at
        least MIN_VECTOR_BLOCKS vectors of them (SqueezeNet's classifier: 1000 channels, 62
        vectors of 16 and 8 left): the whole vectors' channels as one blocked convolution in
        the target's lanes, the rest as another in the largest block that divides them, the
        first's result laid out in that block too and the two concatenated along the blocks,
        instead of the whole convolution in the smaller block, whose vectors are half the
        target's or less. None otherwise (and for Winograd's)."""
        data = call.args[0]
        data_type, out_type = _tensor(data), _tensor(call)
        if (out_block >= self.lanes or not isinstance(weight_value, Constant)
                or data_type is None or out_type is None
                or self._winograd_tile(call, data_type, out_type)):
            return None
        channels = out_type.shape[1]
        whole = channels // self.lanes * self.lanes
        if whole < MIN_VECTOR_BLOCKS * self.lanes:
            return None
        rest_block = power_of_two_block(channels - whole, self.lanes)
        if not rest_block:
            return None
        parts: list[Expr] = []
        for begin, end, block in ((0, whole, self.lanes), (whole, channels, rest_block)):
            layout = f"OIHW{in_block}i{block}o"
            packed = self.transform(Constant(np.ascontiguousarray(
                weight_value.data[begin:end])), "OIHW", layout)
            conv = self._blocked_conv(call, packed, in_block, layout, block,
                                      channels=end - begin)
            # the whole vectors' result split into the rest's smaller blocks (each vector's
            # halves or quarters, copied whole), so that both concatenate along the blocks
            parts.append(conv if block == rest_block
                         else self.transform(conv, data_layout(block), data_layout(rest_block)))
        return _Form(Call(get_op("concatenate"), [Tuple(parts)], {"axis": 1}, call.span),
                     rest_block)

    def _grouped_winograd(self, call: Call, weight_value: Expr, in_block: int,
                          out_block: int) -> _Form | None:
        """A grouped convolution whose groups are whole blocks and, each alone, a convolution
        that takes Winograd (AlexNet's 3x3 layers of 2 groups of 192 channels at 13 x 13):
        one Winograd convolution per group, each on its group's input blocks (a slice, one
        copy) with its group's weight (of ``weight_value``, the OIHW weight), concatenated
        along the blocks. None otherwise."""
        data = call.args[0]
        attrs = call.attrs
        data_type, out_type = _tensor(data), _tensor(call)
        if not isinstance(weight_value, Constant) or data_type is None or out_type is None:
            return None
        groups = attrs.groups
        per_in, per_out = data_type.shape[1] // groups, out_type.shape[1] // groups
        if per_in % in_block or per_out % out_block or weight_value.data.shape[1] != per_in:
            return None
        weight_type = _tensor(call.args[1])
        if weight_type is None or _macs(out_type, weight_type) // groups \
                < WINOGRAD_MIN_GROUP_MACS:
            return None
        tile = self._winograd_tile(
            call, TensorType(data_type.shape[:1] + (per_in,) + data_type.shape[2:],
                             data_type.dtype),
            TensorType(out_type.shape[:1] + (per_out,) + out_type.shape[2:], out_type.dtype),
            grouped=True)
        if not tile:
            return None
        blocked = self.get(data, in_block)
        step = per_in // in_block
        parts: list[Expr] = []
        for group in range(groups):
            piece = Call(get_op("strided_slice"), [blocked],
                         {"begin": [group * step], "end": [(group + 1) * step], "axes": [1]})
            group_weight = Constant(np.ascontiguousarray(
                weight_value.data[group * per_out:(group + 1) * per_out]))
            packed = self.transform(group_weight, "OIHW", f"OIHW{in_block}i{out_block}o")
            transformed = Call(get_op("nn.winograd_weight_transform"), [packed],
                               {"tile_size": tile})
            parts.append(Call(get_op("nn.conv2d_winograd_nchwc"), [piece, transformed],
                              {"tile_size": tile, "padding": attrs.padding,
                               "channels": per_out, "out_dtype": attrs.out_dtype,
                               "data_layout": data_layout(in_block),
                               "out_layout": data_layout(out_block)}, call.span))
        return _Form(Call(get_op("concatenate"), [Tuple(parts)], {"axis": 1}, call.span),
                     out_block)

    def _winograd_tile(self, call: Call, data_type: TensorType, out_type: TensorType,
                       grouped: bool = False) -> int:
        """The Winograd tile for this convolution (0: direct), by the pass context's
        ``AlterOpLayout.winograd``; ``grouped``: for one group of a grouped convolution,
        whose types ``data_type`` and ``out_type`` are."""
        attrs = call.attrs
        weight_type = _tensor(call.args[1])
        if (self.winograd == "never" or weight_type is None or (attrs.groups != 1
                                                                and not grouped)
                or weight_type.shape[2:] != (3, 3) or tuple(attrs.strides) != (1, 1)
                or tuple(attrs.dilation) != (1, 1) or attrs.out_dtype not in (None, "float32")
                or data_type.dtype != "float32"):
            return 0
        side = min(out_type.shape[2:])
        if side < WINOGRAD_MIN_SIZE or min(data_type.shape[1], out_type.shape[1]) \
                < WINOGRAD_MIN_CHANNELS:
            return 0
        if self.direct_quantized and not grouped \
                and quantized_convolution(call.args[0], call.args[1], 0) is not None:
            return 0
        if self.winograd in ("f2", "f4"):
            return int(self.winograd[1])
        return WINOGRAD_AUTO_TILE

    def _conv_blocks(self, channels: int, per_group: int, out_channels: int, groups: int,
                     current: int, wide: int = 0, wide_out: bool = True
                     ) -> tuple[int, int, int] | None:
        """(data block, weight input block, output block) of a convolution, or None when it
        stays NCHW: ``current`` is the block the data has already (PLAIN: none). ``wide``: a
        block the convolution takes for the channels it divides (a quantized one on matrix
        tiles: 64, a tile row of bytes), for its output too where ``wide_out``."""
        if groups == 1:
            out_block = wide if wide and wide_out and out_channels % wide == 0 else \
                power_of_two_block(out_channels, self.lanes)
            in_block = current or (wide if wide and channels % wide == 0
                                   else _input_block(channels, self.lanes))
            return (in_block, in_block, out_block) if out_block else None
        if per_group == 1 and out_channels == channels:  # depthwise, one output per channel
            block = current or power_of_two_block(channels, self.lanes)
            return (block, 1, block) if block else None
        # Grouped: every block inside one group. Data in blocks that straddle groups (16
        # from a layer of 912 channels, for groups of 24) is re-blocked: a layout transform
        # of the input costs less than the convolution in NCHW (RegNetX's 7 x 7 layers).
        out_block = power_of_two_block(out_channels // groups, self.lanes)
        in_block = current if current and per_group % current == 0 else \
            power_of_two_block(per_group, self.lanes)
        if not out_block or not in_block or per_group % in_block:
            return None
        return in_block, in_block, out_block

    def _broadcast(self, call: Call, op: Op) -> _Form | None:
        out_type = _tensor(call)
        if not _is_nchw(out_type):
            return None
        assert out_type is not None
        same_shape = [arg for arg in call.args
                      if _tensor(arg) is not None and _tensor(arg).shape == out_type.shape]
        blocks = [self.forms[arg].block for arg in same_shape if self.forms[arg].block != PLAIN]
        if not blocks:
            return None
        block = blocks[0]
        if call not in self.wanted and not all(self.has_block(arg, block) for arg in same_shape):
            return None
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
        laid = self.channel_vector(bias, bias_type, block)
        return _Form(Call(get_op("add"), [self.get(data, block), laid], None, call.span),
                     block)

    def _channel_shuffle(self, call: Call) -> _Form | None:
        """``reshape(transpose(reshape(x, (N, g, C/g, H, W)), (0, 2, 1, 3, 4)), x's shape)``
        of a blocked ``x``: one channel_shuffle in the blocked layout."""
        transpose = call.args[0]
        if not (isinstance(transpose, Call) and transpose.op_name == "transpose"
                and isinstance(transpose.args[0], Call)
                and transpose.args[0].op_name == "reshape"):
            return None
        split = transpose.args[0]
        data = split.args[0]
        block = self.forms[data].block
        data_type, split_type, out_type = _tensor(data), _tensor(split), _tensor(call)
        if (block == PLAIN or data_type is None or split_type is None or out_type is None
                or data_type.ndim != 4 or out_type.shape != data_type.shape):
            return None
        n, c, h, w = data_type.shape
        groups = split_type.shape[1] if split_type.ndim == 5 else 0
        axes = transpose.attrs.axes
        if (groups < 1 or split_type.shape != (n, groups, c // groups, h, w)
                or axes is None or tuple(a % 5 for a in axes) != (0, 2, 1, 3, 4)):
            return None
        shuffle = Call(get_op("channel_shuffle"), [self.get(data, block)],
                       {"groups": groups, "layout": data_layout(block)}, call.span)
        return _Form(shuffle, block)

    def _pool(self, call: Call) -> _Form | None:
        """Pooling of a blocked tensor: the same pooling in its layout (NCHW<x>c in, NCHW<x>c
        out), the window over H and W as before. Pooling of an NCHW tensor whose result a
        blocked convolution wants (after an NCHW convolution, or an LRN of NCHW data)
        is blocked too, its input converted: a blocked pool reads its input in place, where
        an NCHW one with strided windows builds a padded copy first (GoogLeNet's 3 x 3
        stride-2 pool of 192 x 55 x 55 took 0.51 ms NCHW, Xeon with AVX-512)."""
        data = call.args[0]
        block = self.forms[data].block
        data_type = _tensor(data)
        if (block == PLAIN and call in self.wanted and call.attrs.layout == "NCHW"
                and _is_nchw(data_type)):
            assert data_type is not None
            block = power_of_two_block(data_type.shape[1], self.lanes)
        if block == PLAIN or call.attrs.layout != "NCHW":
            return None
        attrs = {**call.attrs, "layout": data_layout(block)}
        return _Form(Call(call.op, [self.get(data, block)], attrs, call.span), block)

    def _lrn(self, call: Call) -> _Form | None:
        """Local response normalization of a blocked tensor along its channels: the same in
        its layout (NCHW<x>c in and out), where NCHW would convert the tensor each way
        (GoogLeNet's two LRNs, between blocked pools and convolutions)."""
        data = call.args[0]
        block = self.forms[data].block
        data_type = _tensor(data)
        if block == PLAIN or call.attrs.layout != "NCHW" or data_type is None \
                or data_type.ndim != 4 or call.attrs.axis % 4 != 1:
            return None
        attrs = {**call.attrs, "axis": 1, "layout": data_layout(block)}
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
            return self.channel_vector(arg, ty, block)
        return None

    def _split_part(self, item: TupleGetItem) -> _Form | None:
        """Part ``i`` of a split along the channels of a blocked tensor whose parts are
        whole blocks: a slice of its blocks, in its layout (ShuffleNet v2's units split the
        shuffled channels in two; NCHW parts sent the shuffle and every concatenation
        around it back to NCHW, and its blocked convolutions' results through transposes).
        The split itself is then unused."""
        split = item.tuple_value
        if not (isinstance(split, Call) and split.op_name == "split"
                and isinstance(split.checked_type, TupleType)):
            return None
        data = split.args[0]
        block = self.forms[data].block
        data_type = _tensor(data)
        if block == PLAIN or not _is_nchw(data_type) or split.attrs.axis % 4 != 1:
            return None
        sizes = [int(part.shape[1]) for part in split.checked_type.fields]
        if any(size % block for size in sizes):
            return None
        start = sum(sizes[:item.index]) // block
        piece = Call(get_op("strided_slice"), [self.get(data, block)],
                     {"begin": [start], "end": [start + sizes[item.index] // block],
                      "axes": [1]})
        return _Form(piece, block)

    def _concatenate(self, call: Call) -> _Form | None:
        tup = call.args[0]
        out_type = _tensor(call)
        if not isinstance(tup, Tuple) or not _is_nchw(out_type) \
                or call.attrs.axis not in (1, -3):
            return None
        blocks = [self.forms[f].block for f in tup.fields if self.forms[f].block != PLAIN]
        if not blocks:
            return None
        block = blocks[0]
        if call not in self.wanted and not all(self.has_block(f, block) for f in tup.fields):
            return None
        for field in tup.fields:
            ty = _tensor(field)
            if ty is None or ty.ndim != 4 or ty.shape[1] % block:
                return None
        fields = [self.get(field, block) for field in tup.fields]
        return _Form(Call(call.op, [Tuple(fields)], {**call.attrs, "axis": 1}, call.span),
                     block)


def alter_op_layout(func: Function, lanes: int) -> Function:
    """``func`` (types inferred) with its convolutions in NCHW<lanes>c; see the module
    docstring."""
    return _LayoutRewriter(lanes).rewrite(func)


register_pass("AlterOpLayout", AlterOpLayout)

__all__ = ["AlterOpLayout", "alter_op_layout", "data_layout", "power_of_two_block"]
