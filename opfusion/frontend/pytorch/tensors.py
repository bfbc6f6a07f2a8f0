"""torch tensors in and out of opfusion: weights copied into constants at import, and the
arrays a compiled model runs on shared with torch without a copy where torch allows it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import TorchImportError
from ...ir.expr import Constant
from .registry import ir_dtype


def array_of(tensor: Any, what: str) -> np.ndarray:
    """A NumPy copy of ``tensor`` (a parameter, buffer or constant of the model): the
    compiled model keeps the weights it was imported with, whatever happens to the module."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TorchImportError(f"{what} is a {type(tensor).__name__}, not a tensor")
    ir_dtype(tensor.dtype, what)
    if tensor.is_meta:
        raise TorchImportError(f"{what} is on the meta device (it holds no values); load the "
                               "model's weights before importing it")
    return tensor.detach().cpu().contiguous().numpy().copy()


def constant_of(tensor: Any, what: str) -> Constant:
    """``tensor`` as an IR constant (see :func:`array_of`)."""
    return Constant(array_of(tensor, what))


def numpy_view(tensor: Any) -> np.ndarray:
    """The values of a CPU tensor as a NumPy array sharing its memory (a contiguous copy
    first when it is strided or lives on another device)."""
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.numpy()


def torch_tensor(array: np.ndarray) -> Any:
    """A NumPy result as a torch tensor sharing its memory."""
    import torch

    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(np.ascontiguousarray(array))
