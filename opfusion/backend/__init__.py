"""Backends: everything that depends on the kind of machine code is generated for.

One backend per target device family (``cpu`` and ``cuda``), each in its own folder
(``backend/cpu/``, ``backend/cuda/``) holding its schedule rules, its code emitter, its
toolchain (compiler driver and cache) and its module loader. The rest of opfusion reaches
them only through :func:`get_backend`::

    backend = get_backend(target)               # opf.Target or a string such as "c"
    backend.schedule(s, anchor, output, ...)   # an anchor's schedule rule, or the default
    source, parts = backend.generate(funcs)     # source text of a module of kernels
    library = backend.build(source)             # a loadable library, cached by content
    kernels = backend.load(source, expected)    # built (or cached) and loaded, checked
    kernel = backend.build_kernel(func, name)   # one kernel (opf.build)

Adding a backend is: a subclass of :class:`Backend` in a folder of its own, a
:func:`register_backend` for its device family, and a target kind (see
:func:`opfusion.target.register_target_kind`) whose ``device`` names that family."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ..errors import BuildError
from ..target import Target, as_target
from .schedule_rule import as_config


class Backend(ABC):
    """The code-generation interface of one device family for one :class:`Target`.

    Subclasses implement each method; every method takes what it needs explicitly, so a
    backend object is cheap and holds only its target."""

    #: The device family (``Target.device``) this backend compiles for.
    device: str = ""

    def __init__(self, target: Target) -> None:
        self.target = target

    @abstractmethod
    def rules(self) -> Any:
        """The backend's :class:`~opfusion.backend.schedule_rule.RuleRegistry`: a rule per
        anchor family and the fallback (the default schedule)."""

    def schedule(self, s: Any, anchor: Any, output: Any, op_name: str | None,
                 config: Any = None) -> Any:
        """Arrange the loops of one fused group's TE schedule ``s``: the first schedule rule
        of ``op_name`` (the group's anchor operator; its result ``anchor``, the group's result
        ``output``) that takes the group, with ``config`` (a :class:`Config`, its
        ``to_dict()`` or a mapping of knob values; checked against the rule's space) or the
        rule's default for the target. A group no rule takes gets the fallback rule. Returns
        the config used (None for the fallback's default)."""
        registry = self.rules()
        found = registry.find(op_name, anchor, output, self.target)
        if found is None:
            assert registry.fallback is not None
            found = registry.fallback, registry.fallback.space(anchor, output, self.target)
        rule, space = found
        if config is None:
            used = rule.default_config(anchor, output, self.target)
        else:
            used = space.check(as_config(config, rule.name))
        rule.apply(s, anchor, output, self.target, used)
        return None if rule is registry.fallback and config is None else used

    #: Whether groups without an anchor (elementwise chains, pooling) are tuning tasks too:
    #: their fallback rule's knobs matter on a GPU (threads, elements and vectors per
    #: thread); the CPU's fallback has none worth a measurement.
    tunes_fallback = False

    def fallback_space(self, output: Any) -> Any:
        """``(rule, space, default)`` of the fallback rule for a group without an anchor
        whose result is ``output``, when this backend tunes it (:attr:`tunes_fallback`) and
        the space has a choice; else None."""
        registry = self.rules()
        if not self.tunes_fallback or registry.fallback is None:
            return None
        rule = registry.fallback
        space = rule.space(None, output, self.target)
        if space is None or len(space) < 2:
            return None
        return rule, space, rule.default_config(None, output, self.target)

    def config_space(self, anchor: Any, output: Any, op_name: str | None) -> Any:
        """``(rule, space, default)`` for one fused group (arguments as for
        :meth:`schedule`): the schedule rule that takes it, its
        :class:`~opfusion.backend.schedule_rule.ConfigSpace` and the heuristic's config; None
        when no rule with knobs takes the group (a tuner has nothing to choose)."""
        found = self.rules().find(op_name, anchor, output, self.target)
        if found is None:
            return None
        rule, space = found
        return rule, space, rule.default_config(anchor, output, self.target)

    @abstractmethod
    def generate(self, funcs: list[Any], header: str | None = None, model: Any = None) -> Any:
        """Source code of one module holding every PrimFunc of ``funcs`` and, with ``model``
        (a :class:`~opfusion.runtime.model_layout.ModelLayout` whose kernel indices are
        positions in ``funcs``), the model's native entry."""

    @abstractmethod
    def build(self, source: Any) -> Any:
        """A library built from ``source`` (from the backend's cache when it is there)."""

    @abstractmethod
    def load(self, source: Any, kernels: Any) -> Any:
        """Build ``source`` (or find it in the cache) and return its kernels ``(name,
        entry_name, params)``, each checked against what the library says it holds."""

    @abstractmethod
    def build_kernel(self, func: Any, name: str, options: Any = None) -> Any:
        """One PrimFunc as a callable kernel named ``name`` (``opf.build``); ``options`` are
        the emitter's."""


_BACKENDS: dict[str, str | Callable[[Target], Backend]] = {
    # Device family -> backend class, or the module that defines ``Backend`` subclass
    # ``BACKEND`` (imported on first use, so a backend's dependencies load only when used).
    "cpu": "opfusion.backend.cpu",
    "cuda": "opfusion.backend.cuda",
}


def register_backend(device: str, factory: Callable[[Target], Backend]) -> None:
    """Make ``factory(target)`` the backend of targets whose device family is ``device``."""
    _BACKENDS[device] = factory


def get_backend(target: str | Target | None = None) -> Backend:
    """The backend for ``target`` (a :class:`Target`, a target string, or None for the
    current target). Raises BuildError for a target kind no backend compiles for yet."""
    resolved = as_target(target)
    entry = _BACKENDS.get(resolved.device)
    if entry is None:
        raise BuildError(f"target {resolved} is not supported yet: opfusion has backends for "
                         f"{', '.join(sorted(_BACKENDS))} targets only (e.g. target='c', the "
                         f"host CPU)")
    if isinstance(entry, str):
        entry = importlib.import_module(entry).BACKEND
        _BACKENDS[resolved.device] = entry
    return entry(resolved)


__all__ = ["Backend", "get_backend", "register_backend"]
