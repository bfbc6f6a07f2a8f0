"""Building and measuring candidate kernels: each config of a task becomes one kernel,
compiled here, then timed and checked in a separate process.

- :func:`build_candidates` lowers each config (in this process: lowering is Python) and runs
  the C compiler on them in parallel threads (the compiler is a separate program, so the
  threads really overlap); the libraries land in the kernel cache, keyed by content.
- A runner (:class:`LocalRunner`, or :class:`~opfusion.autotune.ray_runner.RayRunner`) measures
  them **one at a time** in a worker process (:mod:`.worker`): it loads the library the
  build made, runs the kernel on the task's inputs and compares every output with the
  reference interpreter's before its time counts; a candidate that crashes the worker,
  hangs past the timeout or computes other numbers is a failed :class:`MeasureResult` and
  costs one trial, not the run.

Builds and measurements never overlap: a build batch finishes before its measurements start,
so the compiler does not share the cores with a kernel being timed."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backend import get_backend
from ..backend.schedule_rule import Config
from ..compiler.lower_group import lower_primitive_function
from ..errors import OpfusionError
from ..ir.evaluate import evaluate
from .task import Task, task_inputs

#: Default relative tolerance of a candidate's outputs (x max|reference|): every config of a
#: space computes the same numbers up to rounding (Winograd's transforms round the most).
DEFAULT_RTOL = 1e-3

#: The tolerance of a task whose tensor cores truncate their operands (``-tf32=fast``): up to
#: one TF32 ulp an operand, toward zero, moves a product by about 8e-4 of its largest value
#: (random operands, 64 to 4608 steps), near DEFAULT_RTOL; rounded operands move it 3e-4.
TRUNCATED_TF32_RTOL = 2e-3


@dataclass
class Candidate:
    """One config of a task built into a kernel: its C ``source``, the exported
    ``entry_name`` and ``params``, the compiler ``flags``; ``prim_func`` is the lowered loop
    IR (for the cost model's features). ``error`` says why it could not be built (then
    nothing else is set)."""

    config: Config
    source: str = ""
    entry_name: str = ""
    params: tuple[Any, ...] = ()
    flags: tuple[str, ...] = ()
    prim_func: Any = None
    error: str | None = None
    #: For a GPU target: the generated :class:`~opfusion.backend.cuda.emitter.CUDASource`
    #: (``source`` is its text) and the group's constants, which a runner uploads.
    kernel: Any = None
    constants: tuple[np.ndarray, ...] = ()


@dataclass
class MeasureResult:
    """The outcome of one candidate: ``seconds`` (the median time of one kernel call) when it
    ran and matched the reference, else ``error`` (``build: ...``, ``crashed: ...``,
    ``timeout: ...``, ``wrong: ...``, ``failed: ...``); ``reference``: the time of the
    runner's reference candidate timed interleaved with it, when one was given."""

    config: Config
    seconds: float | None = None
    error: str | None = None
    repeats: list[float] = field(default_factory=list)
    reference: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.seconds is not None


@dataclass
class TaskData:
    """What a worker needs to check a task's candidates: its ``inputs`` (one array per
    parameter), the reference interpreter's ``expected`` outputs on them, and the least
    tolerance its arithmetic needs (``rtol``, x max|reference|; the options' own where
    larger)."""

    key: str
    inputs: list[np.ndarray]
    expected: list[np.ndarray]
    rtol: float = 0.0

    def tolerance(self, options: MeasureOptions) -> float:
        """The output tolerance a candidate is checked with: ``options.rtol``, or this
        task's where its arithmetic needs more."""
        return max(options.rtol, self.rtol)


@dataclass(frozen=True)
class MeasureOptions:
    """How a candidate is timed: after one warm-up call, ``repeat`` batches of calls, each
    batch at least ``min_repeat_seconds`` long (so short kernels run many times); the median
    batch's mean is the time. ``timeout`` bounds one candidate's whole measurement (a hang
    costs that much once); ``rtol`` is the output tolerance (x max|reference|).
    ``flush_cache`` times ``repeat`` single calls instead, each after writing over a buffer
    four times the last-level cache (at most 256 MiB, ``worker.FLUSH_MAX_BYTES``): what a
    kernel sees in a model whose weights do not fit in the cache (ResNet-50's 100 MB), where
    a warm measurement would favour configs that read the weights more often."""

    repeat: int = 5
    min_repeat_seconds: float = 0.02
    timeout: float = 20.0
    rtol: float = DEFAULT_RTOL
    flush_cache: bool = False

    def __post_init__(self) -> None:
        if self.repeat < 1 or not math.isfinite(self.timeout) or self.timeout <= 0:
            raise OpfusionError(f"measure options need repeat >= 1 and a positive timeout, "
                                f"not repeat={self.repeat}, timeout={self.timeout}")


def task_data(task: Task, seed: int = 0) -> TaskData:
    """Standard-normal inputs for ``task`` and the reference interpreter's outputs on them."""
    inputs = task_inputs(task, seed)
    result = evaluate(task.func, inputs)
    expected = list(result) if isinstance(result, tuple) else [result]
    truncates = task.target.allow_tf32 and not task.target.tf32_rounds_operands
    return TaskData(task.key, inputs, [np.asarray(e) for e in expected],
                    TRUNCATED_TF32_RTOL if truncates else 0.0)


def build_candidates(task: Task, configs: Sequence[Config], workers: int | None = None
                     ) -> list[Candidate]:
    """:func:`generate_candidates`, then :func:`compile_candidates` here."""
    candidates = generate_candidates(task, configs)
    compile_candidates(candidates, workers)
    return candidates


def generate_candidates(task: Task, configs: Sequence[Config]) -> list[Candidate]:
    """Lower each config of ``task`` and generate its C (in this process, one by one: it is
    Python). A config that fails to lower is a candidate with ``error`` set."""
    backend = get_backend(task.target)
    return [_generate(task, config, backend) for config in configs]


def compile_candidates(candidates: Sequence[Candidate], workers: int | None = None) -> None:
    """Run the C compiler on the candidates (not failed yet) on ``workers`` threads (default:
    every core), leaving their libraries in the kernel cache; a failure sets ``error``."""
    pending = [c for c in candidates if c.error is None]
    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        list(pool.map(_compile, pending))


def _generate(task: Task, config: Config, backend: Any) -> Candidate:
    """The candidate's loop IR and C source (not yet compiled)."""
    try:
        group = lower_primitive_function(task.func, f"tune_{task.key[:12]}", backend, config)
        with task.target:
            generated = backend.generate([group.prim_func])
    except OpfusionError as err:
        return Candidate(config, error=f"build: {err}")
    if task.target.device != "cpu":  # CUDA: compiled and measured by a GPURunner
        return Candidate(config, generated.code, prim_func=group.prim_func, kernel=generated,
                         constants=tuple(group.constants))
    source, parts = generated
    from ..backend.cpu.toolchain import target_flags  # the CPU backend's: C is what we tune

    part = parts[0]
    flags = target_flags(task.target)
    return Candidate(config, source, part.entry_name, tuple(part.params), flags,
                     group.prim_func)


def _compile(candidate: Candidate) -> None:
    from ..backend.cpu.toolchain import compile_source

    try:
        compile_source(candidate.source, flags=candidate.flags)
    except OpfusionError as err:
        candidate.error = f"build: {err}"
