"""Data-dependent initialisation: rescale each affine layer so its output is standardized.

Random weights alone let activations grow or vanish with depth, and a network whose
activations vanish computes nearly the same output for every input. So, as in a trained
network, each convolution or dense layer is rescaled and re-biased, in graph order, until on
standard-normal inputs its output has zero mean and unit variance per channel. Where a channel
holds a single value per input (a dense layer at batch 1, a convolution on a 1x1 map), each
unit is centred over the inputs and the scale is shared by the whole tensor.

A layer is affine in its weights, so the standardized output is just ``(out - mean) / std``:
one forward pass of the reference operators over a few inputs, evaluated side by side and
patched layer by layer, calibrates the whole network."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OpfusionError
from ..ir.evaluate import _conform
from ..ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ..ir.infer import infer_type
from ..ir.op import Op
from ..ir.visitor import children, post_order


@dataclass(frozen=True)
class Layer:
    """An affine layer to calibrate: its output in the graph and the weights that make it.

    The output changes as ``out -> (out - mean) / std``. That takes ``weight / std`` (along
    ``weight_axis``, the weight's output-channel axis) and either ``bias -> (bias - mean /
    bias_scale) / std`` for a bias added with a factor ``bias_scale`` (ONNX Gemm's ``beta``),
    or, for a layer without a bias whose only reader is a batch norm, ``bn_mean -> bn_mean +
    mean / std`` (the running mean of that batch norm, as training would have set it)."""

    output: Expr
    weight: str
    weight_axis: int = 0
    channel_axis: int = 1
    bias: str | None = None
    bias_scale: float = 1.0
    bn_mean: str | None = None


def calibrate(
    func: Function,
    layers: Sequence[Layer],
    weights: Mapping[str, np.ndarray],
    samples: Sequence[Mapping[str, np.ndarray]],
) -> dict[str, np.ndarray]:
    """Standardize every layer of ``layers`` on ``samples`` and return the new weights.

    ``func``'s parameters take their values from each sample (the data inputs) or else from
    ``weights`` (parameters shared by all samples). ``weights`` also holds every array the
    layers name; a copy with those arrays rescaled is returned, the input is left alone."""
    if not samples:
        raise OpfusionError("calibration needs at least one input sample")
    infer_type(func)
    by_output = {layer.output: layer for layer in layers}
    if len(by_output) != len(layers):
        raise OpfusionError("calibration: two layers share one output expression")
    owner: dict[str, str] = {}
    for layer in layers:
        for name in (layer.weight, layer.bias, layer.bn_mean):
            if name is not None and owner.setdefault(name, layer.weight) != layer.weight:
                raise OpfusionError(f"calibration: {name!r} belongs to two layers (weights "
                                    f"{owner[name]!r} and {layer.weight!r}); give each its own")
    new_weights = dict(weights)
    count = len(samples)
    env: dict[Expr, list[Any]] = {}
    for param in func.params:
        name = param.name_hint
        if name in samples[0]:
            env[param] = [np.asarray(sample[name]) for sample in samples]
        elif name in weights:
            env[param] = [np.asarray(weights[name])] * count
        else:
            raise OpfusionError(f"calibration: no value for parameter %{name}")
    order = post_order(func.body, into_functions=False)
    remaining: dict[Expr, int] = dict.fromkeys(order, 0)
    for node in order:
        for child in children(node, into_functions=False):
            remaining[child] += 1
    done = 0
    for node in order:
        if node not in env:
            env[node] = _evaluate(node, env, count)
        layer = by_output.get(node)
        if layer is not None:
            env[node] = _standardize(layer, env[node], new_weights)
            done += 1
        for child in children(node, into_functions=False):
            remaining[child] -= 1
            if remaining[child] == 0 and child is not func.body:
                del env[child]
    if done != len(layers):
        raise OpfusionError(f"calibration: {len(layers) - done} layer output(s) are not "
                            "computed by the function")
    return new_weights


def _evaluate(node: Expr, env: dict[Expr, list[Any]], count: int) -> list[Any]:
    """``node``'s value for each sample, with the operators' NumPy references."""
    if isinstance(node, Constant):
        return [node.data] * count
    if isinstance(node, Tuple):
        return [tuple(env[field][i] for field in node.fields) for i in range(count)]
    if isinstance(node, TupleGetItem):
        return [value[node.index] for value in env[node.tuple_value]]
    if isinstance(node, Call) and isinstance(node.op, Op):
        op, attrs, args = node.op, node.attrs, [env[arg] for arg in node.args]
        return [_conform(op.reference(*(arg[i] for arg in args), **attrs), node._checked_type,
                         node) for i in range(count)]
    if isinstance(node, Var):
        raise OpfusionError(f"calibration: %{node.name_hint} is not a parameter of the function")
    raise OpfusionError(f"calibration runs operator calls only, not {type(node).__name__}")


def _standardize(layer: Layer, outputs: list[np.ndarray], weights: dict[str, np.ndarray]
                 ) -> list[np.ndarray]:
    """Measure the layer's output over the samples, fold ``(out - mean) / std`` into its
    weights and return the standardized outputs (what the new weights compute)."""
    dtype = outputs[0].dtype
    stacked = np.stack(outputs).astype(np.float64)  # (samples, *output shape)
    axis = layer.channel_axis % outputs[0].ndim + 1
    channels = stacked.shape[axis]
    shape = [1] * stacked.ndim  # broadcasts per-channel statistics against ``stacked``
    shape[axis] = channels
    if outputs[0].size // channels > 1:  # many values per channel: statistics per channel
        others = tuple(i for i in range(stacked.ndim) if i != axis)
        mean = stacked.mean(axis=others)
        centred = stacked - mean.reshape(shape)
        std = np.sqrt(np.square(centred).mean(axis=others))
    else:  # one value per channel and input: centre each unit over the inputs, scale per tensor
        mean = stacked.mean(axis=0).reshape(channels)
        centred = stacked - mean.reshape(shape)
        std = np.full(channels, np.sqrt(np.square(centred).mean()))
    # A dead channel (constant output) keeps its scale; dividing by ~0 would make noise of it.
    std = np.where(np.isfinite(std) & (std > 1e-12), std, 1.0)
    per_tensor = bool(np.all(std == std[0]))

    weight = weights[layer.weight]
    if per_tensor:
        scaled = weight / std[0]
    else:
        if weight.shape[layer.weight_axis] != channels:
            raise OpfusionError(f"calibration: weight {layer.weight!r} {weight.shape} has no "
                                f"axis {layer.weight_axis} of {channels} output channels")
        along = [1] * weight.ndim
        along[layer.weight_axis] = channels
        scaled = weight / std.reshape(along)
    weights[layer.weight] = scaled.astype(weight.dtype)
    if layer.bias is not None:
        bias = weights[layer.bias]
        shift = mean / layer.bias_scale
        if bias.size != channels:
            raise OpfusionError(f"calibration: bias {layer.bias!r} {bias.shape} does not hold "
                                f"one value per output channel ({channels})")
        new = (bias.reshape(-1) - shift) / std
        weights[layer.bias] = new.reshape(bias.shape).astype(bias.dtype)
    elif layer.bn_mean is not None:
        moving_mean = weights[layer.bn_mean]
        new = moving_mean.reshape(-1) + mean / std
        weights[layer.bn_mean] = new.reshape(moving_mean.shape).astype(moving_mean.dtype)
    else:
        raise OpfusionError(f"calibration: layer of weight {layer.weight!r} has neither a bias "
                            "nor a batch norm to absorb its mean")
    return list((centred / std.reshape(shape)).astype(dtype))
