"""SymbolicModule: a model whose input shapes are not all known until it runs.

The graph IR has static shapes only (:mod:`opfusion.ir.types`). A model with a symbolic
input dimension (an ONNX ``batch`` dim) is therefore kept as a symbolic module: its inputs'
names, dims and dtypes, and a way to make an :class:`~opfusion.ir.module.IRModule` for any
concrete shapes (:meth:`SymbolicModule.specialize`). A frontend returns one when it is given
no shapes (``opf.frontend.from_onnx(model)``); :func:`opfusion.compile` turns it into an
executor that specialises on each new shape a run brings (``compiler/specialize.py``).

Anything that needs the graph itself (passes, the reference interpreter, ``mod["main"]``)
takes an IRModule: given a symbolic module it raises :class:`SymbolicShapeError`, saying to
give the shapes or to compile it."""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OpfusionError
from .module import IRModule

Dim = int | str | None
"""One dimension of a symbolic shape: a size, the name of a symbolic dimension (an ONNX
``dim_param``; inputs that share a name share the size), or None (unknown, unnamed)."""


class SymbolicShapeError(OpfusionError):
    """A symbolic module was given where static shapes are needed."""


@dataclass(frozen=True)
class SymbolicTensor:
    """An input or output of a symbolic module: ``name``, ``dims`` (one :data:`Dim` per axis,
    or None when even the rank is unknown) and ``dtype`` (None when the model does not say;
    only an output's may be unknown)."""

    name: str
    dims: tuple[Dim, ...] | None
    dtype: str | None

    @property
    def is_static(self) -> bool:
        """Whether every dimension is a known size."""
        return self.dims is not None and all(isinstance(d, int) for d in self.dims)

    def shape_text(self) -> str:
        """``float32[N, 3, 16, 16]`` (``?`` for an unknown dim, ``[...]`` for an unknown rank)."""
        dims = "..." if self.dims is None else ", ".join(
            "?" if d is None else str(d) for d in self.dims)
        return f"{self.dtype or '?'}[{dims}]"


class SymbolicModule(abc.ABC):
    """A model with symbolic input dimensions, made static by :meth:`specialize`.

    ``inputs`` and ``outputs`` are :class:`SymbolicTensor` lists in the model's order. A
    frontend subclasses this with the model it keeps and how it imports it."""

    def __init__(self, inputs: Sequence[SymbolicTensor], outputs: Sequence[SymbolicTensor]
                 ) -> None:
        self.inputs = list(inputs)
        self.outputs = list(outputs)

    @property
    def input_names(self) -> list[str]:
        return [tensor.name for tensor in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [tensor.name for tensor in self.outputs]

    @abc.abstractmethod
    def specialize(self, shapes: Mapping[str, Sequence[int]]
                   ) -> tuple[IRModule, dict[str, np.ndarray]]:
        """The model imported with these input shapes (every input that is not static must
        be given one): ``(mod, params)``, as the frontend returns for static shapes."""

    def symbolic_inputs(self) -> list[SymbolicTensor]:
        """The inputs whose shape a run decides."""
        return [tensor for tensor in self.inputs if not tensor.is_static]

    def first_symbolic(self) -> str:
        """``graph input 'x' has a symbolic dimension 'N' at axis 0`` (or ``an unknown
        rank``): the first input a run must give a shape, for messages."""
        first = self.symbolic_inputs()[0]
        if first.dims is None:
            return f"graph input {first.name!r} has an unknown rank"
        axis, dim = next((axis, dim) for axis, dim in enumerate(first.dims)
                         if not isinstance(dim, int))
        return f"graph input {first.name!r} has a symbolic dimension {dim or '?'!r} at axis {axis}"

    def static_error(self, what: str) -> SymbolicShapeError:
        """The error for ``what`` (an operation that needs static shapes) on this module."""
        name = self.symbolic_inputs()[0].name
        return SymbolicShapeError(
            f"{what} needs static shapes, but {self.first_symbolic()}; give its shape when "
            f"importing (from_onnx(model, shape={{{name!r}: (...)}})), or compile the model "
            f"with opf.compile, which specialises on the shapes each run brings")

    def __getitem__(self, name: str) -> Any:
        raise self.static_error(f"mod[{name!r}]")

    def __repr__(self) -> str:
        inputs = ", ".join(f"{t.name}: {t.shape_text()}" for t in self.inputs)
        outputs = ", ".join(f"{t.name}: {t.shape_text()}" for t in self.outputs)
        return f"{type(self).__name__}(inputs: {inputs}; outputs: {outputs})"


class StagedModel(abc.ABC):
    """A model whose shapes depend on the values it computes (a frontend's result when its
    import needs a value the model computes): no single static graph exists, so passes and
    the interpreter refuse it (:meth:`staged_error`), and :func:`opfusion.compile` makes it an
    executor that runs it in compiled stages (:mod:`opfusion.compiler.staged`)."""

    input_names: list[str]
    output_names: list[str]

    @abc.abstractmethod
    def compile(self, settings: Any) -> Any:
        """The executor that runs this model in stages (``run``, ``__call__`` as
        :class:`~opfusion.compiler.executor.Executor`'s), for
        :class:`~opfusion.compiler.staged.CompileSettings`."""

    def staged_error(self, what: str) -> OpfusionError:
        """The error for ``what`` (an operation that needs one static graph)."""
        return OpfusionError(f"{what} needs one static graph, but this model's shapes depend on "
                             f"the values it computes; opf.compile runs it in stages (or import "
                             f"it with data_dependent='raise' to see where)")

    def __getitem__(self, name: str) -> Any:
        raise self.staged_error(f"mod[{name!r}]")
