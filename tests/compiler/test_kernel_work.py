"""No kernel recomputes what its operators define: for the light models (but the three of
heavy weights), on the targets whose schedules differ (the register counts and vector widths
of AVX-512, AVX2, SSE and NEON), each fused group's kernel runs at most WORK_SLACK times the
innermost statements of the same group with no schedule rule
(:func:`opfusion.compiler.lower_group.unscheduled_work`).

Why: a schedule that computes a stage at a loop whose iterations do not map onto the stage's
axes gets a loose region from bounds inference, and recomputes the stage, up to all of it, at
every iteration. The numbers stay right, so only the time shows it: a per-tile epilogue over a
convolution's pixel line ran ResNet-50 for AVX2 at a thousand times its multiply-adds, and
DenseNet-121 for SSE past ``compile.max_kernel_work``. Convolutions of drawn shapes are held
to the same (and must lower at all: a default schedule outside its rule's own space raised).
Only lowering runs here, no C compiler, so every target is checked on any host."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend import get_backend
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.compile import fused_module
from opfusion.compiler.lower_group import lower_primitive_function, unscheduled_work
from opfusion.ir import structural_hash
from opfusion.ir.expr import Call, Function
from opfusion.ir.visitor import post_order
from opfusion.target import Target
from opfusion.testing import LIGHT_MODEL_NAMES, assert_close, light_model
from opfusion.tir.work import kernel_work

onnx = pytest.importorskip("onnx")

#: What a kernel may run over its unscheduled work: tiles round extents up to whole register
#: tiles and vectors (a 58-channel ShuffleNet v2 slice in 16-lane blocks: 1.14x), Winograd's
#: tiles cover a few rows past the edge, and a depthwise task pads its own halo rows.
WORK_SLACK = 1.3

#: Targets whose schedules differ: 32 registers of 16 lanes, 16 of 8, 16 of 4, 32 of 4.
TARGETS = ("c -mattr=+avx512f,+avx512bw,+avx512dq,+avx512vl,+avx2,+fma",
           "c -mattr=+avx2,+fma", "c -mattr=+sse4.2", "c -mattr=+neon")

#: The models whose shapes cover the schedules' cases on every target (pixel lines and
#: K-blocking, grouped, depthwise-free 1x1 and 3x3, Winograd, pools, products); the rest of
#: the light models run on AVX2 alone, the ISA of the machines most users have.
EVERY_TARGET = ("resnet50", "squeezenet", "densenet121", "shufflenet")


def primitive_functions(mod):
    """The distinct primitive functions ``@main`` calls, in call order."""
    seen, functions = set(), []
    for node in post_order(mod["main"].body, into_functions=False):
        if isinstance(node, Call) and isinstance(node.op, Function):
            key = structural_hash(node.op)
            if key not in seen:
                seen.add(key)
                functions.append(node.op)
    return functions


def excess_work(name, spec):
    """(kernel, its work / the unscheduled work) of each of model ``name``'s kernels for the
    target ``spec`` that runs more than WORK_SLACK times its unscheduled work."""
    target = Target(spec)
    backend = get_backend(target)
    mod, params = opf.frontend.from_onnx(onnx.load(str(light_model(name))))
    fused = fused_module(mod, params, target)
    found = []
    for index, func in enumerate(primitive_functions(fused)):
        group = lower_primitive_function(func, f"kernel_{index}", backend)
        if group.prim_func is None:
            continue  # an operator the reference runs
        ratio = kernel_work(group.prim_func.body) / max(1, unscheduled_work(func, backend))
        if ratio > WORK_SLACK:
            found.append((f"{group.name} ({', '.join(group.op_names)})", round(ratio, 2)))
    return found


#: Left out: their layers are plain convolutions the drawn ones below cover, and loading
#: their hundreds of megabytes of weights was most of this file's time.
HEAVY = ("vgg19", "bvlc_alexnet", "zfnet512")

CASES = [(name, spec) for name in LIGHT_MODEL_NAMES if name not in HEAVY
         for spec in (TARGETS if name in EVERY_TARGET else ("c -mattr=+avx2,+fma",))]


@pytest.mark.slow
@pytest.mark.parametrize("name,spec", CASES)
def test_kernels_do_their_operators_work_once(name, spec):
    assert excess_work(name, spec) == []


def test_a_pixel_line_convolution_computes_its_sums_once():
    """The case that regressed: a 1x1 convolution whose 28 x 28 pixels run as one line of
    3-pixel units on AVX2 (28 is no multiple of 3), with an epilogue."""
    x = opf.var("x", shape=(1, 40, 28, 28))
    w = opf.const(np.full((240, 40, 1, 1), 0.01, "float32"))
    body = opf.op.sigmoid(opf.op.nn.conv2d(x, w))
    mod = opf.IRModule.from_expr(Function([x], body))
    target = Target("c -mattr=+avx2,+fma")
    fused = fused_module(mod, {}, target)
    backend = get_backend(target)
    for func in primitive_functions(fused):
        group = lower_primitive_function(func, "line", backend)
        work = kernel_work(group.prim_func.body)
        assert work <= WORK_SLACK * unscheduled_work(func, backend), group.name


def _random_convolution(rng):
    """A convolution of channel counts, sizes, kernels, strides and groups drawn from those
    of the light and vision models (and some odd ones), with or without an epilogue and a
    global average pool after it."""
    channels = int(rng.choice([3, 8, 16, 24, 32, 40, 58, 64, 72, 96, 116, 144, 256]))
    out_channels = int(rng.choice([8, 16, 24, 40, 58, 64, 96, 116, 120, 240, 256, 1000]))
    size = int(rng.choice([1, 3, 7, 9, 13, 14, 15, 17, 28, 31, 56]))
    kernel, stride = int(rng.choice([1, 1, 3, 3, 5, 7])), int(rng.choice([1, 1, 2]))
    groups = channels if kernel > 1 and rng.random() < 0.25 else 1
    out_channels = channels if groups > 1 else out_channels
    x = opf.var("x", shape=(1, channels, size, size))
    weight = rng.standard_normal((out_channels, channels // groups, kernel, kernel))
    y = opf.op.nn.conv2d(x, opf.const(weight.astype("float32")), strides=stride,
                         padding=kernel // 2, groups=groups)
    y = [y, opf.op.nn.relu(y), opf.op.multiply(y, opf.op.sigmoid(y))][int(rng.integers(3))]
    if rng.random() < 0.3:
        y = opf.op.nn.global_avg_pool2d(y)
    return opf.IRModule.from_expr(Function([x], y))


#: One convolution the sweep below does not draw: its default Winograd tile (28 tiles of a
#: row of 56 in one register tile, on AVX-512) was outside its own rule's space, and
#: opf.compile raised a ScheduleError.
WIDE_WINOGRAD_ROW = (256, 24, 56)


@pytest.mark.parametrize("spec", TARGETS)
def test_convolutions_of_many_shapes_lower_and_do_their_work_once(spec):
    """40 drawn convolutions, and WIDE_WINOGRAD_ROW, lower on each target with their default
    schedules, every kernel within WORK_SLACK of its unscheduled work."""
    target = Target(spec)
    backend = get_backend(target)
    rng = np.random.default_rng(11)
    channels, out_channels, size = WIDE_WINOGRAD_ROW
    x = opf.var("x", shape=(1, channels, size, size))
    weight = opf.const(rng.standard_normal((out_channels, channels, 3, 3)).astype("float32"))
    modules = [opf.IRModule.from_expr(Function([x], opf.op.nn.conv2d(x, weight, padding=1)))]
    modules += [_random_convolution(rng) for _ in range(40)]
    for mod in modules:
        for func in primitive_functions(fused_module(mod, {}, target)):
            group = lower_primitive_function(func, "conv", backend)
            if group.prim_func is not None:
                work = kernel_work(group.prim_func.body)
                assert work <= WORK_SLACK * unscheduled_work(func, backend), group.op_names


#: Products of few rows (M < PACK_MIN_ROWS): their weights packed in panels as wide as a
#: tile of few rows takes (8 vectors for a tile of 1 row); 5 rows (prime, above the 4 rows of
#: a tile) on AVX-512 made a default of 5 rows x 8 vectors, outside the registers.
FEW_ROW_PRODUCTS = [(5, 64, 768), (5, 3, 768), (7, 64, 128), (3, 768, 3072), (6, 100, 96)]

#: Products whose constant weight's columns are padded with zeros to whole panels (the
#: kernel computes them and its crop drops them): a power-of-two width in panels of three
#: vectors, a classifier's 1000, with 197 rows (a crop of rows too).
PADDED_COLUMN_PRODUCTS = [(64, 40, 1024), (197, 64, 1000), (130, 40, 4096)]


@pytest.mark.parametrize("spec", TARGETS)
def test_products_of_few_rows_or_padded_columns_lower_and_do_their_work_once(spec):
    target = Target(spec)
    backend = get_backend(target)
    rng = np.random.default_rng(2)
    for rows, depth, cols in FEW_ROW_PRODUCTS + PADDED_COLUMN_PRODUCTS:
        x = opf.var("x", shape=(rows, depth))
        weight = opf.const(rng.standard_normal((depth, cols)).astype("float32"))
        mod = opf.IRModule.from_expr(Function([x], opf.op.nn.matmul(x, weight)))
        for func in primitive_functions(fused_module(mod, {}, target)):
            group = lower_primitive_function(func, "product", backend)
            work = kernel_work(group.prim_func.body)
            assert work <= WORK_SLACK * unscheduled_work(func, backend), (rows, depth, cols)


def test_a_product_of_five_rows_computes_the_reference():
    if not have_c_compiler():
        pytest.skip("no C compiler installed")
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((64, 768)).astype("float32")
    x = opf.var("x", shape=(5, 64))
    exe = opf.compile(opf.IRModule.from_expr(Function([x], opf.op.nn.matmul(
        x, opf.const(weight)))))
    data = rng.standard_normal((5, 64)).astype("float32")
    assert_close(exe(data), data @ weight, 1e-5)
