"""Where an operator finds its tensor expression: computes and anchor schedules, by op name.

A **compute** turns an operator call into TE: ``fn(inputs, attrs, out_type)`` where
``inputs`` holds one ``te.Tensor`` per argument (a list of them for a tuple argument, e.g.
concatenate), ``attrs`` is the call's normalized :class:`~opfusion.ir.Attrs` and
``out_type`` its inferred type; it returns a ``te.Tensor`` (or a tuple of them for a
tuple-typed result). Computes never schedule.

A **schedule** is registered for anchor operators only (conv2d, dense, pooling, reductions,
softmax...): ``fn(s, anchor, output)`` arranges the loops of ``anchor`` (the op's own result
tensor) inside schedule ``s`` whose final stage is ``output`` (the fused group's result,
possibly ``anchor`` itself, possibly an elementwise epilogue that the schedule attaches to
the anchor's tiles). Elementwise and injective stages are inlined by the group lowering, not
here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import OpfusionError

ComputeFn = Callable[[list[Any], Any, Any], Any]
ScheduleFn = Callable[[Any, Any, Any], None]

_COMPUTES: dict[str, ComputeFn] = {}
_SCHEDULES: dict[str, ScheduleFn] = {}


def register_compute(*op_names: str) -> Callable[[ComputeFn], ComputeFn]:
    """Decorator: ``fn`` is the TE compute of each op in ``op_names``."""

    def wrap(fn: ComputeFn) -> ComputeFn:
        for name in op_names:
            if name in _COMPUTES:
                raise OpfusionError(f"a TE compute for {name!r} is already registered")
            _COMPUTES[name] = fn
        return fn

    return wrap


def register_schedule(*op_names: str) -> Callable[[ScheduleFn], ScheduleFn]:
    """Decorator: ``fn`` schedules a fused group anchored at each op in ``op_names``."""

    def wrap(fn: ScheduleFn) -> ScheduleFn:
        for name in op_names:
            if name in _SCHEDULES:
                raise OpfusionError(f"a schedule for {name!r} is already registered")
            _SCHEDULES[name] = fn
        return fn

    return wrap


def get_compute(op_name: str) -> ComputeFn | None:
    """The TE compute registered for ``op_name`` (None when the op has none)."""
    _load_all()
    return _COMPUTES.get(op_name)


def get_schedule(op_name: str) -> ScheduleFn | None:
    """The anchor schedule registered for ``op_name`` (None: use the default)."""
    _load_all()
    return _SCHEDULES.get(op_name)


def ops_with_compute() -> list[str]:
    _load_all()
    return sorted(_COMPUTES)


def _load_all() -> None:
    from . import _all  # noqa: F401 - importing the modules registers their computes
    from ..backend.cpu import schedules  # noqa: F401 - and the CPU schedules
