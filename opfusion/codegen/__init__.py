"""Code generation, the public façade: ``codegen_c(func, name, options, target)`` gives the C of
one PrimFunc for a CPU target. The emitters live with their backends: the shared C-family
printing in :mod:`opfusion.backend.c_family`, the CPU one in
:mod:`opfusion.backend.cpu.emitter`."""

from ..backend.c_names import sanitize_identifier
from ..backend.cpu.emitter import CodegenOptions, CSource, codegen_c

__all__ = ["CSource", "CodegenOptions", "codegen_c", "sanitize_identifier"]
