"""FoldChannelShuffle: ShuffleNet's channel shuffle read by the grouped convolution after it.

A ShuffleNet unit shuffles the channels of its first grouped 1x1 convolution's result, runs
a depthwise convolution (with its batch norm folded into a bias) on them, then a second
grouped 1x1 convolution::

    s = channel_shuffle(a, groups=G)
    d = add(conv2d_nchwc(s, Wd, groups=C), b)          (depthwise; the add per channel)
    y = conv2d_nchwc(d, Wg, group_window=True)

The shuffle is a copy of the whole tensor: a kernel that moves every value and computes
nothing (15% of ShuffleNet's time on AVX2). The ops between it and the grouped convolution
act channel by channel, so they commute with it: run on ``a`` with their per-channel
constants permuted, they compute the unshuffled ``d``, and the grouped convolution reads
its input through the shuffle instead (``input_shuffle=G``: each group's input channels are
read one by one already, so only their addresses change)::

    d' = add(conv2d_nchwc(a, Wd'), b')                 (Wd', b': channels permuted)
    y = conv2d_nchwc(d', Wg, group_window=True, input_shuffle=G)

The pass runs after AlterOpLayout and FoldConstant in ``opf.compile`` (blocked shuffles
and group windows, constant weights), at opt_level 3; a shuffle it cannot fold (another
reader, an op that mixes channels, a consumer that is not a group window) stays as it is.
``disabled_pass=["FoldChannelShuffle"]`` turns it off; ``opfusion show --stage fused`` shows
the ``input_shuffle`` attribute."""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op, OpPatternKind, get_op
from ..ir.visitor import ExprMutator, children, post_order
from .context import PassContext
from .pass_infra import Pass, function_pass, pass_factory, register_pass

#: Binary elementwise ops whose per-channel constant operand moves with the permutation.
_PER_CHANNEL = ("add", "multiply", "subtract")


@pass_factory
def FoldChannelShuffle() -> Pass:  # noqa: N802 - a pass name
    """A channel shuffle read, through channel-wise ops, by a group-window convolution
    becomes that convolution's ``input_shuffle`` (see the module docstring)."""
    return _fold_channel_shuffle_pass()


@function_pass(opt_level=3, name="FoldChannelShuffle")
class _fold_channel_shuffle_pass:  # noqa: N801 - a pass class, named like the others
    def transform_function(self, func: Function, mod: IRModule, ctx: PassContext) -> Function:
        if func.is_primitive:
            return func
        infer_type(func, mod)
        return _ShuffleFolder(func).visit(func)


register_pass("FoldChannelShuffle", FoldChannelShuffle)


def _readers(func: Function) -> dict[Expr, list[Expr]]:
    """Every node's readers (the nodes that take it as an operand: calls, tuples, ...), in
    post order; the function's result is read by the function."""
    readers: dict[Expr, list[Expr]] = {}
    for node in post_order(func.body, into_functions=False):
        for operand in children(node, into_functions=False):
            readers.setdefault(operand, []).append(node)
    readers.setdefault(func.body, []).append(func)
    return readers


def _permutation(channels: int, groups: int) -> np.ndarray:
    """``p`` with shuffle(x)[c] == x[p[c]]."""
    shuffle = get_op("channel_shuffle")
    return np.array([shuffle.source_channel(c, channels, groups) for c in range(channels)])


def _blocked_channels(value: np.ndarray, block: int, source: np.ndarray) -> np.ndarray:
    """``value`` (a blocked per-channel array: channels on axes 0 or 1 and the last, as
    ``(C/k, ..., k)`` weights or ``(1, C/k, 1, 1, k)`` vectors) with its channel ``source[c]``
    moved to ``c``'s place."""
    axis = 0 if value.shape[0] * block == len(source) else 1
    moved = np.moveaxis(value, axis, 0)
    plain = moved.reshape(moved.shape[0], -1, block).transpose(0, 2, 1).reshape(
        moved.shape[0] * block, -1)
    permuted = np.empty_like(plain)
    permuted[source] = plain
    back = permuted.reshape(moved.shape[0], block, -1).transpose(0, 2, 1).reshape(moved.shape)
    return np.ascontiguousarray(np.moveaxis(back, 0, axis))


class _ShuffleFolder(ExprMutator):
    def __init__(self, func: Function) -> None:
        super().__init__()
        readers = _readers(func)
        #: a folded shuffle and the channel-wise ops after it -> the shuffle
        self.chain_of: dict[Expr, Call] = {}
        #: the group window that reads a folded shuffle -> the shuffle
        self.window_of: dict[Expr, Call] = {}
        #: a folded shuffle -> its channel block and the permutation of its channels
        self.source_of: dict[Call, tuple[int, np.ndarray]] = {}
        for node in post_order(func.body, into_functions=False):
            if isinstance(node, Call) and node.op_name == "channel_shuffle":
                chain = _foldable_chain(node, readers)
                if chain is not None:
                    *links, window = chain
                    for link in (node, *links):
                        self.chain_of[link] = node
                    self.window_of[window] = node
                    block = int(node.checked_type.shape[4])
                    channels = int(node.checked_type.shape[1]) * block
                    self.source_of[node] = (block, _permutation(channels, node.attrs.groups))

    def visit_call(self, call: Call) -> Expr:
        shuffle = self.chain_of.get(call)
        if shuffle is call:
            return self.visit(call.args[0])  # read through by the group window
        if shuffle is not None:
            return self._permuted(call, shuffle)
        shuffle = self.window_of.get(call)
        if shuffle is not None:
            attrs = {key: call.attrs[key] for key in call.attrs}
            attrs["input_shuffle"] = shuffle.attrs.groups
            return Call(call.op, [self.visit(a) for a in call.args], attrs, call.span)
        return super().visit_call(call)

    def _permuted(self, call: Call, shuffle: Call) -> Expr:
        """A channel-wise op of the chain, on the unshuffled data, its constants permuted."""
        block, source = self.source_of[shuffle]
        args = []
        for arg in call.args:
            if isinstance(arg, Constant) and arg.data.ndim >= 5:
                args.append(Constant(_blocked_channels(arg.data, block, source)))
            else:
                args.append(self.visit(arg))
        return Call(call.op, args, call.attrs, call.span)


def _foldable_chain(shuffle: Call, readers: dict[Expr, list[Expr]]) -> list[Call] | None:
    """The channel-wise ops from ``shuffle`` to the group window that reads their result,
    then that window, when each has one reader; else None."""
    if shuffle.attrs.layout == "NCHW" or len(shuffle.checked_type.shape) != 5:
        return None
    chain: list[Call] = []
    node: Expr = shuffle
    while True:
        users = readers.get(node, [])
        if len(users) != 1 or not isinstance(users[0], Call):
            return None
        user = users[0]
        if _is_window_reading(user, node, shuffle):
            return [*chain, user]
        if not _is_channel_wise(user, node):
            return None
        chain.append(user)
        node = user


def _is_window_reading(call: Call, data: Expr, shuffle: Call) -> bool:
    """Whether ``call`` is a group-window convolution reading ``data`` in the shuffle's
    blocks, and no shuffle yet."""
    return (call.op_name == "nn.conv2d_nchwc" and call.args[0] is data
            and call.attrs.group_window and not call.attrs.input_shuffle
            and call.attrs.data_layout == shuffle.attrs.layout)


def _is_channel_wise(call: Call, data: Expr) -> bool:
    """Whether ``call`` computes each channel of ``data`` from that channel alone: a
    depthwise blocked convolution, a unary elementwise op, or a binary one with a per-channel
    constant (the same blocked shape as a depthwise weight's channels)."""
    if not isinstance(call.op, Op) or call.args[0] is not data:
        return False
    shape = data.checked_type.shape
    if call.op_name == "nn.conv2d_nchwc":
        weight = call.args[1]
        return (isinstance(weight, Constant) and not call.attrs.group_window
                and call.attrs.groups == shape[1] * shape[4] and weight.data.shape[4] == 1
                and call.attrs.data_layout == call.attrs.out_layout)
    if call.op.pattern == OpPatternKind.kElemWise and len(call.args) == 1:
        return True
    if call.op_name in _PER_CHANNEL and len(call.args) == 2:
        other = call.args[1]
        return isinstance(other, Constant) and other.data.shape == (1, shape[1], 1, 1,
                                                                      shape[4])
    return False


__all__ = ["FoldChannelShuffle"]
