"""Random-weight PyTorch models whose outputs depend on their inputs, for comparing opfusion
with eager PyTorch (the PyTorch frontend's tests and ``benchmarks/torch_models.py``). Needs
torch (and torchvision for :func:`torchvision_model`).

A freshly initialised torchvision model is a poor oracle: ViT's head starts at zero (every
output 0 whatever the input), and through a deep random network the logits barely move with
the input. :func:`randomize` therefore draws every weight and normalization statistic and
then calibrates the network layer by layer, as LSUV initialisation does (Mishkin & Matas,
"All you need is a good init", 2016): each convolution and linear layer, in the order the
forward pass reaches it, is rescaled so that its output on standard-normal inputs has zero
mean and unit variance. Layers whose outputs are 1x1 maps or single vectors per sample
(squeeze-excitation gates) keep their drawn weights: standardising their few values over a
handful of samples would turn tiny differences between inputs into huge ones.

Beside torchvision's classifiers: :class:`GPTBlock`, a GPT-style decoder block with a causal
mask, and :func:`transformer_encoder`, a 2-layer ``nn.TransformerEncoder``."""

from __future__ import annotations

import functools
import math
from typing import Any

TORCHVISION_INPUT = (1, 3, 224, 224)


def randomize(model: Any, example: Any, seed: int = 0, samples: int = 4) -> Any:
    """Draw ``model``'s weights and statistics from ``seed`` and calibrate its layers on
    ``samples`` standard-normal inputs shaped like ``example`` (LSUV, see the module's
    docstring); the model in eval mode, returned."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    model.eval()
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if tensor.dtype.is_floating_point:
                tensor.copy_(_draw(name, tensor, generator))
        batch = torch.randn((samples, *example.shape[1:]), generator=generator)
        for layer in _layers_in_call_order(model, batch):
            _standardize(model, layer, batch)
    return model


def _draw(name: str, tensor: Any, generator: Any) -> Any:
    """A random value for one parameter or buffer, by what its name says it is."""
    import torch

    leaf = name.rsplit(".", 1)[-1]
    if leaf == "running_var":
        return torch.rand(tensor.shape, generator=generator) + 0.5
    if leaf == "running_mean":
        return torch.randn(tensor.shape, generator=generator) * 0.1
    if tensor.ndim == 1:  # norm scales near 1, biases near 0
        base = 1.0 if leaf == "weight" else 0.0
        return base + torch.randn(tensor.shape, generator=generator) * 0.1
    fan_in = math.prod(tensor.shape[1:]) if tensor.ndim > 1 else tensor.numel()
    return torch.randn(tensor.shape, generator=generator) / math.sqrt(max(fan_in, 1))


def _layers_in_call_order(model: Any, batch: Any) -> list[Any]:
    import torch

    order: list[Any] = []
    hooks = [module.register_forward_hook(lambda mod, _i, _o: order.append(mod))
             for module in model.modules()
             if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear))]
    try:
        model(batch)
    finally:
        for hook in hooks:
            hook.remove()
    return list(dict.fromkeys(order))


def _standardize(model: Any, layer: Any, batch: Any) -> None:
    captured: list[Any] = []
    hook = layer.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        model(batch)
    finally:
        hook.remove()
    out = captured[0]
    per_sample = out[0].numel() if out.ndim else 1
    if out.ndim == 2 and out.shape[0] == batch.shape[0] or out.ndim == 4 and \
            out.shape[-2:] == (1, 1):
        if per_sample < 2000 and layer is not _last_linear(model):
            return  # a gate or a head over pooled features: keep the drawn weights
    mean, std = out.mean().item(), out.std().item()
    if not math.isfinite(std) or std < 1e-12:
        return
    layer.weight.div_(std)
    if layer.bias is not None:
        layer.bias.sub_(mean).div_(std)


def _last_linear(model: Any) -> Any:
    import torch

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return linears[-1] if linears else None


def torchvision_model(name: str, seed: int = 0) -> Any:
    """torchvision's classifier ``name`` (``resnet18``, ``mobilenet_v3_small``, ...) with
    random, calibrated weights, in eval mode."""
    import torch
    import torchvision

    model = getattr(torchvision.models, name)(weights=None)
    return randomize(model, torch.zeros(TORCHVISION_INPUT), seed)


def transformer_encoder(d_model: int = 64, heads: int = 4, layers: int = 2,
                        seed: int = 0) -> Any:
    """A ``layers``-layer ``nn.TransformerEncoder`` (batch first, GELU), random weights."""
    import torch

    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(d_model, heads, 2 * d_model, dropout=0.0,
                                             activation="gelu", batch_first=True)
    model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    return randomize(model, torch.zeros(1, 16, d_model), seed)


def gpt_block(d_model: int = 64, heads: int = 4, seed: int = 0, sdpa: bool = True) -> Any:
    """A GPT-style decoder block (pre-norm, causal self-attention, tanh-GELU MLP), random
    weights; attention through ``scaled_dot_product_attention(is_causal=True)``, or with
    ``sdpa=False`` written out with an explicit triangular mask."""
    import torch

    torch.manual_seed(seed)
    model = _gpt_block_class()(d_model, heads, sdpa)
    return randomize(model, torch.zeros(1, 16, d_model), seed)


@functools.cache
def _gpt_block_class() -> Any:
    import torch
    from torch import nn
    from torch.nn import functional

    class _GPTBlock(nn.Module):
        """x + attn(ln1(x)), then + mlp(ln2(x)); attention causal through an explicit
        lower-triangular mask (as GPT-2 code writes it) or SDPA's ``is_causal``."""

        def __init__(self, d_model: int, heads: int, sdpa: bool = True) -> None:
            super().__init__()
            self.heads, self.sdpa = heads, sdpa
            self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.fc, self.out = nn.Linear(d_model, 4 * d_model), nn.Linear(4 * d_model, d_model)

        def attention(self, x: Any) -> Any:
            batch, tokens, width = x.shape
            q, k, v = self.qkv(x).split(width, dim=2)
            q, k, v = (t.view(batch, tokens, self.heads, -1).transpose(1, 2) for t in (q, k, v))
            if self.sdpa:
                y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
                mask = torch.tril(torch.ones(tokens, tokens, dtype=torch.bool))
                y = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
            return self.proj(y.transpose(1, 2).reshape(batch, tokens, width))

        def forward(self, x: Any) -> Any:
            x = x + self.attention(self.ln1(x))
            return x + self.out(functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    return _GPTBlock


def __getattr__(name: str) -> Any:
    if name == "GPTBlock":  # built on first use: torch is imported only then
        return _gpt_block_class()
    raise AttributeError(name)
