"""Frontends: import models from other frameworks into the graph IR."""

from ..errors import OnnxImportError, TorchImportError
from .onnx import OnnxSymbolicModule, UnsupportedOnnxError, from_onnx
from .pytorch import TorchSymbolicModule, UnsupportedTorchError, from_exported_program, from_torch

__all__ = ["OnnxImportError", "OnnxSymbolicModule", "TorchImportError", "TorchSymbolicModule",
           "UnsupportedOnnxError", "UnsupportedTorchError", "from_exported_program", "from_onnx",
           "from_torch"]
