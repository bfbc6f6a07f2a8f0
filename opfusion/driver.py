"""build(): the kernel-level pipeline — schedule → loop IR → C → shared library → callable.

    fadd = opf.build(s, [A, B, C], target="c", name="vecadd")
    fadd(a, b, c)                 # opf.nd arrays or NumPy arrays
    print(fadd.get_source())      # the generated C

Each stage is reachable on its own: ``opf.lower`` (loop IR), ``opfusion.codegen.codegen_c``
(C text), ``opfusion.backend.cpu.toolchain.compile_source`` (cached shared library) and
``opfusion.backend.cpu.module.Module`` (loading and argument checks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .backend import get_backend
from .backend.cpu.module import Module
from .codegen import CodegenOptions
from .errors import BuildError
from .target import Target
from .tir.stmt import PrimFunc


def build(inputs: Any, args: Sequence[Any] | None = None, target: str | Target | None = None,
          name: str | None = None, *, options: CodegenOptions | None = None) -> Module:
    """Compile a schedule (with its argument tensors) or a PrimFunc into a callable kernel.

    ``inputs`` is a ``te`` schedule, lowered with ``opf.lower(inputs, args, name=...)``, or a
    :class:`~opfusion.tir.PrimFunc` (then ``args`` must be None). ``name`` is the kernel's
    name (default: the PrimFunc's name, or "main" for a schedule); the exported C symbol is
    that name made into a safe C identifier. ``target``: an :class:`~opfusion.target.Target`
    or a target string (default: the current target, else the host CPU).

    The shared library is cached by content (see :mod:`opfusion.backend.cpu.toolchain`): building
    the same kernel again loads it without running the compiler. Raises BuildError for an
    unsupported target, CompilerNotFoundError when no C compiler is installed and CompileError
    when the compiler rejects the generated source."""
    backend = get_backend(target)
    if isinstance(inputs, PrimFunc):
        if args is not None:
            raise BuildError(
                "build() got a PrimFunc and an argument list; a PrimFunc already has its "
                "parameters, so pass args only with a schedule"
            )
        func = inputs
        kernel_name = func.name if name is None else name
    else:
        if args is None:
            raise BuildError(
                "build() of a schedule needs the argument tensors in order, e.g. "
                "opf.build(s, [A, B, C], target='c')"
            )
        from .te.lower import lower

        kernel_name = "main" if name is None else name
        func = lower(inputs, list(args), name=kernel_name)
    if not isinstance(kernel_name, str) or not kernel_name:
        raise BuildError(f"a kernel name is a non-empty string, not {kernel_name!r}")
    return backend.build_kernel(func, kernel_name, options)
