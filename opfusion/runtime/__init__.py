"""The runtime: devices, NDArrays, the Ctrl-C bridge to running kernels, the models' layout
for their native entry, and how OpenMP's threads wait (:mod:`.openmp`).

``opf.nd`` is :mod:`opfusion.runtime.ndarray`; ``opf.device`` and ``opf.cpu`` come from
:mod:`opfusion.runtime.device`. Building and loading kernels is the backend's
(:mod:`opfusion.backend.cpu.toolchain`, :mod:`opfusion.backend.cpu.module`)."""

from . import ndarray
from .device import Device, cpu, device
from .ndarray import NDArray

nd = ndarray

__all__ = ["Device", "NDArray", "cpu", "device", "nd", "ndarray"]
