"""Time the CINN-style fusion engine (FusionMerge with the default policies) on graphs of
100,000 nodes, starting from one op per group.

    python benchmarks/fusion_merge_scale.py [--nodes 100000] [--models]

Graphs: a deep chain of elementwise ops and a wide DAG in which every value has two users
(horizontal and recompute policies get work there). The bar is under 10 s per graph."""

from __future__ import annotations

import argparse
import time

import opfusion as opf
from opfusion.ir.printer import gc_paused
from opfusion.testing.examples import chain_graph, wide_dag
from opfusion.transform.fusion import FusionGraph, merge_groups, registered_policies
from opfusion.transform.fusion.rewrite import rewrite_groups


def light_model_groups() -> None:
    """Kernels per light model (after optimize at opt_level 3) under each strategy."""
    import onnx

    from opfusion.frontend import from_onnx
    from opfusion.ir import Call, Function, post_order
    from opfusion.testing.light import LIGHT_MODEL_NAMES, light_model
    from opfusion.transform import FuseOps, FusionMerge, PassContext, optimize

    def groups(mod: opf.IRModule) -> int:
        return sum(isinstance(n, Call) and isinstance(n.op, Function)
                   for n in post_order(mod["main"].body, into_functions=False))

    print(f"\n{'model':<14} {'none':>5} {'tvm':>5} {'cinn':>5}")
    for name in LIGHT_MODEL_NAMES:
        mod, params = from_onnx(onnx.load(light_model(name)))
        with PassContext(opt_level=3):
            mod = optimize(mod, params)
            tvm = FuseOps()(mod)
            cinn = FusionMerge()(tvm)
        ops = sum(isinstance(n, Call) for n in post_order(mod["main"].body,
                                                           into_functions=False))
        print(f"{name:<14} {ops:>5} {groups(tvm):>5} {groups(cinn):>5}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--models", action="store_true",
                        help="also print kernels per light model for none / tvm / cinn")
    args = parser.parse_args()
    print(f"{'graph':<10} {'nodes':>7} {'groups':>7} {'graph':>7} {'merge':>7} {'rewrite':>8} "
          f"{'total':>7}")
    for name, build in (("chain", chain_graph), ("wide_dag", wide_dag)):
        mod = build(args.nodes)
        opf.ir.infer_type(mod["main"])  # types are not what is measured here
        with gc_paused():  # as FusionMerge runs them
            start = time.perf_counter()
            graph = FusionGraph(mod["main"])
            built = time.perf_counter()
            state = merge_groups(graph, registered_policies())
            merged = time.perf_counter()
            rewrite_groups(graph, [g.sorted_nodes() for g in state.alive_groups()])
            done = time.perf_counter()
        print(f"{name:<10} {len(graph.nodes):>7} {len(state.alive_groups()):>7} "
              f"{built - start:>6.2f}s {merged - built:>6.2f}s {done - merged:>7.2f}s "
              f"{done - start:>6.2f}s")
    if args.models:
        light_model_groups()


if __name__ == "__main__":
    main()
