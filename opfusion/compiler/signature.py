"""A compiled model's signature, and ONNX Runtime's calling convention for running it.

Users of ONNX Runtime know ``sess.run(None, feeds)``, ``sess.run(["logits"], feeds)`` and
``sess.get_inputs()[0].name``; the executor answers the same calls. This module holds what
that takes: :class:`NodeArg` (an input or output: name, shape, ONNX type string and NumPy
dtype), the default output names, and :func:`parse_run_arguments`, which tells
``exe.run(feeds)`` (opfusion's own form) from ``exe.run(output_names, feeds)`` by the
arguments' types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OpfusionError
from ..ir.types import TensorType

# opfusion's dtypes by the element type names of ONNX's TensorProto, as ONNX Runtime prints them.
_ONNX_TYPE_NAMES = {
    "bool": "bool", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float16": "float16", "float32": "float", "float64": "double",
}


class RunArgumentError(OpfusionError):
    """``exe.run`` was called with arguments of the wrong kind, or unknown output names."""


@dataclass(frozen=True)
class NodeArg:
    """One input or output of a compiled model, like ONNX Runtime's ``NodeArg``: ``name``,
    ``shape`` (a list of ints for a compiled shape; a specializing executor's may hold, as
    ONNX Runtime's do, a symbolic dimension's name or None for an unknown one, and is None
    for an unknown rank), ``type`` (``"tensor(float)"``) and, beyond ONNX Runtime, ``dtype``
    (the NumPy dtype; None when the model does not declare an output's type)."""

    name: str
    shape: list[int | str | None] | None
    type: str
    dtype: np.dtype | None

    @classmethod
    def of(cls, name: str, ty: TensorType) -> NodeArg:
        return cls.symbolic(name, [int(d) for d in ty.shape], str(ty.dtype))

    @classmethod
    def symbolic(cls, name: str, dims: Sequence[int | str | None] | None,
                 dtype: str | None) -> NodeArg:
        """A NodeArg of dims that may be symbolic (see :class:`opfusion.ir.symbolic.Dim`)."""
        if dtype is None:
            return cls(name, None if dims is None else list(dims), "tensor(undefined)", None)
        return cls(name, None if dims is None else list(dims),
                   f"tensor({_ONNX_TYPE_NAMES.get(dtype, dtype)})", np.dtype(dtype))


def default_output_names(count: int) -> list[str]:
    """``output_0``, ``output_1``, ...: the names of outputs that a model does not name."""
    return [f"output_{i}" for i in range(count)]


def check_output_names(names: Any, count: int) -> list[str] | None:
    """``names`` as a list when it is a list or tuple of ``count`` strings, else None."""
    if (isinstance(names, (list, tuple)) and len(names) == count
            and all(isinstance(name, str) for name in names)):
        return list(names)
    return None


def _is_names(value: Any) -> bool:
    """A non-empty list or tuple of strings: output names, never input arrays."""
    return (isinstance(value, (list, tuple)) and len(value) > 0
            and all(isinstance(item, str) for item in value))


def parse_run_arguments(first: Any, second: Any, run_options: Any
                        ) -> tuple[list[str] | None, Any]:
    """(output names or None for all, feeds) from the arguments of ``exe.run``.

    ``run(feeds)``: ``first`` is the feeds (a mapping, a sequence of arrays in input order,
    or None for a model without inputs). ``run(output_names, feeds)``, as in ONNX Runtime:
    ``first`` is None or a list of output names and ``second`` the feeds. Anything else is a
    :class:`RunArgumentError` saying which form was expected."""
    if run_options is not None:
        raise RunArgumentError("exe.run takes no run_options (opfusion has none); call "
                               "exe.run(output_names, feeds) or exe.run(feeds)")
    if second is not None:
        names_ok = first is None or (isinstance(first, (list, tuple))
                                     and all(isinstance(name, str) for name in first))
        if not names_ok:
            raise RunArgumentError(
                f"exe.run(output_names, feeds): output_names must be None or a list of output "
                f"names, got {_kind(first)}")
        _check_feeds(second, "exe.run(output_names, feeds): feeds")
        return (list(first) if first else None), second
    if isinstance(first, str) or _is_names(first):
        raise RunArgumentError("exe.run(output_names, feeds) needs the feeds after the output "
                               "names: a dict of input name -> array")
    _check_feeds(first, "exe.run(feeds): feeds")
    return None, first


def _check_feeds(feeds: Any, what: str) -> None:
    # A list or a dict first, by type alone: the ABC checks below cost a microsecond-scale
    # share of a small model's run.
    if feeds is None or type(feeds) is list or type(feeds) is dict \
            or isinstance(feeds, Mapping):
        return
    if isinstance(feeds, (str, bytes, np.ndarray)) or not isinstance(feeds, Sequence):
        raise RunArgumentError(f"{what} must be a dict of input name -> array (or a list of "
                               f"arrays in input order), got {_kind(feeds)}")


def _kind(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    if isinstance(value, str):
        return f"the string {value!r}"
    return f"a {type(value).__name__}"


def output_positions(names: Sequence[str], wanted: Sequence[str] | None) -> list[int] | None:
    """The positions among ``names`` of the outputs named ``wanted``, in that order (None, all
    of them, when ``wanted`` is None); of outputs with the same name the first is taken. An
    unknown name is a :class:`RunArgumentError` listing the model's outputs."""
    if wanted is None:
        return None
    position: dict[str, int] = {}
    for index, name in enumerate(names):
        position.setdefault(name, index)
    unknown = [name for name in wanted if name not in position]
    if unknown:
        raise RunArgumentError(f"unknown output {unknown[0]!r}; the model's outputs are "
                               f"{', '.join(map(repr, names))}")
    return [position[name] for name in wanted]
