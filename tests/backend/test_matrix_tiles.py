"""Convolutions of words on AMX's matrix tiles (opfusion.backend.cpu.matrix_tiles): a dense
blocked convolution of 4-byte words, on a target with ``amx-int8``, runs its register tiles as
tiles of 16 int32 sums a row, one ``tdpbusd`` per tile of sums and step. The sums are the int64
convolution's exactly, for every shape and schedule config; without AMX on the host, the code
is generated and built, and the numbers are checked where the host runs it."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "transform"))

from int8_helpers import VNNI, module, random_codes, runs_here  # noqa: E402
from test_word_convolutions import blocked, blocked_weight, plain_convolution  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.ir.evaluate import evaluate  # noqa: E402
from opfusion.ir.expr import Call, Constant  # noqa: E402
from opfusion.ir.op import get_op  # noqa: E402
from opfusion.target import Target, isa  # noqa: E402
from opfusion.target import host as host_module  # noqa: E402
from opfusion.topi.nn import matrix_tile, matrix_width_unit  # noqa: E402
from opfusion.transform.word_convolutions import word_weight  # noqa: E402

AMX = Target("c -mattr=+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx2,+fma,+avx512vnni,"
             "+amx-int8")
rng = np.random.default_rng(23)


def _compiler_builds_amx():
    from opfusion.backend.cpu.toolchain import (
        find_compiler,
        have_c_compiler,
        rejected_feature_flags,
    )

    return have_c_compiler() and not rejected_feature_flags(find_compiler(),
                                                            ("-mamx-tile", "-mamx-int8"))


pytestmark = pytest.mark.skipif(not _compiler_builds_amx(),
                                reason="the C compiler builds no AMX code (GCC 11 or later does)")


@pytest.fixture(autouse=True)
def small_convolutions_on_tiles(monkeypatch, request):
    """The convolutions here are small (odd shapes, tails): they take matrix tiles from any
    size (MATRIX_MIN_MACS 0), but in the test of the threshold itself."""
    if "threshold" in request.node.name:
        return
    import importlib

    for name in ("opfusion.topi.nn", "opfusion.backend.cpu.loop_planning"):
        module_ = importlib.import_module(name)
        monkeypatch.setattr(module_, "MATRIX_MIN_MACS", 0)


def test_convolutions_below_the_threshold_keep_vnni(monkeypatch):
    """A convolution of fewer than MATRIX_MIN_MACS multiply-adds in blocks of 16 channels
    keeps VNNI's register tiles (switching to the tiles and back between kernels costs more
    than it gains); from it, tiles."""
    from opfusion.topi.nn import MATRIX_MIN_MACS

    x = extreme_codes((1, 32, 28, 28), "uint8")
    weight = extreme_codes((32, 32, 3, 3), "int8")
    mod, feed, want = word_convolution(x, weight, 1, 1, 5)
    assert 28 * 28 * 32 * 32 * 9 < MATRIX_MIN_MACS
    exe = opf.compile(mod, target=AMX)
    assert "_tile_dpbusd(" not in exe.source() and "opf_dot4_add_u8s8" in exe.source()
    big = extreme_codes((1, 64, 56, 56), "uint8")
    mod, feed, want = word_convolution(big, extreme_codes((64, 64, 3, 3), "int8"), 1, 1, 5)
    assert 56 * 56 * 64 * 64 * 9 >= MATRIX_MIN_MACS
    exe = opf.compile(mod, target=AMX)
    assert "_tile_dpbusd(" in exe.source()
    if runs_here(AMX):
        np.testing.assert_array_equal(exe(feed), want)


def word_convolution(x, weight, stride, pad, point, in_block=16):
    """A module of one nn.conv2d_nchwc of ``x``'s bytes (uint8, NCHW) by ``weight`` (int8,
    OIHW) in 4-byte words, and the int64 result it must give (blocked NCHW16c)."""
    channels, size = x.shape[1], x.shape[2:]
    kernel = weight.shape[2]
    want = blocked(plain_convolution(x.astype(np.int64), weight, stride, pad, point), 16)
    data = opf.var("x", shape=(1, channels // in_block, *size, in_block), dtype="uint8")
    packed = Call(get_op("nn.byte_words"), [data], {"per_word": 4})
    conv = Call(get_op("nn.conv2d_nchwc"), [packed, Constant(word_weight(
        blocked_weight(weight, in_block, 16), 4))], {
        "strides": [stride, stride], "padding": [pad] * 4, "data_layout": f"NCHW{in_block}c",
        "kernel_layout": f"OIHW{in_block}i16o", "out_layout": "NCHW16c", "words": 4,
        "pad_value": point, "out_dtype": "int32", "kernel_size": [kernel, kernel]})
    return module(conv), blocked(x, in_block), want


def extreme_codes(shape, dtype):
    values = random_codes(rng, shape, dtype)
    values.reshape(-1)[:9] = np.iinfo(dtype).max if dtype == "uint8" else -128
    return values


@pytest.mark.parametrize("channels,outs,size,kernel,stride,pad", [
    (64, 64, (56, 56), 3, 1, 1),     # ResNet's first stage: rows of 14, taps folded (48 bytes)
    (32, 48, (13, 17), 3, 1, 1),     # no divisor of 17 from 8 to 16: units of 16, cropped
    (32, 32, (7, 7), 3, 1, 1),       # rows of 7
    (16, 112, (9, 9), 3, 2, 1),      # 7 output blocks (padded to 8), strided
    (64, 32, (14, 14), 1, 1, 0),     # 1x1: one block's 16 bytes a product
    (32, 64, (16, 16), 1, 2, 0),     # strided 1x1 (its compact copy)
    (3, 16, (23, 23), 7, 2, 3),      # a stem: one word a pixel, the 7 column taps folded
], ids=str)
def test_convolutions_of_words_on_matrix_tiles_are_exact(channels, outs, size, kernel, stride,
                                                          pad):
    in_block = min(channels, 16)
    x = extreme_codes((1, channels, *size), "uint8")
    weight = extreme_codes((outs, channels, kernel, kernel), "int8")
    mod, feed, want = word_convolution(x, weight, stride, pad, 201, in_block)
    np.testing.assert_array_equal(evaluate(mod, [feed]), want)
    exe = opf.compile(mod, target=AMX)
    source = exe.source()
    assert "_tile_dpbusd(" in source and "opf_tiles_release();" in source
    if runs_here(AMX):
        np.testing.assert_array_equal(exe(feed), want)
        # and the VNNI build's sums, to the bit
        np.testing.assert_array_equal(opf.compile(mod, target=VNNI)(feed), want)


def test_a_3x3_convolution_folds_its_column_taps_into_each_product():
    """A 3x3 stride-1 convolution's products take the 12 words of three neighbouring pixels
    (48-byte rows of data, 12 rows of weights); rows of 14 columns, 2 x 2 tiles of sums."""
    x = extreme_codes((1, 32, 28, 28), "uint8")
    weight = extreme_codes((32, 32, 3, 3), "int8")
    mod, feed, want = word_convolution(x, weight, 1, 1, 7)
    source = opf.compile(mod, target=AMX).source()
    config = next(line for line in source.splitlines() if "static const opf_tile_config" in line)
    # 4 tiles of sums (14 rows of 64 bytes), 2 data tiles (14 x 48), 2 weight tiles (12 x 64)
    assert "{64, 64, 64, 64, 48, 48, 64, 64}, {14, 14, 14, 14, 14, 14, 12, 12}" in config
    assert source.count("_tile_dpbusd(") == 4
    if runs_here(AMX):
        np.testing.assert_array_equal(opf.compile(mod, target=AMX)(feed), want)


@pytest.mark.parametrize("channels,size,kernel,stride,pad", [
    (64, (7, 7), 3, 1, 1),    # ResNet's last stage: 7 rows of 9 padded columns, 4 tiles of 16
    (64, (7, 7), 1, 1, 0),    # 1x1: 49 pixels, the last tile's 15 rows past them
    (32, (9, 9), 3, 1, 0),    # no padding: the line is the input's own width
    (16, (5, 6), 5, 1, 2),    # 5 taps a row (their bytes folded), more columns than rows
    (64, (14, 14), 3, 2, 1),  # strided: 4 phases of 8 columns, tap (ry, rx) in its phase
    (32, (13, 14), 1, 2, 0),  # strided 1x1: one phase, the pixels it reads
    (16, (11, 11), 5, 3, 2),  # 3 x 3 phases, taps 0 and 3 of a row in the same one
], ids=str)
def test_small_outputs_run_as_one_padded_line(channels, size, kernel, stride, pad):
    """A convolution whose rows would fill few of a tile's 16 rows runs its output as one
    line of the padded input's width (topi.nn.matrix_line_pays; strided, in phases of the
    stride): every tile of sums has 16 rows, the positions past a row's outputs are cropped,
    and the sums are the int64 convolution's exactly (a zero point of 201 in the padding)."""
    from opfusion.topi.nn import matrix_line_pays

    out_h = (size[0] + 2 * pad - kernel) // stride + 1
    out_w = (size[1] + 2 * pad - kernel) // stride + 1
    assert matrix_line_pays(out_h, out_w, (kernel - 1) // stride, 16)
    x = extreme_codes((1, channels, *size), "uint8")
    weight = extreme_codes((64, channels, kernel, kernel), "int8")
    mod, feed, want = word_convolution(x, weight, stride, pad, 201, min(channels, 16))
    exe = opf.compile(mod, target=AMX)
    config = next(line for line in exe.source().splitlines()
                  if "static const opf_tile_config" in line)
    rows = config.rsplit("{", 1)[1]
    assert rows.startswith("16, 16") and " 7," not in rows
    if runs_here(AMX):
        np.testing.assert_array_equal(exe(feed), want)


def test_a_fresh_accumulator_starts_its_tiles_at_zero():
    """A 1x1 convolution of 64 channels sums its whole reduction in one step: its tiles of
    sums start at zero (``tilezero``), the accumulator's fill of zeros is not written, and no
    tile of sums is loaded; a K-blocked one (its sums carried over blocks) loads them."""
    x = extreme_codes((1, 64, 14, 14), "uint8")
    weight = extreme_codes((64, 64, 1, 1), "int8")
    mod, feed, want = word_convolution(x, weight, 1, 0, 3)
    exe = opf.compile(mod, target=AMX)
    kernel = exe.source().split("//@opfusion-section kernel")[-1]
    assert kernel.count("_tile_zero(") == 4 and "opf_splat_int32x16(0)" not in kernel
    loads = [line for line in kernel.splitlines() if "_tile_loadd(" in line]
    assert not any("_acc[" in line for line in loads)
    if runs_here(AMX):
        np.testing.assert_array_equal(exe(feed), want)


@pytest.mark.parametrize("size", [(14, 28), (7, 7)], ids=["rows", "padded_line"])
def test_every_config_of_a_matrix_convolution_computes_the_same_sums(size):
    """The tuner's knobs on matrix tiles (channel blocks x units of columns within the tiles,
    K-blocking, task shapes, a padded line's chunks): each sampled config builds a kernel on
    the tiles, and where the host runs it, the runner finds its numbers the reference's."""
    from opfusion.autotune.measure import MeasureOptions, build_candidates, task_data
    from opfusion.autotune.runner import LocalRunner
    from opfusion.autotune.task import extract_tasks

    x = extreme_codes((1, 32, *size), "uint8")
    weight = extreme_codes((64, 32, 3, 3), "int8")
    mod, _, _ = word_convolution(x, weight, 1, 1, 99)
    (task,) = [t for t in extract_tasks(mod, target=AMX) if t.rule == "conv2d_nchwc"]
    points = list(task.space)
    configs = [task.default, *task.space.sample(4, seed=0), points[0], points[-1]]
    assert len({(c["channel_tile"], c["col_units"], c["k_blocks"]) for c in configs}) >= 3
    candidates = build_candidates(task, configs)
    for candidate in candidates:
        assert candidate.error is None, candidate.error
        assert "_tile_dpbusd(" in candidate.source
    if runs_here(AMX):
        with LocalRunner() as runner:
            results = runner.run(task_data(task), candidates, MeasureOptions(repeat=1))
        for result in results:
            assert result.ok, (result.config, result.error)


def test_matrix_tile_shapes():
    """Units of columns: the row up to 16, else its largest divisor from 8 to 16, else 16.
    Tiles: 2 x 2 tiles of sums where the blocks and units allow (each operand tile used
    twice a step), else the most sums up to 4."""
    assert [matrix_width_unit(w, 16) for w in (7, 14, 16, 28, 56, 112, 17, 150)] == \
        [7, 14, 16, 14, 14, 16, 16, 15]
    assert matrix_tile(4, 4, 14, AMX) == (2, 2)
    assert matrix_tile(4, 1, 14, AMX) == (4, 1)
    assert matrix_tile(32, 1, 7, AMX) == (4, 1)
    assert matrix_tile(3, 2, 16, AMX) == (3, 1)
    assert matrix_tile(1, 3, 16, AMX) == (1, 3)
    assert AMX.matrix_tiles == 8 and VNNI.matrix_tiles == 0


def test_vnni_and_float_targets_keep_their_register_tiles():
    x = extreme_codes((1, 16, 8, 8), "uint8")
    weight = extreme_codes((16, 16, 3, 3), "int8")
    mod, _, _ = word_convolution(x, weight, 1, 1, 0)
    assert "_tile_dpbusd" not in opf.compile(mod, target=VNNI).source()


def test_amx_is_a_host_feature_only_where_the_os_grants_the_tiles(monkeypatch):
    flags = ("avx512f", "avx512bw", "avx512_vnni", "amx_tile", "amx_int8")
    assert {"amx-tile", "amx-int8"} <= isa.features_from_cpuinfo("x86_64", flags)
    monkeypatch.setattr(host_module, "host_cpuinfo_flags", lambda: flags)
    monkeypatch.setattr(host_module, "host_arch", lambda: "x86_64")
    for granted in (True, False):
        monkeypatch.setattr(host_module, "os_grants_amx", lambda g=granted: g)
        host_module.host_features.cache_clear()
        try:
            assert ("amx-int8" in host_module.host_features()) == granted
        finally:
            host_module.host_features.cache_clear()
    assert "-mamx-int8" in Target("c -mcpu=sapphirerapids").compiler_flags()


@pytest.mark.parametrize("x_shape,outs,kernel,stride,pad,activation", [
    ((1, 64, 14, 14), 128, 1, 1, 0, "uint8"),   # 1x1: one 64-byte row of channels a product
    ((1, 64, 12, 12), 64, 3, 1, 1, "int8"),     # chained 3x3s with a residual add
], ids=str)
def test_quantized_convolutions_on_matrix_tiles_take_blocks_of_64_channels(
        x_shape, outs, kernel, stride, pad, activation):
    """On AMX, AlterOpLayout gives the quantized convolutions blocks of 64 channels (a tile
    row of bytes): each product then takes 64 input channels (16 words), not one block of
    16. The module computes the float-simulated QDQ graph's numbers."""
    from test_word_convolutions import optimized, qdq_conv_model, rewritten

    chained = kernel == 3
    bound, mod = optimized(qdq_conv_model(x_shape, outs, kernel, stride, pad, activation,
                                          chained))
    new = rewritten(mod, AMX)
    convs = [n for n in opf.ir.visitor.post_order(new["main"].body)
             if isinstance(n, Call) and n.op.name == "nn.conv2d_nchwc"]
    assert convs and all(c.attrs.words == 4 and c.attrs.data_layout == "NCHW64c"
                         and c.attrs.out_layout == "NCHW64c" for c in convs)
    with opf.transform.PassContext(opt_level=3):
        exe = opf.compile(mod, target=AMX)
    source = exe.source()
    assert "_tile_dpbusd(" in source and "opf_dot4" not in source
    # a product's rows of data are 64 bytes (16 words of a pixel's 64 channels)
    assert any("64, 64, 64, 64, 64" in line for line in source.splitlines()
               if "static const opf_tile_config" in line)
    if runs_here(AMX):
        x = rng.standard_normal(x_shape).astype(np.float32) * 3
        want = evaluate(bound, [x])
        np.testing.assert_allclose(exe(x), want, rtol=0,
                                   atol=1e-5 * float(np.abs(want).max()))


def test_a_quantized_convolution_read_by_a_depthwise_one_keeps_vector_blocks():
    """A quantized convolution whose result a depthwise convolution reads (MobileNet's
    expansions) keeps blocks of 16 outputs: the depthwise one would run in blocks of 64 too,
    its register tiles of four vectors a point spilling."""
    from onnx import TensorProto, helper, numpy_helper
    from test_word_convolutions import optimized, qdq_conv_model, rewritten

    model = qdq_conv_model((1, 64, 16, 16), 128, 1)
    graph = model.graph
    graph.output[0].name = "e"
    graph.node[-1].output[0] = "e"
    graph.initializer.append(numpy_helper.from_array(
        rng.standard_normal((128, 1, 3, 3)).astype(np.float32), "dw"))
    graph.node.append(helper.make_node("Conv", ["e", "dw"], ["y"], group=128, pads=[1] * 4))
    graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT, None))
    _, mod = optimized(model)
    new = rewritten(mod, AMX)
    convs = [n for n in opf.ir.visitor.post_order(new["main"].body)
             if isinstance(n, Call) and n.op.name == "nn.conv2d_nchwc"]
    quantized = [c for c in convs if c.attrs.words]
    assert quantized and all(c.attrs.out_layout == "NCHW16c" for c in quantized)
