"""The transcendental functions the CPU kernels compute themselves (opfusion.backend.cpu.
vector_math): float32 exp within 1 ulp of the float64 result rounded to float32 over its
whole range, tanh and erf within 3 ulp, sigmoid (1 / (1 + exp(-x))) within 3; NaN,
infinities, signed zeros, subnormals and overflow as NumPy gives them; the same numbers
whether a loop runs in vectors or in its scalar form."""

import math
import shutil

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") or shutil.which("cc")),
                                reason="no C compiler")

SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 88.72283, 88.7229,
                     89.5, -87.33655, -103.972, -103.97207, -103.97209, -103.9799, -103.98,
                     -103.9801, -200.0, 1e30, -1e30], "float32")


def compiled_exp(shape, op=opf.op.exp):
    x = opf.var("x", shape=shape)
    return opf.compile(IRModule.from_expr(Function([x], op(x))))


def ulps(a, b):
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


@pytest.mark.parametrize("width", [1024, 1000], ids=["vector loop", "scalar remainder"])
def test_exp_is_within_one_ulp_over_its_range(width):
    exe = compiled_exp((256, width))
    values = np.random.default_rng(width).uniform(-104, 89, (256, width)).astype("float32")
    values.flat[:len(SPECIALS)] = SPECIALS
    got = exe(values)
    with np.errstate(over="ignore"):
        exact = np.exp(values.astype("float64")).astype("float32")
    finite = np.isfinite(exact)
    assert ulps(got[finite], exact[finite]).max() <= 1
    np.testing.assert_array_equal(got[~finite], exact[~finite])  # NaN and +inf as NumPy
    assert (got[exact == 0] == 0).all()


def test_exp_of_the_specials_matches_numpy_exactly():
    exe = compiled_exp((len(SPECIALS),))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(exe(SPECIALS), np.exp(SPECIALS.astype("float64"))
                                      .astype("float32"))


def test_vector_and_scalar_forms_agree_bit_for_bit():
    values = np.random.default_rng(1).uniform(-104, 89, (16, 1024)).astype("float32")
    vector = compiled_exp((16, 1024))
    scalar = compiled_exp((16 * 1024 // 8, 8))  # rows of 8: another width or the scalar form
    np.testing.assert_array_equal(vector(values), scalar(values.reshape(-1, 8)).reshape(16, 1024))


def test_avx512s_scalef_form_gives_the_plain_forms_values_bit_for_bit():
    """On AVX-512 the vector exp scales by 2^n with one scalef; the plain form multiplies by
    two exact powers of two. Both round once: the same numbers, subnormals included."""
    avx512 = opf.Target("c -mattr=+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx2,+fma")
    avx2 = opf.Target("c -mattr=+avx2,+fma")
    if avx512.missing_on_host():
        pytest.skip("no AVX-512 here")
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.uniform(-104, 89, 48 * 1024),
                             np.linspace(-104, -87, 16 * 1024)]).astype("float32")
    values[:len(SPECIALS)] = SPECIALS
    values = values.reshape(64, 1024)
    x = opf.var("x", shape=values.shape)
    mod = IRModule.from_expr(Function([x], opf.op.exp(x)))
    fast, plain = opf.compile(mod, target=avx512), opf.compile(mod, target=avx2)
    assert "_mm512_maskz_scalef_ps" in fast.source() and "scalef" not in plain.source()
    np.testing.assert_array_equal(fast(values), plain(values))


def test_a_vectorized_loop_calls_the_vector_exp():
    source = compiled_exp((4, 1024)).source()
    assert "opf_exp_float32x" in source and "expf(" not in source


ERF = np.vectorize(math.erf)
EXPANDED = {
    "tanh": (opf.op.tanh, np.tanh, 3),
    "erf": (opf.op.erf, ERF, 3),
    "sigmoid": (opf.op.sigmoid, lambda v: 1.0 / (1.0 + np.exp(-v)), 3),
}


@pytest.mark.parametrize("name", list(EXPANDED))
@pytest.mark.parametrize("width", [1024, 1000], ids=["vector loop", "scalar remainder"])
def test_functions_built_on_exp_are_within_a_few_ulp(name, width):
    op, exact_fn, most = EXPANDED[name]
    exe = compiled_exp((128, width), op)
    rng = np.random.default_rng(7)
    values = rng.uniform(-12, 12, (128, width)).astype("float32")
    values[:16] = rng.uniform(-1e-2, 1e-2, (16, width))  # where tanh and erf are near x
    values.flat[:len(SPECIALS)] = SPECIALS
    got = exe(values)
    with np.errstate(over="ignore"):
        exact = exact_fn(values.astype("float64")).astype("float32")
    assert np.array_equal(np.isnan(got), np.isnan(exact))
    finite = ~np.isnan(exact)
    assert ulps(got[finite], exact[finite]).max() <= most
    np.testing.assert_array_equal(np.signbit(got[exact == 0]), np.signbit(exact[exact == 0]))


def test_tanh_and_erf_loops_run_in_vectors():
    source = compiled_exp((4, 1024), opf.op.tanh).source()
    assert "opf_exp_float32x" in source and "tanhf(" not in source
    source = compiled_exp((4, 1024), opf.op.erf).source()  # a polynomial: no exp, no erff
    assert "opf_float32x" in source and "erff(" not in source and "opf_exp" not in source


def test_erf_is_within_3_ulp_across_its_polynomials():
    # densely over both pieces and their seams (0.875 and 3.92), either sign
    exe = compiled_exp((64, 32768), opf.op.erf)
    values = np.linspace(0.0, 4.5, 64 * 32768 // 2, dtype="float32")
    values = np.concatenate([values, -values]).reshape(64, 32768)
    got = exe(values)
    exact = ERF(values.astype("float64")).astype("float32")
    assert ulps(got, exact).max() <= 3


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("exponent", [2.0, 3.0, 4.0])
def test_small_integer_powers_are_products_with_pows_specials(dtype, exponent):
    x = opf.var("x", shape=(8, 64), dtype=dtype)
    power = opf.op.power(x, opf.const(np.array(exponent, dtype)))
    exe = opf.compile(IRModule.from_expr(Function([x], power)))
    values = (np.random.default_rng(3).standard_normal((8, 64)) * 10).astype(dtype)
    values.flat[:7] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30]
    with np.errstate(all="ignore"):
        want = np.power(values, np.array(exponent, dtype))
    got = exe(values)
    assert "pow(" not in exe.source() and "powf(" not in exe.source()
    np.testing.assert_allclose(got, want, rtol=3e-7 if dtype == "float32" else 1e-15)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [1024, 1000], ids=["vector loop", "scalar remainder"])
def test_square_roots_run_in_vectors_correctly_rounded(dtype, width):
    # libm's sqrt lane by lane (one vector instruction): NumPy's results exactly, -0, the
    # infinities, NaN for negatives and the subnormals included
    x = opf.var("x", shape=(8, width), dtype=dtype)
    exe = opf.compile(IRModule.from_expr(Function([x], opf.op.sqrt(x))))
    if width == 1024:
        assert f"opf_sqrt_{dtype}x" in exe.source()
    values = np.abs(np.random.default_rng(3).standard_normal((8, width))).astype(dtype) * 1e3
    values[0, :len(SPECIALS)] = SPECIALS
    values[1, :3] = [np.finfo(dtype).smallest_subnormal, np.finfo(dtype).max, -2.0]
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(exe(values), np.sqrt(values))


def _sigmoid_of_parts(x, negation):
    """1 / (1 + exp(-x)) from its operators, the negation ``0 - x`` or ``negative(x)``."""
    negated = opf.op.subtract(opf.const(np.float32(0)), x) if negation == "subtract" \
        else opf.op.negative(x)
    return opf.op.divide(opf.const(np.float32(1)),
                         opf.op.add(opf.const(np.float32(1)), opf.op.exp(negated)))


@pytest.mark.parametrize("negation", ["subtract", "negative"])
@pytest.mark.parametrize("width", [1024, 1000], ids=["vector loop", "scalar remainder"])
def test_exp_of_a_negation_gives_exps_bits_without_the_negation(negation, width):
    """Fused, exp(0 - x) and exp(-x) are one exp_neg(x) (the clamps mirrored, the reduction
    negated inside its multiply-adds); unfused, exp reads the negation a kernel wrote: the
    same numbers, bit for bit, over exp's range and the specials."""
    x = opf.var("x", shape=(64, width))
    mod = IRModule.from_expr(Function([x], _sigmoid_of_parts(x, negation)))
    fused = opf.compile(mod)
    assert "opf_exp_neg_float32" in fused.source()
    unfused = opf.compile(mod, fusion="none")
    assert "opf_exp_neg_float32" not in unfused.source()
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.uniform(-89, 104, 48 * width),
                             np.linspace(87, 104, 16 * width)]).astype("float32")
    values[:len(SPECIALS)] = -SPECIALS
    values = values.reshape(64, width)
    np.testing.assert_array_equal(fused(values), unfused(values))


def test_exp_neg_on_avx512_gives_the_plain_forms_bits():
    avx512 = opf.Target("c -mattr=+avx512f,+avx512dq,+avx512bw,+avx512vl,+avx2,+fma")
    if avx512.missing_on_host():
        pytest.skip("no AVX-512 here")
    x = opf.var("x", shape=(64, 1024))
    mod = IRModule.from_expr(Function([x], _sigmoid_of_parts(x, "subtract")))
    fast = opf.compile(mod, target=avx512)
    plain = opf.compile(mod, target="c -mattr=+avx2,+fma")
    assert "_mm512_maskz_scalef_ps" in fast.source() and "scalef" not in plain.source()
    values = np.concatenate([np.random.default_rng(4).uniform(-89, 104, 48 * 1024),
                             np.linspace(87, 104, 16 * 1024)]).astype("float32")
    values[:len(SPECIALS)] = -SPECIALS
    values = values.reshape(64, 1024)
    np.testing.assert_array_equal(fast(values), plain(values))


def test_a_product_with_a_reciprocal_is_one_division():
    """SiLU's x * (1 / (1 + exp(-x))) divides once: within 2 ulp of the exact x / (1 +
    exp(-x)) wherever exp(-x) is finite in float32 (its own ulp and the division's half),
    and the reference's values where it overflows (zeros) and at the specials."""
    x = opf.var("x", shape=(16, 1024))
    exe = opf.compile(IRModule.from_expr(Function([x], opf.op.multiply(x, opf.op.sigmoid(x)))))
    kernel = exe.source().split("//@opfusion-section kernel ")[1]
    assert "opf_splat_float32x16(1.0f) /" not in kernel and " / " in kernel
    values = np.random.default_rng(6).uniform(-30, 30, (16, 1024)).astype("float32")
    values.flat[:len(SPECIALS)] = SPECIALS
    got = exe(values)
    with np.errstate(over="ignore", invalid="ignore"):
        exact = (values / (1 + np.exp(-values.astype("float64")))).astype("float32")
        reference = values * (np.float32(1) / (np.float32(1) + np.exp(-values)))
        in_range = np.isfinite(np.exp(-values.astype("float64")).astype("float32"))
    assert ulps(got[in_range], exact[in_range]).max() <= 2
    np.testing.assert_array_equal(got[~in_range], reference[~in_range])


def _te_kernel(fn, shape, vector, target=None):
    """A kernel of ``fn`` on a float32 tensor of ``shape``, its inner loop in vectors of 16
    (or scalar), for ``target`` (default: the host)."""
    from opfusion import te

    x = te.placeholder(shape, name="x", dtype="float32")
    y = te.compute(shape, lambda i, j: fn(x[i, j]), name="y")
    s = te.create_schedule(y.op)
    if vector:
        _, inner = s[y].split(y.op.axis[1], factor=16)
        s[y].vectorize(inner)
    return opf.build(s, [x, y], target=target), y


def test_exp_normal_is_exp_or_zero_below_the_normal_floats():
    """te.exp_normal (softmax's and attention's weights): exp's bits, vector and scalar
    alike, from EXP_NORMAL_BELOW up, 0 below it where exp gives a subnormal, never a
    subnormal; one helper of the vector loop, not an exp and a select."""
    from opfusion import te
    from opfusion.tir.expr import EXP_NORMAL_BELOW

    rng = np.random.default_rng(6)
    values = np.concatenate([rng.uniform(-110, 89, 48 * 1024),
                             np.linspace(-104, -87, 16 * 1024)]).astype("float32")
    values[:len(SPECIALS)] = SPECIALS
    values = values.reshape(64, 1024)
    exact, _ = _te_kernel(te.exp, values.shape, vector=True)
    want = np.empty_like(values)
    exact(values, want)
    want[values < np.float32(EXP_NORMAL_BELOW)] = 0.0
    avx2 = opf.Target("c -mattr=+avx2,+fma")  # the plain vector form, without scalef
    for vector, target in ((True, None), (False, None), (True, avx2)):
        if target is not None and target.missing_on_host():
            continue
        kernel, _ = _te_kernel(te.exp_normal, values.shape, vector, target)
        got = np.empty_like(values)
        kernel(values, got)
        np.testing.assert_array_equal(got, want)
        tiny = np.finfo(np.float32).tiny
        assert not np.any((got != 0) & (np.abs(got) < tiny))
        if vector:
            assert "opf_exp_normal_float32x" in kernel.get_source()
