"""The model's layout for its native entry: which kernel each step calls and where each of
its arguments lives, as flat tables that the generated C holds (TVM's AOT executor,
Inductor's AOT wrapper).

Every value a kernel takes is one of four kinds:

- a **constant** (``CONSTANT``, slot ``index`` of the constants' pointer table: the model's
  constants in value order);
- an **input** (``INPUT``, the model's ``index``-th input);
- an **output** (``OUTPUT``, the model's ``index``-th output, the first position at which the
  value is an output);
- an **intermediate** (``WORKSPACE``, at byte ``offset`` of the run's workspace, which holds
  the memory plan's blocks one after another).

An output that no kernel writes into its own slot (it is an input, a constant, or a value
already returned at an earlier position) is a **copy** made after the last step.

The same :class:`ModelLayout` is derived at compile time (and emitted as C), at load time from
an artifact's manifest, and read back from a library's kernel table: a library runs a model
only if the table it holds equals the layout derived from the manifest, so an edited manifest
cannot make the native entry read or write outside the buffers the executor passes."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the runtime does not import the compiler
    from ..compiler.memory_plan import MemoryPlan

#: Kinds of argument of a step (the C ``opf_model_arg_t.kind``).
CONSTANT, INPUT, OUTPUT, WORKSPACE = 0, 1, 2, 3
#: Kernel index of a step that has no native code (the executor runs it with NumPy).
NO_KERNEL = -1
#: The status of the native entry for a step range outside the model.
MODEL_BAD_RANGE = -3


@dataclass(frozen=True)
class ModelArg:
    """Where one argument of a step lives: ``kind`` (CONSTANT, INPUT, OUTPUT, WORKSPACE),
    ``index`` (the slot; for WORKSPACE the block) and ``offset`` (bytes into the workspace,
    0 for the other kinds)."""

    kind: int
    index: int
    offset: int = 0


@dataclass(frozen=True)
class ModelCopy:
    """After the last step: output ``output`` is ``nbytes`` copied from ``source``."""

    output: int
    source: ModelArg
    nbytes: int


@dataclass(frozen=True)
class ModelLayout:
    """Everything the native entry needs besides the kernels: per step the kernel it calls
    (an index of the library's kernel table, or NO_KERNEL) and its arguments' places; the
    copies; and the byte size of every constant, input and output and of the workspace (for
    the loader's checks and the exported header)."""

    step_kernels: tuple[int, ...]
    step_args: tuple[tuple[ModelArg, ...], ...]
    copies: tuple[ModelCopy, ...]
    constant_bytes: tuple[int, ...]
    input_bytes: tuple[int, ...]
    output_bytes: tuple[int, ...]
    workspace_bytes: int

    @property
    def num_steps(self) -> int:
        return len(self.step_kernels)

    @property
    def max_args(self) -> int:
        """The most arguments of any step (the size of the entry's argument array)."""
        return max((len(args) for args in self.step_args), default=0)

    @property
    def fits_int64(self) -> bool:
        """Whether every size and offset fits the C tables' int64 (only a model past any
        machine's memory does not, and its workspace cannot be allocated anyway)."""
        limit = 1 << 63
        sizes = [*self.constant_bytes, *self.input_bytes, *self.output_bytes,
                 self.workspace_bytes, *(c.nbytes for c in self.copies)]
        return all(n < limit for n in sizes)


def constant_slots(values: Sequence[Any]) -> dict[int, int]:
    """Value index -> slot of the constants' pointer table (constants in value order)."""
    slots: dict[int, int] = {}
    for index, info in enumerate(values):
        if info.constant is not None:
            slots[index] = len(slots)
    return slots


def model_layout(values: Sequence[Any], steps: Sequence[Any], outputs: Sequence[int],
                 plan: MemoryPlan, step_kernels: Sequence[int]) -> ModelLayout:
    """The layout of a model: ``values`` (ValueInfo: type, input_index, constant), ``steps``
    (``reads``, ``writes``), ``outputs`` (value indices), the memory plan, and the kernel
    index of each step (NO_KERNEL for a step without native code, whose arguments are then
    not listed: the executor runs it)."""
    constants = constant_slots(values)
    first_output: dict[int, int] = {}
    for position, value in enumerate(outputs):
        first_output.setdefault(value, position)
    offsets = plan.block_offsets

    def place(value: int) -> ModelArg:
        info = values[value]
        if info.input_index is not None:
            return ModelArg(INPUT, info.input_index)
        if value in constants:
            return ModelArg(CONSTANT, constants[value])
        if value in first_output:
            return ModelArg(OUTPUT, first_output[value])
        block = plan.block_of[value]
        return ModelArg(WORKSPACE, block, offsets[block] + plan.byte_offset(value))

    step_args = tuple(
        () if kernel == NO_KERNEL else tuple(place(v) for v in [*step.reads, *step.writes])
        for step, kernel in zip(steps, step_kernels, strict=True))
    copies = []
    for position, value in enumerate(outputs):
        source = place(value)
        if source != ModelArg(OUTPUT, position):
            copies.append(ModelCopy(position, source, values[value].type.nbytes))
    input_bytes = [0] * sum(1 for v in values if v.input_index is not None)
    for info in values:
        if info.input_index is not None:
            input_bytes[info.input_index] = info.type.nbytes
    return ModelLayout(
        step_kernels=tuple(int(k) for k in step_kernels), step_args=step_args,
        copies=tuple(copies),
        constant_bytes=tuple(values[v].type.nbytes for v in constants),
        input_bytes=tuple(input_bytes),
        output_bytes=tuple(values[v].type.nbytes for v in outputs),
        workspace_bytes=plan.workspace_bytes)


class ModelCall(ctypes.Structure):
    """The arguments of one call of a model's native entry (``opf_model_call_t``, see
    :mod:`opfusion.backend.cpu.model_entry`): pointer tables of the constants, inputs and
    outputs, the workspace, the failed step (written by the entry) and the thread count."""

    _fields_ = [("constants", ctypes.c_void_p), ("inputs", ctypes.c_void_p),
                ("outputs", ctypes.c_void_p), ("workspace", ctypes.c_void_p),
                ("failed", ctypes.c_int64), ("num_threads", ctypes.c_int32),
                ("reserved", ctypes.c_int32)]
