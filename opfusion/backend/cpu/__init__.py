"""The CPU backend: C with GCC vector types and OpenMP, built by the system C compiler.

- schedule rules: :mod:`opfusion.topi.schedules` (one per anchor operator) and the default
  schedule of :mod:`opfusion.compiler.lower_group`;
- code emitter: :mod:`.emitter` (on the C-family printer of :mod:`opfusion.backend.c_family`),
  after the loop-planning pass of :mod:`.loop_planning`;
- toolchain: :mod:`.toolchain` (the C compiler driver, with the target's ``-m`` flags, and
  the content-addressed kernel cache);
- module loader: :mod:`.module` (a library's kernel table, checked kernels)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...target import Target
from .. import Backend
from .module import KernelParam, Module, load_kernels
from .toolchain import CompiledLibrary, compile_source, target_flags


class CPUBackend(Backend):
    """C for the CPU of ``target``: vectors as wide as its registers, its ISA flags."""

    device = "cpu"

    def schedule(self, s: Any, anchor: Any, output: Any, op_name: str | None,
                 config: Any = None) -> Any:
        from ...compiler.lower_group import default_schedule
        from ...topi import get_schedule

        rule = get_schedule(op_name) if op_name is not None else None
        if rule is None:
            default_schedule(s)
            return None
        rule(s, anchor, output)
        return None

    def generate(self, funcs: list[Any], header: str | None = None) -> Any:
        from .emitter import codegen_c_module

        if header is None:
            return codegen_c_module(funcs, target=self.target)
        return codegen_c_module(funcs, header=header, target=self.target)

    def build(self, source: str) -> CompiledLibrary:
        return compile_source(source, flags=target_flags(self.target))

    def load(self, source: str, kernels: Sequence[tuple[str, str, Sequence[KernelParam]]]
             ) -> list[Module]:
        """Build ``source`` for the target (or find it cached) and load each ``(name,
        entry_name, params)`` kernel of it."""
        return load_kernels(source, kernels, flags=target_flags(self.target))


BACKEND = CPUBackend

__all__ = ["BACKEND", "CPUBackend", "Target"]
