"""The executor: runs a compiled model as a fixed list of kernel calls over planned memory.

Everything that can be decided before the first run is decided at construction: which value
lives where (constants bound once, intermediates in the blocks of the static memory plan),
which pointers each kernel call takes. A run checks the inputs, allocates the results, and
calls the kernels in order.

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
    """The memory of one run in progress: ``blocks`` (the memory plan's), ``arrays`` (every
    constant, shared read-only by all workspaces, and every planned intermediate as a view of
    this workspace's blocks, by value index) and ``pointers`` (per step, the address of each
    argument in ``reads + writes`` order, None where the run binds it: inputs and results)."""

    blocks: list[np.ndarray]
    arrays: dict[int, np.ndarray]
    pointers: list[list[int | None]]
    native: NativeArguments | None = None


class NativeArguments:
    """One workspace's arguments of the native step runner: per step, a C array of its
    argument pointers (``step_args[i]``, fixed for constants and intermediates), a C array of
    those arrays' addresses (``table``), and the slots each run fills in (inputs and results:
    ``(step, position, value)``)."""

    def __init__(self, pointers: list[list[int | None]], arguments: list[list[int]]) -> None:
        self.step_args = [(ctypes.c_void_p * max(1, len(p)))(*[a or None for a in p])
                          for p in pointers]
        self.table = (ctypes.c_void_p * max(1, len(pointers)))(
            *[ctypes.addressof(a) for a in self.step_args])
        self.bound = [(step, position, value)
                      for step, (p, values) in enumerate(zip(pointers, arguments))
                      for position, (address, value) in enumerate(zip(p, values))
                      if address is None]

    def bind(self, arrays: Mapping[int, np.ndarray]) -> None:
        """Point the run-bound slots at this run's inputs and results."""
        for step, position, value in self.bound:
            self.step_args[step][position] = arrays[value].ctypes.data


class WorkspacePool:
    """A thread-safe free list of workspaces: :meth:`take` pops a free one (or builds one
    when all are in use), :meth:`give` pushes it back. Only the push and pop hold the lock, so
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
        with self._lock:
            if self._free:
                return self._free.pop()
            self._built += 1
        return self._build()  # outside the lock: allocating may take a while

    def give(self, workspace: Workspace) -> None:
        """Return a workspace taken with :meth:`take`; its contents need not be clean (every
        run writes each intermediate before it reads it)."""
        with self._lock:
            self._free.append(workspace)


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
        self._constants = {index: np.require(info.constant, requirements="C")
                           for index, info in enumerate(self.values)
                           if info.constant is not None}
        self._arguments = [step.reads + step.writes for step in self.steps]
        self._value_names = _value_names(self.input_names, self.values, self.steps)
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
        self._native: NativePlan | None = None  # decided on the first run
        self.modules: dict[str, Any] = {}  # kernel name -> runtime Module (set by the builder)
        self.source_code = ""
        #: The target the kernels were generated for (set by opf.compile and opf.load).
        self.target: Target = host_target()

    def _new_workspace(self) -> Workspace:
        blocks = self.plan.allocate_blocks(self._block_text)
        arrays = dict(self._constants)
        for value, block in self.plan.block_of.items():
            arrays[value] = _view(blocks[block], self.values[value].type)
        pointers = [[arrays[v].ctypes.data if v in arrays else None for v in arguments]
                    for arguments in self._arguments]
        return Workspace(blocks, arrays, pointers)

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
        bound = self._bind_inputs(feeds)
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
        Without timings, each stretch of compiled steps is one call of the library's step
        runner; with them (a profile), every kernel is called and timed on its own."""
        native = self._native_plan() if timings is None else None
        with self._running(feeds) as (workspace, arrays):
            if native is not None:
                self._run_native(native, workspace, arrays)
                return [_fresh(arrays[index], index, self) for index in self.outputs]
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

    def _native_plan(self) -> NativePlan | None:
        """The step runner, the thunk of every step and the stretches of compiled steps
        between reference steps; None when a compiled step has no thunk (a kernel built
        before thunks existed). Decided on the first run: modules are set after __init__."""
        plan = self._native
        if plan is None:
            plan = self._native = NativePlan.of(self.steps, self.modules)
        return plan if plan.runner is not None else None

    def _run_native(self, plan: NativePlan, workspace: Workspace,
                    arrays: Mapping[int, np.ndarray]) -> None:
        if workspace.native is None:
            workspace.native = NativeArguments(workspace.pointers, self._arguments)
        native = workspace.native
        native.bind(arrays)
        failed = ctypes.c_int64(-1)
        for start, stop in plan.stretches:
            if stop - start == 1 and self.steps[start].function is None:
                _run_reference(self.steps[start], arrays)
                continue
            status = plan.runner(stop - start,
                                 ctypes.addressof(plan.thunks) + start * _POINTER_BYTES,
                                 ctypes.addressof(native.table) + start * _POINTER_BYTES,
                                 ctypes.byref(failed))
            if status != 0:
                _raise_status(self.steps[start + failed.value], status)

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

    def _bind_inputs(self, feeds: Mapping[str, Any] | Sequence[Any] | None) -> dict[int, Any]:
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
        for index, name, value in zip(self._input_values, self.input_names, ordered):
            want = self.values[index].type
            array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
            if array.shape != tuple(want.shape):
                raise InputError(f"input {name!r} must have shape {tuple(want.shape)}, got "
                                 f"{array.shape}")
            if array.dtype != np.dtype(want.dtype):
                raise InputError(f"input {name!r} must be {want.dtype}, got {array.dtype}; "
                                 f"convert it with .astype('{want.dtype}')")
            if not (array.flags.c_contiguous and array.flags.aligned):
                # A non-contiguous input is copied: that copy may fail too.
                array = allocate(lambda array=array: np.require(array, requirements="CA"),
                                 array.nbytes, f"a contiguous copy of input {name!r}")
            bound[index] = array
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


def steps_for_plan(steps: Sequence[ExecStep]) -> list[PlannedStep]:
    return [PlannedStep(tuple(s.reads), tuple(s.writes)) for s in steps]


def _nothing() -> None:
    return None


_POINTER_BYTES = ctypes.sizeof(ctypes.c_void_p)


@dataclass
class NativePlan:
    """How a run goes native: the library's step runner (None when some compiled step has
    no thunk), every step's thunk address (0 for a reference step) and the stretches
    ``(start, stop)`` of the steps in order: each a run of compiled steps, or one reference
    step."""

    runner: Any
    thunks: Any
    stretches: list[tuple[int, int]]

    @staticmethod
    def of(steps: Sequence[ExecStep], modules: Mapping[str, Any]) -> NativePlan:
        thunks: list[int] = []
        runner = None
        for step in steps:
            module = modules.get(step.group.name) if step.function is not None else None
            thunk = getattr(module, "thunk", 0) if module is not None else 0
            if step.function is not None and not thunk:
                return NativePlan(None, None, [])
            if module is not None and runner is None:
                runner = module.kernels.run_steps
            thunks.append(thunk)
        stretches: list[tuple[int, int]] = []
        for index, step in enumerate(steps):
            native = step.function is not None
            if native and stretches and stretches[-1][1] == index and \
                    steps[stretches[-1][0]].function is not None:
                stretches[-1] = (stretches[-1][0], index + 1)
            else:
                stretches.append((index, index + 1))
        table = (ctypes.c_void_p * max(1, len(thunks)))(*[t or None for t in thunks])
        return NativePlan(runner, table, stretches)


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
                 steps: Sequence[ExecStep]) -> dict[int, str]:
    """How error messages name each value: ``input 'x'``, ``a constant``, or ``result 0 of
    kernel fused_add_0 (add)``."""
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
    return names


def _view(block: np.ndarray, ty: TensorType) -> np.ndarray:
    return block[:ty.nbytes].view(np.dtype(ty.dtype)).reshape(ty.shape)
