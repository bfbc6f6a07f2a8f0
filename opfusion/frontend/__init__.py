"""Frontends: import models from other frameworks into the graph IR."""

from .onnx import UnsupportedOnnxError, from_onnx

__all__ = ["UnsupportedOnnxError", "from_onnx"]
