"""The default schedule's loops: nested inside the parallel tasks (the default) against every
loop fused into one (the form before, TVM's injective schedule), on batch-norm-ReLU kernels of
DenseNet's blocked shapes and a transformer row, each kernel timed alone and interleaved.

    python benchmarks/default_loops.py [--repeat 200]

``relu(x * scale + shift)`` with per-channel ``scale`` and ``shift``; its kernel called from
Python with its arguments bound once, in blocks of 5 calls, the two forms alternating block by
block. Set ``OMP_WAIT_POLICY=active`` so the threads do not sleep between calls, and check that
the machine is quiet (``uptime``) first."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os

import numpy as np
from conv_tiles import bound_calls, interleaved_seconds

import opfusion as opf

#: NCHW8c maps of DenseNet-121's blocks, and a BERT-base row block.
SHAPES = [(1, 28, 56, 56, 8), (1, 60, 28, 28, 8), (1, 32, 14, 14, 8), (1, 100, 7, 7, 8),
          (1, 128, 768)]


def bn_relu(shape: tuple[int, ...], rng: np.random.Generator) -> opf.IRModule:
    """relu(x * scale + shift), per channel (the blocked channels or the last axis)."""
    per_channel = (1, shape[1], 1, 1, shape[4]) if len(shape) == 5 else (shape[-1],)
    data = opf.var("x", shape=shape)
    scale = opf.const(rng.standard_normal(per_channel).astype(np.float32))
    shift = opf.const(rng.standard_normal(per_channel).astype(np.float32))
    out = opf.op.nn.relu(opf.op.add(opf.op.multiply(data, scale), shift))
    return opf.IRModule.from_expr(opf.Function([data], out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    # the module (the package exports a function of the same name)
    default = importlib.import_module("opfusion.backend.cpu.schedules.default")
    nested = default.DEFAULT_MIN_TASKS
    rng = np.random.default_rng(0)
    print(f"# ISA {opf.Target('c').isa}, {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}; medians of {args.repeat} blocks")
    print(f"{'shape':<22} {'all fused':>10} {'nested':>10} {'speedup':>8}")
    for shape in SHAPES:
        mod = bn_relu(shape, rng)
        x = rng.standard_normal(shape).astype(np.float32)
        executors = []
        for tasks in (1 << 62, nested):  # one loop of every iteration; the default
            default.DEFAULT_MIN_TASKS = tasks
            executors.append(opf.compile(mod))
        default.DEFAULT_MIN_TASKS = nested
        outputs = [np.asarray(exe(x)) for exe in executors]
        np.testing.assert_array_equal(outputs[0], outputs[1])
        with contextlib.ExitStack() as stack:
            calls = [bound_calls(exe, x, stack) for exe in executors]
            fused, nested_time = interleaved_seconds(calls, args.repeat)
        print(f"{str(shape):<22} {fused * 1e6:8.1f}us {nested_time * 1e6:8.1f}us "
              f"{fused / nested_time:7.2f}x")


if __name__ == "__main__":
    main()
