"""Winograd against direct blocked convolution, one 3x3 stride-1 layer at a time (with a
bias and ReLU epilogue, as in a network): time, effective GFLOP/s (the direct algorithm's
2 x C x K x 9 x OH x OW over the time) and the error against the reference interpreter.

    python benchmarks/winograd.py [--repeat 30]

Layers are resnet50's four 3x3 shapes and a few narrow ones (densenet's 128 -> 32). Check
that the machine is quiet (``uptime``) before quoting numbers."""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import opfusion as opf
from opfusion.opdefs._winograd import transform_weight

LAYERS = [(64, 64, 56), (128, 128, 28), (256, 256, 14), (512, 512, 7), (128, 32, 56),
          (128, 32, 14), (64, 192, 28)]


def layer(channels: int, out_channels: int, size: int, algorithm: str, block: int,
          rng: np.random.Generator) -> tuple[opf.IRModule, np.ndarray]:
    """relu(conv(x) + bias) in NCHW<block>c, direct ("direct") or Winograd ("f2", "f4")."""
    x = rng.standard_normal((1, channels // block, size, size, block)).astype(np.float32)
    w = rng.standard_normal((out_channels // block, channels // block, 3, 3, block, block))
    w = (w / np.sqrt(9 * channels)).astype(np.float32)
    data = opf.var("x", shape=x.shape)
    layouts = {"data_layout": f"NCHW{block}c", "out_layout": f"NCHW{block}c"}
    if algorithm == "direct":
        conv = opf.op.nn.conv2d_nchwc(data, opf.const(w), padding=1,
                                      kernel_layout=f"OIHW{block}i{block}o", **layouts)
    else:
        tile = int(algorithm[1])
        u = transform_weight(w, tile).astype(np.float32)
        conv = opf.op.nn.conv2d_winograd_nchwc(data, opf.const(u), tile_size=tile, padding=1,
                                               **layouts)
    bias = rng.standard_normal((1, out_channels // block, 1, 1, block)).astype(np.float32)
    out = opf.op.nn.relu(opf.op.add(conv, opf.const(bias)))
    return opf.IRModule.from_expr(opf.Function([data], out)), x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    target = opf.Target("c")
    block = target.vector_lanes("float32")
    print(f"# ISA {target.isa}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}; "
          f"NCHW{block}c, best of {args.repeat}")
    print(f"{'layer':<22} {'algorithm':<9} {'time':>9} {'GFLOP/s':>8} {'speedup':>8} "
          f"{'error':>8}")
    for channels, out_channels, size in LAYERS:
        direct_time = None
        for algorithm in ("direct", "f2", "f4"):
            rng = np.random.default_rng(0)
            mod, x = layer(channels, out_channels, size, algorithm, block, rng)
            exe = opf.compile(mod)
            got = exe.run([x])[0]
            want = np.asarray(opf.ir.evaluate(mod, [x]))
            error = float(np.abs(got - want).max() / np.abs(want).max())
            times = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                exe.run([x])
                times.append(time.perf_counter() - start)
            best = min(times)
            direct_time = direct_time or best
            flops = 2 * channels * out_channels * 9 * size * size
            print(f"{channels}->{out_channels} {size}x{size}".ljust(22)
                  + f" {algorithm:<9} {best * 1e3:7.3f}ms {flops / best / 1e9:8.0f} "
                  f"{direct_time / best:7.2f}x {error:8.1e}")


if __name__ == "__main__":
    main()
