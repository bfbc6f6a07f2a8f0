"""Matrix products against NumPy's BLAS over transformer shapes, in one run.

    python benchmarks/gemm.py [--repeat 10] [--quick] [--rows M ...] [--target T]
    OPENBLAS_CORETYPE=Haswell python benchmarks/gemm.py --target "c -mattr=+avx2,+fma"

Each row is ``x (M, K) @ w (K, N)`` with ``w`` a constant, as a model's MatMul or Gemm
imports: opfusion compiles it as a whole model would be (``opf.compile``: the weight packed
into column panels at compile time by PackMatmulWeights, the rows padded to whole register
tiles) and runs it through the executor; NumPy multiplies the same arrays with its BLAS
(``x @ w``, OpenBLAS in NumPy's wheels), both on every core. M runs over the token counts of
transformer inference (1, 16, 64, 128, 197, 512), (K, N) over BERT-base's and BERT-large's
projections and feed-forward layers. Times are the medians of alternating blocks of calls;
GFLOP/s counts 2 M N K. The last column is NumPy's time over opfusion's (above 1: opfusion is
faster). Check that the machine is quiet (``uptime``) first.

``--target`` compiles for another target than the host, e.g. AVX2 code on an AVX-512 host;
``OPENBLAS_CORETYPE=Haswell`` then holds NumPy's OpenBLAS (a build for many CPUs) to its AVX2
kernels too, and the header prints the core type OpenBLAS reports."""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np

import opfusion as opf
from opfusion.ir.expr import Function
from opfusion.ir.module import IRModule
from opfusion.target import Target

ROWS = (1, 16, 64, 128, 197, 512)
#: (K, N): BERT-base's projections, its feed-forward in and out, BERT-large's projections and
#: feed-forward in.
SHAPES = ((768, 768), (768, 3072), (3072, 768), (1024, 1024), (1024, 4096))


def compiled_product(rows: int, depth: int, cols: int, weight: np.ndarray,
                     target: str | None = None):
    x = opf.var("x", shape=(rows, depth))
    mod = IRModule.from_expr(Function([x], opf.op.nn.matmul(x, opf.const(weight))))
    return opf.compile(mod, target=target)


def openblas_core() -> str:
    """The core type NumPy's OpenBLAS chose at load (``Haswell``: AVX2; ``SkylakeX`` or
    ``Cooperlake``: AVX-512), asked of the library NumPy loaded; "unknown" when it is not
    OpenBLAS or does not say."""
    import ctypes

    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower()})
    for path in paths:
        library = ctypes.CDLL(path)
        for symbol in ("openblas_get_corename", "scipy_openblas_get_corename64_",
                       "openblas_get_corename64_"):
            function = getattr(library, symbol, None)
            if function is not None:
                function.restype = ctypes.c_char_p
                return function().decode()
    return "unknown"


#: A pause before each block, in which the other side's threads stop spinning: OpenBLAS's
#: spin for about 2^28 cycles (0.1 s) after a call and took one of the two cores from
#: opfusion's next block (opfusion at 45-60% of NumPy's speed with no pause).
SETTLE_SECONDS = 0.15
#: Seconds of calls per block: long enough that the threads (and the clock of a core that
#: idled through the pause) are up to speed for nearly all of it.
BLOCK_SECONDS = 0.2


#: Seconds of calls each side runs before its per-call time is taken to size the blocks.
WARM_SECONDS = 0.05


def warm_call_seconds(fn) -> float:
    """Seconds per call of ``fn`` once warm: after WARM_SECONDS of calls, the mean of as
    many again. The first calls are slow (page faults, threads starting, a core's clock
    coming up); a block sized from them held 48 calls of a 25 us product, which then took
    the wake-up after each pause as well (1 x 768 x 768 at 150-190 us a call, 25 alone)."""
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < WARM_SECONDS:
        fn()
        calls += 1
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def medians(first, second, repeat: int) -> tuple[float, float]:
    """Median seconds per call of each, timed in alternating blocks of calls of about
    BLOCK_SECONDS each (sized from the warm per-call times), after a pause of
    SETTLE_SECONDS and one untimed call."""
    per_call = warm_call_seconds(first) + warm_call_seconds(second)
    block = max(1, int(BLOCK_SECONDS / max(per_call, 1e-7)))
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for fn, out in zip((first, second), times):
            time.sleep(SETTLE_SECONDS)
            fn()  # wakes this side's threads
            start = time.perf_counter()
            for _ in range(block):
                fn()
            out.append((time.perf_counter() - start) / block)
    return float(np.median(times[0])), float(np.median(times[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="M in 16, 197 and K, N 768 only")
    parser.add_argument("--rows", type=int, nargs="+", help="these values of M only")
    parser.add_argument("--target", help="compile for this target (default: the host)")
    args = parser.parse_args()
    rows = args.rows or ((16, 197) if args.quick else ROWS)
    shapes = SHAPES[:2] if args.quick else SHAPES
    target = Target(args.target or "c")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()}, host ISA "
          f"{Target('c').isa}, code for {target.isa}, {target.num_cores} cores, load "
          f"{os.getloadavg()[0]:.2f}; numpy {np.__version__} (OpenBLAS for {openblas_core()})")
    print(f"{'M':>5} {'K':>5} {'N':>5} {'opfusion':>12} {'numpy':>12} {'numpy/opf':>10}")
    ratios = []
    rng = np.random.default_rng(0)
    for depth, cols in shapes:
        weight = rng.standard_normal((depth, cols), dtype=np.float32)
        for m in rows:
            x = rng.standard_normal((m, depth), dtype=np.float32)
            exe = compiled_product(m, depth, cols, weight, args.target)
            got = exe(x)
            want = x @ weight
            assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()
            ours, theirs = medians(lambda e=exe, v=x: e(v), lambda v=x, w=weight: v @ w,
                                   args.repeat)
            flops = 2.0 * m * depth * cols
            ratios.append(theirs / ours)
            print(f"{m:>5} {depth:>5} {cols:>5} {flops / ours / 1e9:>7.1f} GF/s "
                  f"{flops / theirs / 1e9:>7.1f} GF/s {theirs / ours:>9.2f}x", flush=True)
    print(f"# geomean numpy/opfusion {float(np.exp(np.mean(np.log(ratios)))):.3f}; "
          f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
