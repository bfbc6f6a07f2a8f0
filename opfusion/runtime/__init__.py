"""The runtime: devices, NDArrays, the C compiler driver with its kernel cache, and modules.

``opf.nd`` is :mod:`opfusion.runtime.ndarray`; ``opf.device`` and ``opf.cpu`` come from
:mod:`opfusion.runtime.device`."""

from . import ndarray
from .compiler import (
    DEFAULT_FLAGS,
    CompiledLibrary,
    CompileStats,
    cache_dir,
    compile_source,
    compile_stats,
    find_compiler,
    have_c_compiler,
)
from .device import Device, cpu, device
from .module import KernelParam, Module
from .ndarray import NDArray

nd = ndarray

__all__ = [
    "DEFAULT_FLAGS", "CompileStats", "CompiledLibrary", "Device", "KernelParam", "Module",
    "NDArray", "cache_dir", "compile_source", "compile_stats", "cpu", "device", "find_compiler",
    "have_c_compiler", "nd", "ndarray",
]
