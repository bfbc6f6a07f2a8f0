"""Comparing opfusion with eager PyTorch: the tolerance is relative to the output's largest
value, as everywhere in opfusion's tests."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

import opfusion as opf
from opfusion.frontend.pytorch.backend import TorchFallbackWarning

TOLERANCE = 2e-3


def relative_error(expected: Any, actual: Any) -> float:
    expected = np.asarray(expected.detach() if hasattr(expected, "detach") else expected,
                          dtype=np.float64)
    actual = np.asarray(actual.detach() if hasattr(actual, "detach") else actual,
                        dtype=np.float64)
    assert expected.shape == actual.shape, (expected.shape, actual.shape)
    if expected.size == 0:
        return 0.0
    scale = max(float(np.abs(expected).max()), 1e-6)
    both_nan = np.isnan(expected) & np.isnan(actual)
    diff = np.where(both_nan, 0.0, np.abs(expected - actual))
    return float(np.nan_to_num(diff, nan=np.inf).max() / scale)


def flat(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def assert_matches(expected: Any, actual: Any, tolerance: float = TOLERANCE) -> None:
    expected, actual = flat(expected), flat(actual)
    assert len(expected) == len(actual)
    for want, got in zip(expected, actual):
        got_dtype = str(got.dtype).replace("torch.", "")
        assert str(want.dtype).replace("torch.", "") == got_dtype
        assert relative_error(want, got) <= tolerance


def compiled_from_torch(model: torch.nn.Module, inputs: tuple, **kwargs: Any) -> Any:
    mod, params = opf.frontend.from_torch(model, inputs, **kwargs)
    assert params == {}
    return opf.compile(mod)


def check_from_torch(model: torch.nn.Module, inputs: tuple) -> None:
    """from_torch + opf.compile agree with eager on ``inputs``."""
    model.eval()
    with torch.no_grad():
        expected = model(*inputs)
    executor = compiled_from_torch(model, inputs)
    assert_matches(expected, executor(*[x.numpy() for x in inputs]))


def check_torch_compile(model: torch.nn.Module, inputs: tuple) -> None:
    """torch.compile(backend="opfusion") agrees with eager on ``inputs``, under no_grad and
    inference_mode (where nn.TransformerEncoderLayer and nn.MultiheadAttention take their
    fused fast paths), with nothing left to PyTorch."""
    model.eval()
    for mode in (torch.no_grad, torch.inference_mode):
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="opfusion")
        with mode(), warnings.catch_warnings():
            warnings.simplefilter("error", TorchFallbackWarning)
            expected = model(*inputs)
            assert_matches(expected, compiled(*inputs))
