"""Where a model's time goes, by kind of operator: ``exe.profile``'s kernel times summed by
the kernel's anchor (convolutions split by kernel size and stride, since they cost
differently), with each kind's achieved GFLOP/s for the convolutions and dense layers
(Winograd's counted as the direct algorithm's work, so they can pass the machine's peak).

    python benchmarks/profile_kinds.py resnet50 [--repeat 20] [--no-layout] \
        [--layers [--ort] [--openvino]]

``--no-layout`` compiles with AlterOpLayout disabled (the NCHW kernels), for before/after
tables. ``--layers`` lists every kernel too, in run order, with its result's shape; ``--ort``
lists ONNX Runtime's nodes beside them (their kernel times from its own profile,
``enable_profiling``, medians over the runs, and their output shapes) for a layer-by-layer
comparison: SqueezeNet's squeeze layers, 2x ONNX Runtime's time, were found that way.
``--openvino`` lists OpenVINO's executed operations the same way (f32 precision hint, latency,
one thread per core; times from its ``PERF_COUNT`` profile, medians over the runs, with the
kernel it chose: ``brgconv_avx512_amx_I8``).
Times are per-kernel medians from ``exe.profile`` (each kernel timed alone, so the total is a
little above a whole run's). Check that the machine is quiet (``uptime``)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from collections import defaultdict

import numpy as np
from models import model_path  # noqa: E402  (benchmarks/ is the script's folder)

import opfusion as opf
from opfusion.ir.expr import Call, Constant
from opfusion.ir.visitor import post_order

#: Operators that name a kernel's kind (the first one found in the group, in this order).
ANCHORS = ("nn.conv2d_winograd_nchwc", "nn.conv2d_nchwc", "nn.conv2d", "nn.conv2d_transpose",
           "nn.dense", "nn.matmul", "nn.matmul_packed", "nn.batch_matmul", "nn.max_pool2d",
           "nn.avg_pool2d", "nn.global_avg_pool2d", "nn.global_max_pool2d", "concatenate",
           "layout_transform", "nn.softmax", "nn.layer_norm", "nn.pad", "strided_slice")


def kind_and_flops(group) -> tuple[str, float]:
    """The kind of one lowered group and its multiply-adds x 2 (0 when not a product; an int8
    product of words counts every part of its words, a stem's unused fourth byte too)."""
    func = group.function
    calls = [n for n in post_order(func.body) if isinstance(n, Call)] if func else []
    for name in ANCHORS:
        for call in calls:
            if call.op_name != name:
                continue
            if name == "nn.conv2d_winograd_nchwc":
                # GFLOP/s of the direct algorithm's work (2 x C x 9 per output element)
                data = call.args[0].checked_type.shape
                channels = data[1] * data[4]
                out = int(np.prod(call.checked_type.shape))
                return f"conv 3x3 winograd F({call.attrs.tile_size})", 2.0 * out * channels * 9
            if "conv2d" in name:
                weight = call.args[1].checked_type.shape
                kh, kw = weight[2], weight[3]
                stride = call.attrs.strides[0]
                groups = call.attrs.groups
                label = f"conv {kh}x{kw}" + (f" s{stride}" if stride > 1 else "")
                if groups > 1:
                    label += " grouped"
                out = call.checked_type.shape
                taps = int(np.prod(weight[1:]))  # per output element (blocked: in x o lanes)
                if name == "nn.conv2d_nchwc":
                    taps //= weight[5]
                    if call.attrs.group_window:  # (groups, J, KH, KW, C/groups, o)
                        taps = kh * kw * weight[4]
                    if call.attrs.words:  # each tap a word of 4 bytes or 2 halves
                        taps *= call.attrs.words
                        label += " int8"
                return label, 2.0 * int(np.prod(out)) * taps
            if name in ("nn.dense", "nn.matmul", "nn.matmul_packed", "nn.batch_matmul"):
                depth = call.args[0].checked_type.shape[-1]
                if name == "nn.matmul" and call.attrs.transpose_a:
                    depth = call.args[0].checked_type.shape[-2]
                constant = isinstance(call.args[1], Constant) or name == "nn.matmul_packed"
                label = "dense/matmul" if constant else "matmul (two inputs)"
                if name == "nn.matmul_packed" and call.attrs.words:
                    depth *= call.attrs.words
                    label += " int8"
                return label, 2.0 * int(np.prod(call.checked_type.shape)) * depth
            return name.removeprefix("nn."), 0.0
    return "elementwise/other", 0.0


def ort_node_times(path: str, x: np.ndarray, repeat: int) -> list[tuple[str, str, float]]:
    """ONNX Runtime's nodes in run order: (operator, output shape, median kernel seconds),
    from its own profile of ``repeat`` runs on the machine's cores."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = os.path.join(folder, "ort")
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        feeds = {session.get_inputs()[0].name: x}
        for _ in range(repeat):
            session.run(None, feeds)
        with open(session.end_profiling()) as profile:
            events = json.load(profile)
    times: dict[str, list[float]] = defaultdict(list)
    info: dict[str, tuple[str, str]] = {}
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        args = event.get("args", {})
        shapes = [next(iter(out.values())) for out in args.get("output_type_shape", [])]
        info.setdefault(name, (args.get("op_name", "?"), str(shapes[0] if shapes else "")))
        times[name].append(event["dur"] * 1e-6)
    return [(*info[name], float(np.median(t))) for name, t in times.items()]


def openvino_node_times(path: str, x: np.ndarray, repeat: int) -> list[tuple[str, str, float]]:
    """OpenVINO's executed operations in run order: (type and kernel, node name, median
    seconds), from its ``PERF_COUNT`` profile of ``repeat`` runs (f32 precision hint,
    latency, one thread per core as in ``models.py``). Operations it fused away are left out."""
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": os.cpu_count() or 1, "PERF_COUNT": True})
    request = compiled.create_infer_request()
    times: dict[str, list[float]] = defaultdict(list)
    info: dict[str, tuple[str, str]] = {}
    for _ in range(repeat):
        request.infer({0: x})
        for record in request.get_profiling_info():
            if record.status != record.status.EXECUTED:
                continue
            info.setdefault(record.node_name, (f"{record.node_type} {record.exec_type}",
                                               record.node_name))
            times[record.node_name].append(record.real_time.total_seconds())
    return [(*info[name], float(np.median(t))) for name, t in times.items()]


def print_layers(exe, profile, peers: dict[str, list[tuple[str, str, float]]]) -> None:
    """Every kernel in run order (time, kind, GFLOP/s, result shape), then each peer's."""
    print(f"\n{'opfusion kernel':<52} {'time':>9} {'GFLOP/s':>8}  result")
    for step, (name, _, time, _) in zip(exe.steps, profile.rows):
        kind, work = kind_and_flops(step.group)
        func = step.group.function
        shape = getattr(func.body.checked_type, "shape", "") if func else ""
        rate = f"{work / time / 1e9:8.0f}" if work else " " * 8
        print(f"{name[:52]:<52} {time * 1e3:>7.3f}ms {rate}  {kind} {list(shape)}")
    for peer, nodes in peers.items():
        print(f"\n{peer + ' node':<40} {'time':>9}  output")
        for op, shape, time in nodes:
            print(f"{op[:40]:<40} {time * 1e3:>7.3f}ms  {shape}")
        print(f"{'total':<40} {sum(t for _, _, t in nodes) * 1e3:>7.2f}ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a light, vision or transformer model's name "
                        "(resnet50, bert_layer, ...) or an .onnx file")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-layout", action="store_true",
                        help="compile with AlterOpLayout disabled (NCHW kernels)")
    parser.add_argument("--layers", action="store_true",
                        help="list every kernel too, in run order, with its result's shape")
    parser.add_argument("--ort", action="store_true",
                        help="with --layers: ONNX Runtime's nodes from its own profile beside")
    parser.add_argument("--openvino", action="store_true",
                        help="with --layers: OpenVINO's operations from its own profile beside")
    parser.add_argument("--target", default="c",
                        help='the target to compile for (e.g. "c -mattr=+avx2,+fma" to see '
                        "a narrower machine's kernels on this one)")
    args = parser.parse_args()
    mod, params = opf.frontend.from_onnx(model_path(args.model))
    disabled = ["AlterOpLayout"] if args.no_layout else []
    with opf.transform.PassContext(opt_level=3, disabled_pass=disabled):
        exe = opf.compile(mod, params=params, target=args.target)
    x = np.random.default_rng(0).standard_normal(exe.get_inputs()[0].shape).astype(np.float32)
    exe.run([x])
    profile = exe.profile([x], repeat=args.repeat)
    seconds: dict[str, float] = defaultdict(float)
    flops: dict[str, float] = defaultdict(float)
    kernels: dict[str, int] = defaultdict(int)
    for step, (_, _, time, _) in zip(exe.steps, profile.rows):
        kind, work = kind_and_flops(step.group)
        seconds[kind] += time
        flops[kind] += work
        kernels[kind] += 1
    total = sum(seconds.values())
    print(f"# {args.model}{' (NCHW, no layout pass)' if args.no_layout else ''}: "
          f"{platform.processor() or platform.machine()}, ISA {opf.Target(args.target).isa}, "
          f"load {os.getloadavg()[0]:.2f}; kernel medians of {args.repeat} runs")
    print(f"{'kind':<22} {'kernels':>7} {'time':>9} {'share':>6} {'GFLOP/s':>8}")
    for kind in sorted(seconds, key=lambda k: -seconds[k]):
        rate = f"{flops[kind] / seconds[kind] / 1e9:8.0f}" if flops[kind] else " " * 8
        print(f"{kind:<22} {kernels[kind]:>7} {seconds[kind] * 1e3:>7.2f}ms "
              f"{seconds[kind] / total:>6.1%} {rate}")
    print(f"{'total':<22} {sum(kernels.values()):>7} {total * 1e3:>7.2f}ms")
    if args.layers:
        peers = {}
        if args.ort:
            peers["onnxruntime"] = ort_node_times(model_path(args.model), x, args.repeat)
        if args.openvino:
            peers["openvino"] = openvino_node_times(model_path(args.model), x, args.repeat)
        print_layers(exe, profile, peers)


if __name__ == "__main__":
    main()
