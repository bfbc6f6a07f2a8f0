"""Where a kernel starts to pay for its threads: the target's ``min_parallel_work``.

    python benchmarks/parallel_grain.py [--repeat 2000]

A kernel's parallel loop wakes the other OpenMP threads (with the passive wait policy, a
futex wake and a reschedule per thread); a kernel whose work is small finishes sooner on the
calling thread alone. For elementwise kernels (``exp(x) + x``, N elements) and matrix-vector
products (``dense`` of a 1 x K row and a K x N weight), this compiles each twice — forced
serial and forced parallel — and prints their median run times, measured interleaved in one
process, with each kernel's work (``opfusion.tir.work.kernel_work``). The crossover is the
value of ``opfusion.target.target.PARALLEL_GRAIN``. Quote only figures from a quiet machine
(the load is printed)."""

from __future__ import annotations

import argparse
import os
from functools import partial
from typing import Any

import numpy as np
from overhead import interleaved

import opfusion as opf
import opfusion.target.target as target_module
from opfusion.target import Target, host_cpu_name
from opfusion.tir.work import kernel_work


def elementwise(n: int) -> tuple[Any, dict[str, np.ndarray]]:
    x = opf.var("x", (n,))
    return opf.Function([x], opf.op.add(opf.op.exp(x), x)), {}


def matvec(k: int, n: int) -> tuple[Any, dict[str, np.ndarray]]:
    x, w = opf.var("x", (1, k)), opf.var("w", (n, k))
    weight = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32)
    return opf.Function([x, w], opf.op.nn.relu(opf.op.nn.dense(x, w))), {"w": weight}


def compiled(func: Any, params: dict[str, np.ndarray], grain: int) -> Any:
    saved = target_module.PARALLEL_GRAIN
    target_module.PARALLEL_GRAIN = grain
    try:
        return opf.compile(func, params=params)
    finally:
        target_module.PARALLEL_GRAIN = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    print(f"# cpu: {host_cpu_name()} ({Target('c').isa}, {Target('c').num_cores} cores), "
          f"load {os.getloadavg()[0]:.2f}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    print(f"{'kernel':<22} {'work':>10} {'serial':>10} {'parallel':>10} {'par/ser':>8}")
    cases = [(f"elementwise {n}", *elementwise(n)) for n in (1024, 8192, 32768, 131072,
                                                            524288)]
    cases += [(f"matvec {k}x{n}", *matvec(k, n)) for k, n in ((256, 256), (784, 256),
                                                               (1024, 1024), (4096, 1024))]
    rng = np.random.default_rng(0)
    for label, func, params in cases:
        serial, parallel = compiled(func, params, 1 << 62), compiled(func, params, 0)
        feeds = [rng.standard_normal(serial.values[i].type.shape).astype(np.float32)
                 for i in serial._input_values]
        work = max(kernel_work(step.group.prim_func.body) for step in serial.steps
                   if step.group.prim_func is not None)
        t_serial, t_parallel = interleaved([partial(serial.run, None, feeds),
                                            partial(parallel.run, None, feeds)], args.repeat)
        print(f"{label:<22} {work:>10} {t_serial * 1e6:>8.1f}us {t_parallel * 1e6:>8.1f}us "
              f"{t_parallel / t_serial:>7.2f}x")
    print(f"# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
