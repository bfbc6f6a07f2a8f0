"""Frontends: import models from other frameworks into the graph IR."""

from ..errors import OnnxImportError
from .onnx import OnnxSymbolicModule, UnsupportedOnnxError, from_onnx

__all__ = ["OnnxImportError", "OnnxSymbolicModule", "UnsupportedOnnxError", "from_onnx"]
