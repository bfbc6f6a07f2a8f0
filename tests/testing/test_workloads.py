"""The workload builders: real graphs whose output depends on the input, under the reference
interpreter, with parameters that are seeded and named after the function's variables."""

import numpy as np
import pytest

import opfusion as opf
from opfusion import OpfusionError
from opfusion.testing import (
    SMALL_WORKLOAD_ARGS,
    WORKLOADS,
    mlp,
    resnet,
    squeezenet,
    transformer_encoder,
    workload_input,
)


def outputs_for_two_inputs(mod, params):
    return [opf.ir.evaluate(mod, {**params, **workload_input(mod, params, seed=seed)})
            for seed in (1, 2)]


def assert_depends_on_input(first, second):
    assert np.isfinite(first).all() and np.isfinite(second).all()
    scale = np.abs(first).max()
    assert scale > 0
    assert np.abs(first - second).max() > 0.01 * scale


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_small_workload_output_depends_on_input(name):
    mod, params = WORKLOADS[name](**SMALL_WORKLOAD_ARGS[name])
    assert_depends_on_input(*outputs_for_two_inputs(mod, params))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_default_workload_output_depends_on_input(name):
    # TVM's default sizes (224x224 images, BERT-base encoder layer): a few seconds each.
    mod, params = WORKLOADS[name]()
    assert_depends_on_input(*outputs_for_two_inputs(mod, params))


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_params_are_the_weights_of_main(name):
    mod, params = WORKLOADS[name](**SMALL_WORKLOAD_ARGS[name])
    main = mod["main"]
    data, *weights = main.params
    assert data.name_hint == "data"
    assert [w.name_hint for w in weights] == list(params)
    for weight in weights:
        value = params[weight.name_hint]
        assert value.shape == weight.type_annotation.shape
        assert value.dtype == weight.type_annotation.dtype
    assert list(workload_input(mod, params)) == ["data"]


def test_same_seed_same_weights_other_seed_other_weights():
    _, first = mlp(seed=3)
    _, again = mlp(seed=3)
    _, other = mlp(seed=4)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    assert not np.allclose(first["fc1_weight"], other["fc1_weight"])


def test_workload_input_is_standard_normal_and_seeded():
    mod, params = mlp(batch_size=64)
    x = workload_input(mod, params, seed=5)["data"]
    assert x.shape == (64, 1, 28, 28) and x.dtype == np.float32
    assert abs(x.mean()) < 0.05 and abs(x.std() - 1) < 0.05
    np.testing.assert_array_equal(x, workload_input(mod, params, seed=5)["data"])
    assert not np.array_equal(x, workload_input(mod, params, seed=6)["data"])


def test_batch_size_and_dtype():
    mod, params = resnet(batch_size=2, dtype="float64", image_shape=(3, 16, 16),
                         num_classes=5)
    assert all(value.dtype == np.float64 for value in params.values())
    y = opf.ir.evaluate(mod, {**params, **workload_input(mod, params)})
    assert y.shape == (2, 5) and y.dtype == np.float64
    np.testing.assert_allclose(y.sum(axis=-1), 1.0, rtol=1e-12)  # softmax rows
    assert np.abs(y[0] - y[1]).max() > 0.01 * np.abs(y).max()  # the two images differ


def test_calibrated_layers_are_standardized_on_fresh_inputs():
    # A conv of resnet18 (after the stem: its input is positive) and the first dense of the
    # encoder, measured on inputs the calibration never saw.
    mod, params = resnet(image_shape=(3, 32, 32), num_classes=10)
    main = mod["main"]
    convs = [node for node in opf.ir.post_order(main.body)
             if isinstance(node, opf.Call) and node.op_name == "nn.conv2d"]
    conv = convs[1]
    assert conv.args[1].name_hint == "stage1_unit1_1_conv_weight"
    probe = opf.IRModule.from_expr(opf.Function(main.params, conv))
    y = np.stack([opf.ir.evaluate(probe, {**params, **workload_input(mod, params, seed=s)})
                  for s in range(16)])
    mean = y.mean(axis=(0, 1, 3, 4))
    std = y.std(axis=(0, 1, 3, 4))
    # The conv has no bias: its batch norm's moving mean holds the conv's mean. Per channel
    # the statistics of 16 small images scatter by ~0.1.
    bn_mean = params["stage1_unit1_1_bn_moving_mean"]
    assert np.abs(bn_mean).max() > 1
    assert np.abs(mean - bn_mean).mean() < 0.1 and np.abs(mean - bn_mean).max() < 0.5
    assert np.abs(std - 1).mean() < 0.1 and np.abs(std - 1).max() < 0.3

    mod, params = transformer_encoder(hidden=64, heads=4, seq=32)
    main = mod["main"]
    query = next(node for node in opf.ir.post_order(main.body)
                 if isinstance(node, opf.Call) and node.op_name == "nn.bias_add")
    probe = opf.IRModule.from_expr(opf.Function(main.params, query))
    y = np.stack([opf.ir.evaluate(probe, {**params, **workload_input(mod, params, seed=s)})
                  for s in range(8)])
    # Calibrated on 4 x 32 tokens: each channel's mean is known to ~0.1.
    mean = y.mean(axis=(0, 1, 2))
    assert np.abs(mean).mean() < 0.2 and np.abs(mean).max() < 0.6
    assert abs(y.std() - 1) < 0.1


def test_squeezenet_versions_and_relu_encoder():
    for version in ("1.0", "1.1"):
        mod, params = squeezenet(version=version, image_shape=(3, 48, 48), num_classes=10)
        assert_depends_on_input(*outputs_for_two_inputs(mod, params))
    mod, params = transformer_encoder(hidden=32, heads=2, seq=8, activation="relu")
    assert_depends_on_input(*outputs_for_two_inputs(mod, params))


def test_bad_arguments_are_opfusion_errors():
    with pytest.raises(OpfusionError, match="no 19-layer variant"):
        resnet(num_layers=19)
    with pytest.raises(OpfusionError, match="not divisible by heads"):
        transformer_encoder(hidden=10, heads=3)
    with pytest.raises(OpfusionError, match="version"):
        squeezenet(version="2.0")
    with pytest.raises(OpfusionError, match="batch_size"):
        mlp(batch_size=0)
