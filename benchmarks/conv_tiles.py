"""Blocked convolution register tiles, one resnet50 layer at a time: the default tile against
the narrow one (1 channel block x up to 7 columns, the default before wide tiles), each layer
``relu(conv(x) + bias)`` in NCHW<lanes>c, its kernel timed back to back.

    python benchmarks/conv_tiles.py [--repeat 30]

On a target with 8 accumulators or fewer (AVX2) the default is a wide tile (4 blocks x 2
columns, see ``opfusion.topi.nn.nchwc_width_unit``); with more (AVX-512) both columns print
the same tile. The kernel is called from Python with its arguments bound once (no output
allocation per call), in blocks of 5 calls, the two tiles alternating block by block; set
``OMP_WAIT_POLICY=active`` so the threads do not sleep between calls. Check that the machine
is quiet (``uptime``) first."""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import numpy as np

import opfusion as opf
import opfusion.topi.nn as topi_nn
from opfusion.compiler.executor import _call_kernel

#: (in channels, out channels, output size, kernel, stride): resnet50's 1x1 layers, its
#: strided 3x3 and 1x1 layers and the 7x7 stem.
LAYERS = [(64, 256, 56, 1, 1), (256, 64, 56, 1, 1), (128, 512, 28, 1, 1), (512, 128, 28, 1, 1),
          (256, 1024, 14, 1, 1), (1024, 256, 14, 1, 1), (512, 2048, 7, 1, 1),
          (2048, 512, 7, 1, 1), (128, 128, 28, 3, 2), (256, 256, 14, 3, 2), (256, 512, 28, 1, 2),
          (512, 1024, 14, 1, 2), (3, 64, 112, 7, 2)]


def layer(channels: int, out_channels: int, size: int, kernel: int, stride: int, block: int,
          rng: np.random.Generator) -> tuple[opf.IRModule, np.ndarray]:
    in_block = block if channels % block == 0 else channels
    x = rng.standard_normal((1, channels // in_block, size * stride, size * stride, in_block))
    w = rng.standard_normal((out_channels // block, channels // in_block, kernel, kernel,
                             in_block, block)) / np.sqrt(channels * kernel * kernel)
    data = opf.var("x", shape=x.shape)
    conv = opf.op.nn.conv2d_nchwc(data, opf.const(w.astype(np.float32)), padding=kernel // 2,
                                  strides=(stride, stride),
                                  kernel_layout=f"OIHW{in_block}i{block}o",
                                  data_layout=f"NCHW{in_block}c", out_layout=f"NCHW{block}c")
    bias = rng.standard_normal((1, out_channels // block, 1, 1, block)).astype(np.float32)
    out = opf.op.nn.relu(opf.op.add(conv, opf.const(bias)))
    return opf.IRModule.from_expr(opf.Function([data], out)), x.astype(np.float32)


def bound_calls(exe, x: np.ndarray, stack) -> list:
    """The model's kernels with their arguments bound (in a workspace held by ``stack``)."""
    workspace, arrays = stack.enter_context(exe._running([x]))
    return [(step, [p if p is not None else arrays[v].ctypes.data
                    for p, v in zip(pointers, step.reads + step.writes)])
            for step, pointers in zip(exe.steps, workspace.pointers)]


def interleaved_seconds(variants: list, repeat: int) -> list[float]:
    """Median seconds of one run of each variant's kernels, called back to back in blocks
    of 5, the variants alternating block by block (so a drifting machine favours none)."""
    times: list[list[float]] = [[] for _ in variants]
    for round_ in range(repeat + 3):
        for calls, out in zip(variants, times):
            start = time.perf_counter()
            for _ in range(5):
                for step, pointers in calls:
                    _call_kernel(step, pointers)
            if round_ >= 3:
                out.append((time.perf_counter() - start) / 5)
    return [float(np.median(t)) for t in times]


NCHWC_WIDTH_UNIT = topi_nn.nchwc_width_unit


def narrow_units(out_width: int, budget: int, out_blocks: int = 0) -> int:
    """The unit before wide tiles: the block count ignored."""
    return NCHWC_WIDTH_UNIT(out_width, budget)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    target = opf.Target("c")
    block = target.vector_lanes("float32")
    print(f"# ISA {target.isa}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; NCHW{block}c")
    print(f"{'layer':<24} {'default':>18} {'narrow':>18} {'speedup':>8}")
    for channels, out_channels, size, kernel, stride in LAYERS:
        with contextlib.ExitStack() as stack:
            variants = []
            for units in (NCHWC_WIDTH_UNIT, narrow_units):
                topi_nn.nchwc_width_unit = units
                try:
                    mod, x = layer(channels, out_channels, size, kernel, stride, block,
                                   np.random.default_rng(0))
                    exe = opf.compile(mod)
                finally:
                    topi_nn.nchwc_width_unit = NCHWC_WIDTH_UNIT
                want = np.asarray(opf.ir.evaluate(mod, [x]))
                got = exe.run([x])[0]
                assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
                variants.append(bound_calls(exe, x, stack))
            results = interleaved_seconds(variants, args.repeat)
        flops = 2 * channels * out_channels * kernel * kernel * size * size
        cells = [f"{t * 1e3:7.3f}ms {flops / t / 1e9:5.0f}GF" for t in results]
        print(f"{channels}->{out_channels} {kernel}x{kernel}/{stride} @{size}".ljust(24)
              + f" {cells[0]:>18} {cells[1]:>18} {results[1] / results[0]:7.2f}x", flush=True)


if __name__ == "__main__":
    main()
