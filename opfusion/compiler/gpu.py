"""A model for a GPU: every fused group lowered with the GPU's schedule rules, one CUDA
source for the model, NVRTC builds, and checks in the loop-IR interpreter.

    gm = build_gpu_model(mod, params=params, target="cuda -arch=sm_90")
    print(gm.source)                  # CUDA C: a __global__ function per launch
    ptx = gm.compile("compute_90")    # NVRTC, no GPU needed
    outputs = gm.interpret(x)         # each kernel run as a GPU runs it, in Python

The graph passes are the CPU's, less the CPU layouts (no NCHW<x>c, no packed panels: the GPU
schedules read the plain layouts); then the same fusion, and one kernel per distinct group,
as :func:`opfusion.compile` builds them.

:class:`GPUExecutor` runs a model on a :class:`~opfusion.backend.cuda.runtime.Device`: the
whole static memory plan in one device allocation (constants uploaded once, inputs, results,
intermediates and each group's global temporaries at planned byte offsets, 256-byte
aligned), inputs copied in, every launch of every group in order with pointers into it,
results copied out. Groups without a TE compute run their NumPy reference on the host
between the launches. ``opf.compile(mod, target="cuda")`` builds one on the machine's GPU
(:func:`~opfusion.backend.cuda.runtime.cuda_device`); on the interpreter device
(``GPUExecutor(model, InterpretedDevice())``) the same executor runs on any machine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..backend import get_backend
from ..backend.cuda.emitter import CUDASource
from ..backend.cuda.nvrtc import compile_cuda
from ..errors import DeviceError, OpfusionError
from ..ir.evaluate import evaluate
from ..ir.expr import Function
from ..ir.module import IRModule
from ..target import Target, as_target
from .executor import ExecStep, InputError, ValueInfo, checked_input, ordered_feeds
from .lower_group import LoweredGroup
from .memory_plan import PlannedStep, plan_memory


class GPUModel:
    """The kernels of one model for a GPU target and the order they run in."""

    def __init__(self, target: Target, values: list[ValueInfo], steps: list[ExecStep],
                 kernels: list[LoweredGroup], outputs: list[int], input_names: list[str]
                 ) -> None:
        self.target = target
        self.values = values
        self.steps = steps
        self.kernels = kernels
        self.outputs = outputs
        self.input_names = input_names
        funcs = [g.prim_func for g in kernels if g.prim_func is not None]
        self.source: CUDASource = get_backend(target).generate(funcs)

    @property
    def reference_steps(self) -> list[str]:
        """Groups that run their NumPy reference (operators without a TE compute)."""
        return [s.group.name for s in self.steps if s.group.prim_func is None]

    def compile(self, arch: str | None = None) -> bytes:
        """The model's CUDA source compiled by NVRTC for ``arch`` (default: the target's):
        ``sm_XY`` gives a cubin, ``compute_XY`` PTX."""
        return compile_cuda(self.source.code, arch or self.target.cuda_arch)

    def interpret(self, *inputs: Any) -> list[np.ndarray]:
        """Run the model on the interpreter device (every launch in the loop-IR interpreter,
        block by block and thread by thread, as a GPU runs it; slow: small models only)."""
        from ..backend.cuda.runtime import InterpretedDevice

        executor = GPUExecutor(self, InterpretedDevice())
        return executor.run(*inputs)


#: Byte alignment of every value in device memory (what cudaMalloc guarantees, and enough
#: for any vector load).
DEVICE_ALIGNMENT = 256


class GPUExecutor:
    """A :class:`GPUModel` on a device, ready to run (see the module docstring)."""

    def __init__(self, model: GPUModel, device: Any) -> None:
        from ..backend.cuda.runtime import Arg

        self.model = model
        self.device = device
        values = model.values
        groups = {code.name: code for code in model.source.groups}
        # Each group's global temporaries are values of their own, written and read by its
        # step only, so that the plan gives them memory just while it runs.
        step_temps: list[list[int]] = []
        nbytes: dict[int, int] = {}
        planned: list[PlannedStep] = []
        extra = len(values)
        temp_types: dict[int, tuple[tuple[int, ...], str]] = {}
        for step in model.steps:
            temps = []
            code = groups.get(step.group.name)
            for shape, dtype in (code.temporaries if code is not None else ()):
                temp_types[extra] = (tuple(shape), dtype)
                nbytes[extra] = _nbytes(shape, dtype)
                temps.append(extra)
                extra += 1
            step_temps.append(temps)
            planned.append(PlannedStep(tuple(step.reads), tuple(step.writes) + tuple(temps)))
        for index, info in enumerate(values):
            if info.constant is None and info.input_index is None:
                nbytes[index] = _nbytes(info.type.shape, info.type.dtype)
        plan = plan_memory(planned, nbytes, keep=model.outputs)
        # Layout: constants, inputs, then the plan's blocks.
        offset = 0
        self._where: dict[int, Arg] = {}
        for index, info in enumerate(values):
            if info.constant is not None or info.input_index is not None:
                shape = tuple(int(d) for d in info.type.shape)
                self._where[index] = Arg(offset, shape, info.type.dtype)
                offset = align_offset(offset + _nbytes(shape, info.type.dtype))
        block_start = []
        for size in plan.block_sizes:
            block_start.append(offset)
            offset = align_offset(offset + size)
        for value, block in plan.block_of.items():
            shape, dtype = (temp_types[value] if value in temp_types else
                            (tuple(int(d) for d in values[value].type.shape),
                             values[value].type.dtype))
            self._where[value] = Arg(block_start[block] + plan.byte_offset(value), shape, dtype)
        self.nbytes = offset
        #: Device bytes of the intermediates and temporaries: planned, and one buffer each.
        self.workspace_bytes = plan.total_bytes
        self.naive_bytes = sum(nbytes.values())
        device.allocate(self.nbytes)
        for index, info in enumerate(values):
            if info.constant is not None:
                device.upload(self._where[index].offset,
                              np.ascontiguousarray(info.constant, dtype=info.type.dtype))
        device.load(model.source, {g.name: g.prim_func for g in model.kernels
                                   if g.prim_func is not None})
        # Each kernel step's launches as prepared calls on its arguments (reads, writes,
        # temporaries), fixed by the plan: the device works out each launch once, and a run
        # only walks this list (None: a host step).
        self._calls: list[list[Any] | None] | None = [
            None if step.group.prim_func is None else self._prepare(
                step, groups[step.group.name].launches,
                [self._where[v] for v in (*step.reads, *step.writes, *temps)])
            for step, temps in zip(model.steps, step_temps)]
        # A model whose steps are all kernels runs as one CUDA graph (captured on the first
        # run; None until then, False where there is none: host steps, or a device without
        # graphs).
        self._graph: Any = None if all(c is not None for c in self._calls) else False

    def _prepare(self, step: ExecStep, launches: Sequence[Any], args: list[Any]) -> list[Any]:
        return [self.device.prepare(step.group.name, index, launch.symbol, launch.grid,
                                    launch.block, args)
                for index, launch in enumerate(launches)]

    def _open_calls(self) -> list[list[Any] | None]:
        """The prepared launches; a DeviceError once :meth:`close` gave the memory back."""
        if self._calls is None:
            raise DeviceError("this GPU executor was closed: compile the model again")
        return self._calls

    def run(self, *inputs: Any) -> list[np.ndarray]:
        """The model's outputs for ``inputs``: arrays in the model's input order, or one
        mapping of them by input name. An input may be a NumPy array (copied to the GPU) or
        an array already in GPU memory (a PyTorch CUDA tensor, a CuPy array: anything with
        ``__cuda_array_interface__``), copied on the GPU. The outputs are NumPy arrays."""
        self._upload_inputs(inputs)
        self._launch_all()
        return [self.device.download(self._where[v].offset, self._where[v].shape,
                                     self._where[v].dtype) for v in self.model.outputs]

    def execute(self) -> None:
        """Run every launch on the inputs already on the device (the last run's), leaving
        the results there: the kernels' time alone, for benchmarks against frameworks
        whose data stays on the GPU."""
        self._launch_all()

    def _launch_all(self) -> None:
        """Every step in order, as the model's CUDA graph where it has one, then wait."""
        calls = self._open_calls()
        if self._graph is None:
            self._graph = self.device.capture(
                [call for step_calls in calls for call in step_calls or ()]) or False
        if self._graph:
            self._graph()
        else:
            for number, step in enumerate(self.model.steps):
                self._run_step(number, step)
        self.device.synchronize()

    def profile(self, *inputs: np.ndarray) -> list[tuple[str, float]]:
        """``(group, milliseconds)`` for each step of one run (device timers: CUDA events on
        a GPU)."""
        self._upload_inputs(inputs)
        times = []
        for number, step in enumerate(self.model.steps):
            start = self.device.timer()
            self._run_step(number, step)
            times.append((step.group.name, self.device.elapsed_ms(start)))
        return times

    def __call__(self, *inputs: Any) -> list[np.ndarray]:
        return self.run(*inputs)

    def _upload_inputs(self, inputs: Sequence[Any]) -> None:
        """Check the run's inputs as the CPU executor does (names, count, shape, dtype: an
        InputError naming the input) and copy them to their places on the device."""
        feeds = inputs[0] if len(inputs) == 1 and isinstance(inputs[0], Mapping) else inputs
        ordered = ordered_feeds(feeds, self.model.input_names)
        for index, info in enumerate(self.model.values):
            if info.input_index is None:
                continue
            where = self._where[index]
            name, value = self.model.input_names[info.input_index], ordered[info.input_index]
            address = device_address(name, value, where.shape, np.dtype(where.dtype))
            if address is not None:
                self.device.copy_from_device(where.offset, address, where.nbytes)
                continue
            self.device.upload(where.offset,
                               checked_input(name, value, where.shape, np.dtype(where.dtype)))

    def _run_step(self, number: int, step: ExecStep) -> None:
        group = step.group
        if group.prim_func is None:  # a NumPy reference between the launches
            self.device.synchronize()
            reads = [self.device.download(self._where[v].offset, self._where[v].shape,
                                          self._where[v].dtype) for v in step.reads]
            assert group.reference_function is not None
            result = evaluate(group.reference_function, reads)
            results = list(result) if isinstance(result, tuple) else [result]
            for value, array in zip(step.writes, results):
                self.device.upload(self._where[value].offset,
                                   np.ascontiguousarray(array, dtype=self._where[value].dtype))
            return
        for call in self._open_calls()[number] or ():
            call()

    def close(self) -> None:
        """Give the device memory back (the executor cannot run after)."""
        self._calls = None
        self.device.release()


def device_address(name: str, value: Any, shape: tuple[int, ...], dtype: np.dtype
                   ) -> int | None:
    """The GPU address of input ``value`` when it is an array in GPU memory (it has
    ``__cuda_array_interface__``), after checking its shape, dtype and layout (an
    InputError naming the input otherwise); None for any other value."""
    if not hasattr(type(value), "__cuda_array_interface__"):
        return None
    try:
        interface = value.__cuda_array_interface__
        got_shape = tuple(int(d) for d in interface["shape"])
        got_dtype = np.dtype(interface["typestr"])
        strides = interface.get("strides")
        address = int(interface["data"][0])
        masked = interface.get("mask") is not None
    except Exception as err:  # a tensor that requires grad refuses; a malformed interface
        raise InputError(f"input {name!r} is on the GPU but its __cuda_array_interface__ "
                         f"cannot be read ({type(err).__name__}: {err}); pass a detached, "
                         "contiguous array") from None
    if got_shape != shape:
        raise InputError(f"input {name!r} must have shape {shape}, got {got_shape}")
    if got_dtype != dtype:
        raise InputError(f"input {name!r} must be {dtype}, got {got_dtype}")
    count = int(np.prod(shape, dtype=np.int64))
    contiguous = tuple(int(np.prod(shape[i + 1:], dtype=np.int64)) * dtype.itemsize
                       for i in range(len(shape)))
    if masked or (strides is not None and tuple(strides) != contiguous and count > 1):
        raise InputError(f"input {name!r} is not a contiguous array in GPU memory; call "
                         ".contiguous() (PyTorch) or ascontiguousarray (CuPy) first")
    if address == 0 and count > 0:
        raise InputError(f"input {name!r} has a null GPU address")
    return address


def _nbytes(shape: Any, dtype: str) -> int:
    return int(np.prod([int(d) for d in shape], dtype=np.int64)) * np.dtype(dtype).itemsize


def align_offset(offset: int) -> int:
    """``offset`` rounded up to :data:`DEVICE_ALIGNMENT` (where the next buffer starts)."""
    return -(-offset // DEVICE_ALIGNMENT) * DEVICE_ALIGNMENT


def build_gpu_model(mod: IRModule | Function, params: Mapping[str, Any] | None = None,
                    target: str | Target = "cuda", opt_level: int | None = None,
                    fusion: str | None = None, records: Any = None) -> GPUModel:
    """``mod`` optimized, fused and lowered for the GPU ``target`` (see the module
    docstring); ``records`` (``opf.tune``'s, for the same target) give each group its best
    measured config, else the rule's heuristic decides."""
    from .compile import _ExecutorBuilder, _tuning_records, fused_module

    resolved = as_target(target)
    if resolved.device != "cuda":
        raise OpfusionError(f"build_gpu_model needs a CUDA target (e.g. 'cuda -arch=sm_90'), "
                            f"not {resolved}")
    backend = get_backend(resolved)
    if isinstance(mod, Function):
        mod = IRModule.from_expr(mod)
    mod = fused_module(mod, params, resolved, opt_level, fusion)
    with resolved:
        builder = _ExecutorBuilder(mod["main"], backend, _tuning_records(records))
    return GPUModel(resolved, builder.values, builder.steps,
                    [group for _, group in builder.kernels], builder.outputs,
                    builder.input_names)


def interpret_inputs(model: GPUModel, seed: int = 0) -> Sequence[np.ndarray]:
    """Standard-normal inputs (small non-negative integers for integer ones) for ``model``:
    :func:`opfusion.compiler.compile.random_inputs`, which reads only the model's values."""
    from .compile import random_inputs

    return random_inputs(model, seed)  # type: ignore[arg-type]


__all__ = ["DEVICE_ALIGNMENT", "GPUExecutor", "GPUModel", "align_offset", "build_gpu_model",
           "interpret_inputs"]
