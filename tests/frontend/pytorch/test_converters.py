"""Each ATen converter against eager PyTorch: small modules that exercise one operator (and
its argument forms) each, imported with from_torch and compiled with opf.compile."""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs torch: pip install "
                                    "'opfusion[torch]'")

import torch.nn.functional as F  # noqa: E402, N812 - torch's own convention
from torch import nn  # noqa: E402
from torch_checks import check_from_torch  # noqa: E402


class Lambda(nn.Module):
    def __init__(self, fn: Callable, *modules: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.parts = nn.ModuleList(modules)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.fn(*inputs, *self.parts) if self.parts else self.fn(*inputs)


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) + len(shape)))


X = (2, 3, 8, 8)
V = (2, 5, 6)

ELEMENTWISE = {
    "add_alpha": (lambda x, y: torch.add(x, y, alpha=2.5), [V, V]),
    "sub_scalar": (lambda x: x - 1.5, [V]),
    "rsub": (lambda x: 2 - x, [V]),
    "mul_broadcast": (lambda x, y: x * y, [V, (6,)]),
    "div": (lambda x, y: x / (y.abs() + 1), [V, V]),
    "div_floor": (lambda x: torch.div(x * 4, 1.5, rounding_mode="floor"), [V]),
    "div_trunc_int": (lambda x: torch.div((x * 9).long(), 4, rounding_mode="trunc"), [V]),
    "floor_divide_int": (lambda x: (x * 9).long() // 4, [V]),
    "remainder": (lambda x: torch.remainder(x * 5, 1.5), [V]),
    "fmod_int": (lambda x: torch.fmod((x * 9).long(), 4), [V]),
    "pow": (lambda x: x.abs() ** 1.5 + x ** 2, [V]),
    "clamp": (lambda x: x.clamp(-0.5, 0.7) + x.clamp(min=0.1) + x.clamp(max=-0.2), [V]),
    "clamp_int": (lambda x: (x * 5).long().clamp(min=-2), [V]),
    "clamp_tensor": (lambda x, y: torch.clamp(x, min=y), [V, V]),
    "compare_where": (lambda x, y: torch.where(x > y, x, y * 2) + (x <= 0.3).float(), [V, V]),
    "compare_int_float": (lambda x: ((x * 3).long() >= 0.5).float(), [V]),
    "logical": (lambda x, y: ((x > 0) & ~(y > 0) | (x < -1)).float(), [V, V]),
    "masked_fill": (lambda x: x.masked_fill(x < 0, -7.0), [V]),
    "unary": (lambda x: torch.exp(x.tanh()) + torch.sqrt(x.abs()) - torch.rsqrt(x.abs() + 1)
              + torch.erf(x) + x.floor() + x.ceil() + x.sign() + torch.log1p(x.abs()), [V]),
    "reciprocal": (lambda x: torch.reciprocal(x.abs() + 0.5), [V]),
    "activations": (lambda x: F.silu(x) + F.hardswish(x) + F.hardsigmoid(x) + F.mish(x)
                    + F.leaky_relu(x, 0.2) + F.elu(x) + F.relu6(x) + F.hardtanh(x), [V]),
    "gelu": (lambda x: F.gelu(x) + F.gelu(x, approximate="tanh"), [V]),
    "prelu": (lambda x, m: m(x), [X], nn.PReLU(3)),
    "atan2": (lambda x, y: torch.atan2(x, y), [V, V]),
    "int_to_float": (lambda x: (x * 4).int().float() / 3, [V]),
}

TENSOR = {
    "view_permute": (lambda x: x.view(2, -1, 4).permute(2, 0, 1).reshape(4, -1), [X]),
    "transpose_t": (lambda x: x.transpose(1, 3) + 1, [X]),
    "matrix_t": (lambda x: x[0].t() * 2, [V]),
    "expand": (lambda x: x[:, :1].expand(-1, 5, -1) + x, [V]),
    "unsqueeze_squeeze": (lambda x: x.unsqueeze(1).squeeze(1).unsqueeze(-1).squeeze(), [V]),
    "slices": (lambda x: x[:, 1:-1, ::2] + x[:, -3:, 1::2], [V]),
    "slice_clamped": (lambda x: x[:, 2:100] * 2, [V]),
    "select": (lambda x: x[:, -1] + x[1, 2], [V]),
    "cat": (lambda x, y: torch.cat([x, y, x], dim=-1), [V, V]),
    "split_chunk": (lambda x: sum(p.sum() for p in x.split([2, 3], dim=1))
                    + sum(c.mean(dim=2) for c in x.chunk(3, dim=2)), [V]),
    "unbind_stack": (lambda x: torch.stack(x.unbind(1)[::-1], dim=0), [V]),
    "index_select": (lambda x: x.index_select(1, torch.tensor([4, 0, 2])), [V]),
    "index_tensor": (lambda x: x[:, torch.tensor([[1, -1], [0, 2]])], [V]),
    "embedding": (lambda ids, m: m((ids.abs() * 3).long()), [(2, 7)], nn.Embedding(10, 4)),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 3), value=0.5) + 1, [X]),
    "pad_negative": (lambda x: F.pad(x, (-1, 2, 1, -2)), [X]),
    "flip_roll": (lambda x: x.flip(1, 2) + torch.roll(x, shifts=2, dims=2), [V]),
    "repeat": (lambda x: x.repeat(2, 1, 1, 2), [V]),
    "masks": (lambda x: x + torch.triu(torch.ones(5, 6), diagonal=1) * -3
              + torch.arange(6, dtype=torch.float32) * 0.1 + torch.full((6,), 0.5), [V]),
    "like": (lambda x: torch.zeros_like(x) + torch.ones_like(x) * x + torch.full_like(x, 2),
             [V]),
    "slice_scatter": (lambda x: torch.cat([x[:, :2] * 0, x[:, 2:]], 1).clone()
                      .index_fill(1, torch.tensor([0]), 1.0), [V]),
    "setitem": (lambda x: _setitem(x), [V]),
    "mask_setitem": (lambda x: _mask_setitem(x), [V]),
    "as_strided": (lambda x: x.contiguous().as_strided((3, 4), (2, 1), 1) * 2, [V]),
}


def _setitem(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[:, 1:3] = 0.5
    y[:, :, ::2] = y[:, :, ::2] * 3
    return y


def _mask_setitem(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[y > 0.5] = 0.25
    return y


NN = {
    "conv2d": (lambda x, m: m(x), [X], nn.Conv2d(3, 6, 3, stride=2, padding=1, dilation=1)),
    "conv2d_groups": (lambda x, m: m(x), [(1, 4, 9, 9)],
                      nn.Conv2d(4, 8, 3, padding=2, dilation=2, groups=2, bias=False)),
    "depthwise": (lambda x, m: m(x), [X], nn.Conv2d(3, 3, 5, padding=2, groups=3)),
    "conv1d": (lambda x, m: m(x), [(2, 3, 12)], nn.Conv1d(3, 4, 3, stride=2, padding=1)),
    "conv_transpose": (lambda x, m: m(x), [X],
                       nn.ConvTranspose2d(3, 4, 3, stride=2, padding=1, output_padding=1)),
    "max_pool": (lambda x: F.max_pool2d(x, 3, 2, 1) + F.max_pool2d(x, 2, ceil_mode=True)[
        ..., :4, :4], [X]),
    "avg_pool": (lambda x: F.avg_pool2d(x, 3, 2, 1) + F.avg_pool2d(x, 3, 2, 1,
                                                                   count_include_pad=False), [X]),
    "adaptive_avg": (lambda x: F.adaptive_avg_pool2d(x, 3).sum() + F.adaptive_avg_pool2d(x, 4),
                     [X]),
    "adaptive_max": (lambda x: F.adaptive_max_pool2d(x, 3), [X]),
    "batch_norm": (lambda x, m: m(x), [X], nn.BatchNorm2d(3)),
    "batch_norm_plain": (lambda x, m: m(x), [X], nn.BatchNorm2d(3, affine=False)),
    "layer_norm_2d": (lambda x, m: m(x), [V], nn.LayerNorm([5, 6])),
    "group_norm": (lambda x, m: m(x), [(2, 4, 5, 5)], nn.GroupNorm(2, 4)),
    "linear": (lambda x, m: m(x), [V], nn.Linear(6, 7)),
    "linear_no_bias_2d": (lambda x, m: m(x[0]), [V], nn.Linear(6, 3, bias=False)),
    "bmm_matmul": (lambda x, y: torch.bmm(x, y.transpose(1, 2)) + (x @ y.transpose(1, 2)),
                   [V, V]),
    "softmax": (lambda x: x.softmax(-1) + x.log_softmax(1), [V]),
    "sdpa_masks": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=(
        (torch.arange(5)[:, None] + torch.arange(7)) % 3 != 1)) + F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.ones(5, 7) * 0.5, scale=0.3), [(2, 3, 5, 4), (2, 3, 7, 4),
                                                                 (2, 3, 7, 4)]),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    [(1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 6, 8)]),
    "multihead": (lambda x, m: m(x, x, x, need_weights=False)[0], [V],
                  nn.MultiheadAttention(6, 2, batch_first=True)),
    "upsample": (lambda x: F.interpolate(x, scale_factor=2) + F.interpolate(
        x, size=(16, 16), mode="bilinear") + F.interpolate(x, scale_factor=2, mode="bilinear",
                                                          align_corners=True), [X]),
    "pixel_shuffle": (lambda x: F.pixel_shuffle(x.repeat(1, 4, 1, 1), 2), [X]),
    "dropout_eval": (lambda x, m: m(x) * 2, [V], nn.Dropout(0.5)),
}

REDUCE = {
    "mean_sum": (lambda x: x.mean(dim=(1, 2), keepdim=True) + x.sum(-1, keepdim=True), [X]),
    "sum_all": (lambda x: x.sum() + x.mean(), [V]),
    "count": (lambda x: (x > 0).sum(dim=1), [V]),
    "amax_amin": (lambda x: x.amax(dim=1) - x.amin(dim=(0, 2)).sum(), [V]),
    "max_dim": (lambda x: x.max(dim=1)[0] + x.min(dim=2, keepdim=True).values.sum(), [V]),
    "argmax": (lambda x: x.argmax(dim=1) + x.argmin(), [V]),
    "var_std": (lambda x: x.var(dim=1) + x.std(dim=2, unbiased=False).sum() + x.var(), [V]),
    "any_all": (lambda x: (x > 1).any(dim=1).float() + (x > -3).all().float(), [V]),
    "prod": (lambda x: (x * 0.5 + 1).prod(dim=1), [V]),
    "cumsum": (lambda x: x.cumsum(dim=2), [V]),
    "topk_sort": (lambda x: x.topk(3, dim=2)[0] + x.sort(dim=2, descending=True)[0][..., :3],
                  [V]),
    "norm": (lambda x: torch.linalg.vector_norm(x, dim=-1) + F.normalize(x, dim=-1).sum(-1),
             [V]),
    "logsumexp": (lambda x: torch.logsumexp(x, dim=1), [V]),
}

CASES = {**ELEMENTWISE, **TENSOR, **NN, **REDUCE}


@pytest.mark.parametrize("name", list(CASES))
def test_converter_matches_eager(name: str) -> None:
    fn, shapes, *modules = CASES[name]
    torch.manual_seed(0)
    model = Lambda(fn, *modules).eval()
    for module in modules:  # running statistics that are not the identity
        for buffer_name, buffer in module.named_buffers():
            if buffer.dtype.is_floating_point:
                buffer.copy_(torch.rand(buffer.shape) + (0.5 if "var" in buffer_name else 0))
    check_from_torch(model, tuple(randn(*shape) for shape in shapes))
