"""PackMatmulWeights: pack the constant right operands of matrix products once, at compile time.

A product whose right operand is packed by its compute (:func:`opfusion.topi.nn.panel_width`:
enough output rows, columns in whole vectors, not the dot form) copies that operand into
column panels ``(N/c, K, c)`` on every call: for a transformer's 768x3072 weight that is 9 MB
moved per run; one whose operand runs along the contraction (``nn.dense``) takes the dot
form instead, which is slower from 8 rows up. When the operand is a constant (``nn.matmul``
with a (K, N) weight, or ``nn.dense`` with an (N, K) one, as ONNX's MatMul and Gemm
import), this pass makes the call ``nn.matmul_packed(a, panels)`` with the weight packed into
panels here, once (whatever its size: FoldConstant would leave a result above its
``max_elements`` unfolded), and the kernel reads the panels directly. The panels are the
widest of three, two or one vectors whose zero columns, padding the weight to whole panels,
add little (:func:`opfusion.topi.nn.padded_panel_width`); columns in no whole vectors (a
vocabulary's 30522) are padded to whole vectors. The product's ``columns`` attribute then
names the real columns, and its kernel computes the zero ones with their panel and drops
them (a 128 x 768 x 30522 head: 53 -> 19 ms on AVX-512, 77 -> 42 ms on AVX2, against its
input copied into a padded operand and its weight packed on every call). A constant along
the contraction is packed as well when there are 8 rows or more. Products
with fewer rows (matrix-vector: a decoder's token step, a CNN's classifier) are packed too,
in panels as wide as their register tile (:func:`opfusion.topi.nn.few_rows_panel_width`: 8
vectors for one row), so that each task streams one contiguous panel instead of a few
vectors of every row.

The same pass pads products whose result the register tiles cannot cut evenly: a vision
transformer's attention over 197 tokens multiplies (197, 64) by (64, 197) and (197, 197) by
(197, 64) per head, and 197 (a prime) leaves the tile one row by one scalar column (7-12
GFLOP/s). Such a product of two computed operands, big enough (PAD_MIN_WORK), gets its rows
padded with zeros to whole register tiles of rows and its columns to a multiple of the target's
vector lanes (``nn.pad`` of the operands), and its result cropped back (``strided_slice``):
two small copies buy whole register tiles. A packed product needs no such padding: its
compute rounds its rows up to whole tiles itself (the extra rows read the last one) and
crops them in the same kernel, so ViT's 197 tokens cost no copy and keep the epilogue (bias,
GELU, residual add) in the product's kernel.

An int32 product of two computed 8-bit operands (an attention's, as QLinearMatMul and
MatMulInteger import it) whose sums stay within 2^24 (:func:`.int8_products.exact_in_float`)
becomes the float product of the same values, cast back to int32: exact, and float products
run at two or three times the speed of int32 multiplies (``vpmulld``).

The pass needs opt_level 3 and a target (the current one, or the host);
``disabled_pass=["PackMatmulWeights"]`` turns it off."""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op, get_op
from ..ir.types import TensorType
from ..ir.visitor import ExprMutator, post_order
from ..target import Target, as_target
from ..topi.nn import (
    PACK_MIN_ROWS,
    few_rows_panel_width,
    padded_panel_width,
    register_rows,
)
from .context import PassContext
from .int8_products import (
    QuantizedProduct,
    corrected,
    exact_in_float,
    quantized_operands,
    word_panels,
    word_values,
    words_beat_float,
)
from .pass_infra import Pass, module_pass, pass_factory, register_pass


@pass_factory
def PackMatmulWeights(target: Target | str | None = None) -> Pass:  # noqa: N802 - a pass name
    """Products with constant right operands read panels packed at compile time (see the
    module docstring)."""
    return _pack_matmul_weights_pass(target)


@module_pass(opt_level=3, name="PackMatmulWeights")
class _pack_matmul_weights_pass:  # noqa: N801 - a pass class, named like the others
    def __init__(self, target: Target | str | None = None) -> None:
        self.target = target

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        target = as_target(self.target)
        new = IRModule()
        with target:
            for name, func in mod.functions.items():
                if isinstance(func, Function) and not func.is_primitive:
                    infer_type(func, mod)
                    func = _Packer(func, target).visit(func)
                new[mod.get_global_var(name)] = func
        return new


def packed_columns(call: Call) -> tuple[int, str, int] | None:
    """(panel width, the weight's layout: "KN" or "NK", the columns padded to whole panels)
    when ``call`` is a float32 product of a 2-D constant right operand that is packed at
    compile time; else None."""
    if not (isinstance(call.op, Op) and call.op.name in ("nn.matmul", "nn.dense")):
        return None
    data, weight = call.args
    a, w, out = data.checked_type, weight.checked_type, call.checked_type
    if not (isinstance(weight, Constant) and isinstance(a, TensorType)
            and isinstance(w, TensorType) and isinstance(out, TensorType)
            and a.dtype == w.dtype == out.dtype == "float32" and w.ndim == 2 and a.ndim >= 2):
        return None
    rows = 1
    for dim in a.shape[:-1]:
        rows *= dim
    if call.op.name == "nn.dense":
        layout = "NK"
    else:
        if call.attrs.transpose_a:
            return None
        layout = "NK" if call.attrs.transpose_b else "KN"
    width = w.shape[0] if layout == "NK" else w.shape[1]
    target = Target.current()
    if target is None:
        return None
    # A weight along the contraction is packed too when there are rows enough: packing is
    # free at compile time, and panels beat the dot form's lane sums from 8 rows up (ViT's
    # output projection, 197 x 768 x 768: 118 GFLOP/s as dot products, 220 in panels). Its
    # columns are padded with zeros to whole panels where that costs little (power-of-two
    # widths in panels of three vectors) or the columns are in no whole vectors.
    cols, padded = _panel_width(rows, width, target)
    return (cols, layout, padded) if cols else None


def _panel_width(rows: int, width: int, target: Target) -> tuple[int, int]:
    """(columns per panel, columns padded to whole panels) of a constant right operand of a
    product of ``rows`` rows, or (0, width) to leave it."""
    cols, padded = padded_panel_width(rows, width, target)
    if not cols and rows < PACK_MIN_ROWS:
        # Too few rows for the compute to pack on every call, but packing a constant is free:
        # panels as wide as a few rows' register tile, streamed instead of strided rows (a
        # decoder's token step through a vocabulary of 50257 columns: padded to whole vectors).
        cols, padded = few_rows_panel_width(rows, width, target)
    return cols, padded


#: Multiply-adds below which a product is not padded (the copies would cost more).
PAD_MIN_WORK = 1 << 20


def padded_sizes(call: Call, lanes: int, row_tile: int) -> tuple[int, int] | None:
    """(rows, columns) to pad a float32 ``nn.matmul`` / ``nn.batch_matmul`` of computed
    operands to, when its rows are not a multiple of ``row_tile`` (the rows of the target's
    register tile, :func:`opfusion.topi.nn.register_rows`) or its columns of ``lanes`` and
    it is big enough; else None."""
    if not (isinstance(call.op, Op) and call.op.name in ("nn.matmul", "nn.batch_matmul")):
        return None
    a, b = (arg.checked_type for arg in call.args)
    out = call.checked_type
    if not (isinstance(a, TensorType) and isinstance(b, TensorType)
            and isinstance(out, TensorType) and a.dtype == b.dtype == out.dtype == "float32"
            and a.ndim >= 2 and b.ndim >= 2 and a.ndim == b.ndim):
        return None
    if call.op.name == "nn.matmul" and (call.attrs.transpose_a or call.attrs.transpose_b):
        return None
    if call.op.name == "nn.batch_matmul" and (call.attrs.transpose_a
                                              or call.attrs.transpose_b is not False):
        return None
    rows, depth, cols = a.shape[-2], a.shape[-1], b.shape[-1]
    work = out.size * depth
    if rows < 2 * row_tile or cols < lanes or work < PAD_MIN_WORK:
        return None
    padded = (-(-rows // row_tile) * row_tile, -(-cols // lanes) * lanes)
    return None if padded == (rows, cols) else padded


def _packed(weight: Constant, layout: str, cols: int, padded: int) -> Constant:
    """The weight in column panels ``NK<cols>n``, its columns first padded with zeros to
    ``padded``: packed here, not left to FoldConstant, which leaves results above
    ``FoldConstant.max_elements`` unfolded (packed that way, ZFNet's 25088 x 4096 classifier
    weight was repacked on every call: 134 ms a run)."""
    data = weight.data
    axis = 0 if layout == "NK" else 1
    if padded != data.shape[axis]:
        widths = [(0, 0), (0, 0)]
        widths[axis] = (0, padded - data.shape[axis])
        data = np.pad(data, widths)
    attrs = {"src_layout": layout, "dst_layout": f"NK{cols}n"}
    return Constant(np.ascontiguousarray(get_op("layout_transform").reference(data, **attrs)))


def _padded(expr: Expr, ndim: int, axis: int, extra: int) -> Expr:
    widths = [0] * (2 * ndim)
    widths[2 * axis + 1] = extra
    return Call(get_op("nn.pad"), [expr, Constant(np.zeros((), "float32"))],
                {"pad_width": widths})


class _Packer(ExprMutator):
    def _init(self, func: Function) -> None:
        super().__init__()
        for node in post_order(func.body, into_functions=False):  # fused groups stay
            if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
                self.memo[node.op] = node.op

    def __init__(self, func: Function, target: Target) -> None:
        self.target = target
        self.lanes = target.vector_lanes("float32")
        self.row_tile = register_rows(target)
        self.per_word = word_values(target)
        self.dequantized = words_beat_float(target)
        #: nn.byte_words of each rewritten activations (by the expression's id, kept alive in
        #: the value): the products of one input (queries, keys, values) share one kernel
        self.words: dict[int, tuple[Expr, Expr]] = {}
        self._init(func)

    def visit_call(self, call: Call) -> Expr:
        new = super().visit_call(call)
        quantized = (quantized_operands(call, self.dequantized) if self.per_word
                     else None)
        if quantized is not None and isinstance(new, Call):
            words = self._words_product(call, new, quantized)
            if words is not None:
                return words
        if isinstance(new, Call) and exact_in_float(call):
            # an int32 product of two computed 8-bit operands: float products, exactly
            floats = Call(new.op, [Call(get_op("cast"), [arg], {"dtype": "float32"})
                                   for arg in new.args],
                          {**new.attrs, "out_dtype": "float32"}, new.span)
            padding = padded_sizes(call, self.lanes, self.row_tile)
            if padding is not None:
                floats = self._pad(call, floats, *padding)
            return Call(get_op("cast"), [floats], {"dtype": "int32"})
        packing = packed_columns(call)
        # A product packed at compile time takes care of its rows itself; only products of
        # computed operands (or unpacked ones) are padded.
        padding = (padded_sizes(call, self.lanes, self.row_tile) if packing is None
                   else None)
        if padding is not None and isinstance(new, Call):
            return self._pad(call, new, *padding)
        if packing is None or not isinstance(new, Call):
            return new
        cols, layout, padded = packing
        data, weight = new.args
        assert isinstance(weight, Constant)  # (packed_columns asked for one)
        panels = _packed(weight, layout, cols, padded)
        a_type, out_type = call.args[0].checked_type, call.checked_type
        width = out_type.shape[-1]
        rows = a_type.size // a_type.shape[-1]
        # Every row in the tiled axis: (197, 1, 768) has 197 rows, not 1. (A reshape or a
        # crop after the product ends its kernel before the epilogue: only when needed.)
        flatten = a_type.shape[-2] != rows
        if flatten:
            data = Call(get_op("reshape"), [data], {"newshape": [rows, a_type.shape[-1]]})
        # Rows that do not cut into whole register tiles need no padding here: the packed
        # product computes whole tiles and crops them in its kernel (topi's matmul_packed).
        # Zero columns that fill the last panel are computed and dropped in its kernel.
        out: Expr = Call(get_op("nn.matmul_packed"), [data, panels],
                         {"out_dtype": new.attrs.get("out_dtype"),
                          "columns": width if padded != width else 0}, new.span)
        if flatten:
            out = Call(get_op("reshape"), [out], {"newshape": list(out_type.shape)})
        return out

    def _words_product(self, old: Call, new: Call, parts: QuantizedProduct) -> Expr | None:
        """The product ``old`` of 8-bit activations by an int8 weight (see
        :func:`quantized_operands`) as a product of words (:mod:`.int8_products`), or
        None where its columns take no panels. The parts are ``old``'s; their rewritten forms
        are looked up in the memo."""
        out_type = old.checked_type
        a_type = parts.activations.checked_type
        rows = a_type.size // a_type.shape[-1]
        width = out_type.shape[-1]
        cols, padded = _panel_width(rows, width, self.target)
        if not cols:
            return None
        data = self.visit(parts.activations)
        if a_type.dtype != parts.codes:  # float codes, integers in the 8-bit range
            data = Call(get_op("cast"), [data], {"dtype": parts.codes})
        point: Expr | None = None
        if isinstance(parts.zero_point, Expr):
            point = self.visit(parts.zero_point)
        elif parts.zero_point:
            point = Constant(np.array(parts.zero_point, np.int32))
        if id(data) not in self.words:
            self.words[id(data)] = (data, Call(get_op("nn.byte_words"), [data],
                                               {"per_word": self.per_word}))
        words = self.words[id(data)][1]
        flatten = a_type.shape[-2] != rows
        if flatten:
            words = Call(get_op("reshape"), [words], {"newshape": [
                rows, -(-a_type.shape[-1] // self.per_word)]})
        panels = word_panels(parts.weight, cols, padded, self.per_word)
        out: Expr = Call(get_op("nn.matmul_packed"), [words, Constant(panels)],
                         {"columns": width if padded != width else 0, "words": self.per_word},
                         new.span)
        out = corrected(out, parts.codes, point, parts.weight)
        if parts.scale is not None:  # a float product: the sums scaled once per column
            out = Call(get_op("multiply"), [Call(get_op("cast"), [out], {"dtype": "float32"}),
                                            Constant(parts.scale)])
        if flatten:
            out = Call(get_op("reshape"), [out], {"newshape": list(out_type.shape)})
        return out

    @staticmethod
    def _pad(old: Call, new: Call, rows: int, cols: int) -> Expr:
        a, b = new.args
        a_type, b_type = old.args[0].checked_type, old.args[1].checked_type
        ndim = a_type.ndim
        if rows != a_type.shape[-2]:
            a = _padded(a, ndim, ndim - 2, rows - a_type.shape[-2])
        if cols != b_type.shape[-1]:
            b = _padded(b, ndim, ndim - 1, cols - b_type.shape[-1])
        product = Call(new.op, [a, b], new.attrs, new.span)
        out = old.checked_type
        return Call(get_op("strided_slice"), [product],
                    {"begin": [0, 0], "end": [out.shape[-2], out.shape[-1]],
                     "axes": [ndim - 2, ndim - 1]})


register_pass("PackMatmulWeights", PackMatmulWeights)

__all__ = ["PAD_MIN_WORK", "PackMatmulWeights", "packed_columns", "padded_sizes"]
