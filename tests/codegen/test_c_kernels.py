"""Kernels from te schedules, built to C, compiled and run against NumPy (seed 001 and friends)."""

import math

import numpy as np
import pytest

import opfusion as opf
from opfusion import te
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.errors import BuildError, DeviceError
from opfusion.testing import assert_close

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

rng = np.random.default_rng(7)


def vecadd(n: int, schedule: str):
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute(A.shape, lambda i: A[i] + B[i], name="C")
    s = te.create_schedule(C.op)
    if schedule != "none":
        outer, inner = s[C].split(C.op.axis[0], factor=64)
        s[C].parallel(outer)
        if schedule == "split+parallel+vectorize":
            s[C].vectorize(inner)
    return s, [A, B, C]


@pytest.mark.parametrize("schedule", ["none", "split+parallel", "split+parallel+vectorize"])
@pytest.mark.parametrize("n", [1024, 1000])
def test_seed_vecadd_matches_numpy(schedule, n):
    s, args = vecadd(n, schedule)
    fadd = opf.build(s, args, "c", name="vecadd")
    dev = opf.device("cpu", 0)
    a = opf.nd.array(rng.uniform(size=n).astype("float32"), dev)
    b = opf.nd.array(rng.uniform(size=n).astype("float32"), dev)
    c = opf.nd.array(np.zeros(n, dtype="float32"), dev)
    fadd(a, b, c)
    np.testing.assert_array_equal(c.numpy(), a.numpy() + b.numpy())


def test_parallel_loop_becomes_omp_parallel_for():
    s, args = vecadd(1024, "split+parallel")
    source = opf.build(s, args, name="vecadd").get_source()
    assert "#pragma omp parallel for" in source


def test_vectorized_loop_has_no_per_element_guard():
    s, args = vecadd(1024, "split+parallel+vectorize")
    source = opf.build(s, args, name="vecadd").get_source()
    kernel = source.split("int32_t vecadd(")[1].split("\n}\n")[0]
    # The one `if` allowed is the cancellation check that opens each parallel iteration.
    guards = [line for line in kernel.splitlines()
              if "if (" in line and "opf_cancel_flag" not in line]
    assert not guards and "?" not in kernel


def test_unrolled_loop_is_unrolled_and_correct():
    n = 256
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, name="B")
    s = te.create_schedule(B.op)
    _, inner = s[B].split(B.op.axis[0], factor=4)
    s[B].unroll(inner)
    kernel = opf.build(s, [A, B], name="unrolled")
    assert "#pragma GCC unroll 4" in kernel.get_source()
    a = rng.standard_normal(n).astype("float32")
    b = np.empty_like(a)
    kernel(a, b)
    np.testing.assert_array_equal(b, a * np.float32(2) + np.float32(1))


def matmul_blocked(n: int, bn: int):
    k = te.reduce_axis((0, n), name="k")
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    packed = te.compute((n // bn, n, bn), lambda x, y, z: B[y, x * bn + z], name="packedB")
    C = te.compute((n, n), lambda x, y: te.sum(A[x, k] * packed[y // bn, k, y % bn], axis=k),
                   name="C")
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    xo, yo, xi, yi = s[C].tile(C.op.axis[0], C.op.axis[1], bn, bn)
    s[C].vectorize(yi)
    s[C].parallel(xo)
    s[CC].compute_at(s[C], yo)
    xc, yc = s[CC].op.axis
    (kc,) = s[CC].op.reduce_axis
    ko, ki = s[CC].split(kc, factor=4)
    xco, xci = s[CC].split(xc, factor=2)
    s[CC].reorder(xco, ko, ki, xci, yc)
    s[CC].unroll(ki)
    s[CC].unroll(xci)
    s[CC].vectorize(yc)
    s[packed].vectorize(s[packed].op.axis[2])
    return s, [A, B, C]


def matmul_plain(n: int):
    k = te.reduce_axis((0, n), name="k")
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    C = te.compute((n, n), lambda x, y: te.sum(A[x, k] * B[k, y], axis=k), name="C")
    return te.create_schedule(C.op), [A, B, C]


@pytest.mark.parametrize("make", [lambda: matmul_plain(48), lambda: matmul_blocked(64, 16)],
                         ids=["plain", "blocked-packed-cached"])
def test_matmul_matches_numpy(make):
    s, args = make()
    n = args[0].shape[0]
    kernel = opf.build(s, args, name="matmul")
    a = rng.standard_normal((n, n)).astype("float32")
    b = rng.standard_normal((n, n)).astype("float32")
    c = np.zeros((n, n), "float32")
    kernel(a, b, c)
    assert_close(c, a @ b, rtol=1e-5)


def test_matmul_accumulator_is_vectorized_with_vector_types(cpu_target):
    source = opf.build(*matmul_blocked(64, 16), target=cpu_target, name="matmul").get_source()
    lanes = cpu_target.vector_lanes("float32")  # 8 with AVX2, 16 (the whole row) with AVX-512
    assert f"opf_load_float32x{lanes}(&C_local" in source


_erf = np.vectorize(math.erf)

UNARY = {
    "exp": (te.exp, np.exp, (-5, 5)),
    "log": (te.log, np.log, (0.01, 10)),
    "sqrt": (te.sqrt, np.sqrt, (0, 10)),
    "tanh": (te.tanh, np.tanh, (-4, 4)),
    "erf": (te.erf, _erf, (-3, 3)),
    "floor": (te.floor, np.floor, (-9, 9)),
    "round": (te.round, np.round, (-9, 9)),
    "sigmoid": (te.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-6, 6)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_math_intrinsics_match_numpy(name, dtype):
    fn, ref, (lo, hi) = UNARY[name]
    n = 256
    A = te.placeholder((n,), dtype=dtype, name="A")
    B = te.compute((n,), lambda i: fn(A[i]), name="B")
    s = te.create_schedule(B.op)
    _, inner = s[B].split(B.op.axis[0], factor=8)
    s[B].vectorize(inner)
    kernel = opf.build(s, [A, B], name=name)
    a = rng.uniform(lo, hi, n).astype(dtype)
    if name == "round":
        a[:4] = [0.5, 1.5, 2.5, -0.5]  # half to even, as NumPy
    b = np.empty_like(a)
    kernel(a, b)
    assert_close(b, ref(a.astype("float64")).astype(dtype), rtol=1e-6)


def test_pow_and_division():
    n = 64
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: te.power(A[i], B[i]) / (B[i] + 1.0), name="C")
    kernel = opf.build(te.create_schedule(C.op), [A, B, C], name="pow_div")
    a = rng.uniform(0.5, 2, n).astype("float32")
    b = rng.uniform(0, 3, n).astype("float32")
    c = np.empty_like(a)
    kernel(a, b, c)
    assert_close(c, (np.power(a, b) / (b + np.float32(1))).astype("float32"), rtol=1e-6)


@pytest.mark.parametrize("vectorize", [False, True])
def test_max_min_propagate_nan_like_numpy(vectorize, cpu_target):
    n = 16
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: te.max(A[i], B[i]) + te.min(A[i], 0.0), name="C")
    s = te.create_schedule(C.op)
    if vectorize:
        s[C].vectorize(C.op.axis[0])
    kernel = opf.build(s, [A, B, C], target=cpu_target, name="maxmin")
    a = rng.standard_normal(n).astype("float32")
    b = rng.standard_normal(n).astype("float32")
    a[0], b[1], a[2], b[2] = np.nan, np.nan, np.nan, np.nan
    a[3:9] = [np.inf, -np.inf, 0.0, -0.0, np.inf, 1.0]
    b[3:9] = [1.0, np.inf, -0.0, 0.0, np.nan, -np.inf]
    c = np.empty_like(a)
    kernel(a, b, c)
    with np.errstate(invalid="ignore"):  # inf + -inf is NaN, in the kernel as here
        want = np.maximum(a, b) + np.minimum(a, np.float32(0))
    np.testing.assert_array_equal(c, want)


@pytest.mark.parametrize("vectorize", [False, True])
def test_select_cast_and_comparison(vectorize, cpu_target):
    n = 32
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: te.if_then_else(A[i] > 0.5, A[i] * 2.0, -A[i]), name="B")
    C = te.compute((n,), lambda i: te.cast(B[i] * 10.0, "int32"), name="C")
    s = te.create_schedule(C.op)
    s[B].compute_inline()
    if vectorize:
        s[C].vectorize(C.op.axis[0])
    kernel = opf.build(s, [A, C], target=cpu_target, name="select_cast")
    a = rng.uniform(-2, 2, n).astype("float32")
    c = np.empty(n, "int32")
    kernel(a, c)
    b = np.where(a > np.float32(0.5), a * np.float32(2), -a)
    np.testing.assert_array_equal(c, (b * np.float32(10)).astype("int32"))


def test_integer_floor_division_and_modulo_follow_python():
    n = 64
    A = te.placeholder((n,), dtype="int32", name="A")
    B = te.placeholder((n,), dtype="int32", name="B")
    C = te.compute((n,), lambda i: te.floordiv(A[i], B[i]) * 1000 + te.floormod(A[i], B[i]),
                   name="C")
    kernel = opf.build(te.create_schedule(C.op), [A, B, C], name="floor_ops")
    a = rng.integers(-50, 50, n).astype("int32")
    b = rng.integers(1, 7, n).astype("int32") * rng.choice([-1, 1], n).astype("int32")
    c = np.empty(n, "int32")
    kernel(a, b, c)
    np.testing.assert_array_equal(c, (a // b) * 1000 + a % b)


def test_index_arithmetic_with_non_dividing_split_and_fuse():
    rows, cols = 37, 29
    A = te.placeholder((rows, cols), name="A")
    B = te.compute((cols, rows), lambda j, i: A[i, j] * 3.0, name="B")
    s = te.create_schedule(B.op)
    fused = s[B].fuse(*B.op.axis)
    outer, inner = s[B].split(fused, factor=16)
    s[B].parallel(outer)
    kernel = opf.build(s, [A, B], name="transpose_scale")
    a = rng.standard_normal((rows, cols)).astype("float32")
    b = np.empty((cols, rows), "float32")
    kernel(a, b)
    np.testing.assert_array_equal(b, a.T * np.float32(3))


def test_same_schedule_gives_byte_identical_source():
    first = opf.build(*matmul_blocked(64, 16), name="matmul").get_source()
    second = opf.build(*matmul_blocked(64, 16), name="matmul").get_source()
    assert first == second


def test_hostile_kernel_name_becomes_a_safe_identifier():
    s, args = vecadd(64, "none")
    kernel = opf.build(s, args, name='a"; system("rm -rf /')
    assert kernel.entry_name == "a___system__rm__rf__"
    assert kernel.name == 'a"; system("rm -rf /'
    assert '"' not in kernel.get_source()
    a, b, c = (np.ones(64, "float32") for _ in range(3))
    kernel(a, b, c)
    np.testing.assert_array_equal(c, 2.0)


@pytest.mark.parametrize("target", ["cuda", "opencl -device=mali", "wasm"])
def test_targets_other_than_c_are_refused(target):
    s, args = vecadd(64, "none")
    with pytest.raises((BuildError, DeviceError), match="target"):
        opf.build(s, args, target=target)


def test_build_of_schedule_needs_args():
    s, _ = vecadd(64, "none")
    with pytest.raises(BuildError, match="argument tensors"):
        opf.build(s)


def test_building_the_same_kernel_twice_compiles_once():
    from opfusion.backend.cpu.toolchain import compile_stats

    n = 96  # a size no other test builds, so the first build really compiles
    before = compile_stats()
    first = opf.build(*vecadd(n, "split+parallel+vectorize"), name="twice")
    middle = compile_stats()
    second = opf.build(*vecadd(n, "split+parallel+vectorize"), name="twice")
    after = compile_stats()
    assert middle.compiles == before.compiles + 1 and not first.library.from_cache
    assert after.compiles == middle.compiles and second.library.from_cache
    assert first.library.path == second.library.path


def test_build_without_a_compiler_says_what_to_do(monkeypatch):
    from opfusion.errors import CompilerNotFoundError

    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(CompilerNotFoundError, match="Set CC"):
        opf.build(*vecadd(64, "none"), name="no_cc")
