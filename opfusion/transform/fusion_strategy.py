"""Fusion strategies: a name (``"tvm"``, ``"cinn"``, ``"none"``) for each way of grouping a
model's operators into kernels, and the pipeline that does it.

``opf.compile(..., fusion=name)``, the ``fusion.strategy`` pass config, ``opfusion compile
--fusion`` and docs/fusion.md all read this one registry::

    def fuse_twice(mod, opt_level):
        return FusionMerge()(FusionMerge()(FuseOps(fuse_opt_level=opt_level)(mod)))

    register_fusion_strategy("twice", fuse_twice, "FuseOps, then FusionMerge twice")
    exe = opf.compile(mod, fusion="twice")

A pipeline takes the optimized, typed module and the opt_level it is compiled at, and returns
the module with its operators grouped into primitive functions (every operator in one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import OpfusionError
from ..ir.module import IRModule
from .context import register_pass_config
from .fuse_ops import FuseOps
from .fusion import FusionMerge

#: ``pipeline(mod, opt_level) -> fused module``.
FusionPipeline = Callable[[IRModule, int], IRModule]


@dataclass(frozen=True)
class FusionStrategy:
    """A registered strategy: its ``name``, its ``pipeline``, a one-line ``doc`` (shown by
    ``opfusion compile --help``) and whether ``opf.compile`` first replaces operator chains
    by composite operators (``patterns``: FuseAttention's ``nn.attention``, before the layout
    passes, since a product padded for its register tiles no longer looks like attention)."""

    name: str
    pipeline: FusionPipeline
    doc: str
    patterns: bool = True


_STRATEGIES: dict[str, FusionStrategy] = {}


def register_fusion_strategy(name: str, fn: FusionPipeline, doc: str,
                             override: bool = False, patterns: bool = True) -> FusionStrategy:
    """Make ``fn`` the fusion strategy ``name``. Registering a taken name is an error unless
    ``override`` is true. ``patterns=False``: no composite-operator rewrites (FuseAttention)
    before the layout passes (see :class:`FusionStrategy`)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise OpfusionError(f"a fusion strategy's name is an identifier, got {name!r}")
    if not callable(fn):
        raise OpfusionError(f"fusion strategy {name!r}: the pipeline must be a function "
                            f"(mod, opt_level) -> IRModule, got {type(fn).__name__}")
    if name in _STRATEGIES and not override:
        raise OpfusionError(f"fusion strategy {name!r} is already registered; pass "
                            f"override=True to replace it")
    strategy = FusionStrategy(name, fn, doc, patterns)
    _STRATEGIES[name] = strategy
    return strategy


def unregister_fusion_strategy(name: str) -> None:
    """Remove the strategy ``name`` (see :func:`register_fusion_strategy`)."""
    get_fusion_strategy(name)
    del _STRATEGIES[name]


def fusion_strategies() -> dict[str, FusionStrategy]:
    """Every registered strategy by name, in registration order (the built-in ones first)."""
    return dict(_STRATEGIES)


def get_fusion_strategy(name: str) -> FusionStrategy:
    """The strategy registered as ``name``; an unknown name is an OpfusionError listing the
    known ones."""
    strategy = _STRATEGIES.get(name) if isinstance(name, str) else None
    if strategy is None:
        raise OpfusionError(f"unknown fusion strategy {name!r}; choose one of "
                            f"{', '.join(_STRATEGIES)}")
    return strategy


def _fuse_tvm(mod: IRModule, opt_level: int) -> IRModule:
    return FuseOps(fuse_opt_level=opt_level)(mod)


def _fuse_cinn(mod: IRModule, opt_level: int) -> IRModule:
    mod = FuseOps(fuse_opt_level=opt_level)(mod)
    # At opt_level 0 nothing is fused, whatever the strategy.
    return FusionMerge()(mod) if opt_level > 0 else mod


def _fuse_none(mod: IRModule, opt_level: int) -> IRModule:
    return FuseOps(fuse_opt_level=0)(mod)


register_fusion_strategy("tvm", _fuse_tvm, "FuseOps (TVM's post-dominator rules)")
register_fusion_strategy("cinn", _fuse_cinn,
                         "FuseOps, then FusionMerge with the registered CINN-style policies")
register_fusion_strategy("none", _fuse_none, "every operator its own kernel", patterns=False)

register_pass_config(
    "fusion.strategy", str, "tvm",
    "Which fusion opf.compile runs: the name of a registered fusion strategy (see "
    "opf.transform.fusion_strategies(): 'tvm', 'cinn', 'none', ...).",
    validate=get_fusion_strategy)
