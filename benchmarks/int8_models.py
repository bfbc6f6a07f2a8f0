"""An int8 model against its float version, in opfusion and ONNX Runtime, interleaved.

    python benchmarks/int8_models.py [--model resnet18] [--format qdq|qoperator]
                                     [--repeat 20] [--threads 2]

The int8 model is made by ONNX Runtime's quantization tool (``quant_pre_process``, then
``quantize_static``, per-channel
weights, 8 calibration batches of standard-normal inputs) from the random-weight torchvision
copy of :func:`opfusion.testing.vision_model`. Prints, per engine, the median times of the
float and the int8 model (batch 1), the int8/float ratio, opfusion/ONNX Runtime ratios, and
how far each int8 output is from the float model's (relative to its largest magnitude).
Check ``uptime`` first: ONNX Runtime's spinning threads make busy-machine ratios
meaningless. Needs the test extra (onnxruntime)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_static,
)

import opfusion as opf
from opfusion.frontend import from_onnx
from opfusion.target import host_target
from opfusion.testing.vision import vision_model


class _RandomBatches(CalibrationDataReader):
    def __init__(self, name: str, shape: tuple[int, ...], count: int = 8) -> None:
        rng = np.random.default_rng(0)
        self.batches = iter([{name: rng.standard_normal(shape, dtype=np.float32)}
                             for _ in range(count)])

    def get_next(self):
        return next(self.batches, None)


def quantized(path: Path, out: Path, fmt: str) -> Path:
    """``path`` pre-processed (batch norms folded, shapes inferred) and quantized as ONNX
    Runtime's documentation recommends."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = out.with_name("prepared.onnx")
    quant_pre_process(str(path), str(prepared))
    path = prepared
    model = onnx.load(path)
    value = model.graph.input[0]
    shape = tuple(d.dim_value for d in value.type.tensor_type.shape.dim)
    quantize_static(str(path), str(out), _RandomBatches(value.name, shape),
                    quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                    per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--format", choices=["qdq", "qoperator"], default="qdq")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    float_path = vision_model(args.model)
    int8_path = quantized(float_path, Path(tempfile.mkdtemp()) / "int8.onnx", args.format)
    x = np.random.default_rng(1).standard_normal((1, 3, 224, 224), dtype=np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    runners, outputs = {}, {}
    for label, path in [("float", float_path), ("int8", int8_path)]:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        runners[f"onnxruntime {label}"] = (lambda s=session, n=name: s.run(None, {n: x})[0])
        mod, params = from_onnx(str(path))
        exe = opf.compile(mod, params=params, num_threads=args.threads)
        runners[f"opfusion {label}"] = (lambda e=exe: e.run([x])[0])
    times: dict[str, list[float]] = {key: [] for key in runners}
    for key, run in runners.items():
        outputs[key] = run()
    for _ in range(args.repeat):  # interleaved
        for key, run in runners.items():
            time.sleep(0.05)  # ONNX Runtime's threads stop spinning before the next engine
            start = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - start)
    target = host_target()
    print(f"{args.model} ({args.format}), batch 1, {args.threads} threads, "
          f"ISA {'+'.join(sorted(target.features)) or 'baseline'}")
    median = {key: statistics.median(values) * 1e3 for key, values in times.items()}
    for key in runners:
        print(f"  {key:<20} {median[key]:8.2f} ms")
    for engine in ("opfusion", "onnxruntime"):
        ratio = median[f"{engine} int8"] / median[f"{engine} float"]
        print(f"  {engine}: int8 / float time {ratio:.2f}")
    for label in ("float", "int8"):
        print(f"  opfusion / onnxruntime ({label}): "
              f"{median[f'opfusion {label}'] / median[f'onnxruntime {label}']:.2f}")
    reference = outputs["onnxruntime float"]
    scale = float(np.max(np.abs(reference)))
    for key, value in outputs.items():
        print(f"  {key:<20} max |out - float| / max|float| = "
              f"{float(np.max(np.abs(value - reference))) / scale:.4f}")
    apart = np.max(np.abs(outputs["opfusion int8"] - outputs["onnxruntime int8"]))
    print(f"  opfusion int8 vs onnxruntime int8: max diff / max|float| = "
          f"{float(apart) / scale:.4f}")


if __name__ == "__main__":
    main()
