"""The "cinn" strategy (FuseOps, then FusionMerge with the default policies) on every light
model's random-weight copy: the same numbers as the unfused model, no cycle between groups,
and never more groups than FuseOps alone."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.ir import Call, Function, evaluate, post_order  # noqa: E402
from opfusion.testing.light import LIGHT_MODEL_NAMES, light_model  # noqa: E402
from opfusion.transform import FuseOps, FusionMerge, PassContext, optimize  # noqa: E402
from opfusion.transform.fuse.check import check_fused_module  # noqa: E402


def group_count(mod):
    return sum(isinstance(n, Call) and isinstance(n.op, Function)
               for n in post_order(mod["main"].body, into_functions=False))


@pytest.mark.parametrize("name", LIGHT_MODEL_NAMES)
def test_cinn_strategy_keeps_the_numbers_of_every_light_model(name):
    mod, params = from_onnx(onnx.load(light_model(name)))
    with PassContext(opt_level=3):
        mod = optimize(mod, params)
        tvm = FuseOps()(mod)
        cinn = FusionMerge()(tvm)
    check_fused_module(cinn)
    assert group_count(cinn) <= group_count(tvm)
    (data,) = mod["main"].params
    x = np.random.default_rng(0).standard_normal(data.type_annotation.shape).astype("float32")
    np.testing.assert_array_equal(evaluate(cinn, [x]), evaluate(mod, [x]))
