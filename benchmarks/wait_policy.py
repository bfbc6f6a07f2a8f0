"""What OpenMP's threads should do between kernels: sleep, spin, or spin a while.

    python benchmarks/wait_policy.py [names...] [--repeat 30]

Every kernel is an OpenMP parallel region; between two kernels of a run the worker threads
wait. libgomp's wait policy decides how: ``passive`` (sleep at once: waking them for the next
kernel costs a futex wake and a reschedule, microseconds per kernel), ``active`` (spin: no
wake-up cost, but a spinning thread takes its core from any other work), or spin for
``GOMP_SPINCOUNT`` iterations and then sleep; the last column is Intel's runtime
(``OPFUSION_OPENMP=intel``: spin with yields for 1 ms, then sleep), which opfusion takes when
it is installed. The runtimes read these when they load, once per
process, so each setting runs in a process of its own (the same models, the kernel cache
shared). Each process times the light models (batch 1, standard-normal input) and the MLP of
``benchmarks/overhead.py``, and the table shows the median latency per setting. Quote only
figures from a quiet machine (the load is printed): on a busy one, spinning threads fight
whatever else runs and every ratio changes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

_GNU = {"OPFUSION_OPENMP": "gnu"}
SETTINGS = {
    "passive": {**_GNU, "OMP_WAIT_POLICY": "passive"},
    "spin 1k": {**_GNU, "GOMP_SPINCOUNT": "1000"},
    "spin 3k": {**_GNU, "GOMP_SPINCOUNT": "3000"},
    "spin 10k": {**_GNU, "GOMP_SPINCOUNT": "10000"},
    "spin 100k": {**_GNU, "GOMP_SPINCOUNT": "100000"},
    # empty: libgomp's default (spin ~300k, then sleep)
    "default": {**_GNU, "OMP_WAIT_POLICY": ""},
    "active": {**_GNU, "OMP_WAIT_POLICY": "active"},
    # Intel's runtime, opfusion's choice when it is installed (skipped when it is not)
    "intel": {"OPFUSION_OPENMP": "intel"},
}

_CHILD = r"""
import json, sys, statistics, time
import numpy as np
sys.path.insert(0, sys.argv[1])
import opfusion as opf
from opfusion.frontend import from_onnx
from opfusion.testing.light import light_model
from overhead import mlp_model

names, repeat = json.loads(sys.argv[2]), int(sys.argv[3])
results = {}
for name in names:
    model = mlp_model() if name == "mlp" else light_model(name)
    mod, params = from_onnx(model)
    exe = opf.compile(mod, params=params)
    feeds = {a.name: np.random.default_rng(0).standard_normal(a.shape).astype(np.float32)
             for a in exe.get_inputs()}
    for _ in range(3):
        exe.run(None, feeds)
    inner = 200 if name == "mlp" else 1
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(inner):
            exe.run(None, feeds)
        times.append((time.perf_counter() - start) / inner)
    results[name] = statistics.median(times)
print(json.dumps(results))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=["mlp", "squeezenet", "shufflenet",
                                                     "resnet50", "inception_v1"])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--busy", action="store_true",
                        help="time with a process burning one core meanwhile (a neighbour)")
    args = parser.parse_args()
    hog = None
    if args.busy:
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    from opfusion.target import Target, host_cpu_name

    print(f"# cpu: {host_cpu_name()} ({Target('c').isa}), load {os.getloadavg()[0]:.2f}")
    here = str(Path(__file__).resolve().parent)
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    table: dict[str, dict[str, float]] = {}
    from opfusion.runtime.openmp import intel_library

    for label, setting in SETTINGS.items():
        if label == "intel" and intel_library("intel") is None:
            continue
        env = {**clean, **setting}
        out = subprocess.run([sys.executable, "-c", _CHILD, here, json.dumps(args.names),
                              str(args.repeat)], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"{label}: {out.stderr.strip()[-2000:]}")
        table[label] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{'model':<14}" + "".join(f"{label:>12}" for label in table))
    for name in args.names:
        unit, scale = ("us", 1e6) if name == "mlp" else ("ms", 1e3)
        print(f"{name:<14}" + "".join(f"{table[label][name] * scale:>10.3f}{unit}"
                                      for label in table))
    print(f"# load after: {os.getloadavg()[0]:.2f}" + (" (one core kept busy)" if hog else ""))
    if hog is not None:
        hog.kill()


if __name__ == "__main__":
    main()
