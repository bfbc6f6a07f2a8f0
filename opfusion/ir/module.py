"""IRModule: the named functions of a program (``@main`` and, after fusion, its helpers)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ..errors import OpfusionError
from .expr import Expr, Function, GlobalVar
from .visitor import free_vars


class IRModule:
    """An ordered mapping from global names to functions.

    Passes treat modules as values: they build a new module instead of changing their input
    (``mod.with_function``); ``mod["f"] = func`` exists for interactive use."""

    def __init__(self, functions: Mapping[str | GlobalVar, Function] | None = None) -> None:
        self._functions: dict[str, Function] = {}
        self._global_vars: dict[str, GlobalVar] = {}
        for name, func in (functions or {}).items():
            self[name] = func

    @staticmethod
    def from_expr(expr: Expr) -> IRModule:
        """A module whose ``@main`` is ``expr`` (wrapped in a function of its free variables
        when it is not already a function)."""
        if not isinstance(expr, Function):
            expr = Function(free_vars(expr), expr)
        return IRModule({"main": expr})

    def __getitem__(self, name: str | GlobalVar) -> Function:
        key = name.name_hint if isinstance(name, GlobalVar) else name
        try:
            return self._functions[key]
        except KeyError:
            known = ", ".join("@" + n for n in self._functions) or "none"
            raise OpfusionError(f"the module has no function @{key} (it has {known})") from None

    def __setitem__(self, name: str | GlobalVar, func: Function) -> None:
        key = name.name_hint if isinstance(name, GlobalVar) else str(name)
        if not isinstance(func, Function):
            raise OpfusionError(f"@{key} must be a Function, got {type(func).__name__}")
        self._functions[key] = func
        if isinstance(name, GlobalVar):
            self._global_vars[key] = name
        else:
            self._global_vars.setdefault(key, GlobalVar(key))

    def __contains__(self, name: object) -> bool:
        key = name.name_hint if isinstance(name, GlobalVar) else name
        return key in self._functions

    def __iter__(self) -> Iterator[str]:
        return iter(self._functions)

    def __len__(self) -> int:
        return len(self._functions)

    @property
    def functions(self) -> dict[str, Function]:
        """Name -> function, in definition order (a copy)."""
        return dict(self._functions)

    def get_global_var(self, name: str) -> GlobalVar:
        """The GlobalVar that calls of ``@name`` use."""
        if name not in self._global_vars:
            raise OpfusionError(f"the module has no function @{name}")
        return self._global_vars[name]

    def with_function(self, name: str | GlobalVar, func: Function) -> IRModule:
        """A new module with ``name`` bound to ``func``; this one is unchanged."""
        new = self.copy()
        new[name] = func
        return new

    def copy(self) -> IRModule:
        new = IRModule()
        new._functions = dict(self._functions)
        new._global_vars = dict(self._global_vars)
        return new

    def astext(self, show_meta_data: bool = True) -> str:
        """The module as text IR; see :mod:`opfusion.ir.printer`."""
        from .printer import astext

        return astext(self, show_meta_data=show_meta_data)

    def __str__(self) -> str:
        return self.astext()

    def __repr__(self) -> str:
        return f"IRModule({', '.join('@' + n for n in self._functions)})"
