"""Where an operator finds its tensor expression: its TE compute, by op name.

A **compute** turns an operator call into TE: ``fn(inputs, attrs, out_type)`` where
``inputs`` holds one ``te.Tensor`` per argument (a list of them for a tuple argument, e.g.
concatenate), ``attrs`` is the call's normalized :class:`~opfusion.ir.Attrs` and
``out_type`` its inferred type; it returns a ``te.Tensor`` (or a tuple of them for a
tuple-typed result). Computes never schedule: the schedules of fused groups are the
backend's schedule rules (:mod:`opfusion.backend.schedule_rule`; the CPU's in
:mod:`opfusion.backend.cpu.schedules`). A compute may read the current target
(``Target.current()``, set by the group lowering) for hardware facts such as the vector
width its accumulators are laid out in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import OpfusionError

ComputeFn = Callable[[list[Any], Any, Any], Any]

_COMPUTES: dict[str, ComputeFn] = {}


def register_compute(*op_names: str) -> Callable[[ComputeFn], ComputeFn]:
    """Decorator: ``fn`` is the TE compute of each op in ``op_names``."""

    def wrap(fn: ComputeFn) -> ComputeFn:
        for name in op_names:
            if name in _COMPUTES:
                raise OpfusionError(f"a TE compute for {name!r} is already registered")
            _COMPUTES[name] = fn
        return fn

    return wrap


def get_compute(op_name: str) -> ComputeFn | None:
    """The TE compute registered for ``op_name`` (None when the op has none)."""
    _load_all()
    return _COMPUTES.get(op_name)


def ops_with_compute() -> list[str]:
    _load_all()
    return sorted(_COMPUTES)


def _load_all() -> None:
    from . import _all  # noqa: F401 - importing the modules registers their computes
