"""The table of ATen operator converters, and the view of one FX node that a converter reads.

A converter is a function ``(node: AtenNode) -> Expr | tuple`` registered under the names of
the ATen overloads it handles (``str(torch.ops.aten.add.Tensor)``, ``"aten.add.Tensor"``)::

    @converter("aten.relu.default")
    def relu(node):
        return op.nn.relu(node.tensor("self"))

Arguments are read by their name in the overload's schema (``node.tensor("input")``,
``node.get("stride")``), defaults filled in. Nothing here imports torch: the importer
gives converters plain Python values and IR expressions only."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...errors import TorchImportError
from ...ir.expr import Expr

Converter = Callable[["AtenNode"], Any]

_CONVERTERS: dict[str, Converter] = {}

TORCH_DTYPES = {
    "torch.float32": "float32", "torch.float64": "float64", "torch.float16": "float16",
    "torch.int64": "int64", "torch.int32": "int32", "torch.int16": "int16",
    "torch.int8": "int8", "torch.uint8": "uint8", "torch.bool": "bool",
}
"""torch dtypes (by ``str``) that the graph IR holds, and their names there."""


def converter(*targets: str) -> Callable[[Converter], Converter]:
    """Register ``fn`` as the converter of each ATen overload named in ``targets``."""

    def register(fn: Converter) -> Converter:
        for target in targets:
            assert target not in _CONVERTERS, f"{target} registered twice"
            _CONVERTERS[target] = fn
        return fn

    return register


def lookup_converter(target: str) -> Converter | None:
    """The converter of the ATen overload named ``target``, or None if there is none."""
    return _CONVERTERS.get(target)


def supported_targets() -> list[str]:
    """The names of every ATen overload with a converter, sorted."""
    return sorted(_CONVERTERS)


def ir_dtype(torch_dtype: Any, what: str) -> str:
    """The IR's name of ``torch_dtype``; a dtype the IR cannot hold (bfloat16, complex) is a
    :class:`TorchImportError` naming ``what``."""
    name = str(torch_dtype)
    if name not in TORCH_DTYPES:
        raise TorchImportError(f"{what} has dtype {name}, which opfusion does not compile; "
                               f"cast the model to one of "
                               f"{', '.join(sorted(set(TORCH_DTYPES.values())))} (float32 for "
                               "a bfloat16 or float16 model: model.float())")
    return TORCH_DTYPES[name]


class Unavailable:
    """An output of an ATen node that opfusion does not compute (max_pool2d's indices, a
    normalization's saved statistics): an error when a later node reads it."""

    def __init__(self, what: str) -> None:
        self.what = what


class AtenNode:
    """What a converter sees of one FX node calling an ATen overload: its arguments by schema
    name (tensors as IR expressions, SymInts as ints, everything else as given), the dtype
    of its (first) output, and where in the model's source it was traced from."""

    def __init__(self, name: str, target: str, values: Mapping[str, Any],
                 out_dtype: str | None, where: str) -> None:
        self.name = name
        self.target = target
        self.values = dict(values)
        self.out_dtype = out_dtype
        self.where = where

    def get(self, name: str, default: Any = None) -> Any:
        """Argument ``name`` (its schema default when the call leaves it out), or
        ``default`` when it is None."""
        value = self.values.get(name)
        return default if value is None else value

    def tensor(self, name: str) -> Expr:
        """Tensor argument ``name``; missing or not a tensor is an error naming the node."""
        value = self.values.get(name)
        if not isinstance(value, Expr):
            raise self.error(f"argument {name!r} must be a tensor, got {value!r}")
        return value

    def optional_tensor(self, name: str) -> Expr | None:
        """Tensor argument ``name``, or None when the call passes none."""
        value = self.values.get(name)
        return None if value is None else self.tensor(name)

    def tensors(self, name: str) -> list[Expr]:
        """A ``Tensor[]`` argument as a list of expressions."""
        value = self.values.get(name)
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, Expr) for v in value):
            raise self.error(f"argument {name!r} must be a list of tensors, got {value!r}")
        return list(value)

    def ints(self, name: str, default: Any = None) -> list[int]:
        """An ``int[]`` argument as a list (a single int as a list of one)."""
        value = self.get(name, default)
        if value is None:
            raise self.error(f"argument {name!r} is required")
        return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]

    @property
    def dtype(self) -> str:
        """The dtype of the node's (first) output, as the trace recorded it."""
        if self.out_dtype is None:
            raise self.error("the trace recorded no dtype for the node's output")
        return self.out_dtype

    def error(self, message: str) -> TorchImportError:
        """A :class:`TorchImportError` naming this node and its source line."""
        return TorchImportError(f"{self.target} (node {self.name!r}{self.where}): {message}",
                                node=self.name)
