"""optimize: the standard sequence of graph simplifications that prepares a model for fusion.

    InferType -> [BindParams] -> SimplifyInference -> FoldConstant -> FoldScaleAxis ->
    FoldConstant -> SimplifyExpr -> EliminateCommonSubexpr -> DeadCodeElimination

Which of them run is decided by the pass context (opt_level, required_pass, disabled_pass),
as for any Sequential: at opt_level 0 and 1 only the cheap, always-safe ones run; FoldConstant
needs level 2; FoldScaleAxis and EliminateCommonSubexpr need level 3."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..ir.module import IRModule
from .common_subexpr import EliminateCommonSubexpr
from .context import PassContext
from .dead_code import DeadCodeElimination
from .fold_constant import BindParams, FoldConstant
from .fold_scale_axis import FoldScaleAxis
from .infer_type import InferType
from .pass_infra import Pass, Sequential
from .simplify_expr import SimplifyExpr
from .simplify_inference import SimplifyInference


def optimization_passes(params: Mapping[str, Any] | None = None) -> Sequential:
    """The passes :func:`optimize` runs, as one Sequential (named "Optimize")."""
    passes: list[Pass] = [InferType()]
    if params:
        passes.append(BindParams(params))
    passes += [SimplifyInference(), FoldConstant(), FoldScaleAxis(), FoldConstant(),
               SimplifyExpr(), EliminateCommonSubexpr(), DeadCodeElimination(), InferType()]
    return Sequential(passes, name="Optimize")


def optimize(mod: IRModule, params: Mapping[str, Any] | None = None,
             opt_level: int | None = None) -> IRModule:
    """Bind ``params`` (name -> array) into ``@main`` and run the standard simplifications.

    ``opt_level`` None takes the level of the current :class:`PassContext`; a number runs
    under a copy of that context at this level (same config, instruments and pass lists)."""
    ctx = PassContext.current()
    sequence = optimization_passes(params)
    if opt_level is None or opt_level == ctx.opt_level:
        return sequence(mod)
    with ctx.with_opt_level(opt_level):
        return sequence(mod)
