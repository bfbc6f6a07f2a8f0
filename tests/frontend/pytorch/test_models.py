"""Whole models through from_torch + opf.compile and through torch.compile(backend=
"opfusion"): a 2-layer TransformerEncoder, a GPT-style block and torchvision's classifiers,
random calibrated weights (opfusion.testing.torch_models), against eager PyTorch; dynamic
shapes; and the errors a user meets."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs torch: pip install "
                                    "'opfusion[torch]'")

from torch import nn  # noqa: E402
from torch_checks import assert_matches, check_from_torch, check_torch_compile  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.testing import torch_models  # noqa: E402

TOKENS = (1, 16, 64)
TORCHVISION = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "vit_b_16", "mobilenet_v2",
               "regnet_y_400mf", "convnext_tiny", "shufflenet_v2_x0_5", "swin_t"]


def _transformers() -> dict[str, nn.Module]:
    return {"encoder": torch_models.transformer_encoder(),
            "gpt_sdpa": torch_models.gpt_block(),
            "gpt_mask": torch_models.gpt_block(sdpa=False)}


@pytest.mark.parametrize("name", ["encoder", "gpt_sdpa", "gpt_mask"])
def test_transformer_blocks_match_eager(name: str) -> None:
    model = _transformers()[name]
    x = torch.randn(TOKENS)
    check_from_torch(model, (x,))
    check_torch_compile(model, (x,))


class _MultiheadSelfAttention(nn.Module):
    def __init__(self, padding: bool) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(64, 4, batch_first=True)
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.arange(x.shape[1]) >= x.shape[1] - 3 if self.padding else None
        mask = mask.expand(x.shape[0], -1) if mask is not None else None
        return self.attention(x, x, x, need_weights=False, key_padding_mask=mask)[0]


@pytest.mark.parametrize("padding", [False, True])
def test_multihead_attention_matches_eager(padding: bool) -> None:
    model = torch_models.randomize(_MultiheadSelfAttention(padding), torch.zeros(TOKENS))
    x = torch.randn(2, *TOKENS[1:])
    check_from_torch(model, (x,))
    check_torch_compile(model, (x,))


def test_norm_first_encoder_matches_eager() -> None:
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True,
                                       norm_first=True)
    model = torch_models.randomize(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                                   torch.zeros(TOKENS))
    check_torch_compile(model, (torch.randn(TOKENS),))


def test_attention_becomes_one_kernel_op() -> None:
    mod, _ = opf.frontend.from_torch(torch_models.gpt_block(), (torch.randn(TOKENS),))
    assert "nn.attention" in mod.astext()


def test_calibrated_outputs_depend_on_the_input() -> None:
    model = torch_models.gpt_block()
    with torch.no_grad():
        a, b = model(torch.randn(TOKENS)), model(torch.randn(TOKENS))
    assert float((a - b).abs().max() / a.abs().max()) > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("name", TORCHVISION)
def test_torchvision_classifiers_match_eager(name: str) -> None:
    pytest.importorskip("torchvision", reason="torchvision's models need torchvision")
    model = torch_models.torchvision_model(name)
    x = torch.randn(torch_models.TORCHVISION_INPUT)
    check_from_torch(model, (x,))
    check_torch_compile(model, (x,))


class _ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean(dim=(2, 3))).view(x.shape[0], -1)


def _convnet() -> nn.Module:
    return torch_models.randomize(_ConvNet(), torch.zeros(1, 3, 8, 8))


def test_dynamic_batch_specialises_per_shape() -> None:
    model = _convnet()
    batch = torch.export.Dim("batch", min=1, max=64)
    mod, _ = opf.frontend.from_torch(model, (torch.randn(2, 3, 8, 8),),
                                     dynamic_shapes={"x": {0: batch}})
    assert isinstance(mod, opf.frontend.TorchSymbolicModule)
    executor = opf.compile(mod)
    for size in (1, 5, 5):
        x = torch.randn(size, 3, 8, 8)
        with torch.no_grad():
            assert_matches(model(x), executor(x.numpy()))
    assert executor.compiled == 2
    with pytest.raises(opf.OpfusionError, match="must be 1..64"):
        executor(np.zeros((65, 3, 8, 8), np.float32))
    with pytest.raises(opf.OpfusionError, match="axis 2 is 8"):
        executor(np.zeros((2, 3, 9, 8), np.float32))


def test_weights_are_copied_at_import() -> None:
    model = _convnet()
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
    mod, _ = opf.frontend.from_torch(model, (x,))
    with torch.no_grad():
        model.fc.weight.mul_(3)
    assert_matches(expected, opf.compile(mod)(x.numpy()))


class _Unsupported(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.i0(torch.erfinv(torch.tanh(x) * 0.5)) + 1


def test_unsupported_ops_listed_in_one_error_with_their_lines() -> None:
    with pytest.raises(opf.frontend.UnsupportedTorchError) as info:
        opf.frontend.from_torch(_Unsupported(), (torch.randn(2, 3),))
    message = str(info.value)
    assert "2 ATen node(s)" in message
    assert "aten.erfinv.default (node 'erfinv'" in message and "aten.i0.default" in message
    assert "test_models.py:" in message


def test_training_mode_batch_norm_says_eval() -> None:
    model = _convnet().train()
    with pytest.raises(opf.frontend.TorchImportError, match=r"model\.eval\(\)"):
        opf.frontend.from_torch(model, (torch.randn(2, 3, 8, 8),))


def test_bfloat16_model_is_refused_by_name() -> None:
    model = nn.Linear(4, 3).to(torch.bfloat16)
    with pytest.raises(opf.frontend.TorchImportError, match=r"bfloat16.*model\.float\(\)"):
        opf.frontend.from_torch(model, (torch.randn(2, 4, dtype=torch.bfloat16),))


def test_not_a_module_is_refused() -> None:
    with pytest.raises(opf.OpfusionError, match="takes a torch.nn.Module"):
        opf.frontend.from_torch(lambda x: x, (torch.randn(2),))
