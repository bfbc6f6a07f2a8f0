"""One validated reader of ONNX ``TensorProto``s: initializers, Constant values and every other
tensor attribute, stored in the model or in an external data file.

A model is untrusted input, so nothing here hands a tensor to NumPy before checking it:

* the element type is one the IR holds (:data:`ONNX_DTYPES`); anything else, including
  ``UNDEFINED`` and codes ONNX does not define, is an error naming the tensor;
* every dimension is a non-negative integer and the element count is at most
  :data:`MAX_TENSOR_ELEMENTS`;
* the data holds exactly that many elements (``raw_data`` bytes, or entries of the typed
  field), so a declared shape can never allocate more than the model actually stores;
* external data is read only from inside a trusted directory (the model file's, or the
  ``base_dir`` the caller names): the location must be relative, free of ``..`` and NUL, must
  not leave the directory through a symbolic link, and its ``offset``/``length`` must be
  non-negative integers inside the file that give exactly the tensor's byte count.

Every failure is an :class:`~opfusion.errors.OnnxImportError` whose message names the tensor."""

from __future__ import annotations

import math
import ntpath
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import OnnxImportError

#: The most elements one tensor of a model may declare (2**32): far above any real weight,
#: low enough that a crafted shape cannot ask NumPy for exabytes. A declared tensor must also
#: store all its data, so reading it never allocates more than a copy of what the model
#: holds. Constants the importer makes itself (ConstantOfShape, Range, ...) have no data to
#: bound them: they follow FoldConstant.max_elements and compile.max_allocation_bytes
#: instead (see ``converters._common.filled``), as graph inputs follow the latter.
MAX_TENSOR_ELEMENTS = 2**32

#: ONNX element type code -> the IR dtype it is read as (the IR's dtypes, no others).
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32",
               7: "int64", 9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}

# The typed field that holds each element type when raw_data is not used (ONNX's layout:
# the small integer types, bool and the bits of float16 go one per int32_data entry).
_TYPED_FIELD = {"float32": "float_data", "float64": "double_data", "int64": "int64_data",
                "uint32": "uint64_data", "uint64": "uint64_data"}

_EXTERNAL = 1  # TensorProto.EXTERNAL
_DIGITS = re.compile(r"[0-9]+")


def element_type_name(code: int) -> str:
    """ONNX's name of an element type code (``FLOAT``), or the number when ONNX has none."""
    from onnx import TensorProto

    try:
        return TensorProto.DataType.Name(code)
    except ValueError:
        return str(code)


def onnx_dtype(code: int, what: str) -> str:
    """The IR dtype of ONNX element type ``code``; an error naming ``what`` for codes that
    are undefined, unknown to ONNX, or not held by the IR (strings, bfloat16, 4-bit, ...)."""
    dtype = ONNX_DTYPES.get(code) if isinstance(code, int) else None
    if dtype is None:
        known = ", ".join(element_type_name(c) for c in ONNX_DTYPES)
        raise OnnxImportError(f"{what} has element type {element_type_name(code)}, which "
                              f"opfusion does not support (it supports {known})")
    return dtype


def tensor_shape(tensor: Any, what: str) -> tuple[int, ...]:
    """The dims of ``tensor``, checked non-negative and within :data:`MAX_TENSOR_ELEMENTS`
    (its non-zero dims too: an empty tensor of shape [0, 2^62] is no array NumPy makes)."""
    dims = tuple(int(d) for d in tensor.dims)
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"{what} has a negative dimension in its shape {list(dims)}; "
                              "the model is malformed")
    extent = math.prod(d for d in dims if d)  # (the elements, but for a zero dimension)
    if extent > MAX_TENSOR_ELEMENTS:
        raise OnnxImportError(f"{what} declares shape {list(dims)}, whose non-zero dimensions "
                              f"span {extent} elements; opfusion reads at most "
                              f"{MAX_TENSOR_ELEMENTS} per tensor")
    return dims


def read_tensor(tensor: Any, what: str) -> np.ndarray:
    """The value of an in-memory ``TensorProto`` as a NumPy array, every field checked (see
    the module's docstring). External data must have been inlined (:func:`inline_external_data`)
    first; a tensor still pointing to a file is an error here, never read from the current
    directory."""
    if tensor.data_location == _EXTERNAL:
        raise OnnxImportError(f"{what} keeps its data in an external file that was not read; "
                              "load the model from its path, or pass base_dir= (the directory "
                              "holding the data files) to from_onnx")
    if tensor.HasField("segment"):
        raise OnnxImportError(f"{what} is a segment of a larger tensor, which opfusion does not "
                              "read")
    dtype = np.dtype(onnx_dtype(tensor.data_type, what))
    shape = tensor_shape(tensor, what)
    count = math.prod(shape)
    if tensor.HasField("raw_data"):
        raw = tensor.raw_data
        if len(raw) != count * dtype.itemsize:
            raise OnnxImportError(f"{what} has {len(raw)} bytes of raw_data but its shape "
                                  f"{list(shape)} of {dtype} needs {count * dtype.itemsize}")
        return _from_bytes(raw, dtype, shape)
    field = _TYPED_FIELD.get(dtype.name, "int32_data")
    values = getattr(tensor, field)
    others = [name for name in ("float_data", "double_data", "int32_data", "int64_data",
                                "uint64_data", "string_data")
              if name != field and len(getattr(tensor, name))]
    if len(values) != count or others:
        stored = f"{len(values)} values in {field}" + (f" and data in {', '.join(others)}"
                                                       if others else "")
        raise OnnxImportError(f"{what} has shape {list(shape)} ({count} elements of {dtype}) "
                              f"but stores {stored}; the model is malformed")
    if dtype == np.float16:  # the bits of each half float, one per int32 entry
        return np.asarray(values, np.int64).astype(np.uint16).view(np.float16).reshape(shape)
    if dtype == np.bool_:
        return np.asarray(values, np.int64).astype(np.bool_).reshape(shape)
    return np.asarray(values).astype(dtype).reshape(shape)


def _from_bytes(raw: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    # ONNX stores raw_data little-endian; a copy, so the array owns writable memory.
    array = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype)
    return array.reshape(shape)


# ---------------------------------------------------------------------------------------------
# external data


def uses_external_data(tensor: Any) -> bool:
    return tensor.data_location == _EXTERNAL


def model_tensors(graph: Any) -> Iterator[tuple[Any, str]]:
    """Every ``TensorProto`` of ``graph`` and of its subgraphs with a description naming it:
    initializers and tensor attributes of nodes (a worklist, not recursion)."""
    pending = [graph]
    while pending:
        current = pending.pop()
        for tensor in current.initializer:
            yield tensor, f"initializer {tensor.name!r}"
        for node in current.node:
            for attr in node.attribute:
                where = f"attribute {attr.name!r} of {node.op_type} (node {node.name!r})"
                if attr.HasField("t"):
                    yield attr.t, where
                for index, tensor in enumerate(attr.tensors):
                    yield tensor, f"{where}, tensor {index}"
                if attr.HasField("g"):
                    pending.append(attr.g)
                pending.extend(attr.graphs)


def first_external_tensor(model: Any) -> str | None:
    """The description of the first tensor of ``model`` kept in an external file, or None."""
    return next((what for tensor, what in model_tensors(model.graph)
                 if uses_external_data(tensor)), None)


def inline_external_data(model: Any, base_dir: Path) -> None:
    """Read every external tensor of ``model`` from inside ``base_dir`` into its raw_data
    (checked as the module's docstring says), so the model holds all its data."""
    base = base_dir.resolve()
    if not base.is_dir():
        raise OnnxImportError(f"base_dir {str(base_dir)!r} is not a directory")
    for tensor, what in model_tensors(model.graph):
        if uses_external_data(tensor):
            tensor.raw_data = read_external(tensor, base, what)
            tensor.data_location = 0  # TensorProto.DEFAULT
            del tensor.external_data[:]


def read_external(tensor: Any, base: Path, what: str) -> bytes:
    """The bytes of external tensor ``tensor`` from inside the resolved directory ``base``."""
    info = {_entry_text(entry.key, what): _entry_text(entry.value, what)
            for entry in tensor.external_data}
    location = info.get("location", "")
    path = _contained_path(location, base, what)
    dtype = np.dtype(onnx_dtype(tensor.data_type, what))
    expected = math.prod(tensor_shape(tensor, what)) * dtype.itemsize
    offset = _byte_count(info, "offset", what, default=0)
    length = _byte_count(info, "length", what, default=None)
    size = path.stat().st_size
    available = size - offset
    if offset > size or (length is not None and length > available):
        end = offset + (length or 0)
        raise OnnxImportError(f"{what}: external data {location!r} is {size} bytes but the "
                              f"tensor asks for bytes {offset} to {end}; the model or its "
                              "data file is broken")
    count = available if length is None else length
    if count != expected:
        raise OnnxImportError(f"{what}: external data {location!r} gives {count} bytes but the "
                              f"tensor's shape {list(tensor.dims)} of {dtype} needs {expected}")
    with path.open("rb") as file:
        file.seek(offset)
        data = file.read(count)
    if len(data) != count:  # the file shrank since it was measured
        raise OnnxImportError(f"{what}: external data {location!r} ended early")
    return data


def _contained_path(location: str, base: Path, what: str) -> Path:
    """``base / location`` after refusing every way out of ``base``."""
    shown = repr(location)
    if not location:
        raise OnnxImportError(f"{what} is marked as external data but names no location")
    if "\x00" in location:
        raise OnnxImportError(f"{what}: external data path {shown} contains a NUL byte; the "
                              "model is malformed")
    parts = re.split(r"[\\/]", location)
    reason = ""
    if location.startswith(("/", "\\")) or ntpath.splitdrive(location)[0]:
        reason = "it is an absolute path"
    elif ".." in parts:
        reason = "it has a '..' component"
    else:
        path = (base / location).resolve()
        if base not in path.parents:
            reason = "a symbolic link leads outside it"
    if reason:
        raise OnnxImportError(f"{what}: external data path {shown} leaves the model's directory "
                              f"({reason}); refusing to read it")
    if not path.is_file():
        raise OnnxImportError(f"{what}: external data file {shown} does not exist next to the "
                              f"model (in {str(base)!r})")
    return path


def _entry_text(value: Any, what: str) -> str:
    """An external-data entry's key or value as text: protobuf hands over the bytes of a
    string field that is not UTF-8 (a damaged model) as they are."""
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except (UnicodeDecodeError, TypeError):
        raise OnnxImportError(f"{what}: an external data entry {value!r} is not UTF-8 text; "
                              "the model is damaged") from None


def _byte_count(info: dict[str, str], key: str, what: str, default: int | None) -> int | None:
    text = info.get(key)
    if text is None:
        return default
    if not _DIGITS.fullmatch(text):
        raise OnnxImportError(f"{what}: external data {key} {text!r} is not a non-negative "
                              "integer")
    return int(text)
