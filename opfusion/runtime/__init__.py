"""The runtime: devices, NDArrays, the C compiler driver with its kernel cache, and modules.

``opf.nd`` is :mod:`opfusion.runtime.ndarray`; ``opf.device`` and ``opf.cpu`` come from
:mod:`opfusion.runtime.device`."""

import os

# Kernels use OpenMP. With libgomp's default, threads that finish a parallel loop spin for a
# while; when another process holds one of the cores, the spinning threads take the core from
# the one still working and a model runs 3-5x slower (measured on the 2-core CI machine:
# resnet50 824 ms spinning, 162 ms passive). Sleeping threads cost a few microseconds per
# kernel instead. libgomp reads this when the first kernel library loads; a value the user
# set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from . import ndarray  # noqa: E402
from .compiler import (  # noqa: E402
    DEFAULT_FLAGS,
    CompiledLibrary,
    CompileStats,
    cache_dir,
    compile_source,
    compile_stats,
    find_compiler,
    have_c_compiler,
)
from .device import Device, cpu, device  # noqa: E402
from .module import KernelParam, Module  # noqa: E402
from .ndarray import NDArray  # noqa: E402

nd = ndarray

__all__ = [
    "DEFAULT_FLAGS", "CompileStats", "CompiledLibrary", "Device", "KernelParam", "Module",
    "NDArray", "cache_dir", "compile_source", "compile_stats", "cpu", "device", "find_compiler",
    "have_c_compiler", "nd", "ndarray",
]
