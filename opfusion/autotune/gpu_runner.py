"""Measuring candidate kernels on a GPU: :class:`GPURunner`, the runner of ``opf.tune`` for a
CUDA target.

Each candidate is one fused group's kernel for one config (its CUDA source and launches,
from :func:`~opfusion.autotune.measure.generate_candidates`). :meth:`GPURunner.build`
compiles the candidates with NVRTC for the device's architecture, on several threads, into
the kernel cache. :meth:`GPURunner.run` then measures them one at a time on the device:

- the group's inputs, constants, outputs and global temporaries in one device allocation;
  the outputs filled with NaN first, so that an element no launch writes is caught;
- every launch of the group once, then the outputs compared with the reference
  interpreter's (``options.rtol`` of the largest reference value): a wrong candidate is a
  failed result, never a time;
- the launches timed with device timers (CUDA events): ``options.repeat`` batches, each of
  enough calls to last ``options.min_repeat_seconds``; the median batch's mean is the time,
  and the outputs are checked again after.

Unlike the CPU's :class:`~opfusion.autotune.runner.LocalRunner`, candidates run in this
process: a GPU kernel cannot crash the process (a fault is a CUDA error, reported as the
candidate's failure), and the GPU's clocks do not drift with other tenants of the CPU, so
the timings need no interleaving. A kernel that faults leaves the CUDA context unusable, so
the runner then fails every later candidate with that error instead of measuring on a
broken context. The rules' configs are each checked in the loop-IR interpreter by the
tests, so a fault would be a bug. On :class:`~opfusion.backend.cuda.runtime.
InterpretedDevice` (tests, machines without a GPU) the same runner works unchanged: its
times are the interpreter's, useful for nothing but the checks."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ..compiler.executor import _relative_error
from ..compiler.gpu import align_offset
from ..errors import DeviceError, OpfusionError
from .measure import Candidate, MeasureOptions, MeasureResult, TaskData
from .runner import Runner


class GPURunner(Runner):
    """Builds candidates with NVRTC and measures them on ``device`` (default: this
    machine's GPU through the CUDA driver, opened on first use; see the module
    docstring)."""

    name = "gpu"

    def __init__(self, device: Any = None) -> None:
        self._device = device
        self._broken: str | None = None

    @property
    def device(self) -> Any:
        if self._device is None:
            from ..backend.cuda.runtime import cuda_device

            self._device = cuda_device()
        return self._device

    def build(self, candidates: Sequence[Candidate], workers: int | None = None) -> None:
        """NVRTC compiles of the candidates for the device's architecture, into the kernel
        cache (where the device's ``load`` finds them); none for the interpreter."""
        arch = getattr(self.device, "arch", None)
        if arch is None:
            return
        from ..backend.cuda.nvrtc import compile_cuda_cached

        def compile_one(candidate: Candidate) -> None:
            try:
                compile_cuda_cached(candidate.source, arch)
            except OpfusionError as err:
                candidate.error = f"build: {err}"

        pending = [c for c in candidates if c.error is None]
        with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
            list(pool.map(compile_one, pending))

    def run(self, data: TaskData, candidates: Sequence[Candidate], options: MeasureOptions,
            reference: Candidate | None = None) -> list[MeasureResult]:
        everyone = [*candidates, *([reference] if reference is not None else [])]
        results = [self._measure(data, candidate, options) for candidate in everyone]
        if reference is not None:
            measured = results.pop()
            for result in results:
                result.reference = measured.seconds
        return results

    def _measure(self, data: TaskData, candidate: Candidate,
                 options: MeasureOptions) -> MeasureResult:
        if candidate.error is not None:
            return MeasureResult(candidate.config, error=candidate.error)
        if self._broken is not None:
            return MeasureResult(candidate.config, error=f"failed: {self._broken}")
        try:
            seconds, repeats = measure_candidate(self.device, data, candidate, options)
        except ValueError as err:
            return MeasureResult(candidate.config, error=f"wrong: {err}")
        except DeviceError as err:
            # A fault poisons the context: every later launch would fail the same way.
            self._broken = f"an earlier candidate broke the GPU context: {err}"
            return MeasureResult(candidate.config, error=f"crashed: {err}")
        except OpfusionError as err:
            return MeasureResult(candidate.config, error=f"failed: {err}")
        return MeasureResult(candidate.config, seconds, repeats=repeats)

    def close(self) -> None:
        """Nothing to release: each candidate gives its memory back when measured."""


def measure_candidate(device: Any, data: TaskData, candidate: Candidate,
                      options: MeasureOptions) -> tuple[float, list[float]]:
    """``(median seconds per call, each batch's mean)`` of ``candidate`` on ``device``
    after its outputs matched ``data.expected`` (a ValueError when they do not; see the
    module docstring)."""
    from ..backend.cuda.runtime import Arg

    (code,) = candidate.kernel.groups
    arrays = [*data.inputs, *candidate.constants]
    layout: list[tuple[tuple[int, ...], str]] = [
        *((tuple(a.shape), str(a.dtype)) for a in arrays),
        *((tuple(e.shape), str(e.dtype)) for e in data.expected),
        *((tuple(int(d) for d in shape), dtype) for shape, dtype in code.temporaries)]
    if len(layout) - len(code.temporaries) != len(candidate.prim_func.params):
        raise OpfusionError(f"candidate {candidate.config}: its kernel takes "
                            f"{len(candidate.prim_func.params)} buffers, the task gives "
                            f"{len(layout) - len(code.temporaries)}")
    args, offset = [], 0
    for shape, dtype in layout:
        args.append(Arg(offset, shape, dtype))
        offset = align_offset(offset + args[-1].nbytes)  # as the GPU executor places them
    outputs = args[len(arrays):len(arrays) + len(data.expected)]
    device.allocate(offset)
    try:
        for arg, array in zip(args, arrays):
            device.upload(arg.offset, np.ascontiguousarray(array, dtype=arg.dtype))
        for arg in outputs:  # poisoned: an element no launch writes fails the check
            poison = np.nan if np.dtype(arg.dtype).kind == "f" else 0
            device.upload(arg.offset, np.full(arg.shape, poison, arg.dtype))
        device.load(candidate.kernel, {code.name: candidate.prim_func})
        launches = [device.prepare(code.name, number, launch.symbol, launch.grid,
                                   launch.block, args)
                    for number, launch in enumerate(code.launches)]

        def call(times: int = 1) -> None:
            for _ in range(times):
                for launch in launches:
                    launch()

        def check(when: str) -> None:
            device.synchronize()
            for index, (arg, want) in enumerate(zip(outputs, data.expected)):
                error = _relative_error(device.download(arg.offset, arg.shape, arg.dtype),
                                        want)
                tolerance = data.tolerance(options)
                if not error <= tolerance:
                    raise ValueError(f"output {index} differs from the reference{when}: max "
                                     f"error {error:.3g} x max|reference| (tolerance "
                                     f"{tolerance:g})")

        call()
        check("")
        start = device.timer()
        call()
        once = max(device.elapsed_ms(start) * 1e-3, 1e-7)
        number = max(1, int(options.min_repeat_seconds / once))
        repeats = []
        for _ in range(options.repeat):
            start = device.timer()
            call(number)
            repeats.append(device.elapsed_ms(start) * 1e-3 / number)
        check(" after the timed runs")
        return float(statistics.median(repeats)), repeats
    finally:
        device.release()


__all__ = ["GPURunner", "measure_candidate"]
