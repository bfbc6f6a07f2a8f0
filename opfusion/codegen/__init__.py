"""Code generation: loop IR (PrimFunc) to source text. C for the host CPU; CUDA later."""

from .c import CodegenOptions, CSource, codegen_c
from .c_names import sanitize_identifier

__all__ = ["CSource", "CodegenOptions", "codegen_c", "sanitize_identifier"]
