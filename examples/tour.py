"""The README's tour: import an ONNX model, see its fused groups, compile, run, profile.

    python examples/tour.py

The model is a random-weight copy of the ONNX project's SqueezeNet 1.0 (written once into
the opfusion cache by ``opfusion.testing.light_model``; needs the ``onnx`` package). The last
lines check the compiled model against the reference interpreter and the exported file."""

import tempfile
from pathlib import Path

import numpy as np

import opfusion as opf
from opfusion.testing import assert_close, light_model

# -- the tour, as in README.md ------------------------------------------------------------------
path = light_model("squeezenet")                  # a random-weight SqueezeNet 1.0 (ONNX file)
mod, params = opf.frontend.from_onnx(path)        # shape={"data_0": (1, 3, 224, 224)} if symbolic
with opf.transform.PassContext(opt_level=3):
    optimized = opf.transform.optimize(mod, params)   # fold batch norms and constants, CSE, DCE
    fused = opf.transform.FuseOps()(optimized)        # each fused group: one primitive function
print(fused.astext(show_meta_data=False))             # the IR with its fused groups
print(opf.transform.explain_fusion(optimized))        # why the remaining edges were not fused

exe = opf.compile(mod, params=params)             # optimize, fuse, lower, generate C, compile
x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
(y,) = exe.run({"data_0": x})                     # numpy in, numpy out
(y,) = exe.run(None, {"data_0": x})               # or as ONNX Runtime: output names, feeds
print(exe.get_inputs()[0].name, exe.get_outputs()[0].type)   # data_0 tensor(float)
print(y.shape, exe.num_kernels, "kernels")
print(exe.profile({"data_0": x}, repeat=3))       # per-kernel median times and fused operators

# -- checks ---------------------------------------------------------------------------------------
assert_close(y, opf.ir.evaluate(mod, {"data_0": x, **params}), rtol=1e-4)
with tempfile.TemporaryDirectory() as directory:
    exe.export(Path(directory) / "squeezenet.opf")      # one file, run without recompiling
    loaded = opf.load(Path(directory) / "squeezenet.opf")
    np.testing.assert_array_equal(loaded(data_0=x), y)
print("the compiled model matches the reference interpreter; the exported file runs alike")
