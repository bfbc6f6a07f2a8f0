"""ONNX operator converters, one file per family. Importing this package registers them."""

from . import activation, control, elementwise, nn, normalization, reduce, resize, tensor  # noqa: F401
