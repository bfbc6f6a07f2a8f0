"""Converters of ONNX's tensor operators: shape and layout, indexing, constants and shape
arithmetic, padding; and the helpers the other tensor families (:mod:`.reduce`,
:mod:`.resize`) share.

Inputs that decide a shape (Reshape's shape, Slice's starts, Expand's shape, Tile's repeats,
...) must be constants once the importer has folded the graph: opfusion compiles static
shapes. ``node.const_input`` says so, naming the input, when one is computed at run time.
ONNX operators with no IR counterpart (GatherND, OneHot, Trilu, wrap padding) are decomposed
into operators that have one."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .... import op
from ....compiler.limits import import_constant_fits
from ....errors import IndexOutOfRangeError
from ....ir.expr import Constant, Expr, TupleGetItem
from ....opdefs.transform import check_in_range
from ..registry import OnnxNode, converter
from ._common import filled, index_range, shape_of, tensor_type

# ---------------------------------------------------------------------------------------------
# helpers


def as_ints(value: np.ndarray | Sequence[int]) -> list[int]:
    """A constant input or an ints attribute as a flat list of Python ints."""
    return [int(v) for v in np.asarray(value).reshape(-1)]


def required_const(node: OnnxNode, index: int, what: str) -> np.ndarray:
    """The value of constant input ``index``; an error naming ``what`` if it is absent or
    computed at run time."""
    value = node.const_input(index, what)
    if value is None:
        raise node.error(f"input {index} ({what}) is required but missing")
    return value


def present(value: np.ndarray | None) -> np.ndarray | None:
    """ONNX writes 'absent' for some optional inputs as an empty tensor (Resize's scales)."""
    return None if value is None or value.size == 0 else value


def normalize_axis(node: OnnxNode, axis: int, ndim: int, what: str = "axis") -> int:
    """``axis`` in 0..ndim-1 (negative counts from the end), or an error naming the node."""
    if not -ndim <= axis < ndim:
        raise node.error(f"{what} {axis} is out of range for rank {ndim}")
    return axis % ndim


def normalize_axes(node: OnnxNode, axes: Sequence[int], ndim: int,
                   what: str = "axes") -> list[int]:
    """Each axis normalized; a repeated axis is an error."""
    result = [normalize_axis(node, a, ndim, what) for a in axes]
    if len(set(result)) != len(result):
        raise node.error(f"{what} {list(axes)} repeats an axis")
    return result


def scalar_const(value: float, dtype: str) -> Constant:
    """A 0-d constant of ``dtype``."""
    return Constant(np.asarray(value, dtype=dtype))


def reshape_exact(node: OnnxNode, x: Expr, shape: Sequence[int]) -> Expr:
    """``x`` under an explicit target shape (every size given, 0 meaning 0)."""
    shape = tuple(int(d) for d in shape)
    if shape == shape_of(x):
        return x
    if 0 in shape:
        # The IR's reshape reads 0 as "copy this dimension"; an empty result has no data to
        # move anyway, so it is a constant.
        if tensor_type(x).size:
            raise node.error(f"cannot reshape {shape_of(x)} ({tensor_type(x).size} elements) to "
                             f"{shape}")
        return Constant(np.zeros(shape, tensor_type(x).dtype))
    return op.reshape(x, newshape=shape)


def tuple_fields(call: Expr, count: int) -> list[Expr]:
    """The first ``count`` fields of a tuple-valued call, one ONNX output each."""
    return [TupleGetItem(call, i) for i in range(count)]


# ---------------------------------------------------------------------------------------------
# shape and layout


@converter("Flatten")
def flatten(node: OnnxNode) -> Expr:
    return op.flatten(node.input(0), axis=node.attr("axis", 1))


def _reshape_to(node: OnnxNode, shape: list[int], allowzero: bool) -> Expr:
    x = node.input(0)
    if allowzero and 0 in shape:
        # allowzero=1: a 0 is a real zero-sized dimension, not a copy of the input's.
        if -1 in shape:
            raise node.error(f"shape {shape} has both 0 and -1, which allowzero=1 forbids")
        return reshape_exact(node, x, shape)
    return op.reshape(x, newshape=shape)


@converter("Reshape")
def reshape_1(node: OnnxNode) -> Expr:
    return _reshape_to(node, as_ints(node.attr("shape", [])), allowzero=False)


@converter("Reshape", since=5)  # the shape became an input; allowzero arrived in 14
def reshape_5(node: OnnxNode) -> Expr:
    shape = as_ints(required_const(node, 1, "shape"))
    return _reshape_to(node, shape, allowzero=bool(node.attr("allowzero", 0)))


@converter("Transpose")
def transpose(node: OnnxNode) -> Expr:
    return op.transpose(node.input(0), axes=node.attr("perm"))


@converter("Squeeze")
def squeeze_1(node: OnnxNode) -> Expr:
    return op.squeeze(node.input(0), axis=node.attr("axes"))


@converter("Squeeze", since=13)  # axes became an (optional) input
def squeeze_13(node: OnnxNode) -> Expr:
    axes = node.const_input(1, "axes")
    return op.squeeze(node.input(0), axis=None if axes is None else as_ints(axes))


def _unsqueeze(node: OnnxNode, axes: list[int]) -> Expr:
    x = node.input(0)
    shape = list(shape_of(x))
    # Axes name positions in the output, so they are inserted in increasing order.
    for position in sorted(normalize_axes(node, axes, len(shape) + len(axes))):
        shape.insert(position, 1)
    return reshape_exact(node, x, shape)


@converter("Unsqueeze")
def unsqueeze_1(node: OnnxNode) -> Expr:
    return _unsqueeze(node, as_ints(node.attr("axes", [])))


@converter("Unsqueeze", since=13)  # axes became an input
def unsqueeze_13(node: OnnxNode) -> Expr:
    return _unsqueeze(node, as_ints(required_const(node, 1, "axes")))


@converter("Concat")
def concat(node: OnnxNode) -> Expr:
    parts = [node.input(i) for i in range(len(node.inputs))]
    return op.concatenate(parts, axis=node.attr("axis", 1))  # opset 1's default; 4+ requires it


def _split(node: OnnxNode, sizes: list[int] | None, count: int | None = None) -> list[Expr]:
    """Split input 0 into pieces of ``sizes``, or into ``count`` pieces (the last one smaller
    when the axis does not divide, as opset 18's num_outputs) or into one per output."""
    x = node.input(0)
    shape = shape_of(x)
    axis = normalize_axis(node, node.attr("axis", 0), len(shape))
    dim = shape[axis]
    if sizes is None:
        if count is None:
            count = node.num_outputs
            if dim % count:
                raise node.error(f"axis {axis} of size {dim} does not split into {count} equal "
                                 "outputs; give 'split'")
        if count < 1:
            raise node.error(f"num_outputs={count} must be positive")
        chunk = -(-dim // count)
        sizes = [max(0, min(chunk, dim - i * chunk)) for i in range(count)]
    if sum(sizes) != dim or min(sizes, default=0) < 0:
        raise node.error(f"split sizes {sizes} do not add up to {dim}, the size of axis {axis}")
    if len(sizes) != node.num_outputs:
        raise node.error(f"split makes {len(sizes)} pieces but the node has {node.num_outputs} "
                         "outputs")
    indices = as_ints(np.cumsum(sizes)[:-1])
    return tuple_fields(op.split(x, indices_or_sections=indices, axis=axis), len(sizes))


@converter("Split")
def split_1(node: OnnxNode) -> list[Expr]:
    sizes = node.attr("split")
    if sizes is None and len(node.inputs) > 1:  # opset 1 also took it as a second input
        sizes = as_ints(required_const(node, 1, "split"))
    return _split(node, sizes)


@converter("Split", since=13)  # split became an input
def split_13(node: OnnxNode) -> list[Expr]:
    sizes = node.const_input(1, "split")
    return _split(node, None if sizes is None else as_ints(sizes))


@converter("Split", since=18)  # num_outputs: pieces of ceil(dim / n), the last one smaller
def split_18(node: OnnxNode) -> list[Expr]:
    sizes = node.const_input(1, "split")
    count = node.attr("num_outputs")
    if sizes is None and count is None:
        raise node.error("needs either the 'split' input or the 'num_outputs' attribute")
    return _split(node, None if sizes is None else as_ints(sizes), count)


def _slice(node: OnnxNode, starts: list[int], ends: list[int], axes: list[int] | None,
           steps: list[int] | None) -> Expr:
    if len(ends) != len(starts):
        raise node.error(f"starts {starts} and ends {ends} differ in length")
    # strided_slice clamps as ONNX Slice does (Python slice semantics), so INT64_MAX ends and
    # negative steps pass straight through.
    return op.strided_slice(node.input(0), begin=starts, end=ends, strides=steps, axes=axes)


@converter("Slice")
def slice_1(node: OnnxNode) -> Expr:
    return _slice(node, as_ints(node.attr("starts", [])), as_ints(node.attr("ends", [])),
                  node.attr("axes"), None)


@converter("Slice", since=10)  # starts/ends/axes became inputs, steps arrived
def slice_10(node: OnnxNode) -> Expr:
    starts, ends = required_const(node, 1, "starts"), required_const(node, 2, "ends")
    axes, steps = node.const_input(3, "axes"), node.const_input(4, "steps")
    return _slice(node, as_ints(starts), as_ints(ends), None if axes is None else as_ints(axes),
                  None if steps is None else as_ints(steps))


@converter("Expand", since=8)
def expand(node: OnnxNode) -> Expr:
    x = node.input(0)
    target = tuple(as_ints(required_const(node, 1, "shape")))
    try:  # ONNX Expand broadcasts both ways: a 1 in the target keeps the input's size
        shape = tuple(int(d) for d in np.broadcast_shapes(shape_of(x), target))
    except ValueError:
        raise node.error(f"input of shape {shape_of(x)} cannot be broadcast to {target}") from None
    return x if shape == shape_of(x) else op.broadcast_to(x, shape=shape)


@converter("Tile", since=6)
def tile(node: OnnxNode) -> Expr:
    x = node.input(0)
    repeats = as_ints(required_const(node, 1, "repeats"))
    if len(repeats) != len(shape_of(x)):
        raise node.error(f"repeats {repeats} must have one entry per axis of {shape_of(x)}")
    return op.tile(x, reps=repeats)


@converter("DepthToSpace")
def depth_to_space(node: OnnxNode) -> Expr:
    return op.depth_to_space(node.input(0), block_size=node.attr("blocksize"),
                             mode=node.attr("mode", "DCR"))


@converter("SpaceToDepth")
def space_to_depth(node: OnnxNode) -> Expr:
    return op.space_to_depth(node.input(0), block_size=node.attr("blocksize"),
                             mode=node.attr("mode", "DCR"))  # mode arrived in opset 28


# ---------------------------------------------------------------------------------------------
# indexing


def checked_indices(node: OnnxNode, indices: Expr, bounds: Sequence[int]) -> Expr:
    """``indices`` known to lie in [-n, n) for their bound n (one for all, or one per position
    of the last axis), as ONNX Runtime requires: constant ones are checked now, ones computed
    at run time pass through ``check_indices``, which raises in the reference and, run with
    NumPy between kernels, in compiled models too. The compiler's LegalizeCheckedIndices
    would guard a checked take by itself, but only this check can name the ONNX node in the
    reference's errors too, and check GatherND's tuples entry by entry; the pass sees it and
    adds no second one."""
    if isinstance(indices, Constant):
        try:
            check_in_range(indices.data, bounds, "the constant indices")
        except IndexOutOfRangeError as error:
            raise node.error(str(error)) from None
        return indices
    return op.check_indices(indices, bounds=list(bounds),
                            consumer=f"{node.op_type} (node {node.name!r}) indices")


@converter("Gather")
def gather(node: OnnxNode) -> Expr:
    data = node.input(0)
    shape = shape_of(data)
    axis = normalize_axis(node, node.attr("axis", 0), len(shape))
    indices = checked_indices(node, node.input(1), [shape[axis]])
    return op.take(data, indices, axis=axis)


@converter("GatherElements", since=11)
def gather_elements(node: OnnxNode) -> Expr:
    data = node.input(0)
    shape = shape_of(data)
    axis = normalize_axis(node, node.attr("axis", 0), len(shape))
    indices = checked_indices(node, node.input(1), [shape[axis]])
    return op.gather_elements(data, indices, axis=axis)


@converter("GatherND", since=11)
def gather_nd(node: OnnxNode) -> Expr:
    """data[b..., indices[b..., q..., :]] as one take from a flattened data: each index tuple
    becomes a row-major offset (plus the batch's), so GatherND needs no operator of its own.
    Each tuple entry is checked against its own axis first (a flat offset in range does not
    mean every entry was)."""
    data, indices = node.input(0), node.input(1)
    batch_dims = node.attr("batch_dims", 0)  # opset 12
    dshape, ishape = shape_of(data), shape_of(indices)
    depth = ishape[-1] if ishape else -1
    if not 0 <= depth <= len(dshape) - batch_dims or ishape[:batch_dims] != dshape[:batch_dims]:
        raise node.error(f"indices {ishape} do not index data {dshape} with "
                         f"batch_dims={batch_dims}")
    indexed = dshape[batch_dims:batch_dims + depth]
    if depth:
        indices = checked_indices(node, indices, indexed)
    inner = math.prod(indexed)
    index = indices if tensor_type(indices).dtype == "int64" else op.cast(indices, dtype="int64")
    sizes = Constant(np.array(indexed, np.int64))
    index = op.where(op.less(index, scalar_const(0, "int64")), op.add(index, sizes), index)
    strides = [math.prod(indexed[j + 1:]) for j in range(depth)]
    offset = op.sum(op.multiply(index, Constant(np.array(strides, np.int64))), axis=[-1])
    if batch_dims:
        batches = np.arange(math.prod(dshape[:batch_dims]), dtype=np.int64) * inner
        lead = dshape[:batch_dims] + (1,) * (len(ishape) - 1 - batch_dims)
        offset = op.add(offset, Constant(batches.reshape(lead)))
    rest = dshape[batch_dims + depth:]
    flat = reshape_exact(node, data, (math.prod(dshape[:batch_dims]) * inner,) + rest)
    # Every tuple entry was checked above, so the offset is in range: no second check.
    return op.take(flat, offset, axis=0, mode="clip")


@converter("OneHot", since=9)
def one_hot(node: OnnxNode) -> Expr:
    indices, values = node.input(0), node.input(2)
    depth = int(required_const(node, 1, "depth").reshape(-1)[0])
    rank = len(shape_of(indices)) + 1
    axis = normalize_axis(node, node.attr("axis", -1), rank)
    if shape_of(values) != (2,):
        raise node.error(f"values must hold [off_value, on_value], got shape {shape_of(values)}")
    index = indices if tensor_type(indices).dtype == "int64" else op.cast(indices, dtype="int64")
    # Negative indices count from the end; anything still out of range matches no class.
    index = op.where(op.less(index, scalar_const(0, "int64")),
                     op.add(index, scalar_const(depth, "int64")), index)
    classes = op.reshape(index_range(depth, "the classes"),
                         newshape=[depth if a == axis else 1 for a in range(rank)])
    hit = op.equal(op.expand_dims(index, axis=axis), classes)
    off, on = (op.reshape(op.strided_slice(values, begin=[i], end=[i + 1]), newshape=())
               for i in (0, 1))
    return op.where(hit, on, off)


@converter("Trilu", since=14)
def trilu(node: OnnxNode) -> Expr:
    x = node.input(0)
    shape = shape_of(x)
    if len(shape) < 2:
        raise node.error(f"input must have rank 2 or more, got shape {shape}")
    k = node.const_input(1, "k")
    k = 0 if k is None else int(k.reshape(-1)[0])
    rows, cols = shape[-2:]
    # Diagonals beyond the matrix keep all or nothing, so clamping k changes no value and
    # keeps INT64_MIN/INT64_MAX from overflowing NumPy's index arithmetic.
    k = min(max(k, -rows), cols)
    ones = np.ones((rows, cols), bool)
    keep = np.triu(ones, k) if node.attr("upper", 1) else np.tril(ones, k)
    return op.where(Constant(keep), x, scalar_const(0, tensor_type(x).dtype))


@converter("NonZero", since=9)
def non_zero(node: OnnxNode) -> Expr:
    # The output's length is the count of non-zeros, so only a constant input has a static one.
    value = required_const(node, 0, "input; NonZero's output shape depends on its values")
    if value.ndim == 0:
        return Constant(np.zeros((0, int(value != 0)), np.int64))
    return Constant(np.array(np.nonzero(value), dtype=np.int64).reshape(value.ndim, -1))


# ---------------------------------------------------------------------------------------------
# constants and shape arithmetic: all of them fold to constants at import


@converter("Shape")
def shape(node: OnnxNode) -> Expr:
    dims = np.array(shape_of(node.input(0)), np.int64)
    # start/end (opset 15) clamp and count from the end exactly as a Python slice does.
    return Constant(dims[node.attr("start", 0):node.attr("end")])


@converter("Size")
def size(node: OnnxNode) -> Expr:
    return Constant(np.asarray(tensor_type(node.input(0)).size, np.int64))


@converter("ConstantOfShape", since=9)
def constant_of_shape(node: OnnxNode) -> Expr:
    dims = as_ints(required_const(node, 0, "shape"))
    if min(dims, default=0) < 0:
        raise node.error(f"shape {dims} has a negative dimension")
    value = np.asarray(node.attr("value", np.zeros(1, np.float32)))
    if value.size != 1:
        raise node.error(f"attribute 'value' must hold one element, got shape {value.shape}")
    # A constant up to the folding limit, else a broadcast of the value (see filled).
    return filled(dims, value.reshape(()), str(value.dtype),
                  what=f"its result ({math.prod(dims)} elements)")


_CONSTANT_LISTS = {"value_float": "float32", "value_floats": "float32", "value_int": "int64",
                   "value_ints": "int64"}


@converter("Constant")
def constant(node: OnnxNode) -> Expr:
    for key in ("sparse_value", "value_string", "value_strings"):
        if key in node.attrs:
            raise node.error(f"attribute {key!r} is not supported (opfusion holds dense numeric "
                             "tensors only)")
    if "value" in node.attrs:
        value = np.asarray(node.attrs["value"])
    else:
        key = next((k for k in _CONSTANT_LISTS if k in node.attrs), None)
        if key is None:
            raise node.error("has no value attribute (value, value_float(s), value_int(s))")
        value = np.asarray(node.attrs[key], dtype=_CONSTANT_LISTS[key])
    if value.dtype.kind not in "biuf":
        raise node.error(f"holds a {value.dtype} tensor, a dtype opfusion does not support")
    return Constant(value)


def range_count(node: OnnxNode, start: np.ndarray, limit: np.ndarray, delta: np.ndarray) -> int:
    """The spec's max(ceil((limit - start) / delta), 0), exactly: in Python integers for
    integer inputs (float64 would round INT64_MAX and overflow int64 differences), in float64
    for floating-point ones, which must be finite."""
    values = {"start": start.item(), "limit": limit.item(), "delta": delta.item()}
    if start.dtype.kind == "f":
        for what, value in values.items():
            if not math.isfinite(value):
                raise node.error(f"{what} is {value}; start, limit and delta must be finite")
    if values["delta"] == 0:
        raise node.error("delta is 0; the range would never reach its limit")
    span = values["limit"] - values["start"]
    if start.dtype.kind == "f":
        return max(math.ceil(span / values["delta"]), 0)
    return max(-(-span // values["delta"]), 0)  # ceil division, exact


@converter("Range", since=11)
def range_(node: OnnxNode) -> Expr:
    start, limit, delta = (required_const(node, i, what).reshape(())
                           for i, what in enumerate(("start", "limit", "delta")))
    if not start.dtype == limit.dtype == delta.dtype:
        raise node.error(f"start, limit and delta must share one type, got {start.dtype}, "
                         f"{limit.dtype} and {delta.dtype}")
    count = range_count(node, start, limit, delta)
    dtype = str(start.dtype)
    text = f"Range({start.item()}, {limit.item()}, {delta.item()})"
    if not import_constant_fits(f"{text}, {count} elements,", [count], dtype):
        return _range_operator(node, text, (start.item(), limit.item(), delta.item()), count,
                               dtype)
    # Element i is start + i * delta, computed in float64 or int64 (wrapping int64 products
    # land back in range: every element lies between start and limit), then in the inputs'
    # dtype, as onnx.reference.
    wide = np.float64 if start.dtype.kind == "f" else np.int64
    steps = np.arange(count, dtype=wide)
    with np.errstate(over="ignore"):
        values = wide(start.item()) + steps * wide(delta.item())
    return Constant(values.astype(start.dtype))


def _range_operator(node: OnnxNode, text: str, bounds: tuple[Any, Any, Any], count: int,
                    dtype: str) -> Expr:
    """A range too long to fold as the ``arange`` operator, which computes the same elements
    (start + i * delta in float64 or int64, then cast) in a kernel. Its attributes are
    floats: integer bounds beyond 2**53 would round, so they are refused."""
    exact = 2**53
    if any(isinstance(v, int) and abs(v) > exact for v in bounds):
        raise node.error(f"{text} has {count} elements, too many to fold into a constant, and "
                         f"bounds beyond 2**53, which opfusion's arange cannot compute exactly")
    start, stop, step = (float(v) for v in bounds)
    result = op.arange(start=start, stop=stop, step=step, dtype=dtype)
    if result.checked_type.shape != (count,):
        raise node.error(f"{text} has {count} elements, too many to fold into a constant, but "
                         f"opfusion's arange would count {result.checked_type.shape[0]}")
    return result


# ---------------------------------------------------------------------------------------------
# padding


def _pad(node: OnnxNode, pads: list[int], value: Expr | None, axes: list[int] | None) -> Expr:
    x = node.input(0)
    shape = shape_of(x)
    rank = len(shape)
    axes = list(range(rank)) if axes is None else normalize_axes(node, axes, rank)
    if len(pads) != 2 * len(axes):
        raise node.error(f"pads {pads} must hold 2 x {len(axes)} values (all begins, then all "
                         "ends)")
    before, after = [0] * rank, [0] * rank
    for i, axis in enumerate(axes):
        before[axis], after[axis] = pads[i], pads[len(axes) + i]
    if min(before + after) < 0:
        # Negative pads remove elements; crop first, then pad what is left.
        begin = [max(-b, 0) for b in before]
        end = [dim - max(-e, 0) for dim, e in zip(shape, after)]
        if any(lo > hi for lo, hi in zip(begin, end)):
            raise node.error(f"pads {pads} remove more than data {shape} has")
        x = op.strided_slice(x, begin=begin, end=end)
        before, after = [max(b, 0) for b in before], [max(e, 0) for e in after]
    if not any(before + after):
        return x
    mode = node.attr("mode", "constant")
    dtype = tensor_type(x).dtype
    if mode == "wrap":  # opset 19: the tensor as a torus, an index map per padded axis
        for axis, (lo, hi) in enumerate(zip(before, after)):
            if lo or hi:
                size = shape_of(x)[axis]
                if size == 0:
                    raise node.error(f"wrap mode cannot pad the empty axis {axis} of {shape}")
                index = np.arange(-lo, size + hi, dtype=np.int64) % size
                x = op.take(x, Constant(index), axis=axis)
        return x
    if mode not in ("constant", "edge", "reflect"):
        raise node.error(f"mode {mode!r} is not supported (constant, edge, reflect, wrap)")
    if value is None:
        value = scalar_const(0, dtype)
    else:
        if shape_of(value) != ():
            value = reshape_exact(node, value, ())
        if tensor_type(value).dtype != dtype:
            value = op.cast(value, dtype=dtype)
    widths = [w for pair in zip(before, after) for w in pair]
    return op.nn.pad(x, value, pad_width=widths, pad_mode=mode)


@converter("Pad", since=2)
def pad_2(node: OnnxNode) -> Expr:
    value = scalar_const(node.attr("value", 0.0), tensor_type(node.input(0)).dtype)
    return _pad(node, as_ints(node.attr("pads", [])), value, None)


@converter("Pad", since=11)  # pads and constant_value became inputs
def pad_11(node: OnnxNode) -> Expr:
    return _pad(node, as_ints(required_const(node, 1, "pads")), node.optional_input(2), None)


@converter("Pad", since=18)  # axes: pads name only some axes
def pad_18(node: OnnxNode) -> Expr:
    axes = node.const_input(3, "axes")
    return _pad(node, as_ints(required_const(node, 1, "pads")), node.optional_input(2),
                None if axes is None else as_ints(axes))
