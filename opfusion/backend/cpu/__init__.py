"""The CPU backend: C with GCC vector types and OpenMP, built by the system C compiler.

- schedule rules: :mod:`.schedules` (one rule per anchor family, each with its knobs and
  a default config from the target; the default rule for the rest);
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
from .module import KernelParam, Module, load_kernel, load_kernels
from .toolchain import CompiledLibrary, compile_source, target_flags


class CPUBackend(Backend):
    """C for the CPU of ``target``: vectors as wide as its registers, its ISA flags."""

    device = "cpu"

    def rules(self) -> Any:
        """The CPU's schedule rules (:mod:`.schedules`)."""
        from .schedules import RULES

        return RULES

    def generate(self, funcs: list[Any], header: str | None = None, model: Any = None) -> Any:
        """One C file for the kernels of a model (and its native entry with ``model``); a
        kernel too small for threads runs on the calling one (the target's
        ``min_parallel_work``), a parallel loop of much work is scheduled ``guided``
        (``BALANCED_WORK``)."""
        from .emitter import BALANCED_WORK, CodegenOptions, codegen_c_module

        options = CodegenOptions(min_parallel_work=None, balanced_work=BALANCED_WORK)
        if header is None:
            return codegen_c_module(funcs, options, target=self.target, model=model)
        return codegen_c_module(funcs, options, header=header, target=self.target, model=model)

    def build(self, source: str) -> CompiledLibrary:
        return compile_source(source, flags=target_flags(self.target))

    def load(self, source: str, kernels: Sequence[tuple[str, str, Sequence[KernelParam]]]
             ) -> list[Module]:
        """Build ``source`` for the target (or find it cached) and load each ``(name,
        entry_name, params)`` kernel of it."""
        return load_kernels(source, kernels, flags=target_flags(self.target))

    def build_kernel(self, func: Any, name: str, options: Any = None) -> Module:
        from .emitter import codegen_c

        source = codegen_c(func, name, options, target=self.target)
        with self.target:  # lowering inside codegen reads the current target
            return load_kernel(name, source.entry_name, source.params, source.code,
                               target_flags(self.target))


BACKEND = CPUBackend

__all__ = ["BACKEND", "CPUBackend", "Target"]
