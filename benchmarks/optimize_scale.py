"""Time ``opf.transform.optimize`` (opt_level 3) on graphs of 100,000 nodes, pass by pass.

    python benchmarks/optimize_scale.py [--nodes 100000]

Three graphs: a deep chain of elementwise ops, a wide DAG full of shared subexpressions, and a
deep stack of tiny conv2d + batch_norm + relu blocks with constant weights (every block gives
SimplifyInference, FoldConstant and FoldScaleAxis work). The bar is that optimize finishes;
the per-pass table shows where the time goes."""

from __future__ import annotations

import argparse
import time

import numpy as np

import opfusion as opf
from opfusion.testing.examples import chain_graph, wide_dag
from opfusion.transform import PassContext, PassTimingInstrument


def conv_bn_stack(num_nodes: int) -> opf.IRModule:
    """About ``num_nodes`` calls: blocks of conv2d -> batch_norm -> relu on a (1, 4, 4, 4)
    tensor, each block with its own constant weight and batch-norm parameters."""
    rng = np.random.default_rng(0)
    x = opf.var("x", (1, 4, 4, 4))
    y: opf.Expr = x
    for _ in range(max(1, num_nodes // 3)):
        weight = opf.const(rng.standard_normal((4, 4, 1, 1)).astype(np.float32) * 0.5)
        gamma, beta, mean = (opf.const(rng.standard_normal(4).astype(np.float32))
                             for _ in range(3))
        var = opf.const(rng.uniform(0.5, 1.5, 4).astype(np.float32))
        y = opf.op.nn.relu(opf.op.nn.batch_norm(opf.op.nn.conv2d(y, weight), gamma, beta,
                                                mean, var))
    return opf.IRModule.from_expr(opf.Function([x], y))


def count_calls(mod: opf.IRModule) -> int:
    return sum(isinstance(n, opf.Call) for n in opf.ir.post_order(mod["main"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    args = parser.parse_args()
    graphs = {"chain": lambda: chain_graph(args.nodes),
              "wide_dag": lambda: wide_dag(args.nodes),
              "conv_bn_stack": lambda: conv_bn_stack(args.nodes)}
    print(f"{'graph':<14} {'calls in':>9} {'calls out':>9} {'optimize':>10}")
    timings = {}
    for name, build in graphs.items():
        mod = build()
        timing = PassTimingInstrument()
        with PassContext(opt_level=3, instruments=[timing]):
            start = time.perf_counter()
            new = opf.transform.optimize(mod)
            seconds = time.perf_counter() - start
        timings[name] = timing
        print(f"{name:<14} {count_calls(mod):>9} {count_calls(new):>9} {seconds:>9.2f}s")
    for name, timing in timings.items():
        print(f"\n{name}")
        print(timing)


if __name__ == "__main__":
    main()
