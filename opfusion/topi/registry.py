"""Where an operator finds its tensor expression: its TE compute, by op name.

A **compute** turns an operator call into TE: ``fn(inputs, attrs, out_type)`` where
``inputs`` holds one ``te.Tensor`` per argument (a list of them for a tuple argument, e.g.
concatenate), ``attrs`` is the call's normalized :class:`~opfusion.ir.Attrs` and
``out_type`` its inferred type; it returns a ``te.Tensor`` (or a tuple of them for a
tuple-typed result). Computes never schedule: the schedules of fused groups are the
backend's schedule rules (:mod:`opfusion.backend.schedule_rule`; the CPU's in
:mod:`opfusion.backend.cpu.schedules`). A compute may read the current target
(``Target.current()``, set by the group lowering) for hardware facts such as the vector
width its accumulators are laid out in. A device family may register its own compute for an
operator (``register_compute("nn.conv2d", device="cuda")``): ``get_compute`` returns it while
a target of that family is current (a GPU convolution reads its padded input through a
bounds test instead of a padded copy in the CPU's column phases)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import OpfusionError

ComputeFn = Callable[[list[Any], Any, Any], Any]

_COMPUTES: dict[str, ComputeFn] = {}
_DEVICE_COMPUTES: dict[tuple[str, str], ComputeFn] = {}


def register_compute(*op_names: str, device: str | None = None
                     ) -> Callable[[ComputeFn], ComputeFn]:
    """Decorator: ``fn`` is the TE compute of each op in ``op_names`` (for targets of the
    device family ``device`` only, when given; an op needs a compute for every device
    first)."""

    def wrap(fn: ComputeFn) -> ComputeFn:
        for name in op_names:
            table: dict[Any, ComputeFn] = _COMPUTES if device is None else _DEVICE_COMPUTES
            key: Any = name if device is None else (device, name)
            if key in table:
                raise OpfusionError(f"a TE compute for {name!r} is already registered"
                                    + (f" for {device}" if device else ""))
            table[key] = fn
        return fn

    return wrap


def get_compute(op_name: str) -> ComputeFn | None:
    """The TE compute registered for ``op_name`` (None when the op has none): the current
    target's device family's own, if it has one."""
    from ..target import Target

    _load_all()
    target = Target.current(allow_none=True)
    if target is not None and target.device != "cpu":
        own = _DEVICE_COMPUTES.get((target.device, op_name))
        if own is not None:
            return own
    return _COMPUTES.get(op_name)


def ops_with_compute() -> list[str]:
    _load_all()
    return sorted(_COMPUTES)


def _load_all() -> None:
    from . import _all  # noqa: F401 - importing the modules registers their computes
