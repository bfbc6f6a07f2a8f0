"""build(): the kernel-level pipeline — schedule → loop IR → C → shared library → callable.

    fadd = opf.build(s, [A, B, C], target="c", name="vecadd")
    fadd(a, b, c)                 # opf.nd arrays or NumPy arrays
    print(fadd.get_source())      # the generated C

Each stage is reachable on its own: ``opf.lower`` (loop IR), ``opfusion.codegen.codegen_c``
(C text), ``opfusion.runtime.compile_source`` (cached shared library) and
``opfusion.runtime.Module`` (loading and argument checks)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .codegen.c import CodegenOptions, codegen_c
from .errors import BuildError
from .runtime.module import Module, load_kernel
from .tir.stmt import PrimFunc

#: Targets build() accepts. "llvm" is accepted because TVM scripts name the host CPU that way;
#: opfusion generates C for it either way.
_HOST_TARGETS = ("c", "llvm")


def _target_name(target: object) -> str:
    if target is None:
        return "c"
    name = getattr(target, "kind", target)
    name = getattr(name, "name", name)
    if isinstance(name, str):
        base = name.split()[0].strip().lower() if name.strip() else ""
        if base in _HOST_TARGETS:
            return "c"
        if base in ("cuda", "rocm", "opencl", "metal", "vulkan", "nvptx"):
            raise BuildError(
                f"target {name!r} is not supported yet: opfusion generates C for the host CPU "
                "only. Use target='c'."
            )
    raise BuildError(f"unknown target {target!r}; opfusion builds for target='c' (the host CPU)")


def build(inputs: Any, args: Sequence[Any] | None = None, target: object = "c",
          name: str | None = None, *, options: CodegenOptions | None = None) -> Module:
    """Compile a schedule (with its argument tensors) or a PrimFunc into a callable kernel.

    ``inputs`` is a ``te`` schedule, lowered with ``opf.lower(inputs, args, name=...)``, or a
    :class:`~opfusion.tir.PrimFunc` (then ``args`` must be None). ``name`` is the kernel's
    name (default: the PrimFunc's name, or "main" for a schedule); the exported C symbol is
    that name made into a safe C identifier. ``target`` must be "c" (the host CPU).

    The shared library is cached by content (see :mod:`opfusion.runtime.compiler`): building
    the same kernel again loads it without running the compiler. Raises BuildError for an
    unsupported target, CompilerNotFoundError when no C compiler is installed and CompileError
    when the compiler rejects the generated source."""
    _target_name(target)
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
    source = codegen_c(func, kernel_name, options)
    return load_kernel(kernel_name, source.entry_name, source.params, source.code)
