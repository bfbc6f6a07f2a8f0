"""WordConvolutions: quantized convolutions as products of words, 8-bit by 8-bit in int32.

ONNX Runtime's ``quantize_static`` leaves a vision model's convolutions as QDQ pairs: each
convolution reads ``DequantizeLinear(QuantizeLinear(x))`` (the import keeps the pair in
float: ``(where(isnan(c), 0, c) - z) * s``, ``c`` the float codes of ``clip(round(x / s) +
z, 0, 255)``) and a weight that is a DequantizeLinear of int8 codes per output channel, folded
into a float constant (FoldScaleAxis may have moved ``s`` into it too). Computed in float,
every multiply-add is a float one; ResNet-18 ran at 0.43x ONNX Runtime's int8 speed.

After the layout pass, such a blocked convolution (``nn.conv2d_nchwc`` of one group) whose
weight is exactly an int8 tensor times a scale per output channel
(:func:`.int8_products.int8_columns`) becomes::

    cast(nn.conv2d_nchwc(nn.byte_words(cast(c, uint8)), words, words=w, pad_value=z)
         - z * weight_sums, float32) * (s * channel_scales)

- the codes are cast to bytes where they are computed (the quantizing kernel writes a
  quarter of the float bytes), and ``nn.byte_words`` packs ``w`` input channels of each pixel
  into an int32 word (:func:`word_values`: 4 bytes with VNNI, 2 16-bit halves with AVX2): for
  bytes whose blocks are whole words, the same memory, which the executor aliases (no
  kernel); the convolution's padding holds words of the zero point ``z`` (whose real value
  is 0);
- the weight holds the int8 codes, ``w`` input channels interleaved in each int32 of its
  blocked layout (OIHW<i>i<o>o with ceil(i / w) words a block); the register tiles broadcast a
  word of the input and multiply-add a vector of the weight with one ``vpdpbusd``
  (``dot4_u8s8``) or a ``vpmaddwd`` and an add (``dot2_s16``) per accumulator;
- sum (c - z) q = sum c q - z sum q: the zero point times each output channel's sum of the
  weight is subtracted in the epilogue, and the exact int32 sums are scaled once per channel.

An int32 convolution of bytes (``cast(x, int32)`` less a constant zero point, by an int32
constant whose values fit int8: QLinearConv's and ConvInteger's import,
:func:`integer_convolution`) becomes the same convolution of words, whose int32 sums (less the
zero point's) are its result, exactly; AlterOpLayout blocks it where the target has words.
Words take one group: a grouped (depthwise) one whose sums stay within 2^24, where float32
is exact (:func:`float_exact_weight`), runs as a float convolution, cast back to int32.

The float form's result differs from the float convolution by the float one's rounding (about
1e-7 of its magnitude), as ONNX Runtime's and OpenVINO's integer kernels do on the same model.

Only where words outrun float products (:func:`words_beat_float`: VNNI, AVX2); with VNNI
the layout pass leaves such 3x3 convolutions direct rather than Winograd's (four
multiply-adds an instruction against Winograd's 2.25x fewer of them; see
:func:`takes_words`). The pass needs opt_level 3 and a target;
``disabled_pass=["WordConvolutions"]`` turns it off."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op, OpPatternKind, get_op
from ..ir.visitor import ExprMutator, post_order
from ..target import Target, as_target
from .context import PassContext
from .int8_products import (
    FLOAT_EXACT,
    MAX_DEPTH,
    dequantized_codes,
    int8_columns,
    pack_words,
    widened_bytes,
    widened_magnitude,
    word_values,
    words_beat_float,
    zero_point_value,
)
from .pass_infra import Pass, module_pass, pass_factory, register_pass
from .simplify_expr import codes_bounds


@pass_factory
def WordConvolutions(target: Target | str | None = None) -> Pass:  # noqa: N802 - a pass name
    """Blocked convolutions of quantized data by int8 weights as products of words (see the
    module docstring)."""
    return _word_convolutions_pass(target)


@module_pass(opt_level=3, name="WordConvolutions")
class _word_convolutions_pass:  # noqa: N801 - a pass class, named like the others
    def __init__(self, target: Target | str | None = None) -> None:
        self.target = target

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        target = as_target(self.target)
        per_word = word_values(target)
        if not per_word:
            return mod
        # (int32 convolutions of bytes take words wherever there are words; float ones of
        # dequantized codes only where words outrun float products)
        floats = words_beat_float(target)
        new = IRModule()
        for name, func in mod.functions.items():
            if isinstance(func, Function) and not func.is_primitive:
                infer_type(func, mod)
                func = _Rewriter(per_word, floats).find(func).visit(func)
            new[mod.get_global_var(name)] = func
        return new


def takes_words(target: Target) -> bool:
    """Whether a quantized 3x3 convolution on ``target`` should stay direct (and take words)
    rather than take Winograd's float transform: with VNNI, whose ``vpdpbusd`` does four
    times a float multiply-add's work (Winograd F(2x2) saves 2.25x of them and keeps
    floats). AVX2's pairs do about a float multiply-add's work: Winograd stays."""
    return word_values(target) == 4 and words_beat_float(target)


@dataclass(frozen=True)
class QuantizedConvolution:
    """A convolution of quantized data by an int8 weight: the float ``codes`` (integers of
    ``dtype``'s range), their zero point and scale, the weight's int8 codes (as the
    convolution's own weight) and each output channel's scale. For an int32 convolution of
    8-bit data, ``codes`` are those bytes and ``channel_scales`` None: the int32 sums are the
    result."""

    codes: Expr
    dtype: str
    zero_point: int
    scale: float
    weight: np.ndarray
    channel_scales: np.ndarray | None


def quantized_convolution(data: Expr, weight: Expr, out_axis: int) -> QuantizedConvolution | None:
    """The parts of a convolution of ``data`` by ``weight`` when ``data`` is dequantized codes
    (:func:`.int8_products.dequantized_codes`) and ``weight`` a float32 constant that is
    exactly an int8 tensor times a scale per output channel (``out_axis``: the weight's
    axis, or its two blocked axes ``(block, lane)`` as a tuple, of output channels); else
    None."""
    found = dequantized_codes(data)
    if found is None or not isinstance(weight, Constant) or weight.data.dtype != np.float32:
        return None
    codes, dtype, zero_point, scale = found
    values = weight.data
    axes = (out_axis,) if isinstance(out_axis, int) else tuple(out_axis)
    rest = [a for a in range(values.ndim) if a not in axes]
    matrix = values.transpose(*rest, *axes).reshape(-1, int(np.prod([values.shape[a]
                                                                     for a in axes])))
    if not 0 < matrix.shape[0] <= MAX_DEPTH or matrix.size == 0:
        return None
    columns = int8_columns(matrix)
    if columns is None:
        return None
    q, channel_scales = columns
    shape = [values.shape[a] for a in (*rest, *axes)]
    back = np.argsort([*rest, *axes])
    codes_weight = q.reshape(shape).transpose(*back)
    return QuantizedConvolution(codes, dtype, zero_point, scale, codes_weight, channel_scales)


def integer_convolution(data: Expr, weight: Expr, out_axis: int | tuple[int, int]
                        ) -> QuantizedConvolution | None:
    """The parts of an int32 convolution of ``data`` = ``cast(x, int32)`` less a constant
    zero point, ``x`` 8-bit (QLinearConv's and ConvInteger's import), by an int32 constant
    ``weight`` whose values fit int8; else None. (``out_axis`` as for
    :func:`quantized_convolution`.)"""
    if not (isinstance(weight, Constant) and weight.data.dtype == np.int32):
        return None
    source, point = widened_bytes(data)
    if source is None:
        return None
    zero_point = 0 if point is None else zero_point_value(point)
    values = weight.data
    axes = (out_axis,) if isinstance(out_axis, int) else tuple(out_axis)
    depth = values.size // int(np.prod([values.shape[a] for a in axes]) or 1)
    if (zero_point is None or not 0 < depth <= MAX_DEPTH or values.min() < -128
            or values.max() > 127):
        return None
    return QuantizedConvolution(source, source.checked_type.dtype, zero_point, 1.0,
                                values.astype(np.int8), None)


def float_exact_weight(data: Expr, weight: Expr, outputs: int) -> np.ndarray | None:
    """The float32 copy of ``weight`` when an int32 convolution of ``data`` = ``cast(x,
    int32)`` less a zero point, ``x`` 8-bit, by the int32 constant ``weight`` (of ``outputs``
    output channels) is exact in float32: each output sums ``weight.size / outputs``
    products, each at most 255 (the bytes less their zero point) times the weight's largest
    magnitude, and all of that stays within :data:`FLOAT_EXACT`; else None."""
    if not (isinstance(weight, Constant) and weight.data.dtype == np.int32 and weight.data.size):
        return None
    if widened_magnitude(data) is None:  # not bytes less a constant zero point
        return None
    depth = weight.data.size // outputs
    if depth * 255 * int(np.abs(weight.data.astype(np.int64)).max()) > FLOAT_EXACT:
        return None
    return weight.data.astype(np.float32)


def word_weight(weight: np.ndarray, per_word: int) -> np.ndarray:
    """An int8 blocked weight (O/o, C/i, KH, KW, i, o) as int32 words (O/o, C/i, KH, KW,
    ceil(i / w), o), ``w`` = ``per_word`` input channels of each output channel in a word, the
    first lowest (bytes, or 16-bit halves: :func:`.int8_products.pack_words`); zero channels
    fill the last word."""
    return pack_words(weight, 4, per_word)


class _Rewriter(ExprMutator):
    """One function's rewrite: its quantized convolutions found first (:meth:`find`), so that
    every other reader of their dequantized codes can read the same bytes."""

    def __init__(self, per_word: int, floats: bool = True) -> None:
        super().__init__()
        self.per_word = per_word
        #: whether float convolutions of dequantized codes take words too
        self.floats = floats
        #: the parts of each convolution that takes words, by the call's id
        self.convolutions: dict[int, tuple[QuantizedConvolution, list[Call]]] = {}
        #: the codes those convolutions read, by id
        self.codes: dict[int, str] = {}  # (their 8-bit dtype)
        #: the bytes of each quantized value (by the rewritten codes' id, kept alive in the
        #: value): the convolutions and the other readers of one input share its cast
        self.bytes: dict[int, tuple[Expr, Expr]] = {}
        #: their words (by the codes' id and the layout transforms' ids, kept alive in the
        #: value): the convolutions of one input (a block's first and its projection) share
        #: them
        self.words: dict[tuple[int, ...], tuple[list[Call], Expr]] = {}

    def find(self, func: Function) -> _Rewriter:
        for node in post_order(func.body, into_functions=False):
            if isinstance(node, Call):
                found = _quantized_blocked_convolution(node, self.floats)
                if found is not None:
                    self.convolutions[id(node)] = found
                    self.codes[id(found[0].codes)] = found[0].dtype
        return self

    def visit_call(self, call: Call) -> Expr:
        new = super().visit_call(call)
        if not isinstance(new, Call):
            return new
        found = self.convolutions.get(id(call))
        if found is not None:
            return self._words(new, *found)
        exact = _float_exact_convolution(new)
        if exact is not None:
            return exact
        kept = _kept_codes(call)
        if kept is not None and id(kept[0]) in self.codes:
            # where(isnan(c), 0, c) is the codes' bytes back in float, exactly (NaN casts to
            # 0): the residual adds read the bytes (a quarter of the floats), and the kernel
            # that quantizes writes the bytes alone
            data = self._bytes(self.visit(kept[0]), kept[1])
            return Call(get_op("cast"), [data], {"dtype": call.checked_type.dtype})
        return self._reading_bytes(call, new)

    def _reading_bytes(self, call: Call, new: Call) -> Call:
        """``new`` reading the bytes of the convolutions' codes, cast back to float, where
        ``call`` is an elementwise operator that reads NaN-free codes themselves (a residual
        add reads max-pooled codes so): the same values, and the codes' kernel writes bytes
        alone."""
        if not (isinstance(call.op, Op) and call.op.pattern <= OpPatternKind.kBroadcast
                and call.op.name not in ("isnan", "where", "cast")):
            return new
        args = list(new.args)
        for index, arg in enumerate(call.args):
            dtype = self.codes.get(id(arg))
            if dtype is None or arg.checked_type.dtype != "float32":
                continue
            bounds = codes_bounds(arg)
            if bounds is None or not bounds[2]:
                continue  # (a NaN code casts to 0)
            data = self._bytes(self.visit(arg), dtype)
            args[index] = Call(get_op("cast"), [data], {"dtype": "float32"})
        if all(a is b for a, b in zip(args, new.args)):
            return new
        return Call(new.op, args, new.attrs, new.span)

    def _bytes(self, codes: Expr, dtype: str) -> Expr:
        if id(codes) not in self.bytes:
            self.bytes[id(codes)] = (codes, Call(get_op("cast"), [codes], {"dtype": dtype}))
        return self.bytes[id(codes)][1]

    def _words(self, new: Call, parts: QuantizedConvolution, transforms: list[Call]) -> Expr:
        codes = self.visit(parts.codes)
        key = (id(codes), *(id(t) for t in transforms))
        if key not in self.words:
            data = codes if parts.channel_scales is None else self._bytes(codes, parts.dtype)
            for transform in reversed(transforms):  # (the stem's NCHW -> NCHW3c)
                data = Call(transform.op, [data], transform.attrs, transform.span)
            self.words[key] = (transforms, Call(get_op("nn.byte_words"), [data],
                                                {"per_word": self.per_word}))
        # the zero point as the words hold it (int8 codes are offset by 128 into bytes)
        point = parts.zero_point + (128 if parts.dtype == "int8" else 0)
        attrs = dict(new.attrs.items())
        attrs.update(words=self.per_word, pad_value=point, out_dtype="int32")
        conv: Expr = Call(get_op("nn.conv2d_nchwc"),
                          [self.words[key][1],
                           Constant(word_weight(parts.weight, self.per_word))],
                          attrs, new.span)
        blocks, lanes = parts.weight.shape[0], parts.weight.shape[5]
        # sum (c - z) q = sum c q - z' sum q
        sums = parts.weight.astype(np.int64).sum(axis=(1, 2, 3, 4)) * point  # (O/o, o)
        if sums.any():
            conv = Call(get_op("subtract"), [conv, Constant(
                sums.astype(np.int32).reshape(1, blocks, 1, 1, lanes))])
        if parts.channel_scales is None:  # an int32 convolution: its sums are the result
            return conv
        scales = (np.float32(parts.scale) * parts.channel_scales).astype(np.float32)
        return Call(get_op("multiply"), [Call(get_op("cast"), [conv], {"dtype": "float32"}),
                                         Constant(scales.reshape(1, blocks, 1, 1, lanes))])


def _float_exact_convolution(call: Call) -> Expr | None:
    """``call`` in float32, cast back to int32, when it is a blocked int32 convolution of
    several groups (a depthwise one: words take one group) that float32 computes exactly
    (:func:`float_exact_weight`); else None."""
    if not (isinstance(call.op, Op) and call.op.name == "nn.conv2d_nchwc"
            and call.attrs.groups > 1 and not call.attrs.words
            and call.checked_type.dtype == "int32"):
        return None
    data, weight = call.args
    weight_type = weight.checked_type
    floats = float_exact_weight(_through_layout_transforms(data)[0], weight,
                                weight_type.shape[0] * weight_type.shape[-1])
    if floats is None:
        return None
    attrs = dict(call.attrs.items())
    attrs["out_dtype"] = "float32"
    conv = Call(call.op, [Call(get_op("cast"), [data], {"dtype": "float32"}), Constant(floats)],
                attrs, call.span)
    return Call(get_op("cast"), [conv], {"dtype": "int32"})


def _quantized_blocked_convolution(call: Call, floats: bool = True
                                   ) -> tuple[QuantizedConvolution, list[Call]] | None:
    """The parts of ``call`` when it is a blocked convolution of one group that takes words
    (:func:`integer_convolution`; with ``floats``, :func:`quantized_convolution` too), and
    the layout transforms between its data and the dequantized codes; else None."""
    if not (isinstance(call.op, Op) and call.op.name == "nn.conv2d_nchwc"):
        return None
    attrs = call.attrs
    if attrs.groups != 1 or attrs.group_window or attrs.words:
        return None
    data, transforms = _through_layout_transforms(call.args[0])
    # the weight's output channels: its blocks (axis 0) and lanes (axis 5)
    if call.checked_type.dtype == "int32":
        parts = integer_convolution(data, call.args[1], (0, 5))
    elif floats and attrs.out_dtype in (None, "float32"):
        parts = quantized_convolution(data, call.args[1], (0, 5))
    else:
        parts = None
    return None if parts is None else (parts, transforms)


def _kept_codes(call: Call) -> tuple[Expr, str] | None:
    """(c, its 8-bit dtype) when ``call`` is ``where(isnan(c), 0, c)`` of dequantized codes
    (the dequantization's first step); else None."""
    found = dequantized_codes(call)
    if found is None or found[2] != 0 or found[3] != 1.0 or call.op.name != "where":
        return None
    return found[0], found[1]


def _through_layout_transforms(data: Expr) -> tuple[Expr, list[Call]]:
    """``data`` without the layout transforms it went through (the stem's input, blocked
    after it was dequantized), and those transforms, the outermost first."""
    transforms: list[Call] = []
    while (isinstance(data, Call) and isinstance(data.op, Op)
           and data.op.name == "layout_transform"):
        transforms.append(data)
        data = data.args[0]
    return data, transforms


register_pass("WordConvolutions", WordConvolutions)

__all__ = ["FLOAT_EXACT", "QuantizedConvolution", "WordConvolutions", "float_exact_weight",
           "integer_convolution",
           "quantized_convolution", "takes_words", "word_weight"]
