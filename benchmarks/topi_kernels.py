"""The topi CPU schedules of conv2d and the products against NumPy formulations, and pooling
in NCHW against the blocked layout, in one run.

    $ python benchmarks/topi_kernels.py
    kernel                               opfusion         numpy   opfusion/numpy
    conv2d 1x64x56x56 k64 3x3           ... GF/s      ... GF/s           ...x
    ...
    pooling                                  NCHW      NCHW16c      NCHW/blocked
    max_pool2d 64x112x112 3x3 s2 p1      ... ms       ... ms               ...x
    ...

Each kernel is what the group lowering makes of one operator call: the registered TE compute
and the backend's schedule rule with its default config (with a bias + relu epilogue fused in
for the ``+relu`` row), built to C. The NumPy baselines: conv2d as im2col (a strided window
view copied into a matrix) times the weight matrix, the bias and relu applied after; dense as
``x @ w.T`` and matmul as ``a @ b`` (BLAS). The last column is opfusion's speed over NumPy's
(above 1: opfusion is faster). The pooling rows time the same pooling (the pools of resnet50,
squeezenet, densenet and inception) over NCHW data and over the same data in NCHW<x>c, x the
target's float32 lanes, as the layout pass makes it: the last column is the NCHW kernel's
time over the blocked one's (above 1: the blocked kernel is faster). Times are medians over
blocks of runs of each side (see :func:`blocked_medians`), both using every core
(``--threads 1`` for one: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS, set before NumPy loads).

On a machine shared with other work, OpenMP's default of spinning while it waits makes
parallel kernels stall whenever another process holds a core; OMP_WAIT_POLICY=passive avoids
that (it affects both sides: NumPy's BLAS uses its own threads)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

if __name__ == "__main__" and "--threads" in sys.argv:  # before NumPy starts its threads
    _count = sys.argv[sys.argv.index("--threads") + 1]
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = _count

import numpy as np  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion import te  # noqa: E402
from opfusion.backend import get_backend  # noqa: E402
from opfusion.ir.layout import Layout, transform_array  # noqa: E402
from opfusion.ir.types import TensorType  # noqa: E402
from opfusion.target import Target  # noqa: E402
from opfusion.testing import eval_op  # noqa: E402
from opfusion.topi import get_compute  # noqa: E402
from opfusion.topi.testing import call_over_arrays  # noqa: E402


def scheduled_kernel(builder: Callable[..., Any], arrays: list[np.ndarray], epilogue: bool,
                     **attrs: Any) -> tuple[Any, np.ndarray]:
    """The kernel of ``builder(*arrays, **attrs)`` (plus a per-channel bias and relu when
    ``epilogue``), scheduled by its anchor schedule; returns it and an empty output array."""
    call, params, _ = call_over_arrays(builder, tuple(arrays), attrs)
    holders = [te.placeholder(p.type_annotation.shape, p.type_annotation.dtype,
                              name=p.name_hint) for p in params]
    anchor = get_compute(call.op.name)(holders, call.attrs, call.checked_type)
    output = anchor
    if epilogue:
        bias = te.placeholder((anchor.shape[1],), anchor.dtype, name="bias")
        added = te.compute(anchor.shape, lambda n, c, *i: anchor[(n, c, *i)] + bias[c],
                           name="add")
        output = te.compute(anchor.shape, lambda *i: te.max(added[i], 0.0), name="relu")
        holders.append(bias)
    s = te.create_schedule(output.op)
    if epilogue:
        s[added].compute_inline()
    get_backend().schedule(s, anchor, output, call.op.name)
    kernel = opf.build(s, [*holders, output], name=call.op.name.replace(".", "_"))
    out_type: TensorType = call.checked_type
    return kernel, np.empty(out_type.shape, out_type.dtype)


def blocked_medians(first: Callable[[], object], second: Callable[[], object], repeat: int,
                    rounds: int = 3, pause: float = 0.3) -> tuple[float, float]:
    """Median seconds of ``first`` and ``second``: ``rounds`` times, a block of runs of each
    (the first of a block a warm-up), with a pause between blocks.

    Not run by run alternately: a thread pool spins for a while after its last call (OpenBLAS
    for up to ~0.1 s, OpenMP by default too), and its spinning threads would take the cores
    from the other side's next call. The pause lets them go to sleep."""
    times: tuple[list[float], list[float]] = ([], [])
    per_block = max(1, -(-repeat // rounds))
    for _ in range(rounds):
        for fn, out in ((first, times[0]), (second, times[1])):
            time.sleep(pause)
            fn()
            for _ in range(per_block):
                start = time.perf_counter()
                fn()
                out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def im2col_conv(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    """Stride-1 NCHW conv2d as im2col + one BLAS matmul (batch 1)."""
    out_c, in_c, kh, kw = w.shape
    padded = np.pad(x[0], ((0, 0), (pad, pad), (pad, pad)))
    view = np.lib.stride_tricks.sliding_window_view(padded, (kh, kw), axis=(1, 2))
    oh, ow = view.shape[1:3]
    cols = np.ascontiguousarray(view.transpose(0, 3, 4, 1, 2)).reshape(in_c * kh * kw, oh * ow)
    return (w.reshape(out_c, -1) @ cols).reshape(1, out_c, oh, ow)


def bench_conv(batch: int, channels: int, size: int, filters: int, epilogue: bool,
               repeat: int, rng: np.random.Generator) -> tuple[str, float, float]:
    x = rng.standard_normal((batch, channels, size, size), dtype=np.float32)
    w = rng.standard_normal((filters, channels, 3, 3), dtype=np.float32) * 0.1
    b = rng.standard_normal(filters, dtype=np.float32)
    kernel, out = scheduled_kernel(opf.op.nn.conv2d, [x, w], epilogue, padding=1)
    args = [x, w, b] if epilogue else [x, w]

    def baseline() -> np.ndarray:
        y = im2col_conv(x, w, 1)
        if epilogue:
            y = np.maximum(y + b.reshape(1, -1, 1, 1), 0)
        return y

    kernel(*args, out)
    want = baseline()
    error = float(np.max(np.abs(out - want)) / np.max(np.abs(want)))
    if error > 1e-4:
        raise SystemExit(f"conv2d is wrong: relative error {error:.3g}")
    t_numpy, t_ours = blocked_medians(baseline, lambda: kernel(*args, out), repeat)
    flops = 2.0 * batch * filters * channels * 9 * size * size
    name = f"conv2d {batch}x{channels}x{size}x{size} k{filters} 3x3{' +relu' if epilogue else ''}"
    return name, flops / t_ours / 1e9, flops / t_numpy / 1e9


def bench_product(builder: Callable[..., Any], x: np.ndarray, w: np.ndarray,
                  baseline: Callable[[], np.ndarray], name: str,
                  repeat: int) -> tuple[str, float, float]:
    kernel, out = scheduled_kernel(builder, [x, w], False)
    kernel(x, w, out)
    want = baseline()
    error = float(np.max(np.abs(out - want)) / np.max(np.abs(want)))
    if error > 1e-4:
        raise SystemExit(f"{name} is wrong: relative error {error:.3g}")
    t_numpy, t_ours = blocked_medians(baseline, lambda: kernel(x, w, out), repeat)
    flops = 2.0 * out.size * x.shape[-1]
    return name, flops / t_ours / 1e9, flops / t_numpy / 1e9


def bench_dense(rows: int, depth: int, units: int, repeat: int,
                rng: np.random.Generator) -> tuple[str, float, float]:
    x = rng.standard_normal((rows, depth), dtype=np.float32)
    w = rng.standard_normal((units, depth), dtype=np.float32)
    return bench_product(opf.op.nn.dense, x, w, lambda: x @ w.T,
                         f"dense {rows}x{depth} -> {units}", repeat)


def bench_matmul(rows: int, depth: int, cols: int, repeat: int,
                 rng: np.random.Generator) -> tuple[str, float, float]:
    a = rng.standard_normal((rows, depth), dtype=np.float32)
    b = rng.standard_normal((depth, cols), dtype=np.float32)
    return bench_product(opf.op.nn.matmul, a, b, lambda: a @ b,
                         f"matmul {rows}x{depth} @ {depth}x{cols}", repeat)


#: Pooling layers of the light models: (row name, operator, NCHW input shape, attributes).
POOLS = [
    ("max_pool2d 64x112x112 3x3 s2 p1", "max_pool2d", (1, 64, 112, 112),
     {"pool_size": 3, "strides": 2, "padding": 1}),  # resnet50
    ("max_pool2d 96x111x111 3x3 s2 ceil", "max_pool2d", (1, 96, 111, 111),
     {"pool_size": 3, "strides": 2, "ceil_mode": True}),  # squeezenet
    ("max_pool2d 256x55x55 3x3 s2 ceil", "max_pool2d", (1, 256, 55, 55),
     {"pool_size": 3, "strides": 2, "ceil_mode": True}),
    ("max_pool2d 512x27x27 3x3 s2 ceil", "max_pool2d", (1, 512, 27, 27),
     {"pool_size": 3, "strides": 2, "ceil_mode": True}),
    ("avg_pool2d 128x56x56 2x2 s2", "avg_pool2d", (1, 128, 56, 56),
     {"pool_size": 2, "strides": 2}),  # densenet
    ("max_pool2d 192x35x35 3x3 s1 p1", "max_pool2d", (1, 192, 35, 35),
     {"pool_size": 3, "padding": 1}),  # inception
    ("avg_pool2d 192x35x35 3x3 s1 p1", "avg_pool2d", (1, 192, 35, 35),
     {"pool_size": 3, "padding": 1}),
    ("global_avg_pool2d 2048x7x7", "global_avg_pool2d", (1, 2048, 7, 7), {}),  # resnet50
]


def bench_pool(op_name: str, shape: tuple[int, ...], attrs: dict[str, Any], block: int,
               repeat: int, rng: np.random.Generator) -> tuple[float, float]:
    """Seconds of one pooling layer over NCHW data and over NCHW<block>c data."""
    builder = getattr(opf.op.nn, op_name)
    x = rng.standard_normal(shape, dtype=np.float32)
    plain, blocked = Layout.parse("NCHW"), Layout.parse(f"NCHW{block}c")
    xb = transform_array(x, plain, blocked)
    kernel, out = scheduled_kernel(builder, [x], False, **attrs)
    blocked_kernel, blocked_out = scheduled_kernel(builder, [xb], False,
                                                   layout=blocked.name, **attrs)
    want = eval_op(builder, x, **attrs)
    kernel(x, out)
    blocked_kernel(xb, blocked_out)
    for got in (out, transform_array(blocked_out, blocked, plain)):
        error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
        if error > 1e-5:
            raise SystemExit(f"{op_name} is wrong: relative error {error:.3g}")
    # No pause between blocks: both sides are opfusion kernels, whose threads spin only
    # briefly, and after a pause the runs of a block took about twice as long as back to
    # back (measured), which is how a model runs its kernels.
    return blocked_medians(lambda: kernel(x, out), lambda: blocked_kernel(xb, blocked_out),
                           repeat, pause=0.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20, help="timed runs of each kernel")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for both sides (default: every core)")
    options = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    repeat = options.repeat
    # Kernels are built into a private cache that goes away with the run.
    with tempfile.TemporaryDirectory(prefix="opfusion-bench-") as cache:
        os.environ["OPFUSION_CACHE_DIR"] = cache
        rows = [
            bench_conv(1, 64, 56, 64, False, repeat, rng),
            bench_conv(1, 64, 56, 64, True, repeat, rng),
            bench_conv(1, 256, 14, 256, False, repeat, rng),
            bench_conv(1, 512, 7, 512, False, repeat, rng),
            bench_dense(1, 2048, 1000, repeat, rng),
            bench_dense(128, 768, 768, repeat, rng),
            bench_matmul(128, 768, 768, repeat, rng),
        ]
        lanes = (Target.current(allow_none=True) or Target("llvm")).vector_lanes("float32")
        # Pools take tens of microseconds: more runs for the same confidence.
        pools = [(name, *bench_pool(op_name, shape, attrs, lanes, repeat * 5, rng))
                 for name, op_name, shape, attrs in POOLS]
    print(f"{'kernel':34} {'opfusion':>13} {'numpy':>13} {'opfusion/numpy':>16}")
    for name, ours, theirs in rows:
        print(f"{name:34} {ours:8.1f} GF/s {theirs:8.1f} GF/s {ours / theirs:15.2f}x")
    print(f"\n{'pooling':34} {'NCHW':>13} {f'NCHW{lanes}c':>13} {'NCHW/blocked':>16}")
    for name, plain, blocked in pools:
        print(f"{name:34} {plain * 1e3:10.3f} ms {blocked * 1e3:10.3f} ms "
              f"{plain / blocked:15.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
