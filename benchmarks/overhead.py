"""Per-run overhead: what a run costs beyond its kernels' arithmetic, against ONNX Runtime.

    python benchmarks/overhead.py [--repeat 2000]

Three ONNX models, each run by opfusion and by ONNX Runtime (two threads) interleaved in one
process, batch 1:

- ``tiny``: one Add of two 16-element vectors: the run is all overhead;
- ``mlp``: three Gemm+Relu layers (784 -> 256 -> 256 -> 10), random weights;
- ``chain1`` and ``chain32``: 1 and 32 Relu nodes on 16 elements, compiled with
  ``fusion="none"`` (one kernel per node), so ``(chain32 - chain1) / 31`` is opfusion's
  dispatch cost per extra kernel (ONNX Runtime's per extra node likewise).

Prints the median microseconds per run of each engine, their ratio, and the dispatch cost in
nanoseconds. In one process, the engines' threads meet: ONNX Runtime's spin for a while after
its runs (its default) and take the cores from opfusion's next ones, which on two cores slows
opfusion's parallel kernels (the MLP's) more than its own brief spin slows ONNX Runtime. So
``--alone`` also times each engine in a process of its own, alternating, and prints those
medians beside. Then opfusion's overhead proper, per run: its run time less that of its native
entry called alone on prepared pointers (the call every run makes, without the Python around
it). (ONNX Runtime's profiler cannot tell the same apart: its per-node times include its
own dispatch.) Quote figures only from a quiet machine (the load is printed)."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import opfusion as opf
from opfusion.target import Target, host_cpu_name


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any],
           initializers: list[Any]) -> Any:
    from onnx import helper

    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def tiny_model() -> Any:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])
    out = helper.make_tensor_value_info("z", TensorProto.FLOAT, [16])
    return _model([helper.make_node("Add", ["x", "y"], ["z"])], [x, y], [out], [])


def chain_model(length: int) -> Any:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [16])
    out = helper.make_tensor_value_info(f"r{length}", TensorProto.FLOAT, [16])
    nodes = [helper.make_node("Relu", ["x" if i == 0 else f"r{i}"], [f"r{i + 1}"])
             for i in range(length)]
    return _model(nodes, [x], [out], [])


def mlp_model(sizes: tuple[int, ...] = (784, 256, 256, 10)) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, sizes[0]])
    nodes, weights, name = [], [], "x"
    for layer, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
        b = (0.1 * rng.standard_normal(fan_out)).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"w{layer}"),
                    numpy_helper.from_array(b, f"b{layer}")]
        nodes.append(helper.make_node("Gemm", [name, f"w{layer}", f"b{layer}"], [f"g{layer}"]))
        nodes.append(helper.make_node("Relu", [f"g{layer}"], [f"h{layer}"]))
        name = f"h{layer}"
    out = helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, sizes[-1]])
    return _model(nodes, [x], [out], weights)


def interleaved(fns: list[Callable[[], Any]], repeat: int, batch: int = 50,
                batch_seconds: float = 0.02, settle_seconds: float = 0.0) -> list[float]:
    """Median seconds per call of each of ``fns``, timed in alternating batches of at least
    ``batch`` calls and ``batch_seconds``: long enough that the threads one engine leaves
    spinning after its batch (ONNX Runtime's spin for a while, and opfusion's briefly) slow
    only a sliver of the next engine's batch. ``settle_seconds``: a pause before each batch,
    untimed, in which the previous engine's threads stop spinning (on a model bound by memory
    they slowed the next engine's whole batch by up to 10%). Each round starts one engine
    later than the one before (a rotation), so that no engine always follows the same one:
    in a fixed order, opfusion's fused AlexNet, always timed right after OpenVINO's batch, came
    out 2-7% behind its unfused build in four runs of five, and ahead in one process of its
    own."""
    for fn in fns:
        for _ in range(batch):
            fn()
    start = time.perf_counter()
    for fn in fns:
        fn()
    per_round = max(time.perf_counter() - start, 1e-7)
    batch = max(batch, int(batch_seconds * len(fns) / per_round))
    times: list[list[float]] = [[] for _ in fns]
    for round_ in range(max(5, repeat // batch)):
        shift = round_ % len(fns)
        for fn, out in list(zip(fns, times))[shift:] + list(zip(fns, times))[:shift]:
            if settle_seconds:
                time.sleep(settle_seconds)
            start = time.perf_counter()
            for _ in range(batch):
                fn()
            out.append((time.perf_counter() - start) / batch)
    return [statistics.median(t) for t in times]


def ort_session(model: Any) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = Target.current().num_cores
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


MODELS = {"tiny": (tiny_model, "tvm"), "mlp": (mlp_model, "tvm"),
          "chain1": (partial(chain_model, 1), "none"),
          "chain32": (partial(chain_model, 32), "none")}


def alone_seconds(engine: str, name: str, repeat: int) -> float:
    """Median seconds per run of one engine on model ``name``, with no other engine in the
    process (the ``--alone`` mode's child)."""
    build, fusion = MODELS[name]
    model = build()
    feeds = {"x": np.random.default_rng(0).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(
        np.float32)}
    if len(model.graph.input) > 1:
        feeds["y"] = feeds["x"].copy()
    if engine == "opfusion":
        mod, params = opf.frontend.from_onnx(model)
        runner = partial(opf.compile(mod, params=params, fusion=fusion).run, None, feeds)
    else:
        runner = partial(ort_session(model).run, None, feeds)
    return interleaved([runner], repeat)[0]


def main_alone(repeat: int, rounds: int = 3) -> None:
    """Each engine on each model in a process of its own, the engines alternating, ``rounds``
    times; the median per engine: each undisturbed by the other's threads."""
    import subprocess
    import sys

    print(f"{'model':<8} {'opfusion':>10} {'ort':>10} {'opf/ort':>8}   (each alone, median of "
          f"{rounds} processes)")
    for name in MODELS:
        times: dict[str, list[float]] = {"opfusion": [], "ort": []}
        for _ in range(rounds):
            for engine in times:
                out = subprocess.run([sys.executable, __file__, "--child", engine, name,
                                      "--repeat", str(repeat)], capture_output=True, text=True,
                                     check=True)
                times[engine].append(float(out.stdout.split()[-1]))
        t_opf, t_ort = (statistics.median(times[e]) for e in ("opfusion", "ort"))
        print(f"{name:<8} {t_opf * 1e6:>8.1f}us {t_ort * 1e6:>8.1f}us {t_opf / t_ort:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2000)
    parser.add_argument("--alone", action="store_true",
                        help="also time each engine in a process of its own")
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "MODEL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(alone_seconds(*args.child, args.repeat))
        return
    print(f"# cpu: {host_cpu_name()} ({Target('c').isa}), load {os.getloadavg()[0]:.2f}")
    print(f"{'model':<8} {'kernels':>7} {'opfusion':>10} {'ort':>10} {'opf/ort':>8}")
    rng = np.random.default_rng(0)
    results = {}
    overheads: dict[str, float] = {}
    for name, model, fusion in (("tiny", tiny_model(), "tvm"),
                                ("mlp", mlp_model(), "tvm"),
                                ("chain1", chain_model(1), "none"),
                                ("chain32", chain_model(32), "none")):
        mod, params = opf.frontend.from_onnx(model)
        exe = opf.compile(mod, params=params, fusion=fusion)
        feeds = {arg.name: rng.standard_normal(arg.shape).astype(np.float32)
                 for arg in exe.get_inputs()}
        session = ort_session(model)
        t_opf, t_ort = interleaved([partial(exe.run, None, feeds),
                                    partial(session.run, None, feeds)], args.repeat)
        results[name] = (exe.num_kernels, t_opf, t_ort)
        print(f"{name:<8} {exe.num_kernels:>7} {t_opf * 1e6:>8.1f}us {t_ort * 1e6:>8.1f}us "
              f"{t_opf / t_ort:>7.2f}x")
        overheads[name] = t_opf - native_seconds(exe, feeds, args.repeat)
    (k1, t1, o1), (kn, tn, on) = results["chain1"], results["chain32"]
    extra = max(1, kn - k1)
    print(f"dispatch per extra kernel: opfusion {(tn - t1) / extra * 1e9:.0f} ns, "
          f"onnxruntime {(on - o1) / extra * 1e9:.0f} ns per extra node")
    print("opfusion's overhead per run (run time less its native entry's):")
    for name, seconds in overheads.items():
        print(f"  {name:<8} {seconds * 1e6:6.1f}us")
    if args.alone:
        main_alone(args.repeat)
    print(f"# load after: {os.getloadavg()[0]:.2f}")


def native_seconds(exe: Any, feeds: dict[str, np.ndarray], repeat: int) -> float:
    """Median seconds of one call of ``exe``'s native entry on prepared pointers: the
    kernels (and the entry's own dispatch), without the Python of a run."""
    plan = exe._native_plan()
    outputs = exe.run(None, feeds)  # arrays of the right shapes to write into
    workspace = exe.workspaces.take()
    try:
        for position, name in enumerate(exe.input_names):
            workspace.inputs[position] = feeds[name].ctypes.data
        for position, array in enumerate(outputs):
            workspace.outputs[position] = array.ctypes.data
        workspace.call.constants = plan.constants_address
        workspace.call.num_threads = exe.num_threads
        return interleaved([partial(plan.run, 0, plan.num_steps, workspace.call_address)],
                           repeat)[0]
    finally:
        exe.workspaces.give(workspace)


if __name__ == "__main__":
    main()
