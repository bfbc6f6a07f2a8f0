"""The runtime: devices, NDArrays and the Ctrl-C bridge to running kernels.

``opf.nd`` is :mod:`opfusion.runtime.ndarray`; ``opf.device`` and ``opf.cpu`` come from
:mod:`opfusion.runtime.device`. Building and loading kernels is the backend's
(:mod:`opfusion.backend.cpu.toolchain`, :mod:`opfusion.backend.cpu.module`)."""

import os

# Kernels use OpenMP. With libgomp's default, threads that finish a parallel loop spin for a
# while; when another process holds one of the cores, the spinning threads take the core from
# the one still working and a model runs 3-5x slower (measured on the 2-core CI machine:
# resnet50 824 ms spinning, 162 ms passive). Sleeping threads cost a few microseconds per
# kernel instead. libgomp reads this when the first kernel library loads; a value the user
# set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from . import ndarray  # noqa: E402
from .device import Device, cpu, device  # noqa: E402
from .ndarray import NDArray  # noqa: E402

nd = ndarray

__all__ = ["Device", "NDArray", "cpu", "device", "nd", "ndarray"]
