"""Prefetch hints (``Stage.prefetch``): lowered to a ``Prefetch`` statement at the head of the
chosen loop, checked for bounds by the interpreter, emitted as ``__builtin_prefetch`` in C
(inside a register tile's reduction loop too), nothing in CUDA; and the packed products that
prefetch their next block of weight panels compute the reference's numbers."""

import re

import numpy as np
import pytest

import opfusion as opf
from opfusion import te
from opfusion.backend import get_backend
from opfusion.backend.cpu.schedules import RULES
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.errors import EvaluationError, ScheduleError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule
from opfusion.target import Target
from opfusion.testing import assert_close
from opfusion.tir import Prefetch
from opfusion.tir.interp import run
from opfusion.tir.stmt import walk_stmts
from opfusion.topi import get_compute
from opfusion.topi.testing import call_over_arrays

needs_cc = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

AVX2 = "c -mattr=+avx2,+fma"
PREFETCH = re.compile(r"__builtin_prefetch\(&\w+\[[^;]*\], 0, 2\);")


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def scaled_copy(ahead: int):
    """``b = 2 * a`` in steps of 8, each step prefetching ``a`` ``ahead`` steps on (clamped
    to the last element unless ``ahead`` is negative: then the index runs past the end)."""
    n = 64
    a = te.placeholder((n,), name="a")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="b")
    s = te.create_schedule(b.op)
    outer, inner = s[b].split(b.op.axis[0], factor=8)
    index = outer * 8 + 8 * abs(ahead)
    s[b].prefetch(a, outer, (te.min(index, n - 1) if ahead >= 0 else index,))
    return s, a, b


def call_arguments(source: str, function: str) -> list[str]:
    """The argument text of every call of ``function`` in ``source`` (parentheses balanced)."""
    found = []
    for match in re.finditer(re.escape(function) + r"\(", source):
        depth, end = 1, match.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(source[end], 0)
            end += 1
        found.append(source[match.end():end - 1])
    return found


def prefetches(func) -> list[Prefetch]:
    return [stmt for stmt in walk_stmts(func.body) if isinstance(stmt, Prefetch)]


def test_a_prefetch_is_a_statement_at_the_head_of_its_loop():
    s, a, b = scaled_copy(2)
    func = opf.lower(s, [a, b], name="copy")
    (hint,) = prefetches(func)
    assert hint.buffer is func.params[0]
    assert "prefetch(a[" in str(func)
    x = normal(64)
    y = np.empty_like(x)
    run(func, x, y)
    np.testing.assert_array_equal(y, 2 * x)


def test_the_interpreter_checks_a_prefetch_index_as_a_load():
    s, a, b = scaled_copy(-2)
    func = opf.lower(s, [a, b], name="copy")
    with pytest.raises(EvaluationError, match="out of range"):
        run(func, normal(64), np.empty(64, "float32"))


def test_prefetch_refuses_what_is_not_a_loop_or_a_tensor_of_the_right_rank():
    a = te.placeholder((8, 8), name="a")
    b = te.compute((8, 8), lambda i, j: a[i, j] + 1.0, name="b")
    c = te.compute((8,), lambda i: a[i, 0] * 2.0, name="c")
    s = te.create_schedule([b.op, c.op])
    with pytest.raises(ScheduleError, match="does not belong to this stage"):
        s[b].prefetch(a, c.op.axis[0], (0, 0))
    with pytest.raises(ScheduleError, match="1 indices; it has 2"):
        s[b].prefetch(a, b.op.axis[0], (0,))
    with pytest.raises(ScheduleError, match="needs a te.Tensor"):
        s[b].prefetch("a", b.op.axis[0], (0, 0))


@needs_cc
def test_c_emits_a_prefetch_and_computes_the_same():
    s, a, b = scaled_copy(2)
    kernel = opf.build(s, [a, b], target=AVX2, name="copy")
    assert len(PREFETCH.findall(kernel.get_source())) == 1
    x = normal(64)
    y = np.empty_like(x)
    kernel(x, y)
    np.testing.assert_array_equal(y, 2 * x)


def test_cuda_emits_no_prefetch():
    s, a, b = scaled_copy(2)
    outer, inner = s[b].leaf_iter_vars
    s[b].bind(outer, te.thread_axis("blockIdx.x"))
    s[b].bind(inner, te.thread_axis("threadIdx.x"))
    func = opf.lower(s, [a, b], name="copy")
    assert prefetches(func)
    source = get_backend(Target("cuda")).generate([func]).code
    assert "prefetch" not in source and "__global__" in source


class PackedProduct:
    """``relu(a @ panels + bias)``: a constant right operand in column panels, as
    PackMatmulWeights leaves it, 22 rows (cropped from whole tiles of 4) by 12 panels."""

    def __init__(self):
        arrays = (normal(22, 24), normal(12, 24, 8, seed=1))
        call, params, values = call_over_arrays(opf.op.nn.matmul_packed, arrays, {})
        self.call = call
        self.bias = normal(96, seed=2)
        product = evaluate(IRModule.from_expr(Function(params, call)), values)
        self.want = np.maximum(product + self.bias, 0)
        self.values = [*values, self.bias]
        self.holders = [te.placeholder(p.type_annotation.shape, "float32", name=p.name_hint)
                        for p in params]
        self.holders.append(te.placeholder((96,), "float32", name="bias"))

    def schedule(self, target: Target, **knobs):
        """The lowered kernel with the rule's default config but ``knobs``, and the config."""
        with target:
            anchor = get_compute("nn.matmul_packed")(self.holders[:2], self.call.attrs,
                                                    self.call.checked_type)
            bias = self.holders[2]
            out = te.compute(anchor.shape, lambda i, j: te.max(anchor[i, j] + bias[j], 0.0),
                             name="relu")
            s = te.create_schedule(out.op)
            rule, space = RULES.find("nn.matmul_packed", anchor, out, target)
            config = space.config(**{**rule.default_config(anchor, out, target), **knobs})
            get_backend(target).schedule(s, anchor, out, "nn.matmul_packed", config)
        return s, out, config


@pytest.mark.parametrize("prefetch", [0, 1])
def test_a_packed_product_prefetches_the_next_block_in_bounds(prefetch):
    product = PackedProduct()
    s, out, config = product.schedule(Target(AVX2), block=2, prefetch=prefetch)
    func = opf.lower(s, [*product.holders, out], name="product")
    # A panel (24 x 8 floats) is 12 lines of 16 floats, over 6 row tiles x 6 steps of 4
    # rows: one line a step.
    assert len(prefetches(func)) == prefetch
    got = np.empty(product.want.shape, "float32")
    run(func, *product.values, got)  # every prefetch index checked against the panels' shape
    assert_close(got, product.want, 1e-5)


@needs_cc
def test_the_prefetch_runs_inside_the_register_tile():
    product = PackedProduct()
    s, out, config = product.schedule(Target(AVX2), block=2, prefetch=1)
    kernel = opf.build(s, [*product.holders, out], target=AVX2, name="product")
    source = kernel.get_source()
    tile = source[source.index("opf_float32x8 acc"):]
    reduction = tile[tile.index("for (int32_t k_outer"):]
    assert PREFETCH.search(reduction.split("\n")[1])  # the first line of the step
    got = np.empty(product.want.shape, "float32")
    kernel(*product.values, got)
    assert_close(got, product.want, 1e-5)


def test_the_default_prefetches_only_constant_panels():
    product = PackedProduct()
    _, _, config = product.schedule(Target(AVX2))
    assert config["prefetch"] == 1
    with Target(AVX2):
        a, b = (te.placeholder(shape, "float32", name=name)
                for name, shape in (("a", (16, 32)), ("b", (32, 64))))
        call, _, _ = call_over_arrays(opf.op.nn.matmul, (normal(16, 32), normal(32, 64)), {})
        anchor = get_compute("nn.matmul")([a, b], call.attrs, call.checked_type)
        rule, space = RULES.find("nn.matmul", anchor, anchor, Target(AVX2))
        assert space.knob("prefetch").values == (0,)


class BlockedConvolution:
    """A 1x1 NCHW8c convolution of 8 input blocks into 4 output blocks at 3 x 5, its tasks
    every row of a tile of 2 output blocks, the input channels in reduction blocks of 2."""

    def __init__(self):
        arrays = (normal(1, 8, 3, 5, 8), normal(4, 8, 1, 1, 8, 8, seed=1) * 0.2)
        attrs = {"data_layout": "NCHW8c", "kernel_layout": "OIHW8i8o", "out_layout": "NCHW8c"}
        call, params, values = call_over_arrays(opf.op.nn.conv2d_nchwc, arrays, attrs)
        self.call, self.values = call, values
        self.want = evaluate(IRModule.from_expr(Function(params, call)), values)
        self.holders = [te.placeholder(p.type_annotation.shape, "float32", name=p.name_hint)
                        for p in params]

    def lowered(self, prefetch: int):
        target = Target(AVX2)
        with target:
            anchor = get_compute("nn.conv2d_nchwc")(self.holders, self.call.attrs,
                                                    self.call.checked_type)
            s = te.create_schedule(anchor.op)
            rule, space = RULES.find("nn.conv2d_nchwc", anchor, anchor, target)
            config = space.config(**{**rule.default_config(anchor, anchor, target),
                                     "channel_tile": 2, "task_blocks": 2, "row_block": 3,
                                     "k_blocks": 2, "prefetch": prefetch})
            get_backend(target).schedule(s, anchor, anchor, "nn.conv2d_nchwc", config)
        return s, anchor


@pytest.mark.parametrize("prefetch", [0, 1])
def test_a_k_blocked_convolution_prefetches_the_next_block_in_bounds(prefetch):
    conv = BlockedConvolution()
    s, out = conv.lowered(prefetch)
    func = opf.lower(s, [*conv.holders, out], name="conv")
    assert len(prefetches(func)) == prefetch
    got = np.empty(conv.want.shape, "float32")
    run(func, *conv.values, got)  # the last block's prefetch clamped to the weights
    assert_close(got, conv.want, 1e-5)


@needs_cc
def test_a_k_blocked_convolution_prefetches_inside_its_register_tile():
    conv = BlockedConvolution()
    s, out = conv.lowered(1)
    kernel = opf.build(s, [*conv.holders, out], target=AVX2, name="conv")
    source = kernel.get_source()
    tile = source[source.index("opf_float32x8 acc"):]
    hint = PREFETCH.search(tile[:tile.index("acc = (acc +")])
    assert hint
    # The clamp to the last reduction block is of the block loop alone: the innermost
    # (channel) loop advances the address by a constant stride.
    clamps = call_arguments(hint.group(0), "opf_min_int32")
    assert clamps and all("rc_inner" not in clamp for clamp in clamps)
    got = np.empty(conv.want.shape, "float32")
    kernel(*conv.values, got)
    assert_close(got, conv.want, 1e-5)
