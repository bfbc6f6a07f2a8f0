"""The CPU backend's schedule rules with their default configs: every schedule, compiled to C,
computes what the NumPy reference does, alone and with a bias + relu epilogue fused into it the
way the group lowering fuses one (the add inlined into the relu, the anchor's tiles computed
inside the relu's loops); and the arrangement is the one intended (parallel, vectorized, the
accumulator a per-task temporary)."""

import re
import shutil

import numpy as np
import pytest

import opfusion as opf
from opfusion import te
from opfusion.backend import get_backend
from opfusion.backend.cpu.schedules import RULES
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule
from opfusion.testing import assert_close
from opfusion.topi import get_compute
from opfusion.topi.testing import call_over_arrays

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")),
                                reason="no C compiler")

nn = opf.op.nn


@pytest.fixture(autouse=True)
def private_kernel_cache(tmp_path_factory, monkeypatch):
    """Compiled kernels go to a cache of this module's own, not ~/.cache."""
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


def normal(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def schedule_call(builder, *arrays, epilogue=False, **attrs):
    """The kernel of one call scheduled by its anchor schedule: returns the schedule, its
    argument tensors, the argument arrays and the expected result.

    With ``epilogue``, the call's result goes through ``relu(result + bias)`` (the bias along
    axis 1: channels, or a matrix's columns); as the group lowering does, the add is inlined
    and the schedule is called with anchor=the call's result, output=the relu."""
    call, params, values = call_over_arrays(builder, arrays, attrs)
    want = evaluate(IRModule.from_expr(Function(params, call)), values)
    holders = [te.placeholder(p.type_annotation.shape, p.type_annotation.dtype,
                              name=p.name_hint) for p in params]
    inputs = [holders] if call.op.name == "einsum" else holders
    anchor = get_compute(call.op.name)(inputs, call.attrs, call.checked_type)
    output, added = anchor, None
    if epilogue:
        axis = 1 if len(anchor.shape) >= 2 else 0
        bias = te.placeholder((anchor.shape[axis],), anchor.dtype, name="bias")
        added = te.compute(anchor.shape, lambda *i: anchor[i] + bias[i[axis]], name="add")
        output = te.compute(anchor.shape, lambda *i: te.max(added[i], 0.0), name="relu")
        b = normal(anchor.shape[axis], seed=9)
        shape = [1] * len(anchor.shape)
        shape[axis] = -1
        want = np.maximum(want + b.reshape(shape), 0).astype(want.dtype)
        holders, values = [*holders, bias], [*values, b]
    s = te.create_schedule(output.op)
    if added is not None:
        s[added].compute_inline()
    get_backend().schedule(s, anchor, output, call.op.name)
    return s, [*holders, output], values, want


def check_schedule(builder, *arrays, epilogue=False, rtol=1e-5, **attrs):
    """Build the scheduled kernel, run it, compare with the reference; returns the kernel."""
    s, args, values, want = schedule_call(builder, *arrays, epilogue=epilogue, **attrs)
    kernel = opf.build(s, args, name="scheduled")
    got = np.empty(want.shape, want.dtype)
    kernel(*values, got)
    assert_close(got, want, rtol)
    return kernel


# ---------------------------------------------------------------------------------------------
# convolution


@pytest.mark.parametrize("epilogue", [False, True])
def test_conv2d_3x3(epilogue):
    check_schedule(nn.conv2d, normal(1, 16, 14, 14), normal(32, 16, 3, 3, seed=1) * 0.2,
                   padding=1, epilogue=epilogue)


@pytest.mark.parametrize("data, weight, attrs", [
    ((2, 8, 15, 13), (12, 4, 3, 3), {"padding": (1, 0, 2, 1), "strides": 2, "groups": 2}),
    ((1, 16, 16, 16), (16, 1, 3, 3), {"padding": 1, "groups": 16}),  # depthwise
    ((1, 4, 9, 9), (8, 4, 3, 3), {"padding": 2, "dilation": 2}),
    ((1, 3, 23, 23), (8, 3, 7, 7), {"padding": 3, "strides": 2}),  # a stem
    ((1, 32, 7, 7), (24, 32, 3, 3), {"padding": 1}),  # 7 columns: one padded block
    ((1, 8, 5, 3), (6, 8, 3, 3), {"padding": 1}),  # 3 columns: no padded block
    ((1, 24, 8, 56), (16, 24, 1, 1), {}),  # 1x1, whole blocks
    ((2, 5, 6, 6), (7, 5, 3, 3), {"padding": 1}),  # channel counts without divisors
])
def test_conv2d_variants_with_epilogue(data, weight, attrs):
    check_schedule(nn.conv2d, normal(*data), normal(*weight, seed=1) * 0.2, epilogue=True,
                   **attrs)


@pytest.mark.parametrize("attrs", [
    {"strides": 2, "padding": 1, "output_padding": 1},
    {"padding": 1},
    {"strides": (2, 1), "groups": 2, "dilation": (1, 2)},
])
def test_conv2d_transpose_with_epilogue(attrs):
    check_schedule(nn.conv2d_transpose, normal(1, 8, 7, 7), normal(8, 4, 3, 3, seed=1) * 0.2,
                   epilogue=True, **attrs)


def test_conv2d_epilogue_keeps_the_accumulator_per_task():
    s, args, _, _ = schedule_call(nn.conv2d, normal(1, 16, 14, 14), normal(32, 16, 3, 3),
                                  padding=1, epilogue=True)
    text = str(opf.lower(s, args))
    # The only full-size arrays are the arguments (and the padded input): the convolution's
    # result is accumulated in a small temporary inside the parallel loop and the relu
    # writes from there.
    allocations = dict(re.findall(r"allocate\((\w+): float32\[([\d, ]+)\]", text))
    assert set(allocations) == {"conv2d_pad", "conv2d_acc"}
    accumulator = [int(d) for d in allocations["conv2d_acc"].split(",")]
    assert np.prod(accumulator) < 32 * 14 * 14
    assert text.index("parallel(") < text.index("allocate(conv2d_acc")


def test_conv2d_kernel_is_parallel_and_vectorized():
    kernel = check_schedule(nn.conv2d, normal(1, 16, 14, 14), normal(32, 16, 3, 3, seed=1),
                            padding=1)
    source = kernel.get_source()
    assert "#pragma omp parallel for" in source
    assert re.search(r"opf_load_float32x\d+\(&conv2d_pad", source)


# ---------------------------------------------------------------------------------------------
# dense and matrix products


@pytest.mark.parametrize("epilogue", [False, True])
def test_dense_8x64x96(epilogue):
    check_schedule(nn.dense, normal(8, 64), normal(96, 64, seed=1), epilogue=epilogue)


@pytest.mark.parametrize("data, units", [
    ((1, 256), 100),  # a matrix-vector product
    ((16, 32), 64),  # shallow: the weight packed into panels
    ((37, 24), 50),  # nothing divides
    ((5, 7), 9),
    ((2, 3, 64), 40),
    ((64,), 24),
])
@pytest.mark.parametrize("epilogue", [False, True])
def test_dense_shapes(data, units, epilogue):
    check_schedule(nn.dense, normal(*data), normal(units, data[-1], seed=1), epilogue=epilogue)


def test_dense_blocks_the_weight_rows():
    check_schedule(nn.dense, normal(64, 512), normal(256, 512, seed=1), epilogue=True)


@pytest.mark.parametrize("a, b, attrs", [
    ((16, 64), (64, 48), {}),  # packed panels
    ((3, 64), (64, 40), {}),  # few rows: read in place
    ((2, 8, 64), (64, 32), {}),
    ((64,), (64, 40), {}),
    ((2, 5, 64), (64,), {}),
    ((24, 40), (24, 16), {"transpose_a": True}),
    ((4, 160), (3, 2, 160), {"transpose_b": True}),
])
@pytest.mark.parametrize("epilogue", [False, True])
def test_matmul(a, b, attrs, epilogue):
    check_schedule(nn.matmul, normal(*a), normal(*b, seed=1), epilogue=epilogue, **attrs)


@pytest.mark.parametrize("size", [5, 16, 1000])
def test_matmul_dot_product(size):
    check_schedule(nn.matmul, normal(size), normal(size, seed=1))


@pytest.mark.parametrize("x, y, attrs", [
    ((4, 16, 32), (4, 24, 32), {}),
    ((4, 16, 256), (4, 24, 256), {}),
    ((4, 16, 32), (1, 32, 24), {"transpose_b": False}),
    ((3, 32, 16), (3, 32, 24), {"transpose_a": True, "transpose_b": False}),
])
def test_batch_matmul(x, y, attrs):
    check_schedule(nn.batch_matmul, normal(*x), normal(*y, seed=1), epilogue=True, **attrs)


# ---------------------------------------------------------------------------------------------
# pooling and row operators


@pytest.mark.parametrize("builder, attrs", [
    (nn.max_pool2d, {"pool_size": 3, "strides": 2, "padding": 1}),
    (nn.max_pool2d, {"pool_size": 2, "strides": 2, "ceil_mode": True}),
    (nn.avg_pool2d, {"pool_size": 3, "strides": 2, "padding": 1, "ceil_mode": True}),
    (nn.avg_pool2d, {"pool_size": 3, "padding": 1, "count_include_pad": True}),
    (nn.global_avg_pool2d, {}),
    (nn.global_max_pool2d, {}),
])
@pytest.mark.parametrize("epilogue", [False, True])
def test_pools(builder, attrs, epilogue):
    check_schedule(builder, normal(2, 8, 15, 15), epilogue=epilogue, **attrs)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_rows_of_1000(name):
    check_schedule(getattr(nn, name), normal(4, 1000) * 3)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_rows_take_their_maxima_and_exponentials_in_vectors(name):
    """An attention's standalone softmax (12 heads x 128 rows of 128; a quantized model's,
    which FuseAttention does not take): partial maxima by lanes and vector exponentials,
    not a scalar chain a row."""
    x = opf.var("x", shape=(1, 12, 128, 128))
    mod = IRModule.from_expr(Function([x], getattr(nn, name)(x, axis=3)))
    exe = opf.compile(mod)
    # (softmax's exponentials flushed below the normal floats: te.exp_normal)
    helper = "opf_exp_normal_float32x" if name == "softmax" else "opf_exp_float32x"
    assert f"{name}_max_lanes" in exe.source() and helper in exe.source()
    value = normal(1, 12, 128, 128) * 4
    value[0, 0, 0, :3] = [np.inf, -np.inf, np.nan]
    assert_close(exe(value), evaluate(mod, [value]))


def test_softmax_weights_below_the_normal_floats_are_zero():
    """Scores 88-104 below their row's largest give weights of 2^-150 to 2^-126: 0 rather
    than subnormal (te.exp_normal), within 2^-126 of the reference; NaN and infinities as
    there. Swin's attention masks of -100 made such weights, and each product of them by
    the values a microcode assist."""
    x = opf.var("x", shape=(4, 49))
    mod = IRModule.from_expr(Function([x], nn.softmax(x, axis=1)))
    exe = opf.compile(mod)
    value = normal(4, 49)
    value[0] = 0.0
    value[0, ::2] = -92.0  # masked: e^-92 below the largest, subnormal in the reference
    value[1, :5] = [-95.0, -88.0, -87.3, np.inf, 1.0]
    value[2, :3] = [-np.inf, np.nan, 0.0]
    with np.errstate(invalid="ignore"):  # the reference's row with +inf: NaN, as ours
        got, want = exe(value), evaluate(mod, [value])
    tiny = np.finfo(np.float32).tiny
    assert np.all((got == 0) | (np.abs(got) >= tiny) | np.isnan(got))  # no subnormal
    assert np.all(got[0, ::2] == 0) and np.all(want[0, ::2] > 0)
    np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=1e-6,
                               atol=tiny)
    assert np.array_equal(np.isnan(got), np.isnan(want))


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, axis", [((2, 5, 3, 4), 1), ((6, 7), 0), ((24,), 0)])
def test_softmax_axes(name, shape, axis):
    check_schedule(getattr(nn, name), normal(*shape), axis=axis)


@pytest.mark.parametrize("shape, axis", [((6, 768), -1), ((2, 6, 4), 1)])
def test_layer_norm(shape, axis):
    size = shape[axis]
    check_schedule(nn.layer_norm, normal(*shape) + 1.0, normal(size, seed=1),
                   normal(size, seed=2), axis=axis)


def test_every_anchor_has_its_rule():
    expected = {
        "nn.conv2d": ["conv2d"],
        "nn.conv2d_transpose": ["conv2d"],
        "nn.dense": ["matmul_dot", "matmul_plain"],
        "nn.matmul": ["matmul_dot", "matmul_plain"],
        "nn.batch_matmul": ["matmul_dot", "matmul_plain"],
        "nn.max_pool2d": ["pool"],
        "nn.avg_pool2d": ["pool"],
        "nn.global_max_pool2d": ["pool"],
        "nn.global_avg_pool2d": ["pool"],
        "nn.softmax": ["rows"],
        "nn.log_softmax": ["rows"],
        "nn.layer_norm": ["rows"],
    }
    assert {name: [r.name for r in RULES.rules(name)] for name in expected} == expected
