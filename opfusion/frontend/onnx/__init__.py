"""The ONNX frontend: ``from_onnx`` (the importer), one converter per ONNX op family
(``converters/``), the converter registry, the checked tensor reader, ONNX functions expanded
into their bodies, and an ONNX backend (``backend``) for the ONNX backend test suite."""

from .importer import OnnxSymbolicModule, UnsupportedOnnxError, from_onnx

__all__ = ["OnnxSymbolicModule", "UnsupportedOnnxError", "from_onnx"]
