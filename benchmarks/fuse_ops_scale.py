"""Time FuseOps on 100,000-node graphs, and count what it makes of the onnx light models.

    python benchmarks/fuse_ops_scale.py [--nodes 100000] [--repeat 3] [--no-models]

For a deep chain and a wide branching DAG (opfusion.testing.examples) it times the pass
(median of --repeat runs; types are inferred beforehand, as the pass's InferType requirement
would) and its two halves: the partition and the rewrite into primitive functions. The bar
is < 5 s per graph. For each light model (as imported, then after the standard
simplifications that decompose batch_norm) it prints the operator calls before fusion, the
primitive functions after, the largest group, and which rules kept the rest apart."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from opfusion.ir import Call, Function, infer_type, post_order
from opfusion.ir.op import Op
from opfusion.ir.printer import gc_paused
from opfusion.testing.examples import chain_graph, wide_dag
from opfusion.transform import PassContext, optimize
from opfusion.transform.fuse.explain import explain_fusion
from opfusion.transform.fuse.partition import FuseOptions, plan_fusion
from opfusion.transform.fuse_ops import FuseOps


def count_ops(func: Function) -> int:
    """Operator calls in ``func``, nested functions included."""
    return sum(1 for node in post_order(func) if isinstance(node, Call) and
               isinstance(node.op, Op))


def count_groups(func: Function) -> int:
    """Primitive functions called from ``func``'s body."""
    return sum(1 for node in post_order(func.body, into_functions=False)
               if isinstance(node, Call) and isinstance(node.op, Function) and
               node.op.is_primitive)


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def scale(nodes: int, repeat: int) -> float:
    print(f"{'graph':10}{'nodes':>9}{'groups':>9}{'partition':>11}{'FuseOps':>10}")
    worst = 0.0
    for name, build in (("chain", chain_graph), ("wide_dag", wide_dag)):
        mod = build(nodes)
        func = mod["main"]
        infer_type(func)
        graph_nodes = len(post_order(func.body, into_functions=False)) + len(func.params)

        def partition(func: Function = func) -> object:
            with gc_paused():  # as inside the pass
                return plan_fusion(func, FuseOptions())

        plan_time = median_seconds(partition, repeat)
        pass_time = median_seconds(lambda mod=mod: FuseOps()(mod), repeat)
        groups = count_groups(FuseOps()(mod)["main"])
        worst = max(worst, pass_time)
        print(f"{name:10}{graph_nodes:>9}{groups:>9}{plan_time:>10.2f}s{pass_time:>9.2f}s")
    print(f"slowest FuseOps: {worst:.2f} s (bar: < 5 s)")
    return worst


def light_models() -> None:
    try:
        import onnx

        from opfusion.frontend import from_onnx
        from opfusion.testing.light import LIGHT_MODEL_NAMES, shipped_light_model
    except ImportError:
        print("light models skipped: pip install onnx")
        return
    for optimized in (False, True):
        title = ("after optimize(opt_level=3): SimplifyInference, FoldConstant, ..."
                 if optimized else "as imported")
        print(f"\nlight models, {title}")
        print(f"{'model':14}{'ops':>6}{'groups':>8}{'largest':>9}{'FuseOps':>10}  "
              f"edges left apart, by rule")
        for name in LIGHT_MODEL_NAMES:
            mod, _ = from_onnx(onnx.load(shipped_light_model(name)))
            if optimized:
                with PassContext(opt_level=3):
                    mod = optimize(mod)
            start = time.perf_counter()
            fused = FuseOps()(mod)
            seconds = time.perf_counter() - start
            calls = [node for node in post_order(fused["main"].body, into_functions=False)
                     if isinstance(node, Call) and isinstance(node.op, Function)]
            largest = max((count_ops(call.op) for call in calls), default=0)
            rules = ", ".join(f"{rule} {count}" for rule, count in
                              explain_fusion(mod).by_rule().items())
            print(f"{name:14}{count_ops(mod['main']):>6}{count_groups(fused['main']):>8}"
                  f"{largest:>9}{seconds * 1e3:>8.1f}ms  {rules}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-models", action="store_true", help="skip the light models")
    args = parser.parse_args()
    scale(args.nodes, args.repeat)
    if not args.no_models:
        light_models()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

