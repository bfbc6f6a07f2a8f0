"""optimize at opt_level 3 on every light ONNX model (random-weight copies): no batch_norm,
no dropout, no constant-only call remains, and the outputs still match the original model."""

import numpy as np
import pytest

from opfusion.frontend import from_onnx
from opfusion.ir import Call, Constant, Tuple, evaluate, post_order
from opfusion.testing import LIGHT_MODEL_NAMES, assert_close, light_model
from opfusion.transform import optimize

onnx = pytest.importorskip("onnx")


def op_names(mod):
    return [n.op.name for n in post_order(mod["main"]) if isinstance(n, Call)]


def constant_only_calls(mod):
    def constant(arg):
        return isinstance(arg, Constant) or (
            isinstance(arg, Tuple) and all(isinstance(f, Constant) for f in arg.fields))

    return [n.op.name for n in post_order(mod["main"])
            if isinstance(n, Call) and all(constant(a) for a in n.args)]


@pytest.mark.parametrize("name", LIGHT_MODEL_NAMES)
def test_optimize_leaves_no_inference_ops_and_keeps_the_numbers(name):
    mod, params = from_onnx(onnx.load(str(light_model(name))))
    new = optimize(mod, params, opt_level=3)
    names = op_names(new)
    assert "nn.batch_norm" not in names and "nn.dropout" not in names
    assert constant_only_calls(new) == []
    assert [p.name_hint for p in new["main"].params] == [
        p.name_hint for p in mod["main"].params if p.name_hint not in params]
    rng = np.random.default_rng(0)
    inputs = {p.name_hint: rng.standard_normal(p.type_annotation.shape).astype("float32")
              for p in new["main"].params}
    want = evaluate(mod, {**inputs, **params})
    got = evaluate(new, inputs)
    # Folding batch norms into weights re-rounds them; deep networks carry that further.
    assert_close(got, want, rtol=1e-4)


def test_batch_norms_are_folded_into_convolutions_in_resnet50():
    mod, params = from_onnx(onnx.load(str(light_model("resnet50"))))
    before = op_names(mod)
    after = op_names(optimize(mod, params, opt_level=3))
    assert before.count("nn.batch_norm") > 0
    assert after.count("nn.conv2d") == before.count("nn.conv2d")
    assert after.count("multiply") == 0  # every batch-norm scale went into a weight
