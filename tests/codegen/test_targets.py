"""The same kernels generated for an AVX2 and an AVX-512 target: each source uses the target's
vector width (32 or 64 bytes), only the intrinsics the target has, and computes the numbers
NumPy (or the reference interpreter) computes. The AVX-512 kernels run only on a host with
AVX-512 (the cpu_target fixture skips them elsewhere)."""

import re

import numpy as np
import pytest
from kernel_schedules import tiled_matmul

import opfusion as opf
from opfusion import te
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.codegen import CodegenOptions, codegen_c
from opfusion.target import Target
from opfusion.testing import SMALL_WORKLOAD_ARGS, WORKLOADS, assert_close, workload_input
from opfusion.tir import expr as E
from opfusion.tir import stmt as S

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

rng = np.random.default_rng(23)


def vector_sizes(source: str) -> set[int]:
    """The byte sizes of the source's GCC vector types."""
    return {int(n) for n in re.findall(r"vector_size\((\d+)\)", source)}


def widest(target: Target) -> int:
    return target.vector_bytes


def test_the_two_targets_differ_in_width():
    assert (Target("c -mattr=+avx2,+fma").vector_bytes, Target("c -mattr=+avx512f").vector_bytes
            ) == (32, 64)


def test_elementwise(cpu_target):
    n = 96
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: te.max(A[i] * 2.0 - 1.0, 0.0), name="B")
    s = te.create_schedule(B.op)
    s[B].vectorize(B.op.axis[0])
    kernel = opf.build(s, [A, B], target=cpu_target, name="relu")
    a = rng.standard_normal(n).astype("float32")
    b = np.empty_like(a)
    kernel(a, b)
    np.testing.assert_array_equal(b, np.maximum(a * np.float32(2) - np.float32(1), 0))
    assert vector_sizes(kernel.get_source()) == {widest(cpu_target)}


def test_column_sums_reduce_in_vectors(cpu_target):
    rows, cols = 40, 64
    A = te.placeholder((rows, cols), name="A")
    r = te.reduce_axis((0, rows), name="r")
    C = te.compute((cols,), lambda j: te.sum(A[r, j], axis=r), name="C")
    s = te.create_schedule(C.op)
    CC = s.cache_write(C, "local")
    jo, ji = s[C].split(C.op.axis[0], factor=32)
    s[C].vectorize(ji)
    s[CC].compute_at(s[C], jo)
    s[CC].reorder(s[CC].op.reduce_axis[0], s[CC].op.axis[0])
    s[CC].vectorize(s[CC].op.axis[0])
    kernel = opf.build(s, [A, C], target=cpu_target, name="colsum")
    a = rng.standard_normal((rows, cols)).astype("float32")
    c = np.empty(cols, "float32")
    kernel(a, c)
    want = np.zeros(cols, np.float32)
    for row in a:  # additions in the kernel's order: exact
        want = want + row
    np.testing.assert_array_equal(c, want)
    assert widest(cpu_target) in vector_sizes(kernel.get_source())


def test_selects_casts_and_comparisons(cpu_target):
    n = 64
    A = E.Buffer("A", (n,), "float32")
    K = E.Buffer("K", (n,), "int32")
    out = E.Buffer("out", (n,), "float64")
    i, t, u = E.Var("i"), E.Var("t", "float32"), E.Var("u", "float32")
    a, k = A.load([i]), K.load([i])
    inside = E.logical_and(a > -0.5, E.logical_not(k == 3))
    # A 32-bit mask selects float32 lanes (vector lets: a select's branches may not load);
    # the result is widened to float64.
    value = E.cast(E.select(inside, t, u), "float64") - E.cast(k * 2 + i, "float64")
    body = S.LetStmt(t, a * 2.0, S.LetStmt(u, E.cast(E.maximum(k, i), "float32"),
                                           S.BufferStore(out, value, [i])))
    func = S.PrimFunc("mixed", [A, K, out], S.For(i, 0, n, S.ForKind.VECTORIZED, body))
    kernel = opf.build(func, target=cpu_target)
    x = rng.standard_normal(n).astype("float32")
    ks = rng.integers(0, 6, n).astype("int32")
    got = np.empty(n, "float64")
    kernel(x, ks, got)
    idx = np.arange(n)
    keep = (x > np.float32(-0.5)) & ~(ks == 3)
    picked = np.where(keep, x * np.float32(2), np.maximum(ks, idx).astype("float32"))
    np.testing.assert_array_equal(got, picked.astype("float64") - (ks * 2 + idx))
    source = kernel.get_source()
    lanes = cpu_target.vector_bytes // 8  # the widest element, float64, sets the lanes
    assert f"opf_select_float32x{lanes}" in source and "__builtin_convertvector" in source
    assert widest(cpu_target) in vector_sizes(source)


def test_register_tiled_matmul(cpu_target):
    m, n, k, rows, cols = 24, 64, 29, 4, 32
    s, (A, B, C) = tiled_matmul(m, n, k, rows, cols, parallel=True)
    kernel = opf.build(s, [A, B, C], target=cpu_target, name="matmul")
    a = rng.standard_normal((m, k)).astype("float32")
    b = rng.standard_normal((k, n)).astype("float32")
    c = np.empty((m, n), "float32")
    kernel(a, b, c)
    assert_close(c, a @ b)
    source = kernel.get_source()
    lanes = cpu_target.vector_lanes("float32")
    accumulators = re.findall(rf"opf_float32x{lanes} acc", source)
    assert len(accumulators) == rows * cols // lanes  # 16 with AVX2, 8 with AVX-512
    # AVX-512 pins operands in any of its 32 registers ("v"), AVX2 in one of 16 ("x")
    pin = '"+v"' if cpu_target.has("avx512f") else '"+x"'
    assert pin in source and "OPF_PIN(" in source


def test_register_tiled_convolutions_match_the_interpreter(cpu_target):
    mod, params = WORKLOADS["resnet18"](**SMALL_WORKLOAD_ARGS["resnet18"])
    exe = opf.compile(mod, params=params, target=cpu_target)
    lanes = cpu_target.vector_lanes("float32")  # the conv tiles are vectors of the target's
    assert f"opf_float32x{lanes} acc" in exe.source()
    lines = exe.verify(workload_input(mod, params, seed=2))  # each kernel vs the interpreter
    assert lines and all(line.endswith(": ok") for line in lines)


def streaming_func() -> S.PrimFunc:
    n = 4096
    A = E.Buffer("A", (n,), "float32")
    out = E.Buffer("out", (n,), "float32")
    io, ii = E.Var("io"), E.Var("ii")
    index = io * 256 + ii
    inner = S.For(ii, 0, 256, S.ForKind.VECTORIZED,
                  S.BufferStore(out, A.load([index]) * 3.0, [index]))
    return S.PrimFunc("stream", [A, out], S.For(io, 0, n // 256, S.ForKind.PARALLEL, inner))


def test_streaming_stores(cpu_target):
    kernel = opf.build(streaming_func(), target=cpu_target,
                       options=CodegenOptions(streaming_store_bytes=1024))
    a = rng.standard_normal(4096).astype("float32")
    got = np.zeros_like(a)
    kernel(a, got)
    np.testing.assert_array_equal(got, a * np.float32(3))
    source = kernel.get_source()
    lanes = cpu_target.vector_lanes("float32")
    assert f"opf_stream_float32x{lanes}(&out" in source and "opf_stream_fence();" in source
    assert ("_mm512_stream_ps" in source) == cpu_target.has("avx512f")
    assert "_mm256_stream_ps" in source


def test_a_target_without_avx_gets_sse_vectors_and_no_avx_code():
    sse2 = Target("c -mattr=+sse2")
    kernel = opf.build(streaming_func(), target=sse2,
                       options=CodegenOptions(streaming_store_bytes=1024))
    a = rng.standard_normal(4096).astype("float32")
    got = np.zeros_like(a)
    kernel(a, got)
    np.testing.assert_array_equal(got, a * np.float32(3))
    source = kernel.get_source()
    assert vector_sizes(source) == {16}
    assert "_mm256" not in source and "_mm512" not in source  # no streaming stores at all
    assert "opf_stream" not in source


def test_avx2_source_has_no_avx512_code():
    source = codegen_c(streaming_func(), target=Target("c -mattr=+avx2,+fma"),
                       options=CodegenOptions(streaming_store_bytes=1024)).code
    assert vector_sizes(source) == {32} and "512" not in source
