"""FuseOps on the onnx package's nine light models (resnet50, densenet121, ...).

The numbers are compared on the random-weight copies of :mod:`opfusion.testing.light` (the
shipped models output the same constant for any input, which would prove nothing); the
partition itself is checked on the shipped models, whose structure is the same. The op and
group counts are printed by ``benchmarks/fuse_ops_scale.py``."""

import numpy as np
import pytest
from fuse_helpers import assert_same_values, fuse, plan

onnx = pytest.importorskip("onnx")

from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.ir import evaluate  # noqa: E402
from opfusion.testing.light import (  # noqa: E402
    LIGHT_MODEL_NAMES,
    light_model,
    shipped_light_model,
)
from opfusion.transform import PassContext, optimize  # noqa: E402
from opfusion.transform.fuse.check import check_fused_module, check_fusion_plan  # noqa: E402
from opfusion.transform.fuse.explain import explain_fusion  # noqa: E402

# Small enough to run through the interpreter twice in a second or two.
QUICK = ("squeezenet", "bvlc_alexnet")


def parametrize_models():
    return pytest.mark.parametrize("name", [
        name if name in QUICK else pytest.param(name, marks=pytest.mark.slow)
        for name in LIGHT_MODEL_NAMES])


def import_random_copy(name):
    mod, params = from_onnx(onnx.load(light_model(name)))
    assert params == {}
    return mod


@parametrize_models()
def test_fused_light_model_computes_the_same_numbers(name):
    check_same_numbers(import_random_copy(name))


@pytest.mark.parametrize("name", [*QUICK, pytest.param("resnet50", marks=pytest.mark.slow)])
def test_optimized_then_fused_light_model_computes_the_same_numbers(name):
    # After SimplifyInference and friends batch norms are arithmetic, and groups grow
    # (conv2d + scale + shift + add + relu).
    with PassContext(opt_level=3):
        check_same_numbers(optimize(import_random_copy(name)))


def check_same_numbers(mod):
    fused = fuse(mod)
    check_fused_module(fused)
    (data,) = mod["main"].params
    ty = data.type_annotation
    x = np.random.default_rng(0).standard_normal(ty.shape).astype(ty.dtype)
    want = evaluate(mod, [x])
    assert np.std(want) > 0  # the random weights make the output depend on the input
    assert_same_values(evaluate(fused, [x]), want)


@pytest.mark.parametrize("name", LIGHT_MODEL_NAMES)
def test_light_model_partition_is_acyclic_and_explained(name):
    mod, _ = from_onnx(onnx.load(shipped_light_model(name)))
    partition = plan(mod)
    check_fusion_plan(partition)
    assert len(partition.fused_groups()) > 0
    assert "unknown" not in explain_fusion(mod).by_rule()
