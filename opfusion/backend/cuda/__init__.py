"""The CUDA backend: CUDA C for NVIDIA GPUs, compiled by NVRTC.

- schedule rules: :mod:`.schedules` (thread binding, shared memory; the default rule for
  the rest);
- code emitter: :mod:`.emitter` (a ``__global__`` function per GPU launch, on the C-family
  printer of :mod:`opfusion.backend.c_family`);
- toolchain: :mod:`.nvrtc` (NVRTC through ``cuda-python``: PTX or a cubin, with no GPU
  needed to compile).

- runtime: :mod:`.runtime` (a device: the CUDA driver through ``cuda-python``, or the
  loop-IR interpreter standing in for a GPU); whole models run in
  :class:`opfusion.compiler.gpu.GPUExecutor` (``opf.compile(mod, target="cuda")``).

Single kernels are not loaded one by one (:meth:`CUDABackend.load` and
:meth:`CUDABackend.build_kernel`, ``opf.build``, raise :class:`~opfusion.errors.DeviceError`).
Every schedule can be checked on any machine, since the loop-IR interpreter runs
thread-bound loops as a GPU does (:mod:`opfusion.tir.interp`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import DeviceError
from .. import Backend
from .emitter import CUDASource, cuda_module
from .nvrtc import compile_cuda


class CUDABackend(Backend):
    """CUDA C for the GPU architecture of ``target`` (``cuda -arch=sm_90``)."""

    device = "cuda"
    tunes_fallback = True

    def rules(self) -> Any:
        """The GPU schedule rules (:mod:`.schedules`)."""
        from .schedules import RULES

        return RULES

    def generate(self, funcs: list[Any], header: str | None = None, model: Any = None
                 ) -> CUDASource:
        """One CUDA source for the kernels of ``funcs`` and the launches of each (a model's
        native entry is the CPU's: the host side of a GPU model is not built yet)."""
        return cuda_module(funcs, header, self.target)

    def build(self, source: CUDASource | str) -> bytes:
        """The cubin of ``source`` for the target's architecture (NVRTC)."""
        return compile_cuda(str(source), self.target.cuda_arch)

    def load(self, source: Any, kernels: Sequence[Any]) -> Any:
        raise DeviceError(self._no_runtime())

    def build_kernel(self, func: Any, name: str, options: Any = None) -> Any:
        raise DeviceError(self._no_runtime())

    def _no_runtime(self) -> str:
        return (f"target {self.target}: CUDA kernels run as whole models "
                "(opf.compile(mod, target='cuda'), a GPUExecutor), not one by one; check a "
                "single GPU schedule with opfusion.tir.interp.run, which runs thread-bound "
                "loops as a GPU does")


BACKEND = CUDABackend

__all__ = ["BACKEND", "CUDABackend", "CUDASource", "compile_cuda", "cuda_module"]
