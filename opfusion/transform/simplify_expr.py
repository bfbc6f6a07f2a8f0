"""SimplifyExpr: remove data movement and arithmetic that do nothing, as a table of rewrites.

The rules (:data:`SIMPLIFY_RULES`): reshape-like ops, broadcast_to and tile that keep the
shape go; chains of reshape-like ops become one reshape; identity transposes go,
consecutive ones compose, and one that moves only axes of extent 1 is a reshape (torch's
``transpose(0, 1)`` of a batch of one, around ``nn.MultiheadAttention``); an elementwise
operator with a constant moves above a reshape that inserts unit axes (``add(reshape(x), c)``
-> ``reshape(add(x, c'))``: a bias after the reshapes around a packed product of a batch of
rows then follows the product and fuses into its epilogue), or above one that gives a
matrix's rows leading axes when the constant varies along the columns only (a bias after a
product of a (1, 56, 56, 96) image's pixels, flattened to rows for its kernel); a ``take``
of one constant index moves before a transpose, and before a reshape that keeps the axis it
takes (torch's split of ``nn.MultiheadAttention``'s projection into q, k and v then reads
the projection, not a transposed copy of it); casts to the
same dtype go and a cast through a dtype that holds every value exactly is skipped; ``x *
1``, ``x / 1``, ``x + 0``, ``x - 0`` and ``-(-x)`` become ``x``; a quantize step (``clip(round(x
/ s) + z)``) of dequantized codes (``(c - z) * s``) with the same scale and zero point gives
the codes back (``c + 0.0``, through movement ops, items of a split, the parts of a
concatenation and max pools: :func:`codes_bounds`), and ``where(isnan(c), 0, c)`` of codes
that are never NaN is ``c``; a max pool of ``x * s`` (``s`` > 0) or ``x - z`` pools ``x``
first, since both steps are non-decreasing and keep -inf and NaN (so a DequantizeLinear
before a pool moves after it, where the QuantizeLinear after the pool undoes it).

Every rule keeps values bit for bit and the rewritten node's type exactly (the rewriter
checks the type). Rules only look at a node and its operands; a merged chain whose inner
node has other users leaves that node for them (see :mod:`opfusion.transform.pattern`).

Signed zeros decide two cases: ``-0.0 + 0.0`` is ``+0.0``, so for floats ``x + 0`` goes only
when the zeros are ``-0.0`` and ``x - 0`` only when they are ``+0.0``. ``x / 1`` goes for
floats only: the reference divides integers through float64, which is not exact for the
largest int64 values."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence

import numpy as np

from ..ir.expr import Call, Constant, Expr, TupleGetItem
from ..ir.expr import Tuple as TupleExpr
from ..ir.module import IRModule
from ..ir.op import Op, OpPatternKind, get_op
from ..ir.types import TensorType
from .context import PassContext
from .pass_infra import module_pass, register_pass
from .pattern import Bindings, Pattern, is_constant, is_op, wildcard
from .pattern_rewrite import PatternCallback, rewrite, rule

__all__ = ["SHAPE_ATTRS", "SIMPLIFY_RULES", "SimplifyExpr", "is_scalar_constant", "simplify_expr"]

#: Operators that only reinterpret the shape: same elements, same row-major order.
RESHAPE_OPS = ("reshape", "squeeze", "expand_dims", "flatten", "nn.batch_flatten")
#: Operators that are the identity whenever their result has their input's shape.
SAME_SHAPE_IS_IDENTITY = (*RESHAPE_OPS, "broadcast_to", "tile")


def _any_of(names: Sequence[str], *args: Pattern) -> Pattern:
    """``(is_op(names[0]) | is_op(names[1]) | ...)(*args)``"""
    return functools.reduce(operator.or_, [is_op(name) for name in names])(*args)


def _same_type(a: Expr, b: Expr) -> bool:
    return a.checked_type == b.checked_type


# -- rules: data movement ----------------------------------------------------------------------

def _identity_by_shape() -> PatternCallback:
    # reshape(x) -> x    (also squeeze, expand_dims, flatten, batch_flatten, broadcast_to,
    #                     tile: whenever the result has x's shape)
    x = wildcard()

    def drop(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        return m[x] if _same_type(post, m[x]) else None

    return rule(_any_of(SAME_SHAPE_IS_IDENTITY, x), drop, "identity_reshape")


def _merge_reshapes() -> PatternCallback:
    # reshape(squeeze(x))  ->  reshape(x, newshape=<result shape>)    (any two reshape-like ops;
    #                                                                  x itself if the shape is x's)
    x = wildcard()

    def merge(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        data = m[x]
        out = post.checked_type
        assert isinstance(out, TensorType)
        if out == data.checked_type:
            return data
        if 0 in out.shape:  # newshape reads 0 as "copy the input's dimension"
            return None
        return Call(get_op("reshape"), [data], {"newshape": out.shape})

    return rule(_any_of(RESHAPE_OPS, _any_of(RESHAPE_OPS, x)), merge, "merge_reshapes")


def _identity_transpose() -> PatternCallback:
    # transpose(x, axes=[0, 1, ..., n-1]) -> x
    x = wildcard()

    def drop(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        ndim = len(m[x].checked_type.shape)
        axes = get_op("transpose").permutation(ndim, post.attrs["axes"])
        return m[x] if axes == tuple(range(ndim)) else None

    return rule(is_op("transpose")(x), drop, "identity_transpose")


def _merge_transposes() -> PatternCallback:
    # transpose(transpose(x, a), b) -> transpose(x, [a[i] for i in b])    (x if that is 0..n-1)
    x = wildcard()
    inner = is_op("transpose")(x)

    def merge(pre: Expr, post: Expr, m: Bindings) -> Expr:
        transpose = get_op("transpose")
        ndim = len(m[x].checked_type.shape)
        first = transpose.permutation(ndim, m[inner].attrs["axes"])
        second = transpose.permutation(ndim, post.attrs["axes"])
        axes = tuple(first[i] for i in second)
        if axes == tuple(range(ndim)):
            return m[x]
        return Call(transpose, [m[x]], {"axes": axes})

    return rule(is_op("transpose")(inner), merge, "merge_transposes")


def _transpose_as_reshape() -> PatternCallback:
    # transpose(x, axes) -> reshape(x, newshape=<result shape>)    (when only axes of extent 1
    #                                                              move: the same row-major order)
    x = wildcard()

    def to_reshape(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        shape = m[x].checked_type.shape
        axes = get_op("transpose").permutation(len(shape), post.attrs["axes"])
        if [a for a in axes if shape[a] != 1] != [a for a in range(len(shape)) if shape[a] != 1]:
            return None  # an axis of several elements moves past another: a real transpose
        out = post.checked_type
        assert isinstance(out, TensorType)
        if 0 in out.shape:  # newshape reads 0 as "copy the input's dimension"
            return None
        return Call(get_op("reshape"), [m[x]], {"newshape": out.shape})

    return rule(is_op("transpose")(x), to_reshape, "transpose_as_reshape")


#: Binary elementwise operators whose operands may be reshaped alike (element by element).
ELEMENTWISE_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum")


def _inserted_unit_axes(source: Sequence[int], result: Sequence[int]) -> list[int] | None:
    """The positions of ``result`` that are axes of extent 1 inserted into ``source`` (the
    rest are ``source``'s axes in order), or None when ``result`` is not ``source`` with unit
    axes inserted (or has no axis more)."""
    if len(result) <= len(source):
        return None
    inserted, j = [], 0
    for i, extent in enumerate(result):
        if j < len(source) and extent == source[j]:
            j += 1
        elif extent == 1:
            inserted.append(i)
        else:
            return None
    return inserted if j == len(source) else None


def _keeps_last_axis(source: Sequence[int], result: Sequence[int]) -> bool:
    """Whether a reshape of ``source`` to ``result`` gives a matrix's rows leading axes and
    keeps its columns (``(3136, 96)`` -> ``(1, 56, 56, 96)``): what PackMatmulWeights puts
    after a packed product of an image's pixels. Only matrices: an elementwise operator
    moved above a reshape of other ranks would leave, say, a channel split of NCHW values
    between its operands' reshapes (QDQ ShuffleNet's shuffles, whose dequantize steps must
    stay next to the quantize steps they undo)."""
    return (len(source) == 2 and len(result) > 2 and source[-1] == result[-1])


def _elementwise_before_reshape() -> PatternCallback:
    # add(reshape(x), c) -> reshape(add(x, c'))    (any of ELEMENTWISE_BINARY, either operand
    #                                               order; c a constant; the reshape inserts
    #                                               unit axes; c' is c without them, c
    #                                               broadcasting into the reshaped x without
    #                                               enlarging it)
    a, b = wildcard(), wildcard()

    def reorder(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        out = post.checked_type
        assert isinstance(out, TensorType)
        if 0 in out.shape:  # newshape reads 0 as "copy the input's dimension"
            return None
        for side, (reshaped, const) in enumerate(((m[a], m[b]), (m[b], m[a]))):
            moved = _move_below(post, reshaped, const, out, side)
            if moved is not None:
                return moved
        return None

    return rule(_any_of(ELEMENTWISE_BINARY, a, b), reorder, "elementwise_before_reshape")


def _move_below(node: Expr, reshaped: Expr, const: Expr, out: TensorType,
                side: int) -> Expr | None:
    """``reshape(op(x, c'))`` for ``node = op(reshaped, const)`` (``side`` 1: ``op(const,
    reshaped)``) when ``const`` is a constant and ``reshaped`` a reshape of ``x`` that
    inserts unit axes, or one that gives a matrix's rows leading axes
    (:func:`_keeps_last_axis`) where ``const`` varies along the columns only; else None.
    Only constants move: a computed operand would need a reshape of its own, which takes
    the operator from that operand's producer instead (a residual add between two products'
    results fuses with one or the other)."""
    if not (isinstance(reshaped, Call) and reshaped.op.name in RESHAPE_OPS
            and isinstance(const, Constant)):
        return None
    source = reshaped.args[0].checked_type
    const_shape = tuple(const.data.shape)
    if (not isinstance(source, TensorType) or reshaped.checked_type != out
            or const.data.dtype != np.dtype(out.dtype) or len(const_shape) > len(out.shape)):
        return None  # the constant enlarges the result or changes its dtype
    full = (1,) * (len(out.shape) - len(const_shape)) + const_shape
    inserted = _inserted_unit_axes(source.shape, out.shape)
    if inserted is not None:
        # The constant right-aligned to the result has extent 1 at every inserted axis (it
        # does not enlarge the result, whose extent there is 1): without them it aligns
        # with x.
        shape = tuple(e for i, e in enumerate(full) if i not in inserted)
        while len(shape) > len(const_shape) and shape[0] == 1:
            shape = shape[1:]  # leading unit axes broadcast alike: keep the constant's rank
    elif _keeps_last_axis(source.shape, out.shape) and all(e == 1 for e in full[:-1]):
        # A matrix's rows given leading axes (a packed product's rows, flattened for its
        # kernel): a constant along the columns only pairs with the same elements of every
        # row either way.
        shape = const_shape[-1:]
    else:
        return None
    if shape != const_shape:
        const = Constant(np.ascontiguousarray(const.data.reshape(shape)))
    operands = [reshaped.args[0], const] if side == 0 else [const, reshaped.args[0]]
    assert isinstance(node, Call)
    return Call(get_op("reshape"), [Call(node.op, operands, node.attrs)],
                {"newshape": out.shape})


def _elementwise_of_reshapes() -> PatternCallback:
    # f(reshape(x))                  -> reshape(f(x))         (f elementwise, of one input)
    # add(reshape(x), reshape(y))    -> reshape(add(x, y))    (any elementwise or broadcasting
    # where(reshape(m), 0, reshape(x)) -> reshape(where(m, 0, x))   operator; x, y of one
    #                                                          shape; scalar constants stay)
    # (every reshape inserts unit axes or gives a matrix's rows leading axes, as for
    # elementwise_before_reshape): the chain of operators after a packed product of a batch
    # of rows, and the product of two values of that chain (a quantized GELU), follow the
    # product into its epilogue
    def movable(node: Expr) -> bool:
        return (isinstance(node, Call) and isinstance(node.op, Op)
                and node.op.pattern <= OpPatternKind.kBroadcast
                and not SHAPE_ATTRS.intersection(node.attrs)
                and any(_is_reshape(a) for a in node.args)
                and all(_is_reshape(a) or is_scalar_constant(a) for a in node.args))

    def reorder(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        out = post.checked_type
        assert isinstance(post, Call) and isinstance(out, TensorType)
        if 0 in out.shape:  # newshape reads 0 as "copy the input's dimension"
            return None
        reshaped = [arg for arg in post.args if _is_reshape(arg)]
        shapes = {_shape_of(arg.args[0]) for arg in reshaped}
        if len(shapes) != 1 or None in shapes:
            return None
        (source,) = shapes
        if any(_shape_of(arg) != out.shape for arg in reshaped):
            return None  # an operand broadcasts: its elements do not pair up one to one
        if (_inserted_unit_axes(source, out.shape) is None
                and not _keeps_last_axis(source, out.shape)):
            return None
        operands = [arg.args[0] if _is_reshape(arg) else arg for arg in post.args]
        return Call(get_op("reshape"), [Call(post.op, operands, post.attrs)],
                    {"newshape": out.shape})

    return rule(wildcard().where(movable), reorder, "elementwise_of_reshapes")


def _is_reshape(expr: Expr) -> bool:
    return isinstance(expr, Call) and isinstance(expr.op, Op) and expr.op.name in RESHAPE_OPS


def is_scalar_constant(expr: Expr) -> bool:
    """Whether ``expr`` is a constant of one element and no axes (it broadcasts alike into
    any shape)."""
    return isinstance(expr, Constant) and expr.data.shape == ()


#: Attributes that name axes or shapes of an operator's operands: an elementwise operator
#: with one of them does not apply unchanged to operands of another shape.
SHAPE_ATTRS = frozenset({"axis", "axes", "shape", "newshape"})


def _shape_of(expr: Expr) -> tuple[int, ...] | None:
    ty = expr.checked_type
    return tuple(ty.shape) if isinstance(ty, TensorType) else None


def _take_before_movement() -> PatternCallback:
    # take(transpose(t, perm), i, axis=a) -> transpose(take(t, i, axis=perm[a]), <perm
    #                                                        without perm[a]>)
    # take(reshape(t), i, axis=a)          -> reshape(take(t, i, axis=b))    (axis b of t has
    #                                                        axis a's extent and elements before)
    # (i a constant index in range: the slice is the same elements in the same order)
    data, index = wildcard(), is_constant()

    def push(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        picked = _constant_index(post, m[data], m[index])
        if picked is None or not isinstance(m[data], Call):
            return None
        axis, value = picked
        inner = m[data]
        if inner.op.name == "transpose":
            return _take_before_transpose(post, inner, axis, value)
        if inner.op.name in RESHAPE_OPS:
            return _take_before_reshape(post, inner, axis, value)
        return None

    return rule(is_op("take")(data, index), push, "take_before_movement")


def _constant_index(node: Expr, data: Expr, index: Expr) -> tuple[int, int] | None:
    """(axis, index) of a ``take`` of one constant index in range along an axis, else None."""
    assert isinstance(node, Call) and isinstance(index, Constant)
    ty = data.checked_type
    if (node.attrs["axis"] is None or index.data.shape != () or index.data.dtype.kind not in "iu"
            or not isinstance(ty, TensorType) or not ty.shape):
        return None
    axis = node.attrs["axis"] % len(ty.shape)
    extent, value = ty.shape[axis], int(index.data)
    if not -extent <= value < extent:
        return None  # an out-of-range index keeps its own error or clamp
    return axis, value % extent


def _take(data: Expr, value: int, axis: int, like: Call) -> Call:
    return Call(get_op("take"), [data, Constant(np.asarray(value, "int64"))],
                {"axis": axis, "mode": like.attrs["mode"]})


def _take_before_transpose(node: Call, transpose: Call, axis: int, value: int) -> Expr:
    source = transpose.args[0]
    perm = get_op("transpose").permutation(len(source.checked_type.shape),
                                           transpose.attrs["axes"])
    along = perm[axis]
    rest = [p - (p > along) for p in perm if p != along]
    return Call(get_op("transpose"), [_take(source, value, along, node)], {"axes": rest})


def _take_before_reshape(node: Call, reshape: Call, axis: int, value: int) -> Expr | None:
    source = reshape.args[0].checked_type
    shape = reshape.checked_type
    assert isinstance(source, TensorType) and isinstance(shape, TensorType)
    before = math.prod(shape.shape[:axis])
    for along, extent in enumerate(source.shape):
        if math.prod(source.shape[:along]) == before and extent == shape.shape[axis]:
            out = node.checked_type
            assert isinstance(out, TensorType)
            if 0 in out.shape:  # newshape reads 0 as "copy the input's dimension"
                return None
            taken = _take(reshape.args[0], value, along, node)
            return Call(get_op("reshape"), [taken], {"newshape": out.shape})
    return None


# -- rules: casts ------------------------------------------------------------------------------

def _identity_cast() -> PatternCallback:
    # cast(x, dtype=x.dtype) -> x
    x = wildcard()

    def drop(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        return m[x] if _same_type(post, m[x]) else None

    return rule(is_op("cast")(x), drop, "identity_cast")


def _exact_in(src: str, dst: str) -> bool:
    """Whether every value of dtype ``src`` is represented exactly in ``dst``."""
    if not np.can_cast(src, dst, casting="safe"):
        return False
    source, target = np.dtype(src), np.dtype(dst)
    if source.kind in "iu" and target.kind == "f":
        # NumPy calls int64 -> float64 safe, but 2**53 + 1 does not survive it.
        value_bits = source.itemsize * 8 - (source.kind == "i")
        return value_bits <= np.finfo(target).nmant + 1
    return True


def _merge_casts() -> PatternCallback:
    # cast(cast(x, wide), t) -> cast(x, t)    when every value of x's dtype is exact in `wide`
    x = wildcard()
    inner = is_op("cast")(x)

    def merge(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        if not _exact_in(m[x].checked_type.dtype, m[inner].attrs["dtype"]):
            return None
        return Call(get_op("cast"), [m[x]], {"dtype": post.attrs["dtype"]})

    return rule(is_op("cast")(inner), merge, "merge_casts")


# -- rules: quantizing dequantized codes -------------------------------------------------------

#: Operators that move values without changing them (one operand): a quantize step may look
#: through them for the dequantize step it undoes (a layout transform's padding is zeros,
#: which every 8-bit range holds).
MOVEMENT_OPS = (*RESHAPE_OPS, "transpose", "strided_slice", "copy", "layout_transform")
#: Scales for which quantize(dequantize(q)) is q: (q - z) * s / s lies within 510 x 2^-23 of
#: q - z (|q - z| <= 510 neither overflows nor turns subnormal), and round() gives q - z.
EXACT_SCALES = (2.0 ** -100, 2.0 ** 100)


def _call_of(expr: Expr, *names: str) -> Call | None:
    if isinstance(expr, Call) and isinstance(expr.op, Op) and expr.op.name in names:
        return expr
    return None


def _scalar_value(expr: Expr) -> float | None:
    if isinstance(expr, Constant) and expr.data.size == 1 and expr.data.dtype.kind == "f":
        return float(expr.data.reshape(()))
    return None


def _moved(expr: Expr) -> tuple[Expr, list[Expr]]:
    """``expr`` without the movement ops (and items of a split) above it, and those ops,
    the outermost first."""
    moves: list[Expr] = []
    while True:
        if _call_of(expr, *MOVEMENT_OPS):
            moves.append(expr)
            expr = expr.args[0]  # type: ignore[union-attr]
        elif isinstance(expr, TupleGetItem) and _call_of(expr.tuple_value, "split"):
            moves.append(expr)
            expr = expr.tuple_value.args[0]  # type: ignore[union-attr]
        else:
            return expr, moves


def _remade(value: Expr, moves: list[Expr]) -> Expr:
    """``moves`` (outermost first) applied again to ``value``."""
    for move in reversed(moves):
        if isinstance(move, TupleGetItem):
            split = move.tuple_value
            value = TupleGetItem(Call(split.op, [value], split.attrs, split.span), move.index)
        else:
            value = Call(move.op, [value], move.attrs, move.span)
    return value


def codes_bounds(expr: Expr) -> tuple[int, int, bool] | None:
    """(low, high, NaN-free) when ``expr`` takes only whole numbers from low to high (or NaN,
    unless NaN-free) by its form: a QuantizeLinear's codes (``codes_range``), their kept form
    ``where(isnan(q), 0, q)``, 8-bit integers cast to float32, any of those moved, plus zero,
    concatenated or max-pooled; else None."""
    from .int8_products import codes_range

    low, high, nan_free = 0, 0, True
    pending: list[tuple[Expr, bool]] = [(expr, False)]
    seen: set[tuple[Expr, bool]] = set()  # (a value shared by parts is walked once)
    while pending:
        item = pending.pop()
        if item in seen:
            continue
        seen.add(item)
        value, zero_kept = item
        value = _moved(value)[0]
        shifted = _call_of(value, "add")
        kept = _call_of(value, "where")
        cast = _call_of(value, "cast")
        joined = _call_of(value, "concatenate")
        pooled = _call_of(value, "nn.max_pool2d")
        if pooled is not None and windows_hold_input(pooled):
            pending.append((pooled.args[0], zero_kept))  # (a maximum of codes is a code)
        elif shifted is not None and _scalar_value(shifted.args[1]) == 0.0:
            pending.append((shifted.args[0], zero_kept))
        elif kept is not None and _call_of(kept.args[0], "isnan") is not None \
                and kept.args[0].args[0] is kept.args[2] and _scalar_value(kept.args[1]) == 0.0:
            pending.append((kept.args[2], True))
        elif joined is not None and isinstance(joined.args[0], TupleExpr):
            pending.extend((field, zero_kept) for field in joined.args[0].fields)
        elif cast is not None and value.checked_type.dtype == "float32" \
                and cast.args[0].checked_type.dtype in ("uint8", "int8"):
            info = np.iinfo(cast.args[0].checked_type.dtype)
            low, high = min(low, int(info.min)), max(high, int(info.max))
        else:
            bounds = codes_range(value)
            if bounds is None:
                return None
            # (a kept NaN is 0: the range holds 0 either way, as every 8-bit range does)
            low, high = min(low, bounds[0]), max(high, bounds[1])
            nan_free = nan_free and zero_kept
    return low, high, nan_free


def windows_hold_input(pool: Call) -> bool:
    """Whether every window of the max pool ``pool`` holds at least one input value, so that
    its maximum is one of its input's values, never the padding's -inf: no dilation (whose
    taps may all fall on padding) and no ceil_mode overhang (the op already refuses padding
    as wide as its window)."""
    attrs = pool.attrs
    return all(d == 1 for d in attrs.dilation) and not attrs.ceil_mode


def _max_pool_of_monotone() -> PatternCallback:
    # max_pool(x * s) -> max_pool(x) * s,  max_pool(x - z) -> max_pool(x) - z
    #     s a positive and z a finite float scalar: both are non-decreasing in x, rounding
    #     too, and keep -inf (the padding) and NaN, so the maximum commutes with them. A
    #     DequantizeLinear before a max pool then follows it, where the QuantizeLinear after
    #     the pool undoes it (quantized_dequantized): the pool reads the codes.
    x = wildcard()
    step = is_op("multiply")(x, is_constant()) | is_op("subtract")(x, is_constant())
    pool = is_op("nn.max_pool2d")(step)

    def move(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        inner = post.args[0]
        value = _scalar_value(inner.args[1])
        if value is None or not math.isfinite(value) or m[x].checked_type.dtype != "float32" \
                or (inner.op.name == "multiply" and value <= 0) \
                or inner.args[1].checked_type.dtype != "float32" \
                or not _same_type(inner, m[x]):
            return None
        pooled = Call(post.op, [m[x]], post.attrs, post.span)
        return Call(inner.op, [pooled, inner.args[1]], inner.attrs, inner.span)

    return rule(pool, move, "max_pool_of_monotone")


def _kept_codes_without_nan() -> PatternCallback:
    # where(isnan(c), 0, c) -> c    (c codes that are never NaN: codes_bounds)
    codes = wildcard()
    kept = is_op("where")(is_op("isnan")(codes), is_constant(), codes)

    def drop(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        bounds = codes_bounds(m[codes])
        if bounds is None or not bounds[2] or _scalar_value(post.args[1]) != 0.0 \
                or not _same_type(post, m[codes]):
            return None
        return m[codes]

    return rule(kept, drop, "kept_codes_without_nan")


def _dequantized(expr: Expr) -> tuple[Expr, list[Expr], float, float, int, int] | None:
    """(the codes, the movement ops above the dequantize step (outermost first), scale, zero
    point, the codes' range) when ``expr`` is ``movement*((c - z) * s)`` (or ``c * s``) of
    NaN-free codes ``c`` (:func:`codes_bounds`); else None."""
    inner, moves = _moved(expr)
    product = _call_of(inner, "multiply")
    if product is None:
        return None
    values, scale = product.args
    factor, point = _scalar_value(scale), 0.0
    shifted = _call_of(values, "subtract")
    if shifted is not None:
        values, point = shifted.args[0], _scalar_value(shifted.args[1])  # type: ignore[assignment]
    bounds = codes_bounds(values)
    if factor is None or point is None or bounds is None or not bounds[2] \
            or values.checked_type.dtype != "float32":
        return None
    return values, moves, factor, point, bounds[0], bounds[1]


def _quantized_dequantized() -> PatternCallback:
    # clip(round(movement*((c - z) * s) / s) + z, lo, hi) -> movement*(c + 0.0)
    #     c NaN-free codes (the kept codes of a dequantize step, bytes cast to float) within
    #     [lo, hi]; the same s and z; "+ 0.0" only where the quantize step adds its zero point
    #     (which turns -0.0 into +0.0 as that does). A quantize step of a concatenation is one
    #     of each part (it is elementwise): the parts so dequantized are their codes.
    operand = wildcard()
    rounded = is_op("round")(is_op("divide")(operand, is_constant()))
    quantize = is_op("clip")(is_op("add")(rounded, is_constant()) | rounded)

    def undo(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        steps = _quantize_steps(post)
        if steps is None:
            return None
        data = m[operand]
        joined = _call_of(data, "concatenate")
        if joined is None or not isinstance(joined.args[0], TupleExpr):
            return _undone(data, steps)
        parts = [_undone(part, steps) for part in joined.args[0].fields]
        if all(part is None for part in parts):
            return None
        fields = [part if part is not None else _requantized(field, post)
                  for part, field in zip(parts, joined.args[0].fields)]
        return Call(joined.op, [TupleExpr(fields)], joined.attrs, joined.span)

    return rule(quantize, undo, "quantized_dequantized")


def _quantize_steps(clip: Call) -> tuple[float, float, bool, float, float] | None:
    """(scale, zero point, whether it adds the zero point, low, high) of a quantize step
    ``clip(round(x / s) [+ z], low, high)``; None for a scale outside EXACT_SCALES."""
    inner, point = clip.args[0], 0.0
    adds = inner.op.name == "add"
    if adds:
        point, inner = _scalar_value(inner.args[1]), inner.args[0]
    scale = _scalar_value(inner.args[0].args[1])
    if point is None or scale is None or not EXACT_SCALES[0] <= scale <= EXACT_SCALES[1]:
        return None
    return scale, point, adds, clip.attrs.a_min, clip.attrs.a_max


def _undone(data: Expr, steps: tuple[float, float, bool, float, float]) -> Expr | None:
    """The codes that quantizing ``data`` with ``steps`` gives back, when ``data`` is their
    dequantization (moved); else None."""
    found = _dequantized(data)
    if found is None:
        return None
    codes, moves, factor, zero, low, high = found
    scale, point, adds, lo, hi = steps
    if not (factor == scale and zero == point and lo <= low and high <= hi):
        return None
    if adds:
        codes = Call(get_op("add"), [codes, Constant(np.array(0.0, np.float32))])
    return _remade(codes, moves)


def _requantized(part: Expr, clip: Call) -> Expr:
    """The quantize step ``clip`` (``clip(round(x / s) [+ z])``) applied to ``part``."""
    inner = clip.args[0]
    adds = inner.op.name == "add"
    rounded = inner.args[0] if adds else inner
    divide = rounded.args[0]
    out: Expr = Call(rounded.op, [Call(divide.op, [part, divide.args[1]], divide.attrs)],
                     rounded.attrs)
    if adds:
        out = Call(inner.op, [out, inner.args[1]], inner.attrs)
    return Call(clip.op, [out], clip.attrs, clip.span)


# -- rules: arithmetic with a neutral constant -------------------------------------------------

def _all_ones(const: Expr) -> bool:
    return isinstance(const, Constant) and bool(np.all(const.data == 1))


def _neutral_for_add(const: Expr) -> bool:
    # -0.0 is the identity of float addition (+0.0 + -0.0 = +0.0, -0.0 + -0.0 = -0.0);
    # +0.0 is not (-0.0 + +0.0 = +0.0).
    data = const.data  # type: ignore[attr-defined]
    zeros = bool(np.all(data == 0))
    return zeros and (data.dtype.kind != "f" or bool(np.all(np.signbit(data))))


def _neutral_for_subtract(const: Expr) -> bool:
    # x - (+0.0) is x for every x, -0.0 included; x - (-0.0) is x + 0.0, which is not.
    data = const.data  # type: ignore[attr-defined]
    zeros = bool(np.all(data == 0))
    return zeros and (data.dtype.kind != "f" or not bool(np.any(np.signbit(data))))


def _float_ones(const: Expr) -> bool:
    return const.data.dtype.kind == "f" and _all_ones(const)  # type: ignore[attr-defined]


def _neutral_operand(op_name: str, neutral: Pattern, name: str) -> PatternCallback:
    x = wildcard()

    def drop(pre: Expr, post: Expr, m: Bindings) -> Expr | None:
        return m[x] if _same_type(post, m[x]) else None  # the constant must not broadcast x

    return rule(is_op(op_name)(x, neutral), drop, name)


def _double_negation() -> PatternCallback:
    # negative(negative(x)) -> x
    x = wildcard()
    return rule(is_op("negative")(is_op("negative")(x)), lambda pre, post, m: m[x],
                "double_negation")


def _rules() -> list[PatternCallback]:
    return [
        _identity_by_shape(),
        _merge_reshapes(),
        _identity_transpose(),
        _merge_transposes(),
        _transpose_as_reshape(),
        _elementwise_before_reshape(),
        _elementwise_of_reshapes(),
        _take_before_movement(),
        _identity_cast(),
        _merge_casts(),
        _max_pool_of_monotone(),
        _quantized_dequantized(),
        _kept_codes_without_nan(),
        # x * 1 -> x, 1 * x -> x
        _neutral_operand("multiply", is_constant().where(_all_ones), "multiply_by_one"),
        # x / 1 -> x    (floats)
        _neutral_operand("divide", is_constant().where(_float_ones), "divide_by_one"),
        # x + 0 -> x, 0 + x -> x    (integers; floats only when the zeros are -0.0)
        _neutral_operand("add", is_constant().where(_neutral_for_add), "add_zero"),
        # x - 0 -> x    (integers; floats when the zeros are +0.0)
        _neutral_operand("subtract", is_constant().where(_neutral_for_subtract),
                         "subtract_zero"),
        _double_negation(),
    ]


#: The rewrite rules SimplifyExpr applies, in the order they are tried at each node.
SIMPLIFY_RULES: list[PatternCallback] = _rules()


def simplify_expr(expr: Expr) -> Expr:
    """Apply :data:`SIMPLIFY_RULES` to an expression until none applies."""
    return rewrite(SIMPLIFY_RULES, expr)


@module_pass(opt_level=0, name="SimplifyExpr")
class SimplifyExpr:
    """Remove identity reshapes, transposes and casts, merge chains of reshapes, transposes
    and value-preserving casts, and drop arithmetic with a neutral constant (``x * 1``,
    ``x - 0``) — each only where values and the result type stay exactly the same."""

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        return rewrite(SIMPLIFY_RULES, mod,
                       max_iterations=ctx.get_config("PatternRewrite.max_iterations"))


register_pass("SimplifyExpr", SimplifyExpr)
