"""How long a new batch size costs a model with a symbolic batch dimension, cold and after a
restart (the kernels then come from the disk cache).

    python benchmarks/specialize_compile.py [name] [--batches 1,8]

The light model ``name`` (default squeezenet; random weights from opfusion.testing) is saved
with its first input's and its outputs' first dimension made the symbolic ``N``. Two fresh
processes then run it in turn on one empty kernel cache: each imports it (a SymbolicModule),
compiles it with ``opf.compile`` and runs each batch size twice, timing the first run (the
specialization: import, passes, code generation and the C compiler, or the cached library)
and the second; the second process is the restart. Each run's outputs are checked against the
first process's. Prints one row per process and batch, with the C compiles and cache hits."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import onnx

from opfusion.testing.light import light_model

_WORKER = """
import json, sys, time
import numpy as np
import opfusion as opf
from opfusion.backend.cpu.toolchain import compile_stats

path, out, batches = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3].split(",")]
mod, params = opf.frontend.from_onnx(path)
exe = opf.compile(mod, params=params)
name, rows, outputs = mod.inputs[0].name, [], {}
for n in batches:
    shape = tuple(d if isinstance(d, int) else n for d in mod.inputs[0].dims)
    x = np.random.default_rng(n).standard_normal(shape).astype(np.float32)
    before = compile_stats()
    start = time.perf_counter()
    (y,) = exe.run(None, {name: x})[:1]
    first = time.perf_counter() - start
    start = time.perf_counter()
    exe.run(None, {name: x})
    second = time.perf_counter() - start
    after = compile_stats()
    outputs[str(n)] = y
    rows.append({"batch": n, "first": first, "second": second,
                 "compiles": after.compiles - before.compiles,
                 "hits": after.cache_hits - before.cache_hits})
np.savez(out, **outputs)
print(json.dumps(rows))
"""


def symbolic_copy(name: str, path: Path) -> None:
    """Save light model ``name`` with its batch dimension made the symbolic ``N``."""
    model = onnx.load(light_model(name))
    for value in [model.graph.input[0], *model.graph.output]:
        dim = value.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = "N"
    onnx.save(model, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", nargs="?", default="squeezenet")
    parser.add_argument("--batches", default="1,8")
    args = parser.parse_args()
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="opf-specialize-") as folder:
        root = Path(folder)
        symbolic_copy(args.name, root / "model.onnx")
        env = {**os.environ, "OPFUSION_CACHE_DIR": str(root / "cache")}
        print(f"model: {args.name}, batch dimension N; load {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores")
        print(f"{'process':<8}  {'batch':>5}  {'first run':>10}  {'next run':>9}  "
              f"{'C compiles':>10}  {'cache hits':>10}")
        results = []
        for process in ("cold", "restart"):
            out = root / f"{process}.npz"
            result = subprocess.run([sys.executable, "-c", _WORKER, str(root / "model.onnx"),
                                     str(out), args.batches], env=env, capture_output=True,
                                    text=True, check=True)
            for row in json.loads(result.stdout.strip().splitlines()[-1]):
                print(f"{process:<8}  {row['batch']:>5}  {row['first']:>9.2f}s  "
                      f"{row['second'] * 1e3:>7.1f}ms  {row['compiles']:>10}  {row['hits']:>10}")
            results.append(np.load(out))
        for key in results[0].files:
            np.testing.assert_allclose(results[1][key], results[0][key], rtol=0, atol=0)
        print("first run: the specialization (import, passes, code generation, C compiler or "
              "cache) and the run; the restart's outputs equal the cold process's")


if __name__ == "__main__":
    main()
