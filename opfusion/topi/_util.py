"""Index maps shared by the TE computes: broadcasting, reshaping, axes, and dtype corners.

Every function here builds scalar expressions for one output element; none creates a tensor.
The maps stay affine where the shapes allow it (a dimension of size 1 is index 0, a copied
dimension is the output index itself) and use floordiv/floormod only where dimensions are
really merged or split, because these expressions end up inside fused kernels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import te
from ..ir.op import get_op
from ..opdefs._common import normalize_axis, reduce_axes
from ..tir.expr import PrimExpr

Index = Any  # a PrimExpr or an int: one coordinate of a tensor element


def stage_name(op_name: str) -> str:
    """The TE stage name of an op's result: ``nn.relu`` -> ``relu`` (names reach C code)."""
    return op_name.rsplit(".", 1)[-1]


def shape_of(out_type: Any) -> tuple[int, ...]:
    """The static shape of a tensor type as plain ints."""
    return tuple(int(d) for d in out_type.shape)


def broadcast_indices(indices: Sequence[Index], shape: Sequence[int]) -> list[Index]:
    """The indices of an input of ``shape`` that NumPy broadcasting maps to the output element
    at ``indices``: missing leading dimensions are dropped, a dimension of size 1 reads 0."""
    lead = len(indices) - len(shape)
    assert lead >= 0, f"an input of rank {len(shape)} cannot broadcast to rank {len(indices)}"
    return [0 if dim == 1 else indices[lead + d] for d, dim in enumerate(shape)]


def load_broadcast(tensor: te.Tensor, indices: Sequence[Index]) -> PrimExpr:
    """``tensor`` read at the output element ``indices`` under NumPy broadcasting."""
    return tensor[tuple(broadcast_indices(indices, tensor.shape))]


def _merge_groups(out_shape: Sequence[int], in_shape: Sequence[int]
                  ) -> list[tuple[list[int], list[int]]] | None:
    """Pair runs of output and input dimensions (size-1 dimensions left out) whose sizes
    multiply to the same number: the smallest groups a reshape maps one to one. None when
    the element counts differ."""
    outs = [d for d, n in enumerate(out_shape) if n != 1]
    ins = [d for d, n in enumerate(in_shape) if n != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(outs) and j < len(ins):
        group_out, group_in = [outs[i]], [ins[j]]
        size_out, size_in = out_shape[outs[i]], in_shape[ins[j]]
        i, j = i + 1, j + 1
        while size_out != size_in:
            if size_out < size_in:
                if i == len(outs):
                    return None
                group_out.append(outs[i])
                size_out *= out_shape[outs[i]]
                i += 1
            else:
                if j == len(ins):
                    return None
                group_in.append(ins[j])
                size_in *= in_shape[ins[j]]
                j += 1
        groups.append((group_out, group_in))
    if i != len(outs) or j != len(ins):
        return None
    return groups


def reshape_indices(indices: Sequence[Index], out_shape: Sequence[int],
                    in_shape: Sequence[int]) -> list[Index]:
    """The input element that a row-major reshape from ``in_shape`` to ``out_shape`` puts at
    the output element ``indices``.

    Dimensions are matched in groups of equal size, so a dimension that is merely copied
    (``(N, C, H, W) -> (N, C*H*W)`` keeps ``n``) costs nothing; inside a group the flat offset
    is computed once and split with floordiv/floormod, leaving out the floormod of the
    group's outermost input dimension and the floordiv of its innermost."""
    result: list[Index] = [0] * len(in_shape)
    if 0 in out_shape or 0 in in_shape:
        return result  # no element exists: any index will do
    groups = _merge_groups(out_shape, in_shape)
    assert groups is not None, f"cannot reshape {tuple(in_shape)} to {tuple(out_shape)}"
    for group_out, group_in in groups:
        if len(group_out) == 1 and len(group_in) == 1:
            result[group_in[0]] = indices[group_out[0]]
            continue
        flat: Index = 0
        for d in group_out:
            flat = flat * out_shape[d] + indices[d]
        stride = 1
        for position, d in enumerate(reversed(group_in)):
            index = flat if stride == 1 else flat // stride
            if position != len(group_in) - 1:
                index = index % in_shape[d]
            result[d] = index
            stride *= in_shape[d]
    return result


def unravel(flat: PrimExpr, shape: Sequence[int]) -> list[PrimExpr]:
    """The row-major coordinates of the flat offset ``flat`` (0 <= flat < prod(shape))."""
    coords: list[PrimExpr] = [te.const(0)] * len(shape)
    stride = 1
    dims = [d for d, n in enumerate(shape) if n != 1]
    for position, d in enumerate(reversed(dims)):
        index = flat if stride == 1 else flat // stride
        if position != len(dims) - 1:
            index = index % shape[d]
        coords[d] = index
        stride *= shape[d]
    return coords


def axis_of(op_name: str, axis: int, ndim: int, attr: str = "axis") -> int:
    """A possibly negative axis as 0..ndim-1 (errors name the op and the attribute)."""
    return normalize_axis(get_op(op_name), axis, ndim, attr)


def reduced_axes(op_name: str, axis: Sequence[int] | None, ndim: int,
                 exclude: bool = False) -> tuple[int, ...]:
    """The sorted axes a reduction runs over (TVM's axis/exclude convention)."""
    return reduce_axes(get_op(op_name), axis, ndim, exclude)


def int_info(dtype: str) -> np.iinfo:
    """Range of an integer dtype."""
    return np.iinfo(np.dtype(dtype))


def is_unsigned(dtype: str) -> bool:
    """True for uint8..uint64."""
    return dtype.startswith("uint")


def vector_lanes(dtype: str) -> int:
    """Elements of ``dtype`` in one vector register of the current target (``with target:``;
    the group lowering sets it): the computes lay out accumulators in blocks of this many,
    so that the schedules vectorize them whole."""
    from ..target import Target

    target = Target.current()
    assert target is not None
    return target.vector_lanes(dtype)


def accumulator_dtype(dtype: str) -> str:
    """The dtype products accumulate in: float16 in float32 (it has too few bits to multiply
    many terms), every other dtype in itself as TVM does."""
    return "float32" if dtype == "float16" else dtype


def sum_dtype(dtype: str) -> str:
    """The dtype sums (and the statistics made of them: means, variances, softmax
    denominators) accumulate in: float16 and float32 in float64. A float32 running sum of n
    terms loses up to n ulps of the total: a row of 768 values around 1000 then has a mean
    off by ~1e-4 and a constant row normalizes to values near 1 instead of 0. In float64 the
    sum of float32 terms is exact up to 2^29 of them; with vector partial sums (see
    :func:`opfusion.topi.reduce.blocked_sum`) it costs about what a scalar float32 sum did."""
    return "float64" if dtype in ("float16", "float32") else dtype
