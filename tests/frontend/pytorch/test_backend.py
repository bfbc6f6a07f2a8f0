"""torch.compile(model, backend="opfusion"): registered by entry point, compiled once per
shape, partitioned around what opfusion cannot convert, eager (with a warning) for graphs
that need gradients, and never stale after a weight changes in place."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch frontend needs torch: pip install "
                                    "'opfusion[torch]'")

from torch import nn  # noqa: E402
from torch_checks import assert_matches  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.frontend.pytorch import backend as torch_backend  # noqa: E402
from opfusion.testing import torch_models  # noqa: E402


def _model() -> nn.Module:
    return torch_models.gpt_block(d_model=32, heads=2)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The input shapes of every compilation the backend does."""
    seen: list[tuple] = []
    original = torch_backend.CompiledGraph.build

    def counting(self: torch_backend.CompiledGraph, args: tuple) -> object:
        seen.append(tuple(tuple(a.shape) for a in args if hasattr(a, "shape")
                          and not isinstance(a, nn.Parameter)))
        return original(self, args)

    monkeypatch.setattr(torch_backend.CompiledGraph, "build", counting)
    return seen


def test_backend_is_registered_by_entry_point() -> None:
    assert "opfusion" in torch._dynamo.list_backends()


def test_batch_size_change_compiles_once_then_is_cached(builds: list[tuple]) -> None:
    model = _model()
    compiled = torch.compile(model, backend="opfusion")
    with torch.no_grad():
        for batch in (1, 3, 3, 1, 3):
            x = torch.randn(batch, 16, 32)
            assert_matches(model(x), compiled(x))
    assert len(builds) == 2


def test_dynamic_true_specialises_per_shape(builds: list[tuple]) -> None:
    model = _model()
    compiled = torch.compile(model, backend="opfusion", dynamic=True)
    with torch.no_grad():
        for tokens in (8, 12, 8):
            x = torch.randn(2, tokens, 32)
            assert_matches(model(x), compiled(x))
    assert len(builds) == 2


class _PartlyUnsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.erfinv(torch.tanh(torch.relu(self.conv(x))) * 0.9)
        return self.fc(y.mean(dim=(2, 3)))


def test_unsupported_nodes_run_in_torch_and_are_named() -> None:
    model = torch_models.randomize(_PartlyUnsupported(), torch.zeros(1, 3, 8, 8))
    compiled = torch.compile(model, backend="opfusion")
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), pytest.warns(torch_backend.TorchFallbackWarning,
                                       match=r"(?s)1 node\(s\).*aten\.erfinv\.default"):
        actual = compiled(x)
    with torch.no_grad():
        assert_matches(model(x), actual)


class _WithConv3d(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv3d, self.conv = nn.Conv3d(2, 2, 3, padding=1), nn.Conv2d(4, 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv3d(torch.relu(x) * 2)
        return torch.relu(self.conv(y.flatten(1, 2))).mean(dim=(2, 3))


def test_node_refused_by_its_converter_falls_back_alone() -> None:
    model = _WithConv3d().eval()
    compiled = torch.compile(model, backend="opfusion")
    x = torch.randn(1, 2, 2, 8, 8)
    with torch.no_grad(), pytest.warns(torch_backend.TorchFallbackWarning,
                                       match=r"(?s)1 node\(s\).*aten\.convolution.*3-D") as caught:
        actual = compiled(x)
        expected = model(x)
    assert "a piece of" not in str(caught[0].message)
    assert_matches(expected, actual)


def test_graph_needing_gradients_runs_eager_with_a_warning() -> None:
    model = _model().train()
    compiled = torch.compile(model, backend="opfusion")
    x = torch.randn(1, 16, 32)
    with pytest.warns(torch_backend.TorchFallbackWarning, match="needs gradients"):
        actual = compiled(x)
    assert actual.requires_grad
    assert_matches(model(x), actual)


def test_weight_changed_in_place_is_seen(builds: list[tuple]) -> None:
    model = _model()
    compiled = torch.compile(model, backend="opfusion")
    x = torch.randn(1, 16, 32)
    with torch.no_grad():
        compiled(x)
        model.proj.weight.mul_(2)
        assert_matches(model(x), compiled(x))
    assert len(builds) == 2


def test_options_reach_opf_compile() -> None:
    model = _model()
    compiled = torch.compile(model, backend=opf.frontend.pytorch.backend.backend(opt_level=0))
    x = torch.randn(1, 16, 32)
    with torch.no_grad():
        assert_matches(model(x), compiled(x))


def test_torch_compile_options_reach_opf_compile() -> None:
    model = _model()
    compiled = torch.compile(model, backend="opfusion", options={"fusion": "none"})
    x = torch.randn(1, 16, 32)
    with torch.no_grad():
        assert_matches(model(x), compiled(x))


def test_bfloat16_graph_runs_eager_with_a_warning() -> None:
    model = nn.Linear(8, 4).to(torch.bfloat16)
    compiled = torch.compile(model, backend="opfusion")
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    with torch.no_grad(), pytest.warns(torch_backend.TorchFallbackWarning, match="bfloat16"):
        actual = compiled(x)
    with torch.no_grad():
        assert torch.equal(model(x), actual)


def test_unknown_option_is_refused() -> None:
    with pytest.raises(opf.OpfusionError, match="unknown opfusion backend option"):
        torch_backend.opfusion_backend(None, [], bogus=1)


def test_inference_mode_tensors_work() -> None:
    model = _model()
    compiled = torch.compile(model, backend="opfusion")
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error", torch_backend.TorchFallbackWarning)
        x = torch.randn(1, 16, 32)
        assert_matches(model(x), compiled(x))
