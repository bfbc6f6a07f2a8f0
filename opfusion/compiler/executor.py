"""The executor: runs a compiled model as a fixed list of kernel calls over planned memory.

Everything that can be decided before the first run is decided at construction: which value
lives where (constants bound once, intermediates in the blocks of the static memory plan,
one workspace buffer), which pointers each kernel call takes. A run checks the inputs,
allocates the results, and makes one foreign call: the library's native entry
(:mod:`opfusion.backend.cpu.model_entry`) calls every kernel in order over the workspace.
Steps without native code (the NumPy reference) are run here between calls of the entry.

Runs may come from many threads at once, as with ONNX Runtime's ``InferenceSession.run``. The
intermediates of a run live in a :class:`Workspace` (the plan's blocks and every kernel's
argument pointers into them) that the run has to itself: it takes one from the executor's
:class:`WorkspacePool` and gives it back when it ends, so concurrent runs never share memory
and a steady state allocates no workspace. Only taking and giving back hold a lock; the
kernels of concurrent runs execute in parallel (ctypes releases the GIL).

Ctrl-C stops a run within one task of its current kernel, however long the kernel: the kernels
poll a cancellation flag that a SIGINT handler sets (:mod:`opfusion.runtime.interrupt`), and
the run raises :class:`opfusion.errors.RunInterrupted`, a KeyboardInterrupt. Its workspace goes
back to the pool half-written, which is harmless: every run writes each intermediate before
reading it."""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OpfusionError, OutOfMemoryError, RunInterrupted
from ..ir.evaluate import evaluate
from ..ir.expr import Function
from ..ir.types import TensorType, TupleType
from ..runtime import interrupt
from ..runtime.interrupt import KERNEL_CANCELLED
from ..runtime.model_layout import MODEL_BAD_RANGE, NO_KERNEL, ModelCall, model_layout
from ..runtime.ndarray import aligned_copy
from ..target import Target, host_target
from .lower_group import LoweredGroup
from .memory_plan import MemoryPlan, PlannedStep, allocate
from .signature import (
    NodeArg,
    check_output_names,
    default_output_names,
    output_positions,
    parse_run_arguments,
)


@dataclass
class ExecStep:
    """One kernel call: the group, the callable (a compiled C function, or None for a NumPy
    reference step), the values it reads and the values it writes."""

    group: LoweredGroup
    function: Any
    reads: list[int]
    writes: list[int]


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


@dataclass
class Workspace:
    """The memory of one run in progress: ``buffer`` (one aligned byte array holding the
    memory plan's ``blocks`` one after another, as views), ``arrays`` (every constant, shared
    read-only by all workspaces, and every planned intermediate as a view of ``buffer``, by
    value index) and ``pointers`` (per step, the address of each argument in ``reads +
    writes`` order, None where the run binds it: inputs and results). ``inputs`` and
    ``outputs`` are the pointer arrays that a native run fills, and ``call`` the native
    entry's argument (pointing at them and at ``buffer``; ``call_address`` its address)."""

    buffer: np.ndarray
    blocks: list[np.ndarray]
    arrays: dict[int, np.ndarray]
    pointers: list[list[int | None]]
    inputs: Any = None
    outputs: Any = None
    call: Any = None
    call_address: int = 0


class WorkspacePool:
    """A thread-safe free list of workspaces: :meth:`take` pops a free one (or builds one
    when all are in use), :meth:`give` pushes it back. The push and pop are single list
    operations, atomic under the GIL, and only counting a new workspace takes a lock, so
    the pool never serialises runs, and it holds at most as many workspaces as there were
    runs in progress at once (``built``)."""

    def __init__(self, build: Callable[[], Workspace]) -> None:
        self._build = build
        self._free: list[Workspace] = []
        self._lock = threading.Lock()
        self._built = 0

    @property
    def built(self) -> int:
        """How many workspaces this pool has built (free or in use)."""
        return self._built

    def take(self) -> Workspace:
        """A workspace for the caller's exclusive use until it :meth:`give`s it back."""
        try:
            return self._free.pop()  # atomic: a list's pop holds the GIL throughout
        except IndexError:
            pass
        with self._lock:
            self._built += 1
        return self._build()  # outside the lock: allocating may take a while

    def give(self, workspace: Workspace) -> None:
        """Return a workspace taken with :meth:`take`; its contents need not be clean (every
        run writes each intermediate before it reads it)."""
        self._free.append(workspace)  # atomic, as pop


class Executor:
    """Runs steps over values with a memory plan. Built by :func:`opfusion.compile`.

    :meth:`run`, :meth:`__call__`, :meth:`profile` and :meth:`verify` may be called from
    several threads at once: each run works in a workspace of its own (see the module
    docstring), and the arrays it returns are allocated for that run alone."""

    def __init__(self, input_names: Sequence[str], values: Sequence[ValueInfo],
                 steps: Sequence[ExecStep], outputs: Sequence[int], plan: MemoryPlan,
                 tuple_output: bool, output_names: Sequence[str] | None = None) -> None:
        self.input_names = list(input_names)
        self.values = list(values)
        self.steps = list(steps)
        self.outputs = list(outputs)
        #: The outputs' names: the model's (an ONNX graph's outputs), else output_0, ...
        names = default_output_names(len(self.outputs))
        if output_names is not None:
            names = check_output_names(output_names, len(self.outputs))
            if names is None:
                raise OpfusionError(f"output_names must be {len(self.outputs)} strings, got "
                                    f"{output_names!r}")
        self.output_names = names
        self.plan = plan
        self.tuple_output = tuple_output
        self._constants = {index: aligned_copy(info.constant)
                           for index, info in enumerate(self.values)
                           if info.constant is not None}
        self._arguments = [step.reads + step.writes for step in self.steps]
        self._value_names = _value_names(self.input_names, self.values, self.steps, plan)
        # Decided once, not per run: where each input goes, which outputs a run allocates.
        self._input_values = [index for _, index in sorted(
            (info.input_index, index) for index, info in enumerate(self.values)
            if info.input_index is not None)]
        self._result_values = [index for index in dict.fromkeys(self.outputs)
                               if self.values[index].input_index is None
                               and index not in self._constants]
        #: The workspaces of the runs (one is built now, more only for concurrent runs).
        self.workspaces = WorkspacePool(self._new_workspace)
        self.workspaces.give(self.workspaces.take())
        self._profiles = threading.local()
        self._connected_modules: set[int] = set()  # ids of modules wired to Ctrl-C
        self._run_hooks: tuple[Callable[[], Any], Callable[[], None]] = (_nothing, _nothing)
        self._native: Any = None  # a NativePlan (or _NO_NATIVE_PLAN), decided on the first run
        self._num_threads = 0
        self._output_types = [self.values[index].type for index in self.outputs]
        self._input_specs = [_array_spec(self.values[index].type)
                             for index in self._input_values]
        self._output_specs = [_array_spec(ty)[:2] for ty in self._output_types]
        # Outputs a step writes -> the first position they are returned at (where the native
        # entry has a kernel write them; a reference step must write them there too).
        written = {value for step in self.steps for value in step.writes}
        self._written_outputs: dict[int, int] = {}
        for position, index in enumerate(self.outputs):
            if index in written:
                self._written_outputs.setdefault(index, position)
        self.modules: dict[str, Any] = {}  # kernel name -> runtime Module (set by the builder)
        self.source_code = ""
        #: The target the kernels were generated for (set by opf.compile and opf.load).
        self.target: Target = host_target()

    def _new_workspace(self) -> Workspace:
        buffer, blocks = self.plan.allocate_workspace(self._block_text)
        arrays = dict(self._constants)
        for value, block in self.plan.block_of.items():
            offset = self.plan.byte_offset(value)
            arrays[value] = _view(blocks[block][offset:], self.values[value].type)
        pointers = [[arrays[v].ctypes.data if v in arrays else None for v in arguments]
                    for arguments in self._arguments]
        inputs = (ctypes.c_void_p * max(1, len(self.input_names)))()
        outputs = (ctypes.c_void_p * max(1, len(self.outputs)))()
        call = ModelCall(0, ctypes.addressof(inputs), ctypes.addressof(outputs),
                         buffer.ctypes.data, -1, 0, 0)
        return Workspace(buffer, blocks, arrays, pointers, inputs, outputs, call,
                         ctypes.addressof(call))

    def _block_text(self, block: int) -> str:
        """The values that block ``block`` of the memory plan holds, for an error message."""
        held = [self._value_names[v] for v, b in self.plan.block_of.items() if b == block]
        shown = "; ".join(held[:3]) + (f"; and {len(held) - 3} more" if len(held) > 3 else "")
        return f"block {block} of the memory plan (holding {shown})"

    @property
    def last_profile(self) -> list[tuple[str, float]] | None:
        """(kernel, seconds) of each step of the calling thread's last ``run(...,
        profile=True)``; None before one. Per thread, so concurrent runs do not mix."""
        return getattr(self._profiles, "timings", None)

    # -- running -----------------------------------------------------------------------------
    def run(self, output_names: Any = None, input_feed: Any = None, run_options: Any = None,
            *, profile: bool = False) -> list[np.ndarray]:
        """Run and return the outputs as a list of arrays. Two forms:

        * ``run(feeds)``: ``feeds`` is input name -> array, or the arrays in input order;
          every output comes back.
        * ``run(output_names, feeds)``, as ONNX Runtime's ``InferenceSession.run``:
          ``output_names`` is None (every output) or a list of :attr:`output_names`, whose
          outputs come back in that order.

        Safe to call from several threads at once; the returned arrays belong to the caller
        (never memory of the executor). ``profile=True`` also records each kernel's time in
        :attr:`last_profile`."""
        wanted, feeds = parse_run_arguments(output_names, input_feed, run_options)
        positions = output_positions(self.output_names, wanted)  # before the run
        native = self._native
        if native is not None and native is not _NO_NATIVE_PLAN and native.whole \
                and not profile:  # the common case, without a call more than it needs
            outputs = self._execute_native(native, feeds, None)
            return outputs if positions is None else [outputs[i] for i in positions]
        timings: list[tuple[str, float]] | None = [] if profile else None
        outputs = self._execute(feeds, timings)
        if timings is not None:
            self._profiles.timings = timings
        return outputs if positions is None else [outputs[i] for i in positions]

    def get_inputs(self) -> list[NodeArg]:
        """The model's inputs in order (name, shape, type, dtype), as ONNX Runtime's."""
        return [NodeArg.of(name, self.values[index].type)
                for name, index in zip(self.input_names, self._input_values)]

    def get_outputs(self) -> list[NodeArg]:
        """The model's outputs in order (name, shape, type, dtype), as ONNX Runtime's."""
        return [NodeArg.of(name, self.values[index].type)
                for name, index in zip(self.output_names, self.outputs)]

    @contextlib.contextmanager
    def _running(self, feeds: Mapping[str, Any] | Sequence[Any] | None
                 ) -> Iterator[tuple[Workspace, dict[int, np.ndarray]]]:
        """One run's state: a workspace of its own and every value's array (inputs bound,
        results allocated, intermediates in the workspace), between the Ctrl-C hooks."""
        bound = dict(zip(self._input_values, self._bind_inputs(feeds)))
        results = self._new_results()
        self._connect_interrupts()
        begin, end = self._run_hooks
        workspace = self.workspaces.take()
        try:
            begin()
            yield workspace, {**workspace.arrays, **bound, **results}
        finally:
            end()  # first: a KeyboardInterrupt may come at any Python call from here on
            self.workspaces.give(workspace)

    def _execute(self, feeds: Mapping[str, Any] | Sequence[Any] | None,
                 timings: list[tuple[str, float]] | None) -> list[np.ndarray]:
        """One run in a workspace of its own; appends (kernel, seconds) to ``timings``.
        Through the library's native entry when it has one (one foreign call for a model
        whose every step is compiled; with timings, one per kernel), else kernel by kernel."""
        native = self._native_plan()
        if native is not None:
            return self._execute_native(native, feeds, timings)
        with self._running(feeds) as (workspace, arrays):
            for step, pointers, arguments in zip(self.steps, workspace.pointers,
                                                 self._arguments):
                start = time.perf_counter() if timings is not None else 0.0
                if step.function is None:
                    _run_reference(step, arrays)
                else:
                    _call_kernel(step, [p if p is not None else arrays[v].ctypes.data
                                        for p, v in zip(pointers, arguments)])
                if timings is not None:
                    timings.append((step.group.name, time.perf_counter() - start))
        # Results are the run's own arrays (or copies of inputs and constants), never views of
        # the workspace, which the next run may already be using.
        return [_fresh(arrays[index], index, self) for index in self.outputs]

    def _execute_native(self, plan: NativePlan, feeds: Mapping[str, Any] | Sequence[Any] | None,
                        timings: list[tuple[str, float]] | None) -> list[np.ndarray]:
        """A run through the model's native entry: every output is an array of its own,
        which the entry fills (kernels write the first position of a value, the entry copies
        the rest). Written for a small model's sake: its run is a few microseconds of Python
        around one foreign call. The entry itself calls the Ctrl-C hooks."""
        inputs = self._bind_inputs(feeds)
        try:
            outputs = [np.empty(shape, dtype) for shape, dtype in self._output_specs]
        except (MemoryError, ValueError):
            outputs = [allocate(lambda ty=ty: np.empty(ty.shape, ty.dtype), ty.nbytes,
                                f"output {name!r}, {self._value_names[index]}")
                       for name, ty, index in zip(self.output_names, self._output_types,
                                                  self.outputs)]
        self._connect_interrupts()
        workspace = self.workspaces.take()
        try:
            pointers = workspace.inputs
            for position, array in enumerate(inputs):
                pointers[position] = _address(array)
            pointers = workspace.outputs
            for position, array in enumerate(outputs):
                pointers[position] = _address(array)
            call = workspace.call
            call.constants = plan.constants_address
            call.num_threads = self._num_threads
            if plan.whole and timings is None:
                self._call_native(plan, 0, plan.num_steps, workspace)
            else:
                self._run_stretches(plan, workspace, inputs, outputs, timings)
        finally:
            self.workspaces.give(workspace)
        return outputs

    def _run_stretches(self, plan: NativePlan, workspace: Workspace, inputs: list[Any],
                       outputs: list[np.ndarray],
                       timings: list[tuple[str, float]] | None) -> None:
        """The steps stretch by stretch: compiled ones through the native entry (one call per
        stretch, or per kernel when timed), reference ones in Python on arrays over the same
        memory; then the entry's output copies."""
        arrays = {**workspace.arrays, **dict(zip(self._input_values, inputs)),
                  **{value: outputs[position]
                     for value, position in self._written_outputs.items()}}
        for first, stop in plan.stretches:
            if self.steps[first].function is None:
                started = time.perf_counter()
                _run_reference(self.steps[first], arrays)
                if timings is not None:
                    timings.append((self.steps[first].group.name,
                                    time.perf_counter() - started))
            elif timings is None:
                self._call_native(plan, first, stop, workspace)
            else:
                for step in range(first, stop):
                    started = time.perf_counter()
                    self._call_native(plan, step, step + 1, workspace)
                    timings.append((self.steps[step].group.name,
                                    time.perf_counter() - started))
        self._call_native(plan, plan.num_steps, plan.num_steps, workspace)  # the copies

    def _call_native(self, plan: NativePlan, first: int, stop: int,
                     workspace: Workspace) -> None:
        """Run steps ``first`` to ``stop - 1`` through the native entry; raise naming the
        kernel that failed."""
        status = plan.run(first, stop, workspace.call_address)
        if status != 0:
            failed = workspace.call.failed
            if status == MODEL_BAD_RANGE or not first <= failed < stop:
                raise OpfusionError(f"internal error: the native entry refused steps {first} "
                                    f"to {stop} (status {status})")
            _raise_status(self.steps[failed], status)

    def _native_plan(self) -> NativePlan | None:
        """How runs go native (None: kernel by kernel, when the kernels' library has no
        model entry, the steps use several libraries, or a step's function was replaced).
        Decided on the first run: modules are set after __init__."""
        if self._native is None:
            self._native = NativePlan.of(self) or _NO_NATIVE_PLAN
        return None if self._native is _NO_NATIVE_PLAN else self._native

    def native_mismatch(self) -> str:
        """Why the library's model entry cannot run this executor's steps ("" when it can, or
        when there is no library): its tables differ from the layout of the steps, values and
        memory plan (the loader refuses such an artifact)."""
        library = _library_model(self)
        if library is None:
            return ""
        want = self.model_layout()
        if want != library.layout:
            return _layout_difference(want, library.layout)
        return ""

    def model_layout(self) -> Any:
        """The layout of this executor's steps for a native entry (kernel indices from the
        modules' positions in their library's table)."""
        kernels = []
        for step in self.steps:
            module = self.modules.get(step.group.name) if step.function is not None else None
            kernels.append(NO_KERNEL if module is None else module.table_index)
        return model_layout(self.values, self.steps, self.outputs, self.plan, kernels)

    @property
    def reference_steps(self) -> list[str]:
        """The kernels that run in Python (the NumPy reference interpreter) because they have
        no native code: a run leaves the native entry for each."""
        return [step.group.name for step in self.steps if step.function is None]

    def set_num_threads(self, num_threads: int) -> None:
        """Run the kernels on ``num_threads`` threads (0: OpenMP's default, every core the
        target has). Applies to the runs that start afterwards, from any thread."""
        check_num_threads(num_threads)
        self._num_threads = num_threads

    @property
    def num_threads(self) -> int:
        """The threads the kernels run on (0: OpenMP's default)."""
        return self._num_threads

    def _connect_interrupts(self) -> None:
        """Point the cancellation flag of each kernel library at the one Ctrl-C sets (once per
        module; ``modules`` is filled in after construction, so this runs lazily)."""
        if len(self._connected_modules) == len(self.modules):
            return
        for module in list(self.modules.values()):
            if id(module) not in self._connected_modules:
                interrupt.connect(str(module.library.path))
                self._connected_modules.add(id(module))
        self._run_hooks = interrupt.run_hooks()

    def _new_results(self) -> dict[int, np.ndarray]:
        """Fresh arrays for the outputs that a kernel writes (outputs are never planned)."""
        results = {}
        for index in self._result_values:
            ty = self.values[index].type
            results[index] = allocate(lambda ty=ty: np.empty(ty.shape, ty.dtype),
                                      ty.nbytes, self._value_names[index])
        return results

    def _bind_inputs(self, feeds: Mapping[str, Any] | Sequence[Any] | None) -> list[Any]:
        """The run's input arrays in input order, each checked (shape, dtype) and made
        C-contiguous and aligned (a copy where it is not)."""
        ordered = ordered_feeds(feeds, self.input_names)
        arrays = []
        for (shape, dtype, strides), name, value in zip(self._input_specs, self.input_names,
                                                        ordered):
            # The common case first, checked in a few attribute reads (a run of a small
            # model costs microseconds, and these checks are a part of them): equal strides
            # mean C-contiguous, and an array NumPy made is aligned.
            if type(value) is np.ndarray and value.shape == shape and value.dtype == dtype \
                    and value.strides == strides and value.flags.aligned:
                arrays.append(value)
            else:
                arrays.append(checked_input(name, value, shape, dtype))
        return arrays

    # -- inspection ----------------------------------------------------------------------------
    def source(self) -> str:
        """The generated C of all kernels and the model's native entry."""
        return self.source_code

    def profile(self, feeds: Mapping[str, Any] | Sequence[Any] | None = None,
                repeat: int = 10) -> KernelProfile:
        """Run ``repeat`` times and report each kernel's median time with the operators it
        fuses (``print(exe.profile(inputs))`` shows the table)."""
        runs: list[list[tuple[str, float]]] = []
        for _ in range(max(1, repeat)):
            timings: list[tuple[str, float]] = []
            self._execute(feeds, timings)
            runs.append(timings)
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
        with self._running(feeds) as (_, arrays):
            return [self._verify_step(step, arrays, rtol) for step in self.steps]

    def _verify_step(self, step: ExecStep, arrays: dict[int, np.ndarray], rtol: float) -> str:
        """Run one step on ``arrays`` and compare what it wrote with the interpreter."""
        func = step.group.function
        if step.function is None:
            _run_reference(step, arrays)
        else:
            _call_kernel(step, [arrays[v].ctypes.data for v in step.reads + step.writes])
        if func is None:
            return f"{step.group.name}: not checked (no IR kept after opf.load)"
        wants = _flat_tensors(evaluate(func, group_inputs(func, step.reads, arrays)))
        for value, expected in zip(step.writes, wants, strict=True):
            error = _relative_error(arrays[value], expected)
            if not error <= rtol:
                raise KernelMismatchError(
                    f"kernel {step.group.name} ({', '.join(step.group.op_names)}) differs "
                    f"from the reference interpreter: max error {error:.3g} x max|want| "
                    f"(tolerance {rtol:g})")
        return f"{step.group.name}: ok"

    @property
    def num_kernels(self) -> int:
        return len(self.steps)

    def export(self, path: Any) -> None:
        """Write this executor to one self-contained file (see :func:`opfusion.load`)."""
        from .artifact import export_executor

        export_executor(self, path)

    def export_library(self, directory: Any, name: str = "model") -> Any:
        """Write this model as a shared library that runs without Python, with a C header
        and an example program (see :mod:`opfusion.compiler.export_library`); returns an
        ``ExportedLibrary`` naming the files and the example's build command."""
        from .export_library import export_library

        return export_library(self, directory, name)

    def __call__(self, *arrays: Any, **named: Any) -> Any:
        """Run with positional and/or named inputs; one output comes back as an array,
        several as a tuple."""
        if arrays and named:
            feeds: Any = dict(zip(self.input_names, arrays))
            feeds.update(named)
        else:
            feeds = named if named else list(arrays)
        outs = self.run(None, feeds)
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


def check_num_threads(num_threads: Any) -> None:
    """OpfusionError unless ``num_threads`` is an int from 0 (OpenMP's default) to 4096."""
    if not isinstance(num_threads, int) or isinstance(num_threads, bool) \
            or not 0 <= num_threads <= 4096:
        raise OpfusionError(f"num_threads must be an int from 0 (every core) to 4096, got "
                            f"{num_threads!r}")


def steps_for_plan(steps: Sequence[ExecStep]) -> list[PlannedStep]:
    return [PlannedStep(tuple(s.reads), tuple(s.writes)) for s in steps]


def _nothing() -> None:
    return None


@dataclass
class NativePlan:
    """How a run goes native: the library's model entry (``run``), the constants' pointer
    table (``constants``), whether every step is
    compiled (``whole``: a run is one call), and the stretches ``(first, stop)`` of the steps
    in order, each a run of compiled steps or one reference step."""

    run: Any
    num_steps: int
    constants: Any
    constants_address: int
    whole: bool
    stretches: list[tuple[int, int]]

    @staticmethod
    def of(executor: Executor) -> NativePlan | None:
        """The plan of ``executor``, or None when its kernels have no usable model entry."""
        library = _library_model(executor)
        if library is None or library.layout != executor.model_layout():
            return None
        steps = executor.steps
        stretches: list[tuple[int, int]] = []
        for index, step in enumerate(steps):
            native = step.function is not None
            if native and stretches and stretches[-1][1] == index and \
                    steps[stretches[-1][0]].function is not None:
                stretches[-1] = (stretches[-1][0], index + 1)
            else:
                stretches.append((index, index + 1))
        arrays = list(executor._constants.values())  # value order: the constants' slots
        # The arrays stay alive with the executor's constants.
        table = (ctypes.c_void_p * max(1, len(arrays)))(*[_address(a) for a in arrays])
        return NativePlan(library.run, len(steps), table, ctypes.addressof(table),
                          all(step.function is not None for step in steps), stretches)


_NO_NATIVE_PLAN: Any = object()


def _library_model(executor: Executor) -> Any:
    """The model entry of the one library holding every compiled step's kernel, if any and
    if no step's function was replaced (tests inject Python functions)."""
    model, library = None, None
    for step in executor.steps:
        if step.function is None:
            continue
        module = executor.modules.get(step.group.name)
        if module is None or step.function is not module._function:
            return None
        if library is None:
            library = module.kernels
        elif module.kernels is not library:
            return None
        model = library.model
    return model


def _layout_difference(want: Any, have: Any) -> str:
    """The first field in which two model layouts differ, for a message."""
    for field in ("step_kernels", "step_args", "copies", "constant_bytes", "input_bytes",
                  "output_bytes", "workspace_bytes"):
        if getattr(want, field) != getattr(have, field):
            return (f"the library's model tables differ from the model's steps in "
                    f"{field}")
    return ""


def _address(array: np.ndarray) -> int:
    """The address of an array's first byte (a writable array's through ctypes' buffer
    protocol, several times faster than ``array.ctypes.data``)."""
    if array.flags.writeable and array.nbytes:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    return array.ctypes.data


def _call_kernel(step: ExecStep, pointers: list[int]) -> None:
    """Call a step's compiled kernel on argument addresses; raise on a failure status."""
    status = step.function(*pointers)
    if status != 0:
        _raise_status(step, status)


def _raise_status(step: ExecStep, status: int) -> None:
    """The exception for a kernel's failure status: interrupted, or out of scratch memory."""
    if status == KERNEL_CANCELLED:
        raise RunInterrupted(f"the run was interrupted (Ctrl-C) in kernel {step.group.name}; "
                             f"the executor can run again")
    if status != 0:
        ops = ", ".join(dict.fromkeys(step.group.op_names))
        raise OutOfMemoryError(f"kernel {step.group.name} ({ops}) "
                               f"could not allocate its scratch memory (malloc failed); free "
                               f"memory, or lower compile.max_allocation_bytes so that "
                               f"opf.compile refuses such a kernel")


def ordered_feeds(feeds: Mapping[str, Any] | Sequence[Any] | None,
                  names: Sequence[str]) -> list[Any]:
    """A run's feeds (input name -> value, the values in input order, or None for a model
    without inputs) as values in the order of ``names``; an InputError names an unknown or
    missing input, or says how many the model takes."""
    if feeds is None:
        feeds = {}
    if type(feeds) is list and len(feeds) == len(names):  # the common positional case
        return feeds
    if isinstance(feeds, Mapping):
        try:
            ordered = [feeds[name] for name in names]
        except KeyError:
            ordered = []
        if len(ordered) == len(feeds) == len(names):
            return ordered
        unknown = [name for name in feeds if name not in names]
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are "
                             f"{', '.join(map(repr, names))}")
        missing = [name for name in names if name not in feeds]
        raise InputError(f"input {missing[0]!r} is missing; the model's inputs are "
                         f"{', '.join(map(repr, names))}")
    ordered = list(feeds)
    if len(ordered) != len(names):
        raise InputError(f"the model takes {len(names)} input(s) ({', '.join(names)}), got "
                         f"{len(ordered)}")
    return ordered


def _array_spec(ty: TensorType) -> tuple[tuple[int, ...], np.dtype, tuple[int, ...]]:
    """Shape, dtype and C-order strides of a tensor type, as NumPy reports them."""
    shape, dtype = tuple(int(d) for d in ty.shape), np.dtype(ty.dtype)
    return shape, dtype, _c_strides(shape, dtype.itemsize)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides NumPy gives a C-ordered array of ``shape`` (as ``np.empty`` makes it)."""
    strides, step = [], itemsize
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def checked_input(name: str, value: Any, shape: tuple[int, ...], dtype: np.dtype
                   ) -> np.ndarray:
    """``value`` as a C-contiguous, aligned array of ``shape`` and ``dtype`` (a copy when it
    is not contiguous); InputError naming the input when it cannot be."""
    array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
    if array.shape != shape:
        raise InputError(f"input {name!r} must have shape {shape}, got {array.shape}")
    if array.dtype != dtype:
        raise InputError(f"input {name!r} must be {dtype}, got {array.dtype}; convert it "
                         f"with .astype('{dtype}')")
    if not (array.flags.c_contiguous and array.flags.aligned):
        # A non-contiguous input is copied: that copy may fail too.
        array = allocate(lambda: np.require(array, requirements="CA"), array.nbytes,
                         f"a contiguous copy of input {name!r}")
    return array


def _run_reference(step: ExecStep, arrays: dict[int, np.ndarray]) -> None:
    func = step.group.reference_function
    assert func is not None
    results = _flat_tensors(evaluate(func, group_inputs(func, step.reads, arrays)))
    for value, result in zip(step.writes, results, strict=True):
        np.copyto(arrays[value], result)


def group_inputs(func: Function, reads: Sequence[int], arrays: Mapping[int, Any]) -> list[Any]:
    """The arguments of a group's primitive function ``func`` for the interpreter, gathered
    from its step's flat ``reads``: a tensor parameter takes the next value, a tuple
    parameter (``concatenate``'s operand under fusion "none") a tuple of as many values as
    it holds tensors, rebuilt to its nesting. The reads after the parameters' (the group's
    large constants) are no arguments of ``func``."""
    values = iter(reads)

    def take(ty: Any) -> Any:  # recursion over a type's tuple nesting: a few levels at most
        if isinstance(ty, TupleType):
            return tuple(take(field) for field in ty.fields)
        return arrays[next(values)]

    return [take(param.type_annotation) for param in func.params]


def _flat_tensors(value: Any) -> list[Any]:
    """The tensors of an interpreter result (a tensor or nested tuples), in order: a step
    writes one value per tensor."""
    flat, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(reversed(item))
        else:
            flat.append(item)
    return flat


def _fresh(array: np.ndarray, index: int, executor: Executor) -> np.ndarray:
    # Results that are inputs or constants are copied: the caller may change what it gets.
    info = executor.values[index]
    if info.input_index is not None or info.constant is not None:
        return allocate(lambda: np.array(array, copy=True), array.nbytes,
                        f"a copy of {executor._value_names[index]}")
    return array


def _value_names(input_names: Sequence[str], values: Sequence[ValueInfo],
                 steps: Sequence[ExecStep], plan: MemoryPlan) -> dict[int, str]:
    """How error messages name each value: ``input 'x'``, ``a constant``, ``result 0 of
    kernel fused_add_0 (add)``, or a concatenation assembled in place."""
    names = {}
    for index, info in enumerate(values):
        if info.input_index is not None:
            names[index] = f"input {input_names[info.input_index]!r}"
        elif info.constant is not None:
            names[index] = f"a constant of type {info.type!r}"
    for step in steps:
        ops = ", ".join(dict.fromkeys(step.group.op_names))
        for position, value in enumerate(step.writes):
            names.setdefault(value, f"result {position} of kernel {step.group.name} ({ops}), "
                                    f"of type {values[value].type!r}")
    for holder, _ in plan.aliases.values():
        names.setdefault(holder, "a concatenation written in place by the kernels of its "
                                 f"operands, of type {values[holder].type!r}")
    for value in plan.views:
        holder, offset = plan.aliases[value]
        names.setdefault(value, f"a slice of {names.get(holder, 'an intermediate')} read in "
                                f"place at byte {offset}, of type {values[value].type!r}")
    return names


def _view(block: np.ndarray, ty: TensorType) -> np.ndarray:
    return block[:ty.nbytes].view(np.dtype(ty.dtype)).reshape(ty.shape)
