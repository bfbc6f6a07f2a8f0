"""TE computes of the reductions (opfusion/opdefs/reduce.py): sum, prod, max, min, mean, variance,
argmax and argmin.

Axes follow the declarations (``axis=None`` every axis, ``exclude`` the complement,
``keepdims``). sum, prod, max and min are one stage whose body is the reduction (tag
"comm_reduce"). The others are short chains whose *last* stage is the op's result:

* mean: a sum stage, then ``sum / count`` (tag "elemwise");
* variance: the mean's two stages, the sum of squared deviations, then the division;
* argmax/argmin: the extreme value (a max or min stage), then the smallest (largest, with
  ``select_last_index``) flat index holding it (tag "comm_reduce_idx"). te reducers combine
  one value, not (index, value) pairs, hence two passes; a NaN counts as the extreme, as in
  NumPy.

Sums (and so means and variances) accumulate in float64 for float16 and float32 data
(:func:`._util.sum_dtype`; the references sum in float64 too) and, when the innermost data
axis is reduced, in :data:`SUM_LANES` interleaved partial sums (:func:`blocked_sum`): the
schedules vectorize them, and each partial sum adds up only 1/SUM_LANES of the terms.
Variances are two passes (the mean, then the squared deviations from it), never
E[x^2] - E[x]^2. Products accumulate float16 in float32; max and min propagate NaN through
the C code generator's max/min helpers, as np.max does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .. import te
from ..tir.expr import PrimExpr, is_float
from ._util import accumulator_dtype, reduced_axes, shape_of, stage_name, sum_dtype
from .registry import register_compute

Reducer = Callable[..., PrimExpr]

#: Interleaved partial sums of a blocked sum: element k of a row goes to partial sum k % SUM_LANES
#: (one vector of float64 is 4 or 8 lanes: 16 keeps 2-4 independent vector additions in
#: flight, so the sum runs at the adds' throughput, not their latency). A numerics constant,
#: not a hardware one: it fixes the summation order, so a sum gives the same bits on every
#: target; it is deliberately not read from the target's vector width.
SUM_LANES = 16
#: Tags of the stages of a blocked sum: the partial sums (shape ``(*shape, SUM_LANES)``), the
#: terms left over when the row is not a whole number of lanes.
SUM_PARTIAL = "sum_partial"
SUM_TAIL = "sum_tail"

Positions = list[PrimExpr]


def blocked_sum(shape: Sequence[int], extents: Sequence[int],
                value: Callable[[tuple[PrimExpr, ...], Positions], PrimExpr], name: str,
                tag: str = "comm_reduce", attrs: dict[str, Any] | None = None,
                contiguous: bool = True, reducer: Reducer = te.sum) -> te.Tensor:
    """``sum(value(i, p) for p in the box extents)`` for every index ``i`` of ``shape``, where
    the last of ``extents`` runs along memory. ``value(i, positions)`` gets one position per
    extent.

    With at least 2 * SUM_LANES along the last extent, the sum is three stages: partial sums
    ``{name}_lanes[i, l]`` over the positions ``b * SUM_LANES + l`` (tag SUM_PARTIAL; the
    schedules put ``l`` innermost and vectorize it), the leftover positions past the last
    whole block (``{name}_tail``, tag SUM_TAIL, only when there are some), and the result
    adding up the lanes and the tail (tag ``tag``, ``attrs``). Otherwise one plain
    reduction. Either way the sum is in ``value``'s dtype: pass terms cast to
    :func:`._util.sum_dtype`.

    ``reducer`` te.max or te.min: the same stages for the extreme instead of the sum (a full
    max over BERT's 128 x 3072 activations, which ONNX Runtime's dynamic quantization takes
    before each product, was one scalar chain of 393216 steps: 0.56 ms)."""
    shape = tuple(shape)
    extents = [int(e) for e in extents]
    count = extents[-1] if extents else 0

    def axes(tail_extents: Sequence[int], prefix: str) -> list[te.IterVar]:
        return [te.reduce_axis((0, e), name=f"{prefix}{d}") for d, e in enumerate(tail_extents)]

    if count < 2 * SUM_LANES or not contiguous:
        def plain(*i: PrimExpr) -> PrimExpr:
            ks = axes(extents, "k")
            return reducer(value(i, list(ks)), axis=ks) if ks else value(i, [])
        return te.compute(shape, plain, name=name, tag=tag, attrs=attrs)
    lanes = SUM_LANES
    blocks, rest = divmod(count, lanes)

    def partial_sum(*i: PrimExpr) -> PrimExpr:
        ks = axes([*extents[:-1], blocks], "k")
        return reducer(value(i[:-1], [*ks[:-1], ks[-1] * lanes + i[-1]]), axis=ks)

    partial = te.compute((*shape, lanes), partial_sum, name=f"{name}_lanes", tag=SUM_PARTIAL)
    tail = None
    if rest:
        def tail_sum(*i: PrimExpr) -> PrimExpr:
            ks = axes([*extents[:-1], rest], "t")
            return reducer(value(i, [*ks[:-1], ks[-1] + blocks * lanes]), axis=ks)

        tail = te.compute(shape, tail_sum, name=f"{name}_tail", tag=SUM_TAIL)

    def total(*i: PrimExpr) -> PrimExpr:
        lane = te.reduce_axis((0, lanes), name="lane")
        term = partial[(*i, lane)]
        if tail is not None and reducer is te.sum:
            term = term + te.select(lane == 0, tail[i], te.const(0, partial.dtype))
        elif tail is not None:
            term = te.select(lane == 0, reducer(term, tail[i]), term)
        return reducer(term, axis=lane)

    return te.compute(shape, total, name=name, tag=tag, attrs=attrs)


prod = te.comm_reducer(lambda acc, value: acc * value, lambda dtype: te.const(1, dtype),
                       name="prod")


class Reduction:
    """Which axes of ``data`` a reduction runs over, and how the output (with or without
    ``keepdims``) indexes the data."""

    def __init__(self, op_name: str, data: te.Tensor, axis: Sequence[int] | None,
                 keepdims: bool, exclude: bool = False) -> None:
        self.op_name = op_name
        self.data = data
        self.axes = reduced_axes(op_name, axis, data.ndim, exclude)
        self.kept = [d for d in range(data.ndim) if d not in self.axes]
        self.keepdims = keepdims
        self.count = 1
        for d in self.axes:
            self.count *= data.shape[d]

    @property
    def kept_shape(self) -> tuple[int, ...]:
        """The result's shape without keepdims (the shape of intermediate stages)."""
        return tuple(self.data.shape[d] for d in self.kept)

    def kept_indices(self, out: Sequence[PrimExpr], keepdims: bool) -> list[PrimExpr]:
        """The indices of the kept axes within an output index ``out``."""
        return [out[d] for d in self.kept] if keepdims else list(out)

    def reduce(self, name: str, out_shape: Sequence[int], keepdims: bool, reducer: Reducer,
               body: Callable[[list[Any], list[PrimExpr], list[te.IterVar]], PrimExpr],
               tag: str = "comm_reduce") -> te.Tensor:
        """A stage of ``out_shape`` whose element is ``reducer(body(data_index, kept, axes))``
        over the reduced axes; ``data_index`` indexes ``data`` (kept axes from the output,
        reduced ones from the reduction axes). With nothing to reduce it is ``body`` itself."""

        def element(*out: PrimExpr) -> PrimExpr:
            kept = self.kept_indices(out, keepdims)
            axes = [te.reduce_axis((0, self.data.shape[d]), name=f"k{d}") for d in self.axes]
            index: list[Any] = [0] * self.data.ndim
            for d, i in zip(self.kept, kept):
                index[d] = i
            for d, r in zip(self.axes, axes):
                index[d] = r
            value = body(index, kept, axes)
            return reducer(value, axis=axes) if axes else value

        return te.compute(tuple(out_shape), element, name=name, tag=tag)

    def along_memory(self) -> bool:
        """Whether the innermost data axis (the one along memory) is reduced."""
        return bool(self.axes) and self.axes[-1] == self.data.ndim - 1

    def sum(self, name: str, body: Callable[[list[Any], list[PrimExpr]], PrimExpr],
            tag: str = "comm_reduce") -> te.Tensor:
        """The sum of ``body(data_index, kept)`` over the reduced axes, in the kept shape:
        a :func:`blocked_sum` when the innermost data axis is reduced (it runs along
        memory), else one reduction."""
        return self.blocked(name, body, te.sum, tag)

    def blocked(self, name: str, body: Callable[[list[Any], list[PrimExpr]], PrimExpr],
                reducer: Reducer, tag: str = "comm_reduce") -> te.Tensor:
        """:meth:`sum` with ``reducer`` (te.sum, te.max or te.min) in place of the sum."""
        if not self.along_memory():
            return self.reduce(name, self.kept_shape, False, reducer,
                               lambda index, kept, axes: body(index, kept), tag=tag)

        def value(out: tuple[PrimExpr, ...], positions: list[PrimExpr]) -> PrimExpr:
            kept = list(out)
            index: list[Any] = [0] * self.data.ndim
            for d, i in zip(self.kept, kept):
                index[d] = i
            for d, p in zip(self.axes, positions):
                index[d] = p
            return body(index, kept)

        extents = [int(self.data.shape[d]) for d in self.axes]
        return blocked_sum(self.kept_shape, extents, value, name, tag=tag, reducer=reducer)

    def finish(self, name: str, out_type: Any, source: te.Tensor,
               fn: Callable[[PrimExpr], PrimExpr]) -> te.Tensor:
        """The result stage: ``fn`` of the kept-shape stage ``source``, cast to the result
        dtype, in the result's shape (tag "elemwise")."""
        dtype = out_type.dtype

        def element(*out: PrimExpr) -> PrimExpr:
            kept = self.kept_indices(out, self.keepdims)
            return te.cast(fn(source[tuple(kept)]), dtype)

        return te.compute(shape_of(out_type), element, name=name, tag="elemwise")


@register_compute("sum")
def compute_sum(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """The sum over the reduced axes (see :meth:`Reduction.sum`), cast to the result dtype."""
    red = Reduction("sum", inputs[0], attrs.axis, attrs.keepdims, attrs.exclude)
    total = _sum_stage(red, "sum_acc")
    return red.finish("sum", out_type, total, lambda s: s)


def _simple(op_name: str, reducer: Reducer, accumulate: bool) -> None:
    @register_compute(op_name)
    def compute(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
        data = inputs[0]
        red = Reduction(op_name, data, attrs.axis, attrs.keepdims, attrs.exclude)
        acc = accumulator_dtype(data.dtype) if accumulate else data.dtype
        name = stage_name(op_name)
        if acc == data.dtype and reducer is not prod and red.along_memory():
            # max and min over the innermost axis: in interleaved lanes, as sums are
            extreme = red.blocked(f"{name}_lanes_total", lambda index, kept: data[tuple(index)],
                                  reducer)
            return red.finish(name, out_type, extreme, lambda s: s)
        if acc == data.dtype:
            return red.reduce(name, shape_of(out_type), red.keepdims, reducer,
                              lambda index, kept, axes: data[tuple(index)])
        partial = red.reduce(f"{name}_{acc}", red.kept_shape, False, reducer,
                             lambda index, kept, axes: te.cast(data[tuple(index)], acc))
        return red.finish(name, out_type, partial, lambda s: s)

    compute.__name__ = f"compute_{op_name}"
    compute.__doc__ = f"TE compute of {op_name}."


_simple("prod", prod, True)
_simple("max", te.max, False)
_simple("min", te.min, False)


def _sum_stage(red: Reduction, name: str) -> te.Tensor:
    """The sum over the reduced axes in :func:`sum_dtype`, in the kept shape."""
    data = red.data
    acc = sum_dtype(data.dtype)
    return red.sum(name, lambda index, kept: te.cast(data[tuple(index)], acc))


def _divide_by(count: int) -> Callable[[PrimExpr], PrimExpr]:
    # A division, not a multiplication by 1/count, as the reference does it; count 0 gives
    # NaN (0/0) or inf, as in NumPy.
    return lambda s: s / te.const(float(count), s.dtype)


@register_compute("mean")
def compute_mean(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """sum / count over the reduced axes."""
    red = Reduction("mean", inputs[0], attrs.axis, attrs.keepdims, attrs.exclude)
    total = _sum_stage(red, "mean_sum")
    return red.finish("mean", out_type, total, _divide_by(red.count))


@register_compute("variance")
def compute_variance(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
    """Two passes as the reference: the mean, then the mean square deviation from it (divided
    by count - 1 when ``unbiased``)."""
    data = inputs[0]
    red = Reduction("variance", data, attrs.axis, attrs.keepdims, attrs.exclude)
    acc = sum_dtype(data.dtype)
    total = _sum_stage(red, "variance_sum")
    mean = te.compute(red.kept_shape, lambda *i: total[i] / te.const(float(red.count), acc),
                      name="variance_mean", tag="elemwise")

    def square(index: list[Any], kept: list[PrimExpr]) -> PrimExpr:
        deviation = te.cast(data[tuple(index)], acc) - mean[tuple(kept)]
        return deviation * deviation

    squares = red.sum("variance_squares", square)
    return red.finish("variance", out_type, squares,
                      _divide_by(red.count - 1 if attrs.unbiased else red.count))


def _arg_reduce(op_name: str, extreme: Reducer, pick_first: Reducer,
                pick_last: Reducer) -> None:
    @register_compute(op_name)
    def compute(inputs: list[Any], attrs: Any, out_type: Any) -> te.Tensor:
        data = inputs[0]
        red = Reduction(op_name, data, attrs.axis, attrs.keepdims)
        name = stage_name(op_name)
        value = red.reduce(f"{name}_value", red.kept_shape, False, extreme,
                           lambda index, kept, axes: data[tuple(index)])
        strides = []
        stride = 1
        for d in reversed(red.axes):
            strides.append(stride)
            stride *= data.shape[d]
        strides.reverse()
        last = attrs.select_last_index
        miss = te.const(-1 if last else 2**63 - 1, "int64")

        def position(index: list[Any], kept: list[PrimExpr], axes: list[te.IterVar]
                     ) -> PrimExpr:
            x = data[tuple(index)]
            hit = x == value[tuple(kept)]
            if is_float(x.dtype):
                hit = hit | (x != x)  # a NaN is the extreme (np.argmax finds the first NaN)
            flat = te.const(0, "int64")
            for axis, s in zip(axes, strides):
                flat = flat + te.cast(axis, "int64") * s
            return te.select(hit, flat, miss)

        return red.reduce(name, shape_of(out_type), red.keepdims,
                          pick_last if last else pick_first, position, tag="comm_reduce_idx")

    compute.__name__ = f"compute_{op_name}"
    compute.__doc__ = f"TE compute of {op_name}: the value pass, then the index pass."


_arg_reduce("argmax", te.max, te.min, te.max)
_arg_reduce("argmin", te.min, te.min, te.max)
