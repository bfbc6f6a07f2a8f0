"""The C code generator on hand-built loop IR: literals, names, vector types, allocations."""

import hashlib
import math

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.c_family import float_literal, int_literal
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.codegen import CodegenOptions, codegen_c, sanitize_identifier
from opfusion.errors import BuildError
from opfusion.target import Target
from opfusion.testing import assert_close
from opfusion.tir import expr as E
from opfusion.tir import stmt as S

needs_cc = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")
F = S.ForKind
rng = np.random.default_rng(3)


def loop(var: E.Var, extent: int, body: S.Stmt, kind: F = F.SERIAL) -> S.For:
    return S.For(var, 0, extent, kind, body)


def elementwise(name: str, n: int, value, kind: F = F.VECTORIZED, dtype: str = "float32",
                out_dtype: str | None = None) -> S.PrimFunc:
    """out[i] = value(A[i], i) for i in a loop of ``kind``."""
    A = E.Buffer("A", (n,), dtype)
    out = E.Buffer("out", (n,), out_dtype or dtype)
    i = E.Var("i")
    return S.PrimFunc(name, [A, out], loop(i, n, S.BufferStore(out, value(A.load([i]), i), [i]),
                                           kind))


#: The target of the tests that check the exact vector code (8 float32 lanes).
AVX2 = Target("c -mattr=+avx2,+fma")


def run(func: S.PrimFunc, *arrays: np.ndarray, options: CodegenOptions | None = None,
        target: Target = AVX2):
    kernel = opf.build(func, target=target, options=options)
    kernel(*arrays)
    return kernel.get_source()


# -- literals -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [0.1, 1.5, -2.75, 1e-30, 3.4028234663852886e38, 1e-45])
def test_float32_literals_are_exact(value):
    stored = float(np.float32(value))
    text = float_literal(stored, "float32")
    assert text.strip("()").endswith("f")
    number = text.strip("()").rstrip("f")
    parsed = float.fromhex(number) if "0x" in number else float(np.float32(number))
    assert parsed == stored


def test_special_float_literals():
    assert float_literal(math.inf, "float32") == "INFINITY"
    assert float_literal(-math.inf, "float32") == "(-INFINITY)"
    assert float_literal(math.nan, "float32") == "NAN"
    assert float_literal(-0.0, "float32") == "(-0.0f)"
    assert float_literal(0.1, "float64") == "0.1"
    assert float_literal(math.inf, "float64") == "((double)INFINITY)"


def test_integer_literals():
    assert int_literal(-(2**31), "int32") == "(-2147483647 - 1)"
    assert int_literal(-5, "int32") == "(-5)"
    assert int_literal(2**40, "int64") == "INT64_C(1099511627776)"
    assert int_literal(-(2**63), "int64") == "INT64_MIN"
    assert int_literal(7, "uint8") == "((uint8_t)7)"
    assert int_literal(1, "bool") == "true"


@needs_cc
def test_special_constants_reach_the_kernel_exactly():
    values = [math.inf, -math.inf, -0.0, float(np.float32(0.1)), float(np.float32(1e-45))]
    n = len(values)
    out = E.Buffer("out", (n,), "float32")
    body = S.SeqStmt([S.BufferStore(out, E.FloatImm(v, "float32"), [k])
                      for k, v in enumerate(values)])
    got = np.zeros(n, "float32")
    run(S.PrimFunc("constants", [out], body), got)
    np.testing.assert_array_equal(got, np.array(values, "float32"))
    assert math.copysign(1.0, got[2]) < 0
    nan = E.Buffer("nan", (1,), "float32")
    got = np.zeros(1, "float32")
    run(S.PrimFunc("nan", [nan], S.BufferStore(nan, E.FloatImm(math.nan, "float32"), [0])), got)
    assert np.isnan(got[0])


# -- names ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, safe", [
    ('a"; system("rm', "a___system__rm"),
    ("main", "main_"),
    ("int", "int_"),
    ("expf", "expf_"),
    ("3d", "v3d"),
    ("_x", "v_x"),
    ("opf_status", "uopf_status"),
    ("", "v"),
    ("x" * 100, "x" * 39 + "_" + hashlib.sha256(b"x" * 100).hexdigest()[:8]),
])
def test_sanitize_identifier(name, safe):
    assert sanitize_identifier(name) == safe


@needs_cc
def test_hostile_buffer_names_are_sanitized_and_unique():
    A = E.Buffer('x"); abort(); //', (4,), "float32")
    B = E.Buffer('x"); abort(); //', (4,), "float32")
    i = E.Var("int")
    func = S.PrimFunc("copy", [A, B], loop(i, 4, S.BufferStore(B, A.load([i]) + 1.0, [i])))
    a = np.arange(4, dtype="float32")
    b = np.zeros(4, "float32")
    source = run(func, a, b)
    assert "abort" not in source.replace("x____abort______", "")
    assert "x____abort______" in source and "x____abort_______1" in source
    np.testing.assert_array_equal(b, a + 1)


def test_source_is_deterministic():
    def make():
        return elementwise("det", 64, lambda a, i: E.maximum(a, 0.0) * 2.0)
    assert codegen_c(make()).code == codegen_c(make()).code


# -- vectorized loops -----------------------------------------------------------------------

@needs_cc
def test_vectorized_loop_uses_vector_types_without_guards(cpu_target):
    func = elementwise("relu2", 64, lambda a, i: E.maximum(a * 2.0, 0.0))
    a = rng.standard_normal(64).astype("float32")
    out = np.empty_like(a)
    source = run(func, a, out, target=cpu_target)
    np.testing.assert_array_equal(out, np.maximum(a * np.float32(2), 0))
    body = source.split("int32_t relu2")[1]
    lanes = cpu_target.vector_lanes("float32")
    assert f"opf_load_float32x{lanes}" in body and f"i += {lanes}" in body
    assert "if (" not in body and "?" not in body


@needs_cc
def test_vectorized_ramp_select_and_cast(cpu_target):
    def value(a, i):
        ramp = E.cast(i, "float32")
        return E.select(a > 0.0, ramp, E.FloatImm(-1.0, "float32")) + E.cast(i * 2, "float32")

    func = elementwise("ramp", 64, value)
    a = rng.standard_normal(64).astype("float32")
    out = np.empty_like(a)
    source = run(func, a, out, target=cpu_target)
    idx = np.arange(64, dtype="float32")
    np.testing.assert_array_equal(out, np.where(a > 0, idx, -1) + 2 * idx)
    lanes = cpu_target.vector_lanes("float32")
    assert f"opf_ramp_int32x{lanes}" in source and f"opf_select_float32x{lanes}" in source


@needs_cc
def test_vectorized_loop_with_intrinsic_falls_back_to_omp_simd():
    # (log is a libm call; exp, tanh and erf are the kernels' own: vector_math)
    func = elementwise("vlog", 64, lambda a, i: E.call("log", a))
    a = np.abs(rng.standard_normal(64)).astype("float32") + 0.5
    out = np.empty_like(a)
    source = run(func, a, out)
    assert "#pragma omp simd" in source and "logf(" in source
    np.testing.assert_allclose(out, np.log(a), rtol=1e-6)


@needs_cc
def test_vectorized_loop_with_exp_runs_in_vectors():
    func = elementwise("vexp", 64, lambda a, i: E.call("exp", a))
    a = rng.standard_normal(64).astype("float32")
    out = np.empty_like(a)
    source = run(func, a, out)
    assert "opf_exp_float32x" in source and "expf(" not in source
    np.testing.assert_allclose(out, np.exp(a), rtol=1e-6)


@needs_cc
def test_vectorized_strided_store_falls_back_to_omp_simd():
    A = E.Buffer("A", (32,), "float32")
    out = E.Buffer("out", (64,), "float32")
    i = E.Var("i")
    func = S.PrimFunc("strided", [A, out], loop(i, 32, S.BufferStore(out, A.load([i]), [i * 2]),
                                                F.VECTORIZED))
    a = rng.standard_normal(32).astype("float32")
    got = np.zeros(64, "float32")
    source = run(func, a, got)
    assert "#pragma omp simd" in source
    np.testing.assert_array_equal(got[::2], a)


@needs_cc
def test_vectorized_float64_and_int64(cpu_target):
    func = elementwise("f64", 12, lambda a, i: a * 3.0 + E.cast(i, "float64"), dtype="float64")
    a = rng.standard_normal(12)
    out = np.empty_like(a)
    source = run(func, a, out, target=cpu_target)
    assert "opf_float64x4" in source  # 12 elements: 4 lanes, the widest vector that divides 12
    assert_close(out, a * 3 + np.arange(12), rtol=1e-15)  # the C compiler may contract to an FMA
    func = elementwise("i64", 8, lambda a, i: a * 3 - 1, dtype="int64")
    a = rng.integers(-100, 100, 8)
    out = np.empty_like(a)
    source = run(func, a, out, target=cpu_target)
    assert f"opf_int64x{cpu_target.vector_lanes('int64')}" in source
    np.testing.assert_array_equal(out, a * 3 - 1)


@needs_cc
def test_streaming_stores_for_large_outputs_are_correct():
    n = 4096
    A = E.Buffer("A", (n,), "float32")
    out = E.Buffer("out", (n,), "float32")
    io, ii = E.Var("io"), E.Var("ii")
    index = io * 256 + ii
    body = loop(io, n // 256, loop(ii, 256, S.BufferStore(out, A.load([index]) + 1.0, [index]),
                                   F.VECTORIZED), F.PARALLEL)
    func = S.PrimFunc("stream", [A, out], body)
    a = rng.standard_normal(n).astype("float32")
    got = np.zeros(n, "float32")
    source = run(func, a, got, options=CodegenOptions(streaming_store_bytes=1024))
    assert "opf_stream_float32x8(&out" in source
    # a fence ends each parallel iteration, after its streaming stores
    assert source.index("opf_stream_fence();\n  }") > source.index("opf_stream_float32x8(&out")
    np.testing.assert_array_equal(got, a + np.float32(1))
    small = codegen_c(func, target=AVX2).code
    assert "opf_stream" not in small  # 16 KiB is below the default threshold


# -- allocations, lets, conditions, dtypes ---------------------------------------------------

def local_sum_func(n: int) -> S.PrimFunc:
    """out[0] = sum of A, through a local buffer of n elements."""
    A = E.Buffer("A", (n,), "float32")
    out = E.Buffer("out", (1,), "float32")
    tmp = E.Buffer("tmp", (n,), "float32", scope="local")
    i, j = E.Var("i"), E.Var("j")
    body = S.Allocate(tmp, S.SeqStmt([
        loop(i, n, S.BufferStore(tmp, A.load([i]) * 2.0, [i]), F.VECTORIZED),
        S.BufferStore(out, 0.0, [0]),
        loop(j, n, S.BufferStore(out, out.load([0]) + tmp.load([j]), [0])),
    ]))
    return S.PrimFunc("local_sum", [A, out], body)


@needs_cc
@pytest.mark.parametrize("stack_bytes", [1 << 16, 0], ids=["stack", "heap"])
def test_local_allocation_on_stack_or_aligned_heap(stack_bytes):
    n = 256
    a = rng.standard_normal(n).astype("float32")
    got = np.zeros(1, "float32")
    source = run(local_sum_func(n), a, got, options=CodegenOptions(stack_bytes=stack_bytes))
    assert ("aligned_alloc(64, 1024)" in source) == (stack_bytes == 0)
    assert ("tmp[256] __attribute__((aligned(64)))" in source) == (stack_bytes > 0)
    np.testing.assert_allclose(got[0], np.sum(a.astype("float64") * 2), rtol=1e-5)


@needs_cc
def test_let_if_then_else_and_let_expression():
    n = 16
    A = E.Buffer("A", (n,), "int32")
    out = E.Buffer("out", (n,), "int32")
    i, t, u = E.Var("i"), E.Var("t"), E.Var("u")
    body = loop(i, n, S.LetStmt(t, A.load([i]) * 3, S.IfThenElse(
        t > 10,
        S.BufferStore(out, E.Let(u, t - 10, u * u), [i]),
        S.BufferStore(out, E.floordiv(t, 4) + E.floormod(t, 4), [i]))))
    a = rng.integers(-20, 20, n).astype("int32")
    got = np.zeros(n, "int32")
    run(S.PrimFunc("lets", [A, out], body), a, got)
    t_ = a * 3
    np.testing.assert_array_equal(got, np.where(t_ > 10, (t_ - 10) ** 2, t_ // 4 + t_ % 4))


@needs_cc
def test_float16_arithmetic():
    func = elementwise("half", 8, lambda a, i: a * 2.0 + 1.0, dtype="float16", kind=F.SERIAL)
    a = rng.standard_normal(8).astype("float16")
    out = np.empty_like(a)
    run(func, a, out)
    np.testing.assert_array_equal(out, (a * np.float16(2) + np.float16(1)).astype("float16"))


def test_large_buffers_use_64_bit_offsets():
    n = 2**31 + 8
    A = E.Buffer("A", (n,), "float32")
    i = E.Var("i", "int64")
    func = S.PrimFunc("big", [A], loop(i, n, S.BufferStore(A, 1.0, [i])))
    source = codegen_c(func).code
    assert "for (int64_t i = INT64_C(0); i < INT64_C(2147483656); ++i)" in source


# -- errors ---------------------------------------------------------------------------------

def test_undefined_variable_is_a_build_error():
    A = E.Buffer("A", (4,), "float32")
    stray = E.Var("stray")
    func = S.PrimFunc("bad", [A], S.BufferStore(A, 1.0, [stray]))
    with pytest.raises(BuildError, match="variable 'stray' is used but not defined"):
        codegen_c(func)


def test_unknown_buffer_is_a_build_error():
    A = E.Buffer("A", (4,), "float32")
    ghost = E.Buffer("ghost", (4,), "float32")
    func = S.PrimFunc("bad", [A], S.BufferStore(A, ghost.load([0]), [0]))
    with pytest.raises(BuildError, match="buffer 'ghost' is used but is neither"):
        codegen_c(func)


def test_buffer_passed_twice_is_a_build_error():
    A = E.Buffer("A", (4,), "float32")
    func = S.PrimFunc("twice", [A, A], S.BufferStore(A, 1.0, [0]))
    with pytest.raises(BuildError, match="passed twice"):
        codegen_c(func)


def test_build_of_primfunc_refuses_args():
    func = elementwise("f", 8, lambda a, i: a)
    with pytest.raises(BuildError, match="PrimFunc"):
        opf.build(func, [1, 2])


@needs_cc
def test_vectorized_masks_and_scalar_conditions():
    n, block = 32, 16
    A = E.Buffer("A", (n,), "float32")
    out = E.Buffer("out", (n,), "float32")
    io, ii = E.Var("io"), E.Var("ii")
    a = A.load([io * block + ii])
    inside = E.logical_and(a > 0.0, E.logical_not(a > 1.0))
    value = (E.select(io > 0, a * 2.0, a)
             + E.select(E.logical_or(inside, a < -1.0), E.FloatImm(1.0, "float32"),
                        E.FloatImm(0.0, "float32")))
    body = loop(io, n // block, loop(ii, block, S.BufferStore(out, value, [io * block + ii]),
                                     F.VECTORIZED))
    x = rng.uniform(-2, 2, n).astype("float32")
    got = np.zeros(n, "float32")
    source = run(S.PrimFunc("masks", [A, out], body), x, got)
    assert "opf_select_float32x8" in source and "ii += 8" in source
    scale = np.where(np.arange(n) >= block, np.float32(2), np.float32(1))
    flag = ((x > 0) & ~(x > 1)) | (x < -1)
    np.testing.assert_array_equal(got, x * scale + flag.astype("float32"))


@needs_cc
def test_vectorized_loop_around_other_loops_compiles():
    # A vectorized outer loop may not hold OpenMP constructs (omp simd, parallel for) inside.
    n, m = 8, 16
    A = E.Buffer("A", (n, m), "float32")
    out = E.Buffer("out", (n, m), "float32")
    i, j = E.Var("i"), E.Var("j")
    body = loop(i, n, loop(j, m, S.BufferStore(out, A.load([i, j]) * 2.0, [i, j]), F.PARALLEL),
                F.VECTORIZED)
    a = rng.standard_normal((n, m)).astype("float32")
    got = np.zeros((n, m), "float32")
    source = run(S.PrimFunc("outer_vec", [A, out], body), a, got)
    assert "#pragma GCC ivdep" in source
    np.testing.assert_array_equal(got, a * 2)


@needs_cc
def test_vectorized_body_with_lets():
    # `idx` is an affine index (a scalar at each chunk's first lane), `t` a vector value.
    n, block = 32, 16
    A = E.Buffer("A", (n,), "float32")
    out = E.Buffer("out", (n,), "float32")
    io, ii, idx, t = E.Var("io"), E.Var("ii"), E.Var("idx"), E.Var("t", "float32")
    body = loop(io, n // block, loop(ii, block, S.LetStmt(idx, io * block + ii, S.LetStmt(
        t, A.load([idx]) * 3.0, S.BufferStore(out, t + t * t, [idx]))), F.VECTORIZED))
    x = rng.standard_normal(n).astype("float32")
    got = np.zeros(n, "float32")
    source = run(S.PrimFunc("lets_vec", [A, out], body), x, got)
    assert "const opf_float32x8 t = " in source and "const int32_t idx = " in source
    t_ = x * np.float32(3)
    assert_close(got, t_ + t_ * t_, rtol=1e-6)  # the C compiler may fuse t + t*t into an FMA
