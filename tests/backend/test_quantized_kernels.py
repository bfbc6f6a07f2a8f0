"""The kernels of quantized models: QuantizeLinear's rounding and saturating cast run in
vectors with the scalar rule's values (NaN 0, truncated, saturated), a select that keeps a
value it also compares vectorizes, and chains of QuantizeLinear / DequantizeLinear pairs
(ONNX Runtime's static quantization around every operator) print each shared value once
(opfusion.tir.shared_values) instead of a tree that grows 3x a pair."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opfusion as opf
from opfusion.frontend import from_onnx
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule
from opfusion.target import Target, host_target
from opfusion.testing.targets import OTHER_TARGETS
from opfusion.tir import expr as E
from opfusion.tir import stmt as S
from opfusion.tir.shared_values import MIN_SHARED_NODES, bind_shared_values

SPECIALS = [np.nan, np.inf, -np.inf, -0.5, -0.0, 0.5, 126.9, 127.5, 128.0, 254.9, 255.5, 256.0,
            -127.9, -128.0, -128.5, -129.0, 32767.5, 32768.0, -32768.5, 65535.9, 65536.0, 1e9,
            -1e9]


def compiled(expr):
    params = [n for n in opf.ir.visitor.post_order(expr) if isinstance(n, opf.ir.Var)]
    mod = IRModule.from_expr(Function(params, expr))
    return mod, opf.compile(mod)


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16"])
def test_float_to_narrow_casts_run_in_vectors_with_the_scalar_rule(dtype):
    values = np.array(SPECIALS * 3, np.float32)[:64]
    x = np.concatenate([values, np.random.default_rng(0).standard_normal(64).astype(
        np.float32) * 300])
    mod, exe = compiled(opf.op.cast(opf.var("x", shape=(128,)), dtype=dtype))
    assert f"opf_satcast_float32_{dtype}x" in exe.source_code
    np.testing.assert_array_equal(exe(x), evaluate(mod, [x]))


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16"])
@pytest.mark.parametrize("spec", ["c -mattr=+avx2,+fma", "c -mattr=+sse4.2"],
                         ids=["avx2", "sse4.2"])
def test_narrow_casts_without_vpmovdb_pack_the_halves(spec, dtype):
    """Without AVX-512, int32 lanes inside the narrow type's range (after the saturating
    cast's clamps, or a quantize step's clip) narrow by packs (vpackusdw, vpackuswb...),
    not lane by lane: the reference's values, NaN, infinities and every edge included."""
    target = Target(spec)
    values = np.array(SPECIALS * 3, np.float32)[:64]
    x = np.concatenate([values, np.random.default_rng(2).standard_normal(64).astype(
        np.float32) * 300])
    data = opf.var("x", shape=(128,))
    info = np.iinfo(dtype)
    kept = opf.op.where(opf.op.isnan(data), opf.const(np.float32(0)), data)
    clipped = opf.op.clip(opf.op.round(kept), a_min=float(info.min), a_max=float(info.max))
    for expr in (opf.op.cast(data, dtype=dtype), opf.op.cast(clipped, dtype=dtype)):
        params = [n for n in opf.ir.visitor.post_order(expr) if isinstance(n, opf.ir.Var)]
        mod = IRModule.from_expr(Function(params, expr))
        exe = opf.compile(mod, target=target)
        assert f"opf_narrow_{dtype}x{target.vector_lanes('float32')}(" in exe.source_code
        if target.features <= host_target().features:
            np.testing.assert_array_equal(exe(x), evaluate(mod, [x]))
    # AVX-512's vpmovdb and its kin: GCC's own conversion
    if "avx512vl" in host_target().features:
        assert "opf_narrow_" not in opf.compile(mod).source_code


def test_float_to_int32_casts_run_in_vectors_with_the_scalar_rule():
    """The saturating vector helper (NaN 0, 2^31 and above INT32_MAX, -2^31 and below
    INT32_MIN); where the NaN facts bound the value inside int32, a plain conversion."""
    edges = [2147483520.0, 2147483648.0, 4e9, -2147483648.0, -2147483904.0, -4e9, 1.5, -1.5]
    values = np.array(edges + SPECIALS * 3, np.float32)[:64]
    x = np.concatenate([values, np.random.default_rng(0).standard_normal(64).astype(
        np.float32) * 3e9])
    data = opf.var("x", shape=(128,))
    mod, exe = compiled(opf.op.cast(data, dtype="int32"))
    assert "opf_satcast_float32_int32x" in exe.source_code
    np.testing.assert_array_equal(exe(x), evaluate(mod, [x]))
    kept = opf.op.where(opf.op.isnan(data), opf.const(np.float32(0)), data)
    mod, exe = compiled(opf.op.cast(opf.op.clip(kept, a_min=-1e6, a_max=1e6), dtype="int32"))
    assert "satcast" not in exe.source_code and "__builtin_convertvector" in exe.source_code
    np.testing.assert_array_equal(exe(x), evaluate(mod, [x]))


SCALES = [0.05343363, 0.0039215689, 3.0, 0.1, 1.4142135, 0.0322368]


def _rounded_quotient_module(scale):
    """round(x / scale) of a value the NaN facts bound (QuantizeLinear of a clipped input)."""
    data = opf.var("x", shape=(4096,))
    kept = opf.op.where(opf.op.isnan(data), opf.const(np.float32(0)), data)
    bounded = opf.op.clip(kept, a_min=-1e6, a_max=1e6)
    return compiled(opf.op.round(opf.op.divide(bounded, opf.const(np.float32(scale)))))


@pytest.mark.parametrize("scale", SCALES)
def test_quantize_linear_divides_by_a_corrected_reciprocal_with_the_divisions_values(scale):
    """round(x / s) of a bounded x takes Markstein's quotient (three fused instructions, no
    vdivps) where the target has vector FMAs, and rounds every value as the division does:
    values next to the halfway points between codes, whose quotient's last bit decides."""
    mod, exe = _rounded_quotient_module(scale)
    if host_target().has("fma") or host_target().has("avx512f"):
        assert "opf_quotient_float32x" in exe.source_code
    s = np.float32(scale)
    halves = (np.arange(-512, 512, dtype=np.float64) + 0.5) * float(s)
    near = np.stack([np.nextafter(halves.astype(np.float32), np.float32(d)) for d in (-1e9, 1e9)]
                    + [halves.astype(np.float32)]).reshape(-1)
    rng = np.random.default_rng(0)
    x = np.concatenate([near, rng.standard_normal(4096 - near.size).astype(np.float32) * 300])
    x = x[:4096].astype(np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, 1e-40]
    np.testing.assert_array_equal(exe(x), evaluate(mod, [x]))


@pytest.mark.parametrize("dtype", ["uint8", "int8", "int32"])
@pytest.mark.parametrize("spec", [None, "c -mattr=+avx2,+fma", "c -mattr=+sse4.2"],
                         ids=["host", "avx2", "sse4.2"])
def test_a_cast_of_a_clipped_round_rounds_in_the_conversion(spec, dtype):
    """cast(clip(round(x / s) + z, lo, hi)) of a value the NaN facts bound (a quantize step
    after a product): no round of its own, the clip of the unrounded value converted by the
    rounding vcvtps2dq (round commutes with a clip to whole bounds); the reference's values
    at the halfway points, which round to even, at the clip's edges and past them."""
    target = Target(spec) if spec else host_target()
    data = opf.var("x", shape=(256,))
    kept = opf.op.where(opf.op.isnan(data), opf.const(np.float32(0)), data)
    bounded = opf.op.clip(kept, a_min=-1e6, a_max=1e6)
    scale = np.float32(0.0322368)
    low, high = (0.0, 255.0) if dtype == "uint8" else (-128.0, 127.0)
    shifted = opf.op.add(opf.op.round(opf.op.divide(bounded, opf.const(scale))),
                         opf.const(np.float32(3)))
    expr = opf.op.cast(opf.op.clip(shifted, a_min=low, a_max=high), dtype=dtype)
    params = [n for n in opf.ir.visitor.post_order(expr) if isinstance(n, opf.ir.Var)]
    mod = IRModule.from_expr(Function(params, expr))
    exe = opf.compile(mod, target=target)
    lanes = target.vector_lanes("float32")
    kernel = exe.source_code.split("//@opfusion-section kernel")[1]
    assert f"opf_round_int32_float32x{lanes}(" in kernel
    assert "opf_round_float32x" not in kernel
    halves = (np.arange(-140, 260, dtype=np.float32) + 0.5) * scale
    x = np.concatenate([halves, np.array(SPECIALS, np.float32)])
    x = np.resize(x, 256).astype(np.float32)
    if target.features <= host_target().features:
        np.testing.assert_array_equal(exe(x), evaluate(mod, [x]))


def _scaled_codes(shape, scales):
    """``(float(a) - 128) * scales`` of uint8 codes ``a``: a value the NaN facts bound."""
    codes = opf.var("a", shape=shape, dtype="uint8")
    centred = opf.op.subtract(opf.op.cast(codes, dtype="float32"), opf.const(np.float32(128)))
    return opf.op.multiply(centred, opf.const(scales))


def _quantized(value, scale, point):
    shifted = opf.op.add(opf.op.round(opf.op.divide(value, opf.const(np.float32(scale)))),
                         opf.const(np.float32(point)))
    return opf.op.clip(shifted, a_min=0.0, a_max=255.0)


def _codes_and_scales():
    codes = np.resize(np.arange(256, dtype=np.uint8), 512)
    # halves of the step at small scales (round to even), lanes past int32 at the large ones
    scales = np.concatenate([np.full(256, 0.0161184, np.float32),
                             np.geomspace(1e-3, 1e9, 256).astype(np.float32)])
    return codes, scales


@pytest.mark.parametrize("spec", [None, *OTHER_TARGETS])
def test_a_quantize_step_to_bytes_after_a_relu_saturates_in_the_narrowing(spec):
    """uint8(clip(round(relu(v) / s) + 3, 0, 255)): the ReLU's bound holds the lower clamp,
    and with AVX-512 the narrowing's unsigned saturation (vpmovusdb) the upper one, so the
    step is a quotient, a rounding conversion and one narrowing; the reference's values,
    halfway points and values past int32's range (which saturate to 255) included."""
    target = Target(spec) if spec else host_target()
    codes, scales = _codes_and_scales()
    value = opf.op.nn.relu(_scaled_codes(codes.shape, scales))
    expr = opf.op.cast(_quantized(value, 0.0322368, 3), dtype="uint8")
    params = [n for n in opf.ir.visitor.post_order(expr) if isinstance(n, opf.ir.Var)]
    mod = IRModule.from_expr(Function(params, expr))
    exe = opf.compile(mod, target=target)
    kernel = exe.source_code.split("//@opfusion-section kernel")[1]
    if target.has("avx512f"):
        assert "opf_usat_shift_uint8x16(" in kernel
        assert "opf_min_not_nan" not in kernel and kernel.count("opf_max_not_nan") == 1
    if target.features <= host_target().features:
        np.testing.assert_array_equal(exe(codes), evaluate(mod, [codes]))


@pytest.mark.parametrize("width", [4, 8])
def test_narrow_rows_saturate_in_their_own_width(width):
    """Rows of 4 and 8 values (vectors of that many lanes) narrow with AVX512-VL's
    ``vpmovusdb`` at their own width, with the reference's values."""
    codes = np.resize(np.arange(256, dtype=np.uint8), (64, width))
    scales = np.geomspace(1e-2, 1e9, width).astype(np.float32)
    value = opf.op.nn.relu(_scaled_codes(codes.shape, scales))
    expr = opf.op.cast(_quantized(value, 0.0322368, 3), dtype="uint8")
    params = [n for n in opf.ir.visitor.post_order(expr) if isinstance(n, opf.ir.Var)]
    mod = IRModule.from_expr(Function(params, expr))
    exe = opf.compile(mod)
    if host_target().has("avx512vl"):
        assert f"opf_usat_shift_uint8x{width}(" in exe.source_code
    np.testing.assert_array_equal(exe(codes), evaluate(mod, [codes]))


@pytest.mark.parametrize("spec", [None, *OTHER_TARGETS])
def test_dequantized_codes_clip_without_their_zero_point(spec):
    """A QuantizeLinear / DequantizeLinear pair (before a residual add, in ResNet):
    ``(clip(round(v / s) + z, 0, 255) - z) * s`` is ``clip(round(v / s), -z, 255 - z) * s``,
    without the two adds;
    the reference's values, the clip's edges and values past them included."""
    target = Target(spec) if spec else host_target()
    codes, scales = _codes_and_scales()
    quantized = _quantized(_scaled_codes(codes.shape, scales), 0.0534, 126)
    kept = opf.op.where(opf.op.isnan(quantized), opf.const(np.float32(0)), quantized)
    dequantized = opf.op.multiply(opf.op.subtract(kept, opf.const(np.float32(126))),
                                  opf.const(np.float32(0.0534)))
    expr = opf.op.nn.relu(dequantized)  # (a residual's add would contract into an FMA)
    params = [n for n in opf.ir.visitor.post_order(expr) if isinstance(n, opf.ir.Var)]
    mod = IRModule.from_expr(Function(params, expr))
    exe = opf.compile(mod, target=target)
    kernel = exe.source_code.split("//@opfusion-section kernel")[1]
    lanes = target.vector_lanes("float32")
    assert f"opf_splat_float32x{lanes}(126.0f)" not in kernel
    assert "(-126.0f)" in kernel and "129.0f" in kernel
    if target.features <= host_target().features:
        np.testing.assert_array_equal(exe(codes), evaluate(mod, [codes]))


_EXHAUSTIVE_CHECK = r"""
#include <stdio.h>
#include <string.h>
int main(void) {
  const float c = %(c)s, y = %(y)s;
  unsigned long long differ = 0, rounded_differ = 0;
  /* The 2^32 dividends in chunks over the cores: a minute on one core. */
  #pragma omp parallel for schedule(static) reduction(+:differ, rounded_differ)
  for (unsigned long long base = 0; base < (1ull << 32); base += %(lanes)d) {
    %(vt)s a, want, got;
    for (int k = 0; k < %(lanes)d; ++k) {
      unsigned int bits = (unsigned int)(base + k); float f; memcpy(&f, &bits, 4);
      if (!(f == f) || f > 1e30f || f < -1e30f) f = 0.0f;  /* the helper's domain */
      a[k] = f;
    }
    want = a / c;
    got = %(helper)s(a, c, y);
    for (int k = 0; k < %(lanes)d; ++k) {
      float w = want[k], g = got[k];
      float m = a[k] < 0 ? -a[k] : a[k], n = w < 0 ? -w : w;
      if (m >= 0x1p-90f && n >= 0x1p-90f) differ += memcmp(&w, &g, 4) != 0;
      rounded_differ += __builtin_nearbyintf(w) != __builtin_nearbyintf(g);
    }
  }
  printf("%%llu %%llu\n", differ, rounded_differ);
  return 0;
}
"""


@pytest.mark.slow
@pytest.mark.parametrize("scale", [0.05343363, 1.4142135])
def test_the_corrected_quotient_is_the_division_for_every_float32(scale, tmp_path):
    """The emitted helper against C's division for all 2^32 dividends (NaN and |a| > 1e30,
    outside the facts the helper needs, replaced by 0): the same bits wherever the dividend
    and the quotient are above 2^-90 (below, the residual a - q c may fall below the normal
    range: 4 of the 2^32 quotients near 2^-100 differ in their last bit for s = 0.0534), and
    the same rounding to integers everywhere."""
    import re
    import subprocess

    from opfusion.backend.cpu.toolchain import find_compiler, target_flags

    mod, exe = _rounded_quotient_module(scale)
    source = exe.source_code
    found = re.search(r"static inline (opf_float32x(\d+)) (opf_quotient_float32x\d+)\(", source)
    if found is None:
        pytest.skip("the host has no vector fused multiply-adds")
    vt, lanes, helper = found.group(1), int(found.group(2)), found.group(3)
    prelude = source[:source.index("//@opfusion-section kernel")]
    prelude = re.sub(r"extern [^\n]*opf_cancel_flag;", "", prelude)
    divisor = np.float32(scale)
    program = prelude + _EXHAUSTIVE_CHECK % {
        "c": f"{float(divisor)!r}f", "y": f"{float(np.float32(1) / divisor)!r}f",
        "lanes": lanes, "vt": vt, "helper": helper}
    (tmp_path / "check.c").write_text(program)
    flags = [f for f in target_flags() if f not in ("-shared", "-fPIC")]
    subprocess.run([*find_compiler(), *flags, str(tmp_path / "check.c"), "-o",
                    str(tmp_path / "check"), "-lm"], check=True)
    out = subprocess.run([str(tmp_path / "check")], check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["0", "0"]


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16"])
def test_float_to_narrow_casts_in_scalar_loops_follow_the_rule(dtype):
    """A blocked layout of three channels (a quantized stem's input) stays a scalar loop: its
    cast helper (two clamps and a truncation, no branches) gives the reference's values."""
    x = np.array((SPECIALS * 7)[:147], np.float32).reshape(1, 3, 7, 7)
    expr = opf.op.layout_transform(opf.op.cast(opf.var("x", shape=x.shape), dtype=dtype),
                                   src_layout="NCHW", dst_layout="NCHW3c")
    mod, exe = compiled(expr)
    assert f"opf_cast_float32_{dtype}(" in exe.source_code
    np.testing.assert_array_equal(exe(x), evaluate(mod, [x]))


@pytest.mark.parametrize("dtype", ["uint8", "int8", "uint16", "int16"])
def test_narrow_values_widened_to_float_run_in_vectors(dtype):
    """Codes read back as floats (a quantized residual add reads the bytes a convolution
    read): the loads widen in vectors."""
    info = np.iinfo(dtype)
    x = np.random.default_rng(3).integers(info.min, info.max + 1, 256).astype(dtype)
    x[:2] = info.min, info.max
    var = opf.var("x", shape=(256,), dtype=dtype)
    expr = opf.op.multiply(opf.op.cast(var, dtype="float32"), opf.const(np.float32(0.25)))
    mod, exe = compiled(expr)
    # (through int32, by one vpmovzxbd or its kin: GCC converts bytes straight to floats,
    # and 16 bytes to 16 int32 too, one element at a time)
    assert f"opf_widen_{dtype}_int32x" in exe.source_code
    want = evaluate(mod, [x])
    np.testing.assert_array_equal(exe(x), want)
    for target in OTHER_TARGETS:  # 8 lanes (AVX2), 4 (SSE)
        np.testing.assert_array_equal(opf.compile(mod, target=target)(x), want)


def test_quantize_linear_rounds_and_saturates_in_vectors():
    x = np.concatenate([np.array(SPECIALS, np.float32),
                        np.arange(-2.5, 2.5, 0.5, dtype=np.float32),
                        np.random.default_rng(1).standard_normal(95).astype(np.float32) * 3])
    model = _qdq_model(["quantize"], x.shape)
    mod, params = from_onnx(model)
    exe = opf.compile(mod, params=params)
    assert "opf_round_float32x" in exe.source_code
    np.testing.assert_array_equal(exe(x), evaluate(opf.transform.BindParams(params)(mod), [x]))


@pytest.mark.parametrize("depth", [1, 6])
def test_chains_of_quantize_dequantize_pairs_stay_linear_and_vectorized(depth):
    """Six pairs with Erf (expanded into polynomials) and a Mul between them: 450 KB of C
    before, 28 KB after; the kernel runs in vectors and gives the reference's numbers."""
    ops = (["qdq", "Erf", "qdq", "Mul"] * depth)[:max(2, 2 * depth)]
    x = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)
    x[0, :4] = [np.nan, np.inf, -np.inf, 300.0]
    mod, params = from_onnx(_qdq_model(ops, x.shape))
    exe = opf.compile(mod, params=params)
    source = exe.source_code
    kernel = source[source.index("//@opfusion-section kernel"):
                    source.index("//@opfusion-section table")]
    assert len(kernel) < 12000 * depth  # (9.5 KB for one pair, 28 KB for six)
    assert "opf_store_float32x" in kernel
    want = evaluate(opf.transform.BindParams(params)(mod), [x])
    np.testing.assert_array_equal(np.isnan(exe(x)), np.isnan(want))
    np.testing.assert_allclose(exe(x), want, rtol=1e-6, atol=1e-6)


def test_only_large_values_read_on_every_path_are_bound():
    buffer = E.Buffer("out", (4,), "float32")
    source = E.Buffer("x", (4,), "float32")
    i = E.Var("i", "int32")
    load = E.BufferLoad(source, (i,))
    big = load
    for step in range(MIN_SHARED_NODES):
        big = big * E.FloatImm(1.0 + step, "float32")
    small = load + E.FloatImm(1.0, "float32")
    kept_in_branch = E.Select(load > E.FloatImm(0.0, "float32"), big, small)
    stores = [S.BufferStore(buffer, big + big, [i]),       # bound
              S.BufferStore(buffer, small * small, [i]),   # too small
              S.BufferStore(buffer, kept_in_branch + kept_in_branch, [i])]  # the select is
    func = S.PrimFunc("f", [buffer, source], S.For(i, 0, 4, S.ForKind.SERIAL,
                                                   S.SeqStmt(stores)))
    body = bind_shared_values(func).body.body.stmts
    assert isinstance(body[0], S.LetStmt) and body[0].value is not None
    assert isinstance(body[1], S.BufferStore)
    # big is read only in the select's branch: evaluating it first could skip a guard
    assert isinstance(body[2], S.LetStmt) and isinstance(body[2].value, E.Select)
    assert isinstance(body[2].body, S.BufferStore)


def _qdq_model(ops, shape):
    """x through ``ops``: "qdq" a QuantizeLinear / DequantizeLinear pair (uint8, scale 0.02,
    zero point 128), "quantize" a QuantizeLinear alone, else a unary ONNX operator (Mul by
    0.5)."""
    nodes, current = [], "x"
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    out_type = TensorProto.FLOAT
    for at, name in enumerate(ops):
        if name in ("qdq", "quantize"):
            nodes.append(helper.make_node("QuantizeLinear", [current, "s", "z"], [f"q{at}"]))
            current = f"q{at}"
            if name == "quantize":
                out_type = TensorProto.UINT8
                continue
            nodes.append(helper.make_node("DequantizeLinear", [current, "s", "z"], [f"d{at}"]))
            current = f"d{at}"
        elif name == "Mul":
            nodes.append(helper.make_node("Mul", [current, "half"], [f"m{at}"]))
            current = f"m{at}"
        else:
            nodes.append(helper.make_node(name, [current], [f"o{at}"]))
            current = f"o{at}"
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info(current, out_type, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
