"""How long exporting and loading an ``.opf`` artifact takes, and how large it is.

    python benchmarks/artifact_load.py [names...] [--repeat 7]

For each light model (default: resnet50 and vgg19, the largest; random weights from
opfusion.testing.light_model) it compiles the model, exports it once (timed), and loads it
``--repeat`` times (after one untimed load, so the page cache is warm and the library is
already installed in the kernel cache); it prints the export time, the file's size, the
median load time (with the weights' CRC-32 checked, the default, and without:
``verify_weights=False``) and the median of the first run after a load (which touches every
weight, so lazily mapped weights are paid for there). Each load's outputs are checked against
the compiled executor's. With ``--plain``, only ``opf.load(path)`` is timed (the API every
version has, to time an older opfusion with the same script)."""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

import opfusion as opf
from opfusion.frontend import from_onnx
from opfusion.testing.light import light_model


def measure(name: str, directory: Path, repeat: int, plain: bool) -> None:
    mod, params = from_onnx(onnx.load(light_model(name)))
    exe = opf.compile(mod, params=params)
    shape = next(v.type.shape for v in exe.values if v.input_index == 0)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = exe(x)
    path = directory / f"{name}.opf"
    start = time.perf_counter()
    exe.export(path)
    export_s = time.perf_counter() - start
    opf.load(path)  # warm: page cache, installed library
    loads, unverified, first_runs = [], [], []
    for _ in range(repeat):
        if not plain:
            start = time.perf_counter()
            opf.load(path, verify_weights=False)
            unverified.append(time.perf_counter() - start)
        start = time.perf_counter()
        loaded = opf.load(path)
        middle = time.perf_counter()
        got = loaded(x)
        loads.append(middle - start)
        first_runs.append(time.perf_counter() - middle)
        np.testing.assert_array_equal(got, want)
        del loaded
    size_mb = path.stat().st_size / 1e6
    print(f"{name:10s} export {export_s:7.3f} s  size {size_mb:8.1f} MB  "
          f"load {statistics.median(loads) * 1e3:8.1f} ms  "
          f"unverified {statistics.median(unverified) * 1e3 if unverified else math.nan:6.1f} ms  "
          f"first run {statistics.median(first_runs) * 1e3:8.1f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=["resnet50", "vgg19"])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--plain", action="store_true", help="time opf.load(path) only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.names:
            measure(name, Path(scratch), args.repeat, args.plain)


if __name__ == "__main__":
    main()
