"""Thread scaling at batch 1: each model compiled once and run on 1 thread and on every core,
interleaved, with the speedup. A kernel splits its work into at least NCHWC_MIN_TASKS (64)
tasks (blocked convolutions) or WINOGRAD_MIN_TASKS (8) rows of tiles, and one with less work
than the target's ``min_parallel_work`` runs on the calling thread, so a model's speedup is
near the core count where its big kernels dominate.

    python benchmarks/threads.py [names...] [--repeat 20]

Check that the machine is quiet (``uptime``) first."""

from __future__ import annotations

import argparse
import os
from functools import partial

import numpy as np
from overhead import interleaved

import opfusion as opf
from opfusion.testing.light import LIGHT_MODEL_NAMES, light_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(LIGHT_MODEL_NAMES))
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(f"# ISA {opf.Target('c').isa}, {cores} cores, load {os.getloadavg()[0]:.2f}")
    print(f"{'model':<14} {'1 thread':>10} {f'{cores} threads':>10} {'speedup':>8}")
    for name in args.names:
        mod, params = opf.frontend.from_onnx(str(light_model(name)))
        one = opf.compile(mod, params=params, num_threads=1)
        every = opf.compile(mod, params=params, num_threads=cores)
        x = np.random.default_rng(0).standard_normal(one.get_inputs()[0].shape)
        feeds = [x.astype(np.float32)]
        single, multi = interleaved([partial(one.run, feeds), partial(every.run, feeds)],
                                    args.repeat, batch=1, batch_seconds=0.25)
        print(f"{name:<14} {single * 1e3:8.2f}ms {multi * 1e3:8.2f}ms {single / multi:7.2f}x")


if __name__ == "__main__":
    main()
