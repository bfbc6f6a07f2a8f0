"""ONNX operator converters, one file per family. Importing this package registers them."""

from . import (  # noqa: F401
    activation,
    attention,
    control,
    detection,
    elementwise,
    microsoft,
    nn,
    normalization,
    quantize,
    recurrent,
    reduce,
    resize,
    sampling,
    scatter,
    signal,
    tensor,
)
