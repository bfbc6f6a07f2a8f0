"""Any batch size: a model whose batch dimension is symbolic, compiled once, run at two batch
sizes (each compiled on first use), checked against the reference interpreter."""

import tempfile
from pathlib import Path

import numpy as np
import onnx

import opfusion as opf
from opfusion.testing import assert_close, light_model

# A random-weight SqueezeNet whose batch dimension is "N", as exported models often have it.
model = onnx.load(light_model("squeezenet"))
for value in [model.graph.input[0], *model.graph.output]:
    value.type.tensor_type.shape.dim[0].dim_param = "N"
path = Path(tempfile.mkdtemp(prefix="opf-any-batch-")) / "squeezenet_n.onnx"
onnx.save(model, path)

mod, params = opf.frontend.from_onnx(path)  # no shape=: a SymbolicModule
print(mod)
exe = opf.compile(mod, params=params)       # a SpecializingExecutor: nothing compiled yet
print("inputs:", [(arg.name, arg.shape) for arg in exe.get_inputs()])

for batch in (1, 2):
    x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224), dtype=np.float32)
    (y,) = exe.run(None, {"data_0": x})     # compiles this batch size on first use
    static, static_params = mod.specialize({"data_0": x.shape})  # the same shape, as an IRModule
    assert_close(y, opf.ir.evaluate(static, {"data_0": x, **static_params}), rtol=1e-4)
    print(f"batch {batch}: output {y.shape}, matches the reference interpreter")
print("specializations held:", exe.specializations)
