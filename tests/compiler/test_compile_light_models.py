"""Every light ONNX model (its random-weight copy) compiles, fused and unfused, and matches
the reference interpreter to 1e-4 of the output's largest magnitude (see TOLERANCE for the
two deepest)."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.testing import LIGHT_MODEL_NAMES, assert_close, light_model
from opfusion.testing.targets import OTHER_TARGETS

onnx = pytest.importorskip("onnx")
pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")


# Deep random networks amplify float32 rounding differences (a different summation order in a
# convolution) layer by layer: ONNX Runtime itself differs from the reference interpreter by
# 1.3-2.2e-4 (resnet50) and 2.9e-5 (vgg19) of the output's largest value on these copies, and
# on inception_v2 ONNX Runtime, opfusion in NCHW and opfusion in NCHW16c each range from 1e-5
# to 1.1e-4 over four input seeds (which one is closest changes with the seed). Those three
# get the tolerance ONNX Runtime would need; every other model is held to 1e-4.
TOLERANCE = {"resnet50": 3e-4, "vgg19": 2e-4, "inception_v2": 2e-4}


@pytest.mark.parametrize("name", LIGHT_MODEL_NAMES)
def test_light_model_compiles_to_the_reference_numbers(name):
    mod, params = opf.frontend.from_onnx(onnx.load(str(light_model(name))))
    (data,) = [p for p in mod["main"].params if p.name_hint not in params]
    x = np.random.default_rng(7).standard_normal(data.type_annotation.shape).astype(np.float32)
    want = opf.ir.evaluate(mod, {data.name_hint: x, **params})
    fused = opf.compile(mod, params=params)
    rtol = TOLERANCE.get(name, 1e-4)
    assert_close(fused(x), want, rtol=rtol)
    unfused = opf.compile(mod, params=params, fusion="none")
    assert unfused.num_kernels > fused.num_kernels
    assert_close(unfused(x), want, rtol=rtol)
    for target in OTHER_TARGETS:  # the host target above; an older ISA on the same machine
        assert_close(opf.compile(mod, params=params, target=target)(x), want, rtol=rtol)
