"""The measuring process: ``python -m opfusion.autotune.worker``, started by a runner.

It reads requests from its standard input and answers on its standard output (the
descriptor it had at start; its ``print`` output goes to standard error instead, so nothing
else writes into the answers), each message a length-prefixed pickle. Pickle is safe here
only because both ends are this package, connected by a private pipe; nothing read from disk
is unpickled. Requests:

- ``("task", TaskData)``: the inputs and reference outputs of the candidates that follow;
- ``("load", key, MeasureRequest)``: load a candidate's library (built by the parent and
  found in the kernel cache, or compiled here when the cache is another machine's), run it
  and compare its outputs with the reference's; answers ``("ok", seconds of one call)`` or
  ``("error", message)``;
- ``("time", [key, ...], MeasureOptions)``: time loaded candidates interleaved
  (:func:`time_interleaved`); answers ``("ok", [(median, repeats), ...])`` or an error;
- ``("stop",)``.

A candidate that crashes takes this process with it and one that hangs is killed by the
runner: either way the runner records the failure and starts a fresh worker."""

from __future__ import annotations

import os
import pickle
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

from ..runtime.ndarray import aligned_copy
from .measure import MeasureOptions, TaskData

#: The length prefix of every message: 8 bytes, little-endian.
HEADER = struct.Struct("<Q")


@dataclass
class MeasureRequest:
    """One candidate to measure: its C source, exported entry and params, compiler flags
    (the library is found in the cache by these) and how to time it."""

    source: str
    entry_name: str
    params: tuple[Any, ...]
    flags: tuple[str, ...]
    options: MeasureOptions


def write_message(stream: BinaryIO, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def read_message(stream: BinaryIO) -> Any:
    header = stream.read(HEADER.size)
    if len(header) < HEADER.size:
        raise EOFError("the other end closed the pipe")
    (length,) = HEADER.unpack(header)
    data = stream.read(length)
    if len(data) < length:
        raise EOFError("the other end closed the pipe mid-message")
    return pickle.loads(data)


class Loaded:
    """A candidate loaded in this worker: its kernel, its output buffers and argument
    pointers, and the time of one call (from loading)."""

    def __init__(self, request: MeasureRequest, data: TaskData) -> None:
        from ..backend.cpu.module import load_kernels

        self.module = load_kernels(request.source,
                                   [("candidate", request.entry_name, request.params)],
                                   request.flags)[0]
        self.function = self.module._function
        # At 64-byte boundaries, as the executor's arena and constants are: from arrays
        # NumPy allocated (16-byte aligned) every vector load of a weight spans two cache
        # lines, which timed a ResNet-50 1x1 layer 1.1x slower than the model runs it and
        # ranked configs by a cost the model never pays.
        self.inputs = [aligned_copy(np.ascontiguousarray(a)) for a in data.inputs]
        self.outputs = [aligned_copy(np.full(e.shape, np.nan, e.dtype) if e.dtype.kind == "f"
                                     else np.zeros(e.shape, e.dtype)) for e in data.expected]
        self.pointers = [a.ctypes.data for a in self.inputs + self.outputs]
        self.once = 0.0

    def call(self) -> None:
        status = self.function(*self.pointers)
        if status != 0:
            raise RuntimeError(f"the kernel returned status {status}")

    def check(self, data: TaskData, rtol: float, when: str) -> None:
        _check(self.outputs, data.expected, rtol, when)


def load(request: MeasureRequest, data: TaskData) -> Loaded:
    """Load one candidate, run it once and compare its outputs with the reference
    (ValueError when they differ), then time one call."""
    loaded = Loaded(request, data)
    loaded.call()
    loaded.check(data, data.tolerance(request.options), "")
    start = time.perf_counter()
    loaded.call()
    loaded.once = max(time.perf_counter() - start, 1e-7)
    return loaded


def time_interleaved(candidates: list[Loaded], data: TaskData, options: MeasureOptions
                     ) -> list[tuple[float, list[float]]]:
    """Time loaded candidates **interleaved**: each of ``options.repeat`` rounds runs a batch
    of every candidate in turn (each batch at least ``min_repeat_seconds`` of calls), so a
    machine that slows down or speeds up over the seconds this takes (other tenants, clock
    changes) moves every candidate alike and their ratios hold. Returns each candidate's
    (median seconds per call, each batch's mean) and checks every output again after."""
    repeats: list[list[float]] = [[] for _ in candidates]
    flush = _flush_buffer() if options.flush_cache else None
    numbers = [1 if flush is not None else max(1, int(options.min_repeat_seconds / c.once))
               for c in candidates]
    for _ in range(options.repeat):
        for index, candidate in enumerate(candidates):
            if flush is not None:
                flush += 1.0
            start = time.perf_counter()
            for _ in range(numbers[index]):
                candidate.call()
            repeats[index].append((time.perf_counter() - start) / numbers[index])
    for candidate in candidates:
        candidate.check(data, data.tolerance(options), " after the timed runs")
    return [(float(np.median(r)), r) for r in repeats]


def _check(got: list[np.ndarray], want: list[np.ndarray], rtol: float, when: str) -> None:
    from ..compiler.executor import _relative_error

    for index, (a, b) in enumerate(zip(got, want)):
        error = _relative_error(a, b)
        if not error <= rtol:
            raise ValueError(f"output {index} differs from the reference{when}: max error "
                             f"{error:.3g} x max|reference| (tolerance {rtol:g})")


#: The most a cache flush writes. A virtual machine may report its host's whole L3, shared
#: with other tenants: 480 MiB on a Xeon here, whose four-fold flush wrote 1.9 GB before
#: every timed call (about 0.15 s each, most of a cold tuning run's time). ResNet-50's
#: kernels summed 29.3 ms each timed after writing 64 MB, 30.3 ms in the model's order and
#: 24.5 ms warm: a flush of this size already shows a model's cold caches.
FLUSH_MAX_BYTES = 256 << 20


def flush_bytes() -> int:
    """What a cache flush writes: four times the host's last-level cache (32 MiB if the OS
    does not say), at most FLUSH_MAX_BYTES."""
    from ..target.host import host_cache_bytes

    caches = host_cache_bytes()
    return min(4 * max(caches.values(), default=32 << 20), FLUSH_MAX_BYTES)


def _flush_buffer() -> np.ndarray:
    """A buffer of :func:`flush_bytes`, to write over between timed calls."""
    return np.zeros(flush_bytes() // 8, np.float64)


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """Answer requests until ``("stop",)`` or the end of the input."""
    data: TaskData | None = None
    loaded: dict[int, Loaded] = {}
    while True:
        try:
            message = read_message(requests)
        except EOFError:
            return
        kind = message[0]
        if kind == "stop":
            return
        if kind == "task":
            data, loaded = message[1], {}
            write_message(answers, ("ok",))
            continue
        try:
            if data is None:
                raise RuntimeError("no task was given before the candidate")
            if kind == "load":
                loaded[message[1]] = load(message[2], data)
                write_message(answers, ("ok", loaded[message[1]].once))
            elif kind == "time":
                chosen = [loaded[key] for key in message[1]]
                write_message(answers, ("ok", time_interleaved(chosen, data, message[2])))
            else:
                raise RuntimeError(f"unknown request {kind!r}")
        except Exception as err:  # noqa: BLE001 - any failure of a candidate is its result
            write_message(answers, ("error", f"{type(err).__name__}: {err}"))


def main() -> None:
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, never into the answers
    serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
