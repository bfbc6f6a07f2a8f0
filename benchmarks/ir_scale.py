"""Time the graph-IR basics on graphs of 100,000 nodes: build, print, parse, visit, mutate,
infer types and evaluate, for a deep chain and a wide DAG.

    python benchmarks/ir_scale.py [--nodes 100000]

Each step is timed once per repeat (median of --repeat runs); the bar is < 2 s per step."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

import opfusion as opf
from opfusion.ir import ExprMutator, ExprVisitor, evaluate, infer_type, parse, post_order
from opfusion.testing.examples import chain_graph, wide_dag


class CountCalls(ExprVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def visit_call(self, call: opf.Call) -> None:
        self.calls += 1


class AddToSubtract(ExprMutator):
    def visit_call(self, call: opf.Call) -> opf.Call:
        new = super().visit_call(call)
        if new.op.name == "add":
            return opf.Call("subtract", new.args)
        return new


def time_steps(build: Callable[[], opf.IRModule], repeat: int) -> dict[str, float]:
    times: dict[str, list[float]] = {}

    def timed(step: str, fn: Callable[..., object], *args: object) -> object:
        start = time.perf_counter()
        result = fn(*args)
        times.setdefault(step, []).append(time.perf_counter() - start)
        return result

    for _ in range(repeat):
        mod = timed("build", build)
        timed("infer", infer_type, mod["main"])
        text = timed("print", str, mod)
        timed("parse", parse, text)
        timed("visit", CountCalls().visit, mod["main"])
        timed("mutate", AddToSubtract().visit, mod["main"])
        x = np.random.default_rng(0).standard_normal(4).astype(np.float32)
        timed("evaluate", evaluate, build(), [x])  # a fresh module: evaluate infers types too
    return {step: statistics.median(values) for step, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    graphs = {
        "chain": lambda: chain_graph(args.nodes),
        "wide_dag": lambda: wide_dag(args.nodes),
    }
    steps = ["build", "infer", "print", "parse", "visit", "mutate", "evaluate"]
    print(f"{'graph':10}{'nodes':>9}" + "".join(f"{s:>10}" for s in steps))
    worst = 0.0
    for name, build in graphs.items():
        nodes = len(post_order(build()["main"]))
        result = time_steps(build, args.repeat)
        worst = max(worst, *result.values())
        print(f"{name:10}{nodes:>9}" + "".join(f"{result[s]:>9.2f}s" for s in steps))
    print(f"slowest step: {worst:.2f} s (bar: < 2 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
