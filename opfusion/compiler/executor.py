"""The executor: runs a compiled model as a fixed list of kernel calls over planned memory.

Everything that can be decided before the first run is decided at construction: which value
lives where (constants bound once, intermediates in the blocks of the static memory plan),
which pointers each kernel call takes. A run checks the inputs, allocates the results, and
calls the kernels in order."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import OpfusionError
from ..ir.evaluate import evaluate
from ..ir.types import TensorType, TupleType
from .lower_group import LoweredGroup
from .memory_plan import ALIGNMENT, MemoryPlan, PlannedStep


@dataclass
class ExecStep:
    """One kernel call: the group, the callable (a compiled C function, or None for a NumPy
    reference step), the values it reads and the values it writes."""

    group: LoweredGroup
    function: Any
    reads: list[int]
    writes: list[int]
    pointers: list[int | None] = field(default_factory=list)


@dataclass
class ValueInfo:
    """A value of the model: an input (``input_index``), a constant (``constant``), or a
    kernel result."""

    type: TensorType
    input_index: int | None = None
    constant: np.ndarray | None = None


class KernelMismatchError(OpfusionError):
    """A compiled kernel computes other numbers than the reference interpreter."""


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    want = np.asarray(want)
    if want.dtype.kind != "f":
        return 0.0 if np.array_equal(got, want) else float("inf")
    finite = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), finite):
        return float("inf")
    if not finite.any():
        return 0.0
    scale = float(np.max(np.abs(want[finite]))) or 1.0
    return float(np.max(np.abs(got[finite].astype(np.float64) - want[finite]))) / scale


class InputError(OpfusionError):
    """A compiled model was run with missing, unknown or mis-shaped inputs."""


class Executor:
    """Runs steps over values with a memory plan. Built by :func:`opfusion.compile`."""

    def __init__(self, input_names: Sequence[str], values: Sequence[ValueInfo],
                 steps: Sequence[ExecStep], outputs: Sequence[int], plan: MemoryPlan,
                 tuple_output: bool) -> None:
        self.input_names = list(input_names)
        self.values = list(values)
        self.steps = list(steps)
        self.outputs = list(outputs)
        self.plan = plan
        self.tuple_output = tuple_output
        self._blocks = [_aligned_empty(size) for size in plan.block_sizes]
        self._fixed: dict[int, np.ndarray] = {}
        for index, info in enumerate(self.values):
            if info.constant is not None:
                self._fixed[index] = np.require(info.constant, requirements="C")
            elif index in plan.block_of:
                block = self._blocks[plan.block_of[index]]
                self._fixed[index] = _view(block, info.type)
        for step in self.steps:
            step.pointers = [self._fixed[v].ctypes.data if v in self._fixed else None
                             for v in step.reads + step.writes]
        self.last_profile: list[tuple[str, float]] | None = None
        self.modules: dict[str, Any] = {}  # kernel name -> runtime Module (set by the builder)
        self.source_code = ""

    # -- running -----------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, Any] | Sequence[Any] | None = None,
            profile: bool = False) -> list[np.ndarray]:
        """Run on ``feeds`` (input name -> array, or arrays in input order); returns the
        outputs as a list of arrays, as ONNX Runtime does."""
        arrays = dict(self._fixed)
        for index, array in self._bind_inputs(feeds).items():
            arrays[index] = array
        for index in self.outputs:
            if index not in arrays:
                info = self.values[index]
                arrays[index] = np.empty(info.type.shape, info.type.dtype)
        timings: list[tuple[str, float]] = []
        for step in self.steps:
            start = time.perf_counter() if profile else 0.0
            if step.function is None:
                _run_reference(step, arrays)
            else:
                pointers = [p if p is not None else arrays[v].ctypes.data
                            for p, v in zip(step.pointers, step.reads + step.writes)]
                if step.function(*pointers) != 0:
                    raise MemoryError(f"kernel {step.group.name} could not allocate scratch "
                                      f"memory")
            if profile:
                timings.append((step.group.name, time.perf_counter() - start))
        if profile:
            self.last_profile = timings
        return [_fresh(arrays[index], index, self) for index in self.outputs]

    def _bind_inputs(self, feeds: Mapping[str, Any] | Sequence[Any] | None) -> dict[int, Any]:
        positions = {v.input_index: i for i, v in enumerate(self.values)
                     if v.input_index is not None}
        if feeds is None:
            feeds = {}
        if isinstance(feeds, Mapping):
            unknown = [name for name in feeds if name not in self.input_names]
            if unknown:
                raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are "
                                 f"{', '.join(map(repr, self.input_names))}")
            missing = [name for name in self.input_names if name not in feeds]
            if missing:
                raise InputError(f"input {missing[0]!r} is missing; the model's inputs are "
                                 f"{', '.join(map(repr, self.input_names))}")
            ordered = [feeds[name] for name in self.input_names]
        else:
            ordered = list(feeds)
            if len(ordered) != len(self.input_names):
                raise InputError(f"the model takes {len(self.input_names)} input(s) "
                                 f"({', '.join(self.input_names)}), got {len(ordered)}")
        bound = {}
        for position, (name, value) in enumerate(zip(self.input_names, ordered)):
            index = positions[position]
            want = self.values[index].type
            array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
            if array.shape != tuple(want.shape):
                raise InputError(f"input {name!r} must have shape {tuple(want.shape)}, got "
                                 f"{array.shape}")
            if array.dtype != np.dtype(want.dtype):
                raise InputError(f"input {name!r} must be {want.dtype}, got {array.dtype}; "
                                 f"convert it with .astype('{want.dtype}')")
            bound[index] = np.require(array, requirements="C")
        return bound

    # -- inspection ----------------------------------------------------------------------------
    def source(self) -> str:
        """The generated C of all kernels (one translation unit)."""
        return self.source_code

    def profile(self, feeds: Mapping[str, Any] | Sequence[Any] | None = None,
                repeat: int = 10) -> KernelProfile:
        """Run ``repeat`` times and report each kernel's median time with the operators it
        fuses (``print(exe.profile(inputs))`` shows the table)."""
        runs: list[list[tuple[str, float]]] = []
        for _ in range(max(1, repeat)):
            self.run(feeds, profile=True)
            runs.append(list(self.last_profile or []))
        rows = []
        for index, step in enumerate(self.steps):
            times = sorted(run[index][1] for run in runs)
            rows.append((step.group.name, ", ".join(step.group.op_names),
                         times[len(times) // 2], step.function is None))
        return KernelProfile(rows)

    def verify(self, feeds: Mapping[str, Any] | Sequence[Any] | None = None,
               rtol: float = 1e-4) -> list[str]:
        """Run kernel by kernel and compare each with the reference interpreter on the same
        inputs; return one line per kernel, and raise :class:`KernelMismatchError` naming the
        first kernel whose output differs by more than ``rtol`` x max|reference|."""
        arrays = dict(self._fixed)
        arrays.update(self._bind_inputs(feeds))
        for index in self.outputs:
            if index not in arrays:
                info = self.values[index]
                arrays[index] = np.empty(info.type.shape, info.type.dtype)
        report = []
        for step in self.steps:
            func = step.group.function
            if step.function is None:
                _run_reference(step, arrays)
            else:
                step.function(*[arrays[v].ctypes.data for v in step.reads + step.writes])
            if func is None:
                report.append(f"{step.group.name}: not checked (no IR kept after opf.load)")
                continue
            inputs = [arrays[v] for v in step.reads[:len(func.params)]]
            want = evaluate(func, inputs)
            wants = want if isinstance(want, tuple) else (want,)
            for value, expected in zip(step.writes, wants):
                error = _relative_error(arrays[value], expected)
                if not error <= rtol:
                    raise KernelMismatchError(
                        f"kernel {step.group.name} ({', '.join(step.group.op_names)}) differs "
                        f"from the reference interpreter: max error {error:.3g} x max|want| "
                        f"(tolerance {rtol:g})")
            report.append(f"{step.group.name}: ok")
        return report

    @property
    def num_kernels(self) -> int:
        return len(self.steps)

    def export(self, path: Any) -> None:
        """Write this executor to one self-contained file (see :func:`opfusion.load`)."""
        from .artifact import export_executor

        export_executor(self, path)

    def __call__(self, *arrays: Any, **named: Any) -> Any:
        """Run with positional and/or named inputs; one output comes back as an array,
        several as a tuple."""
        if arrays and named:
            feeds: Any = dict(zip(self.input_names, arrays))
            feeds.update(named)
        else:
            feeds = named if named else list(arrays)
        outs = self.run(feeds)
        return tuple(outs) if self.tuple_output else outs[0]


@dataclass
class KernelProfile:
    """Per-kernel median times: rows of (kernel, fused operators, seconds, runs in Python)."""

    rows: list[tuple[str, str, float, bool]]

    @property
    def total_seconds(self) -> float:
        return sum(row[2] for row in self.rows)

    def render(self) -> str:
        total = self.total_seconds or 1.0
        width = max((len(r[0]) for r in self.rows), default=6)
        lines = [f"{'kernel':<{width}}  {'time':>10}  {'share':>6}  operators"]
        for name, ops, seconds, reference in sorted(self.rows, key=lambda r: -r[2]):
            note = " (NumPy reference)" if reference else ""
            lines.append(f"{name:<{width}}  {seconds * 1e3:>8.3f}ms  {seconds / total:>6.1%}  "
                         f"{ops}{note}")
        lines.append(f"{'total':<{width}}  {self.total_seconds * 1e3:>8.3f}ms")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def steps_for_plan(steps: Sequence[ExecStep]) -> list[PlannedStep]:
    return [PlannedStep(tuple(s.reads), tuple(s.writes)) for s in steps]


def _run_reference(step: ExecStep, arrays: dict[int, np.ndarray]) -> None:
    func = step.group.reference_function
    assert func is not None
    inputs: list[Any] = []
    cursor = 0
    for param in func.params:  # tuple parameters take several flattened values
        ty = param.type_annotation
        count = len(ty.fields) if isinstance(ty, TupleType) else 1
        values = [arrays[v] for v in step.reads[cursor:cursor + count]]
        inputs.append(tuple(values) if isinstance(ty, TupleType) else values[0])
        cursor += count
    out = evaluate(func, inputs)
    results = out if isinstance(out, tuple) else (out,)
    for value, result in zip(step.writes, results):
        np.copyto(arrays[value], result)


def _fresh(array: np.ndarray, index: int, executor: Executor) -> np.ndarray:
    # Results that are inputs or constants are copied: the caller may change what it gets.
    info = executor.values[index]
    if info.input_index is not None or info.constant is not None:
        return np.array(array, copy=True)
    return array


def _aligned_empty(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGNMENT
    return raw[offset:offset + nbytes]


def _view(block: np.ndarray, ty: TensorType) -> np.ndarray:
    dtype = np.dtype(ty.dtype)
    count = int(np.prod(ty.shape, dtype=np.int64)) if ty.shape else 1
    return block[:count * dtype.itemsize].view(dtype).reshape(ty.shape)
