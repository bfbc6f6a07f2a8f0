"""Latency of whole models: opfusion fused, opfusion unfused (fusion="none"), ONNX Runtime.

    python benchmarks/models.py [names...] [--repeat 20] [--no-ort]
    python benchmarks/models.py [names...] --target "c -mattr=+avx2,+fma" --target c

For each light model (the random-weight copies of opfusion.testing.light_model; batch 1,
standard-normal input) it prints the median latency of each engine measured in this one
process (fused and unfused run in turn, call by call, so that a drifting machine slows both
alike), the cold compile time (empty kernel cache) and the cached one, and the executor's
planned memory against the sum of all intermediate tensors. Both cores are used by every
engine. The last line is

    geomean fused_vs_unfused <x> ort_vs_opfusion <y>

(speedup of fused over unfused; ONNX Runtime's latency divided by opfusion's; higher is
better for both).

With ``--target`` (given once per target), the fused model is compiled for each target and
the latencies are printed side by side, measured interleaved in one run, with each target's
speedup over the first (e.g. the host's AVX-512 code against AVX2 code on the same machine);
the header names the CPU and each target's ISA."""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import opfusion as opf
from opfusion.frontend import from_onnx
from opfusion.target import host_cpu_name
from opfusion.testing.light import LIGHT_MODEL_NAMES, light_model


def median_seconds(fn: Callable[[], Any], repeat: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_medians(fns: list[Callable[[], Any]], repeat: int,
                        warmup: int = 2) -> list[float]:
    """Median seconds of each of ``fns``, run in turn (one call of each per round), so that a
    machine whose speed drifts during the run (other jobs, clock changes) slows them alike
    and their ratio stays fair."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, out in zip(fns, times):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def ort_session(path: str) -> Any | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def compile_times(mod: opf.IRModule, params: dict[str, np.ndarray],
                  target: str | None = None) -> tuple[Any, float, float]:
    """Compile (for ``target``; None: the host) with an empty kernel cache, then again with
    it warm."""
    saved = os.environ.get("OPFUSION_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["OPFUSION_CACHE_DIR"] = cache
        try:
            start = time.perf_counter()
            opf.compile(mod, params=params, target=target)
            cold = time.perf_counter() - start
            start = time.perf_counter()
            exe = opf.compile(mod, params=params, target=target)
            cached = time.perf_counter() - start
        finally:
            if saved is None:
                os.environ.pop("OPFUSION_CACHE_DIR", None)
            else:
                os.environ["OPFUSION_CACHE_DIR"] = saved
    return exe, cold, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=LIGHT_MODEL_NAMES)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-ort", action="store_true")
    parser.add_argument("--target", action="append", default=[],
                        help="compare these targets (give it once per target)")
    args = parser.parse_args()
    import onnx

    if args.target:
        compare_targets(args.names, args.target, args.repeat, not args.no_ort)
        return

    print(f"{'model':<14} {'fused':>9} {'unfused':>9} {'ort':>9} {'fused/unf':>9} "
          f"{'ort/fused':>9} {'kernels':>8} {'cold':>7} {'cached':>7} {'plan MB':>8} "
          f"{'all MB':>7}")
    speedups, ort_ratios = [], []
    for name in args.names:
        path = str(light_model(name))
        mod, params = from_onnx(onnx.load(path))
        fused, cold, cached = compile_times(mod, params)
        unfused = opf.compile(mod, params=params, fusion="none")
        (input_name,) = fused.input_names
        shape = next(v.type.shape for v in fused.values if v.input_index == 0)
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        # Fused and unfused in turn (both use OpenMP threads that sleep when idle); ONNX
        # Runtime after them, in a block of its own: its threads spin between runs.
        t_fused, t_unfused = interleaved_medians(
            [partial(fused.run, {input_name: x}), partial(unfused.run, {input_name: x})],
            args.repeat)
        session = None if args.no_ort else ort_session(path)
        t_ort = math.nan
        if session is not None:
            feed_name = session.get_inputs()[0].name
            t_ort = median_seconds(partial(session.run, None, {feed_name: x}), args.repeat)
            ort_ratios.append(t_ort / t_fused)
        speedups.append(t_unfused / t_fused)
        print(f"{name:<14} {t_fused * 1e3:>7.2f}ms {t_unfused * 1e3:>7.2f}ms "
              f"{t_ort * 1e3:>7.2f}ms {t_unfused / t_fused:>8.2f}x {t_ort / t_fused:>8.2f}x "
              f"{fused.num_kernels:>8} {cold:>6.1f}s {cached:>6.2f}s "
              f"{fused.plan.total_bytes / 2**20:>8.1f} {fused.plan.naive_bytes / 2**20:>7.1f}")

    print(f"geomean fused_vs_unfused {geomean(speedups):.3f} "
          f"ort_vs_opfusion {geomean(ort_ratios):.3f}")


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def compare_targets(names: list[str], specs: list[str], repeat: int, with_ort: bool) -> None:
    """Fused latency of each model for each target, interleaved, side by side."""
    import onnx

    targets = [opf.Target(spec) for spec in specs]
    print(f"# cpu: {host_cpu_name()}, host ISA {opf.Target('c').isa}, "
          f"{opf.Target('c').num_cores} cores, load {os.getloadavg()[0]:.2f}")
    for index, target in enumerate(targets):
        print(f"# t{index}: {target.describe()}")
    heads = "".join(f"{'t' + str(i):>10}" for i in range(len(targets)))
    ratios = "".join(f"{'t0/t' + str(i):>8}" for i in range(1, len(targets)))
    print(f"{'model':<14}{heads}{ratios}{'ort':>10}{'ort/t-1':>9}{'cold':>7}")
    speedups: list[list[float]] = [[] for _ in targets]
    for name in names:
        path = str(light_model(name))
        mod, params = from_onnx(onnx.load(path))
        compiled = [compile_times(mod, params, str(t)) for t in targets]
        exes = [exe for exe, _, _ in compiled]
        (input_name,) = exes[0].input_names
        shape = next(v.type.shape for v in exes[0].values if v.input_index == 0)
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        times = interleaved_medians([partial(e.run, {input_name: x}) for e in exes], repeat)
        session = ort_session(path) if with_ort else None
        t_ort = math.nan
        if session is not None:
            feed_name = session.get_inputs()[0].name
            t_ort = median_seconds(partial(session.run, None, {feed_name: x}), repeat)
        for i, t in enumerate(times):
            speedups[i].append(times[0] / t)
        cells = "".join(f"{t * 1e3:>8.2f}ms" for t in times)
        cells += "".join(f"{times[0] / t:>7.2f}x" for t in times[1:])
        print(f"{name:<14}{cells}{t_ort * 1e3:>8.2f}ms{t_ort / times[-1]:>8.2f}x"
              f"{compiled[-1][1]:>6.1f}s")
    summary = " ".join(f"t0/t{i} {geomean(s):.3f}" for i, s in enumerate(speedups) if i)
    print(f"geomean {summary}")


if __name__ == "__main__":
    main()
