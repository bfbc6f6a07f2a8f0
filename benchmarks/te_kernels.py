"""Seed 001's kernels built with opfusion's kernel stack, against NumPy measured in the same run.

    $ python benchmarks/te_kernels.py
    kernel   size            opfusion        numpy baseline        ratio
    matmul   1024^3 f32      ... GFLOP/s     ... GFLOP/s (A @ B)   ...
    ewise    16777216 f32    ... GB/s        ... GB/s (np.copyto)  ...
    build    matmul          cold ... s      cached ... s
    matmul_vs_numpy <ratio>
    ewise_vs_copy <ratio>

matmul: C = A @ B with a schedule made only of the issue's primitives: B packed into
[N/64, K, 64] panels by a te.compute, C tiled 64 x 64, a local accumulator (cache_write)
computed at the tile, the reduction blocked by 16 and split by 4 (unrolled), the tile's 64
columns vectorized (eight AVX2 accumulators), the row tiles parallel. The ratio is achieved
GFLOP/s over NumPy's (BLAS) GFLOP/s.

ewise: y = relu(x*a + b)*0.5 + x over 16M floats, parallel + vectorized. The ratio is its
bytes/s (one read and one write per element) over np.copyto's bytes/s (the same count), i.e.
the fraction of the memory bandwidth that a copy reaches.

Times are medians of interleaved runs after a warm-up; build times are measured in a fresh,
private kernel cache."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

import opfusion as opf
from opfusion import te
from opfusion.backend.cpu.module import Module


def matmul_schedule(n: int, bn: int = 64, rows: int = 1, k_unroll: int = 4, k_blocks: int = 16):
    """Seed 001's matmul with a blocked, packed, vectorized CPU schedule.

    Per bn x bn tile of C: an accumulator tile (cache_write) computed at the tile; the
    reduction cut into ``k_blocks`` blocks (so that the block's slice of the B panel stays in
    L1 while every row of the tile uses it), each split by ``k_unroll`` and unrolled;
    ``rows`` accumulator rows unrolled, the bn columns vectorized: rows * bn / 8 vector
    accumulators live in registers across the reduction (8 fill half of AVX2's 16 registers
    and hide the FMA latency; 16 would spill)."""
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
    ko, ki = s[CC].split(kc, factor=k_unroll)
    kb, ko = s[CC].split(ko, nparts=k_blocks)
    xco, xci = s[CC].split(xc, factor=rows)
    s[CC].reorder(kb, xco, ko, ki, xci, yc)
    s[CC].unroll(ki)
    s[CC].unroll(xci)
    s[CC].vectorize(yc)
    px, _, pz = s[packed].op.axis
    s[packed].vectorize(pz)
    s[packed].parallel(px)
    return s, [A, B, C]


def ewise_schedule(n: int, a: float = 1.5, b: float = -0.25, block: int = 4096):
    """y = relu(x*a + b)*0.5 + x, split into parallel blocks with a vectorized inner loop."""
    X = te.placeholder((n,), name="x")
    Y = te.compute((n,), lambda i: te.max(X[i] * a + b, 0.0) * 0.5 + X[i], name="y")
    s = te.create_schedule(Y.op)
    outer, inner = s[Y].split(Y.op.axis[0], factor=block)
    s[Y].parallel(outer)
    s[Y].vectorize(inner)
    return s, [X, Y]


def interleaved_medians(first: Callable[[], object], second: Callable[[], object],
                        repeat: int) -> tuple[float, float]:
    """Median seconds of ``first`` and ``second``, run alternately so that both see the same
    machine load (the machine is shared; alternating keeps the ratio honest)."""
    first()
    second()
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, out in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def timed_build(schedule, args, name: str) -> tuple[Module, float]:
    start = time.perf_counter()
    module = opf.build(schedule, args, target="c", name=name)
    return module, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matmul-size", type=int, default=1024)
    parser.add_argument("--ewise-size", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--repeat", type=int, default=15, help="timed runs of each kernel")
    options = parser.parse_args(argv)
    n, m = options.matmul_size, options.ewise_size
    rng = np.random.default_rng(0)

    # Build times are measured in an empty cache of our own, so "cold" really compiles.
    with tempfile.TemporaryDirectory(prefix="opfusion-bench-") as cache:
        os.environ["OPFUSION_CACHE_DIR"] = cache
        s, args = matmul_schedule(n)
        matmul, cold = timed_build(s, args, "matmul")
        s, args = matmul_schedule(n)  # a fresh schedule: everything but the compiler reruns
        matmul_again, cached = timed_build(s, args, "matmul")
        assert matmul_again.library.from_cache and not matmul.library.from_cache
        ewise, _ = timed_build(*ewise_schedule(m), "ewise")

        a = opf.nd.array(rng.standard_normal((n, n), dtype=np.float32))
        b = opf.nd.array(rng.standard_normal((n, n), dtype=np.float32))
        c = opf.nd.empty((n, n), "float32")
        matmul(a, b, c)
        want = a.numpy() @ b.numpy()
        error = float(np.max(np.abs(c.numpy() - want)) / np.max(np.abs(want)))
        if error > 1e-4:
            print(f"matmul is wrong: relative error {error:.3g}", file=sys.stderr)
            return 1
        a_np, b_np = np.asarray(a), np.asarray(b)
        t_numpy, t_ours = interleaved_medians(lambda: a_np @ b_np, lambda: matmul(a, b, c),
                                              options.repeat)
        flops = 2.0 * n**3
        matmul_ratio = t_numpy / t_ours

        x = opf.nd.array(rng.standard_normal(m, dtype=np.float32))
        y = opf.nd.empty((m,), "float32")
        copy_dst = np.empty(m, dtype=np.float32)
        ewise(x, y)
        xs = x.numpy()
        want = np.maximum(xs * np.float32(1.5) + np.float32(-0.25), 0) * np.float32(0.5) + xs
        if not np.allclose(y.numpy(), want, rtol=1e-6, atol=1e-6):
            print("ewise is wrong", file=sys.stderr)
            return 1
        x_np = np.asarray(x)
        t_copy, t_ewise = interleaved_medians(lambda: np.copyto(copy_dst, x_np),
                                              lambda: ewise(x, y), options.repeat)
        moved = 2.0 * 4 * m  # one float read and one float written per element, both kernels
        ewise_ratio = t_copy / t_ewise

    print(f"{'kernel':8} {'size':16} {'opfusion':>14} {'numpy baseline':>26} {'ratio':>7}")
    print(f"{'matmul':8} {f'{n}^3 f32':16} {flops / t_ours / 1e9:9.1f} GF/s "
          f"{flops / t_numpy / 1e9:9.1f} GF/s (A @ B)       {matmul_ratio:6.2f}")
    print(f"{'ewise':8} {f'{m} f32':16} {moved / t_ewise / 1e9:9.2f} GB/s "
          f"{moved / t_copy / 1e9:9.2f} GB/s (np.copyto)  {ewise_ratio:6.2f}")
    print(f"{'build':8} {'matmul':16} cold {cold:.3f} s (compiled)  cached {cached:.3f} s "
          "(cache hit; both include lower + codegen + load)")
    print(f"matmul_vs_numpy {matmul_ratio:.3f}")
    print(f"ewise_vs_copy {ewise_ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
