"""torch tensors in and out of opfusion: weights copied into constants at import, and the
arrays a compiled model runs on shared with torch without a copy where torch allows it."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import TorchImportError
from ...ir.expr import Constant, Var
from ...ir.types import TensorType
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


def lifted_tensor(program: Any, spec: Any) -> Any:
    """The tensor an ExportedProgram lifted as input ``spec`` (a parameter, buffer or
    constant): in its state dict, or among its constants (non-persistent buffers too)."""
    source = program.state_dict if spec.target in program.state_dict else program.constants
    return source[spec.target]


def tensor_var(name: str, value: Any) -> Var:
    """An IR variable with the shape and dtype of ``value`` (a tensor or a traced one)."""
    return Var(name, TensorType(tuple(value.shape), ir_dtype(value.dtype, f"input {name!r}")))


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
