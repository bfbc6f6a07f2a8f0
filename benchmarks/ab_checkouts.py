"""A/B latency of two opfusion checkouts on the same models, interleaved in one run.

    python benchmarks/ab_checkouts.py OLD_DIR NEW_DIR [names...] [--rounds 10] [--batch 5]
        [--target "c -mattr=+avx2,+fma"]

OLD_DIR and NEW_DIR are source trees (e.g. ``git worktree add /tmp/old cb21d3a``). One
worker process per checkout imports opfusion from its tree and compiles every model (a light,
transformer or vision model by name, an .onnx file, or ``workload:<name>`` for a builder of
:mod:`opfusion.testing.workloads`);
then the two are timed in turn, ``--batch`` runs each, for ``--rounds`` rounds (each going
first in every other round; half the rounds with each checkout's worker started first), so
that a drifting machine slows both alike. ``--target``
compiles for another target than the host (an AVX2 target on an AVX-512 machine, say).
Prints each model's median latency per checkout and
NEW/OLD as a ratio (below 1: the new checkout is faster), with the machine's load before and
after: quote figures only from a quiet machine (load under 0.5)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

# The worker: reads model names, compiles each, then answers "time <name> <runs>" with the
# seconds of each run, one JSON line per request.
_WORKER = r"""
import json, os, sys, time
import numpy as np
import opfusion as opf

def load(name):
    if name.startswith("workload:"):
        from opfusion.testing.workloads import WORKLOADS, workload_input
        mod, params = WORKLOADS[name.split(":", 1)[1]]()
        return mod, params, workload_input(mod, params)
    from opfusion.testing.light import light_model
    from opfusion.testing.transformer import TRANSFORMER_MODEL_NAMES, transformer_model
    from opfusion.testing.vision import VISION_MODEL_NAMES, vision_model
    path = (transformer_model(name) if name in TRANSFORMER_MODEL_NAMES
            else vision_model(name) if name in VISION_MODEL_NAMES
            else name if name.endswith(".onnx") else light_model(name))
    mod, params = opf.frontend.from_onnx(path)
    rng = np.random.default_rng(0)
    inputs = {p.name_hint: rng.standard_normal(p.type_annotation.shape).astype(
        p.type_annotation.dtype) for p in mod["main"].params if p.name_hint not in params}
    return mod, params, inputs

executors = {}
for name in sys.argv[1:]:
    mod, params, inputs = load(name)
    exe = opf.compile(mod, params=params, target=os.environ.get("AB_TARGET") or None)
    exe.run(inputs)
    executors[name] = (exe, inputs)
print(json.dumps({"ready": opf.__file__}), flush=True)
for line in sys.stdin:
    _, name, runs = line.split()
    exe, inputs = executors[name]
    times = []
    for _ in range(int(runs)):
        start = time.perf_counter()
        exe.run(inputs)
        times.append(time.perf_counter() - start)
    print(json.dumps(times), flush=True)
"""


def start_worker(tree: Path, names: list[str], target: str = "") -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "AB_TARGET": target}
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, *names], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tree)
    assert worker.stdout is not None
    ready = json.loads(worker.stdout.readline())
    if not ready.get("ready", "").startswith(str(tree.resolve())):
        raise SystemExit(f"the worker for {tree} imported opfusion from {ready.get('ready')}")
    return worker


def time_runs(worker: subprocess.Popen[str], name: str, runs: int) -> list[float]:
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(f"time {name} {runs}\n")
    worker.stdin.flush()
    return json.loads(worker.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("names", nargs="*",
                        default=["resnet50", "squeezenet", "shufflenet", "inception_v1",
                                 "densenet121", "workload:transformer_encoder"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--target", default="",
                        help="compile for this target instead of the host")
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()[0]:.2f}")
    times: dict[tuple[str, str], list[float]] = {}
    # Half the rounds with the old checkout's worker started first, half with the new one's:
    # a worker started first ran 3-6% slower than the one started after it, whichever
    # checkout it ran (two identical trees measured 0.963-0.969 new/old, and 1.059 with the
    # new tree's worker started first); a throwaway worker started and stopped before
    # them left 1-2% of it.
    first_half = (args.rounds + 1) // 2
    for order, rounds in ((("old", "new"), first_half), (("new", "old"), args.rounds - first_half)):
        if rounds:
            time_in_order(args, order, rounds, times)
    print(f"load after: {os.getloadavg()[0]:.2f}")
    print(f"{'model':<32} {'old ms':>9} {'new ms':>9} {'new/old':>8}")
    ratios = []
    for name in args.names:
        old = statistics.median(times[("old", name)])
        new = statistics.median(times[("new", name)])
        ratios.append(new / old)
        print(f"{name:<32} {old * 1e3:>9.3f} {new * 1e3:>9.3f} {new / old:>8.3f}")
    geomean = statistics.geometric_mean(ratios)
    print(f"geomean new/old {geomean:.3f}")


def time_in_order(args: argparse.Namespace, order: tuple[str, str], rounds: int,
                  times: dict[tuple[str, str], list[float]]) -> None:
    """Start the two workers in ``order`` (side names) and time ``rounds`` rounds of every
    model into ``times``, each side going first in every other round (the second of two
    batches ran 1-4% faster, whichever checkout it was)."""
    trees = {"old": args.old, "new": args.new}
    workers = {side: start_worker(trees[side], args.names, args.target) for side in order}
    for round_index in range(rounds):
        for name in args.names:
            sides = list(workers.items())
            if round_index % 2:
                sides.reverse()
            for side, worker in sides:
                times.setdefault((side, name), []).extend(time_runs(worker, name, args.batch))
    for worker in workers.values():
        assert worker.stdin is not None
        worker.stdin.close()
        worker.wait()


if __name__ == "__main__":
    main()
