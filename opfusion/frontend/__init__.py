"""Frontends: import models from other frameworks into the graph IR."""

from ..errors import OnnxImportError
from .onnx import UnsupportedOnnxError, from_onnx

__all__ = ["OnnxImportError", "UnsupportedOnnxError", "from_onnx"]
