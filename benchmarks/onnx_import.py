"""Time ``from_onnx`` on the light models, and count the nodes before and after import.

    python benchmarks/onnx_import.py [names...] [--repeat 5]

For each model (default: resnet50, issue 3's bar: under 3 s) prints the median import time of
--repeat runs after one warm-up, for the shipped model (weights made by ConstantOfShape nodes)
and for its random-weight copy ``opfusion.testing.light_model`` (initializers, what a real
model holds), and the node counts: ONNX nodes by op type before; operator calls, constants and
their bytes after."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter

import onnx

from opfusion.frontend import from_onnx
from opfusion.ir import Call, Constant, IRModule, post_order
from opfusion.testing import light_model, shipped_light_model

BAR_S = 3.0


def median_import_s(model: onnx.ModelProto, repeat: int) -> tuple[float, IRModule]:
    mod, _ = from_onnx(model)  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        mod, _ = from_onnx(model)
        times.append(time.perf_counter() - start)
    return statistics.median(times), mod


def ir_counts(mod: IRModule) -> tuple[Counter, int, int]:
    nodes = post_order(mod["main"].body)
    calls = Counter(node.op.name for node in nodes if isinstance(node, Call))
    constants = [node for node in nodes if isinstance(node, Constant)]
    return calls, len(constants), sum(node.data.nbytes for node in constants)


def describe(counter: Counter, top: int = 8) -> str:
    items = ", ".join(f"{name} {count}" for name, count in counter.most_common(top))
    rest = sum(counter.values()) - sum(count for _, count in counter.most_common(top))
    return items + (f", others {rest}" if rest else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=["resnet50"])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'model':<28} {'import (median)':>16} {'onnx nodes':>11} {'IR calls':>9} "
          f"{'constants':>10} {'MiB':>7}")
    slow = []
    for name in args.names:
        shipped = onnx.load(shipped_light_model(name))
        for label, model in ((name, shipped),
                             (f"{name} (initializers)", onnx.load(light_model(name)))):
            seconds, mod = median_import_s(model, args.repeat)
            calls, n_constants, nbytes = ir_counts(mod)
            print(f"{label:<28} {seconds * 1e3:>13.0f} ms {len(model.graph.node):>11} "
                  f"{sum(calls.values()):>9} {n_constants:>10} {nbytes / 2**20:>7.1f}")
            if seconds >= BAR_S:
                slow.append(label)
        print(f"  before: {describe(Counter(n.op_type for n in shipped.graph.node))}")
        print(f"  after:  {describe(calls)}")
    print(f"\nbar: import under {BAR_S:.0f} s -> "
          + ("met" if not slow else f"MISSED by {', '.join(slow)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
