"""Every light ONNX model (its random-weight copy) compiles, fused and unfused, and matches
the reference interpreter to 1e-4 of the output's largest magnitude (the deepest three to
``light_model_tolerance``)."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.testing import LIGHT_MODEL_NAMES, assert_close, light_model, light_model_tolerance
from opfusion.testing.targets import OTHER_TARGETS

onnx = pytest.importorskip("onnx")
pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")




@pytest.mark.parametrize("name", LIGHT_MODEL_NAMES)
def test_light_model_compiles_to_the_reference_numbers(name):
    mod, params = opf.frontend.from_onnx(onnx.load(str(light_model(name))))
    (data,) = [p for p in mod["main"].params if p.name_hint not in params]
    x = np.random.default_rng(7).standard_normal(data.type_annotation.shape).astype(np.float32)
    want = opf.ir.evaluate(mod, {data.name_hint: x, **params})
    fused = opf.compile(mod, params=params)
    rtol = light_model_tolerance(name)  # deep random networks: see its docstring
    assert_close(fused(x), want, rtol=rtol)
    unfused = opf.compile(mod, params=params, fusion="none")
    assert unfused.num_kernels > fused.num_kernels
    assert_close(unfused(x), want, rtol=rtol)
    for target in OTHER_TARGETS:  # the host target above; an older ISA on the same machine
        assert_close(opf.compile(mod, params=params, target=target)(x), want, rtol=rtol)
