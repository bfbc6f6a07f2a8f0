"""Models whose shapes depend on the data they compute, run in compiled stages.

opfusion compiles static shapes. A model in which a value the import needs (a Reshape's
target shape, a NonZero's input, a Loop's trip count, NonMaxSuppression's boxes) is
computed from the inputs cannot be one static graph: a frontend hands :func:`opfusion.compile`
a :class:`StagedModel` instead, and gets back an executor that, per run, compiles and runs
the model up to such a node, computes what the node needs, and goes on with the rest
specialized on what it now knows (cached by shapes and by the small values it froze). This
module holds the contract; the ONNX frontend's :mod:`opfusion.frontend.onnx.staged` is the
implementation."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from ..target import Target


@dataclass(frozen=True)
class CompileSettings:
    """What :func:`opfusion.compile` was asked for, resolved, for each stage it compiles."""

    target: Target
    opt_level: int | None = None
    fusion: str | None = None
    verify: bool = False
    num_threads: int = 0
    records: Any = None
    max_stages: int = 32
    reference: bool = False  # evaluate each stage with the NumPy interpreter, not compiled
    context: Any = field(default=None, compare=False)


class StagedModel(abc.ABC):
    """A model that runs in stages (see the module's docstring)."""

    input_names: list[str]
    output_names: list[str]

    @abc.abstractmethod
    def compile(self, settings: CompileSettings) -> Any:
        """The executor that runs this model in stages (``run``, ``__call__`` as
        :class:`~opfusion.compiler.executor.Executor`'s)."""
