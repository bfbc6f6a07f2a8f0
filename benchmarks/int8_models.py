"""An int8 model against its float version, in opfusion, ONNX Runtime and OpenVINO, interleaved.

    python benchmarks/int8_models.py [--model resnet18|resnet50|...|bert_layer|gpt_block]
                                     [--format qdq|qoperator|dynamic] [--repeat 200]
    python benchmarks/int8_models.py --model resnet18 --save resnet18_qdq.onnx


The int8 model is made by ONNX Runtime's quantization tool from a random-weight float model:
a vision model (:func:`opfusion.testing.vision_model`, or a light model of
:func:`opfusion.testing.light_model`: resnet50, squeezenet, ...) by ``quant_pre_process`` then
``quantize_static`` (per-channel weights, 8 calibration batches of standard-normal inputs;
``--format qdq`` or ``qoperator``); a transformer block
(:func:`opfusion.testing.transformer_model`) by ``quantize_dynamic`` (int8 weights, every MatMul
a MatMulInteger of DynamicQuantizeLinear's bytes; ``--format dynamic``, its default), as ONNX
Runtime's documentation recommends for each. Prints the engines' median times for the float
and the int8 model (batch 1, one thread per core, in alternating batches as
``benchmarks/models.py`` times them), the int8/float ratios, opfusion's ratios to the others,
and how far each int8 output is from the float model's (relative to its largest magnitude).
OpenVINO is left out where it is not installed or cannot read the model. ``--save PATH``
writes the int8 model to PATH and times nothing (for ``benchmarks/models.py PATH --isa
avx2_vnni``, say: other ISAs' code against OpenVINO held to them). Check ``uptime``
first: ONNX Runtime's spinning threads make busy-machine ratios meaningless. Needs the test
extra (onnxruntime)."""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
from models import Engine, openvino_engine, opfusion_engine, ort_engine, timed
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

import opfusion as opf
from opfusion.frontend import from_onnx
from opfusion.target import host_target
from opfusion.testing.light import LIGHT_MODEL_NAMES, light_model
from opfusion.testing.transformer import TRANSFORMER_MODEL_NAMES, transformer_model
from opfusion.testing.vision import vision_model


class _RandomBatches(CalibrationDataReader):
    def __init__(self, name: str, shape: tuple[int, ...], count: int = 8) -> None:
        rng = np.random.default_rng(0)
        self.batches = iter([{name: rng.standard_normal(shape, dtype=np.float32)}
                             for _ in range(count)])

    def get_next(self):
        return next(self.batches, None)


def quantized(path: Path, out: Path, fmt: str) -> Path:
    """``path`` quantized as ONNX Runtime's documentation recommends: dynamically (``fmt``
    "dynamic"), or pre-processed (batch norms folded, shapes inferred) and quantized
    statically."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if fmt == "dynamic":
        quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
        return out

    model = onnx.load(str(path))
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < 13:  # per-channel DequantizeLinear (its axis) needs opset 13
        converted = out.with_name("opset13.onnx")
        onnx.save(onnx.version_converter.convert_version(model, 13), str(converted))
        path = converted
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
    parser.add_argument("--format", choices=["qdq", "qoperator", "dynamic"], default=None,
                        help="qdq for vision models, dynamic for transformer blocks")
    parser.add_argument("--repeat", type=int, default=200, help="calls per engine at least")
    parser.add_argument("--save", type=Path, default=None,
                        help="write the int8 model here and time nothing")
    args = parser.parse_args()

    transformer = args.model in TRANSFORMER_MODEL_NAMES
    fmt = args.format or ("dynamic" if transformer else "qdq")
    if transformer:
        float_path = transformer_model(args.model)
    elif args.model in LIGHT_MODEL_NAMES:
        float_path = light_model(args.model)
    else:
        float_path = vision_model(args.model)
    int8_path = quantized(float_path, Path(tempfile.mkdtemp()) / "int8.onnx", fmt)
    if args.save is not None:
        shutil.copyfile(int8_path, args.save)
        print(f"wrote {args.save}")
        return
    value = onnx.load(str(float_path), load_external_data=False).graph.input[0]
    shape = tuple(d.dim_value or 1 for d in value.type.tensor_type.shape.dim)
    x = np.random.default_rng(1).standard_normal(shape, dtype=np.float32)
    engines: dict[str, Engine] = {}
    for label, path in [("float", float_path), ("int8", int8_path)]:
        mod, params = from_onnx(str(path))
        exe = opf.compile(mod, params=params)
        engines[f"opfusion {label}"] = opfusion_engine(label, exe, {exe.input_names[0]: x})
        ort = ort_engine(str(path), x)
        if ort is not None:
            engines[f"onnxruntime {label}"] = ort
        try:
            found = openvino_engine(str(path), x)
        except RuntimeError as error:  # an operation it does not read
            print(f"# openvino {label}: left out ({str(error).splitlines()[0][:100]})")
            found = None
        if found is not None:
            engines[f"openvino {label}"] = found[0]
    outputs = {key: engine.outputs()[0] for key, engine in engines.items()}
    median = dict(zip(engines, (t * 1e3 for t in timed(list(engines.values()), args.repeat))))
    target = host_target()
    print(f"{args.model} ({fmt}), batch 1, {target.num_cores} threads, "
          f"ISA {'+'.join(sorted(target.features)) or 'baseline'}")
    for key in engines:
        print(f"  {key:<20} {median[key]:8.2f} ms")
    names = sorted({key.rsplit(" ", 1)[0] for key in engines})
    for engine in names:
        if f"{engine} int8" in median and f"{engine} float" in median:
            ratio = median[f"{engine} int8"] / median[f"{engine} float"]
            print(f"  {engine}: int8 / float time {ratio:.2f}")
    for engine in names:
        for label in ("float", "int8"):
            if engine != "opfusion" and f"{engine} {label}" in median:
                print(f"  {engine} / opfusion ({label}): "
                      f"{median[f'{engine} {label}'] / median[f'opfusion {label}']:.2f}")
    reference = outputs["opfusion float"]
    scale = float(np.max(np.abs(reference)))
    for key, value in outputs.items():
        print(f"  {key:<20} max |out - float| / max|float| = "
              f"{float(np.max(np.abs(value - reference))) / scale:.4f}")
    if "onnxruntime int8" in outputs:
        apart = np.max(np.abs(outputs["opfusion int8"] - outputs["onnxruntime int8"]))
        print(f"  opfusion int8 vs onnxruntime int8: max diff / max|float| = "
              f"{float(apart) / scale:.4f}")


if __name__ == "__main__":
    main()
