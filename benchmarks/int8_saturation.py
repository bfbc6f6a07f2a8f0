"""Do int8 convolutions without VNNI give the exact sums? One QDQ 1x1 convolution whose
weights all hold 127 and whose input codes alternate 128 and 255, run by opfusion (for the
host and for AVX2) and by OpenVINO (as it comes, and held to AVX2 by ONEDNN_MAX_CPU_ISA).

Without VNNI, x86 multiplies unsigned by signed bytes with ``vpmaddubsw``, which adds each
pair of products into a saturating int16: 255 * 127 + 128 * 127 = 48641 does not fit, and
the sum comes out as 32767. oneDNN's AVX2 kernels (OpenVINO's) take that instruction, so
their sums saturate wherever a pair of large weights of one sign meets large activations;
opfusion's AVX2 code multiplies 16-bit halves (``vpmaddwd``), exactly, at about 3/4 of the
multiply-adds a cycle. The script prints each engine's first output against the exact one::

    python benchmarks/int8_saturation.py

Needs onnx; OpenVINO is optional (``pip install openvino``). Each OpenVINO setting runs in a
process of its own, since oneDNN reads its ISA cap once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

CHANNELS = 64


def saturating_model(path: str) -> None:
    """x -> QuantizeLinear (scale 1/255, zero point 0) -> DequantizeLinear -> Conv 1x1 of
    int8 weights 127 (scale 1/127) -> QuantizeLinear (scale 0.5) -> DequantizeLinear."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.full((CHANNELS, CHANNELS, 1, 1), 127, np.int8)
    inits = [numpy_helper.from_array(np.array(1 / 255, np.float32), "xs"),
             numpy_helper.from_array(np.array(0, np.uint8), "xz"),
             numpy_helper.from_array(weight, "w"),
             numpy_helper.from_array(np.array(1 / 127, np.float32), "ws"),
             numpy_helper.from_array(np.array(0.5, np.float32), "ys"),
             numpy_helper.from_array(np.array(0, np.uint8), "yz")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
             helper.make_node("Conv", ["xd", "wd"], ["c"]),
             helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["yq"]),
             helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    shape = [1, CHANNELS, 4, 4]
    graph = helper.make_graph(nodes, "saturation",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def input_codes() -> np.ndarray:
    """Codes 128 and 255 in alternate channels (pairs of one of each), as floats."""
    x = np.full((1, CHANNELS, 4, 4), 128 / 255, np.float32)
    x[:, 1::2] = 1.0
    return x


def exact() -> float:
    """The model's first output, computed exactly: the sum of codes x 127, then scaled."""
    codes = np.round(input_codes()[0, :, 0, 0] * 255)
    total = float((codes * 127).sum()) / 255 / 127
    return float(np.clip(np.round(total / 0.5), 0, 255) * 0.5)


def openvino_output(path: str, cap: str | None) -> float | None:
    """OpenVINO's first output in a fresh process (``cap``: ONEDNN_MAX_CPU_ISA), or None."""
    code = ("import json, sys, numpy as np, openvino as ov\n"
            "core = ov.Core()\n"
            "m = core.compile_model(core.read_model(sys.argv[1]), 'CPU', "
            "{'INFERENCE_PRECISION_HINT': 'f32', 'INFERENCE_NUM_THREADS': 1})\n"
            "x = np.load(sys.argv[2])\n"
            "print(json.dumps(float(m.infer_new_request({0: x})[0].reshape(-1)[0])))\n")
    env = dict(os.environ)
    if cap:
        env["ONEDNN_MAX_CPU_ISA"] = cap
    with tempfile.TemporaryDirectory() as tmp:
        feed = os.path.join(tmp, "x.npy")
        np.save(feed, input_codes())
        done = subprocess.run([sys.executable, "-c", code, path, feed], env=env,
                              capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return None
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


def opfusion_output(path: str, target: str | None) -> float:
    import opfusion as opf

    mod, params = opf.frontend.from_onnx(path)
    exe = opf.compile(mod, params=params, target=target)
    return float(exe.run({"x": input_codes()})[0].reshape(-1)[0])


def main() -> None:
    from opfusion.target import host_target

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "saturation.onnx")
        saturating_model(path)
        want = exact()
        print(f"exact: {want:g}   (host ISA {host_target().isa})")
        rows = [("opfusion, host", opfusion_output(path, None)),
                ("opfusion, c -mattr=+avx2,+fma", opfusion_output(path, "c -mattr=+avx2,+fma"))]
        rows += [(f"openvino, {cap or 'as it comes'}", openvino_output(path, cap))
                 for cap in (None, "AVX2")]
        for name, got in rows:
            if got is None:
                print(f"{name:32s} not run (openvino missing or failed)")
            else:
                verdict = "exact" if got == want else f"off by {got - want:+g}"
                print(f"{name:32s} {got:8g}   {verdict}")


if __name__ == "__main__":
    main()
