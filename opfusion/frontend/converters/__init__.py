"""ONNX operator converters, one file per family. Importing this package registers them."""

from . import elementwise, nn, tensor  # noqa: F401
