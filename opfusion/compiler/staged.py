"""Models whose shapes depend on the data they compute, run in compiled stages.

opfusion compiles static shapes. A model in which a value the import needs (a Reshape's
target shape, a NonZero's input, a Loop's trip count, NonMaxSuppression's boxes) is
computed from the inputs cannot be one static graph: a frontend hands :func:`opfusion.compile`
a :class:`StagedModel` instead, and gets back an executor that, per run, compiles and runs
the model up to such a node, computes what the node needs, and goes on with the rest
specialized on what it now knows (cached by shapes and by the small values it froze). The
model's contract is :class:`~opfusion.ir.symbolic.StagedModel` (beside SymbolicModule, which
passes and the interpreter refuse likewise); this module holds the settings each stage is
compiled with; the ONNX frontend's :mod:`opfusion.frontend.onnx.staged` is the
implementation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir.symbolic import StagedModel
from ..target import Target

__all__ = ["CompileSettings", "StagedModel"]


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
