"""Passes: functions from IRModule to IRModule, with a name, an optimization level and the
passes they need first.

Three kinds:

* a **module pass** sees the whole module (``transform_module(mod, ctx)``);
* a **function pass** sees one global function at a time (``transform_function(func, mod,
  ctx)``) and the infrastructure rebuilds the module around the results;
* a **Sequential** runs a list of passes in order, skipping those the context disables and
  running each pass's ``required`` passes before it.

Calling a pass on a module never changes that module: the pass works on a copy and returns a
new one. ``module_pass`` and ``function_pass`` turn a plain function or a class into a pass::

    @module_pass(opt_level=1, name="DropHelpers")
    def drop_helpers(mod, ctx):
        ...

    @function_pass(opt_level=2)
    class ScaleWeights:
        def __init__(self, factor): self.factor = factor
        def transform_function(self, func, mod, ctx): ...

    mod = drop_helpers(mod)            # a function becomes a Pass at once
    mod = ScaleWeights(2.0)(mod)       # a class becomes a factory of Passes

Every public pass of opfusion is a factory, as in TVM: ``InferType()(mod)``,
``FoldConstant()(mod)``, ``FuseOps(fuse_opt_level=3)(mod)``. A factory is made with
``pass_factory`` (or by decorating a class); calling one on a module directly,
``InferType(mod)``, is an OpfusionError that says to write ``InferType()(mod)``.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import OpfusionError
from ..ir.expr import Function
from ..ir.module import IRModule
from ..ir.symbolic import StagedModel, SymbolicModule
from .context import PassContext


@dataclass(frozen=True)
class PassInfo:
    """What the infrastructure knows about a pass: ``name``, ``opt_level`` (the lowest context
    level at which a Sequential runs it), ``required`` (names of passes to run before it) and
    ``kind`` ("module", "function" or "sequential")."""

    name: str
    opt_level: int
    required: tuple[str, ...] = ()
    kind: str = "module"


# Factories of argument-free passes by name, so ``required=("InferType",)`` can be resolved.
_PASS_FACTORIES: dict[str, Callable[[], Pass]] = {}


def register_pass(name: str, factory: Callable[[], Pass]) -> None:
    """Make ``name`` usable in another pass's ``required`` list."""
    _PASS_FACTORIES[name] = factory


def get_pass(name: str) -> Pass:
    """A fresh instance of the registered pass ``name``."""
    factory = _PASS_FACTORIES.get(name)
    if factory is None:
        known = ", ".join(sorted(_PASS_FACTORIES)) or "none"
        raise OpfusionError(f"no pass is registered under the name {name!r} (known: {known})")
    return factory()


def pass_factory(factory: Callable[..., Pass]) -> Callable[..., Pass]:
    """Mark ``factory`` (a function returning a :class:`Pass`) as a public pass factory.

    It is called like TVM's: ``Name(options)(mod)``. Calling it on a module directly,
    ``Name(mod)``, is a mistake it catches with an OpfusionError naming the right spelling."""

    @functools.wraps(factory)
    def make(*args: Any, **kwargs: Any) -> Pass:
        _refuse_module_argument(factory.__name__, args)
        return factory(*args, **kwargs)

    return make


def _refuse_module_argument(name: str, args: Sequence[Any]) -> None:
    if args and isinstance(args[0], IRModule):
        raise OpfusionError(f"{name} is a pass factory, not a pass: write {name}()(mod) "
                            f"(with its options, if any, in the first call), not {name}(mod)")


class Pass:
    """Base class of all passes. Call it on a module: ``new_mod = pass_(mod)``."""

    info: PassInfo

    def __call__(self, mod: IRModule) -> IRModule:
        if isinstance(mod, SymbolicModule):
            raise mod.static_error(f"pass {self.info.name}")
        if isinstance(mod, StagedModel):
            raise mod.staged_error(f"pass {self.info.name}")
        if not isinstance(mod, IRModule):
            raise OpfusionError(f"pass {self.info.name} takes an IRModule, got "
                                f"{type(mod).__name__}; wrap an expression with "
                                f"IRModule.from_expr")
        ctx = PassContext.current()
        return run_instrumented(self, mod, ctx)

    def transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        """Do the work on ``mod`` (a private copy) and return the new module."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        return self.info.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.info.name} opt_level={self.info.opt_level}>"


def run_instrumented(pass_: Pass, mod: IRModule, ctx: PassContext) -> IRModule:
    """Run ``pass_`` on a copy of ``mod``, telling the context's instruments before and after."""
    instruments = ctx.instruments
    if not all(instrument.should_run(mod, pass_.info) for instrument in instruments):
        return mod
    for instrument in instruments:
        instrument.run_before_pass(mod, pass_.info)
    start = time.perf_counter()
    new = pass_.transform(mod.copy(), ctx)
    elapsed = time.perf_counter() - start
    if not isinstance(new, IRModule):
        raise OpfusionError(f"pass {pass_.info.name} returned {type(new).__name__}, not an "
                            f"IRModule")
    for instrument in reversed(instruments):
        instrument.run_after_pass(new, pass_.info, elapsed)
    return new


class ModulePass(Pass):
    """A pass made from ``fn(mod, ctx) -> IRModule``."""

    def __init__(self, fn: Callable[[IRModule, PassContext], IRModule], info: PassInfo) -> None:
        self.fn = fn
        self.info = info

    def transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        return self.fn(mod, ctx)


class FunctionPass(Pass):
    """A pass made from ``fn(func, mod, ctx) -> Function``, applied to every global function."""

    def __init__(self, fn: Callable[[Function, IRModule, PassContext], Function],
                 info: PassInfo) -> None:
        self.fn = fn
        self.info = info

    def transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        new = IRModule()
        for name, func in mod.functions.items():
            out = self.fn(func, mod, ctx)
            if not isinstance(out, Function):
                raise OpfusionError(f"function pass {self.info.name} returned "
                                    f"{type(out).__name__} for @{name}, not a Function")
            new[mod.get_global_var(name)] = out
        return new


class Sequential(Pass):
    """Run ``passes`` in order. A pass the context disables (by ``disabled_pass`` or an
    opt_level above the context's) is skipped unless ``required_pass`` names it; each pass's
    ``required`` passes run first."""

    def __init__(self, passes: Sequence[Pass], opt_level: int = 0,
                 name: str = "Sequential", required: Iterable[str] = ()) -> None:
        for item in passes:
            if not isinstance(item, Pass):
                raise OpfusionError(f"Sequential takes passes, got {type(item).__name__} "
                                    f"{item!r}")
        self.passes = list(passes)
        self.info = PassInfo(name, opt_level, tuple(required), "sequential")

    def transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        for item in self.passes:
            if not ctx.pass_enabled(item.info):
                continue
            for required in item.info.required:
                mod = run_instrumented(get_pass(required), mod, ctx)
            mod = run_instrumented(item, mod, ctx)
        return mod


def module_pass(pass_func: Any = None, *, opt_level: int = 0, name: str | None = None,
                required: Iterable[str] = ()) -> Any:
    """Decorate ``fn(mod, ctx)`` (giving a Pass) or a class with ``transform_module(self, mod,
    ctx)`` (giving a factory: calling it with the class's arguments returns a Pass)."""
    return _decorate(pass_func, opt_level, name, required, "module")


def function_pass(pass_func: Any = None, *, opt_level: int = 0, name: str | None = None,
                  required: Iterable[str] = ()) -> Any:
    """Decorate ``fn(func, mod, ctx)`` or a class with ``transform_function(self, func, mod,
    ctx)``; the pass applies it to every global function of the module."""
    return _decorate(pass_func, opt_level, name, required, "function")


def _decorate(pass_func: Any, opt_level: int, name: str | None, required: Iterable[str],
              kind: str) -> Any:
    if not isinstance(opt_level, int) or opt_level < 0:
        raise OpfusionError(f"a pass's opt_level must be an int >= 0, got {opt_level!r}")
    required = tuple(required)

    def wrap(target: Any) -> Any:
        pass_name = name or target.__name__
        info = PassInfo(pass_name, opt_level, required, kind)
        if isinstance(target, type):
            return _class_factory(target, info)
        made = ModulePass(target, info) if kind == "module" else FunctionPass(target, info)
        made.__doc__ = target.__doc__
        return made

    return wrap if pass_func is None else wrap(pass_func)


def _class_factory(cls: type, info: PassInfo) -> Callable[..., Pass]:
    method = "transform_module" if info.kind == "module" else "transform_function"
    if not callable(getattr(cls, method, None)):
        raise OpfusionError(f"{cls.__name__} is decorated as a {info.kind} pass but has no "
                            f"{method} method")

    def factory(*args: Any, **kwargs: Any) -> Pass:
        _refuse_module_argument(info.name, args)
        instance = cls(*args, **kwargs)
        fn = getattr(instance, method)
        made = ModulePass(fn, info) if info.kind == "module" else FunctionPass(fn, info)
        made.instance = instance  # type: ignore[attr-defined]
        return made

    factory.__name__ = cls.__name__
    factory.__doc__ = cls.__doc__
    factory.info = info  # type: ignore[attr-defined]
    return factory
