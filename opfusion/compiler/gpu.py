"""A model for a GPU: every fused group lowered with the GPU's schedule rules, one CUDA
source for the model, NVRTC builds, and checks in the loop-IR interpreter.

    gm = build_gpu_model(mod, params=params, target="cuda -arch=sm_90")
    print(gm.source)                  # CUDA C: a __global__ function per launch
    ptx = gm.compile("compute_90")    # NVRTC, no GPU needed
    outputs = gm.interpret(x)         # each kernel run as a GPU runs it, in Python

The graph passes are the CPU's, less the CPU layouts (no NCHW<x>c, no packed panels: the GPU
schedules read the plain layouts); then the same fusion, and one kernel per distinct group,
as :func:`opfusion.compile` builds them. Running the kernels on a GPU (device memory, the
CUDA driver's launches) is not built yet: :func:`opfusion.compile` refuses a CUDA target
and says so."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..backend import get_backend
from ..backend.cuda.emitter import CUDASource
from ..backend.cuda.nvrtc import compile_cuda
from ..errors import OpfusionError
from ..ir.evaluate import evaluate
from ..ir.expr import Function
from ..ir.module import IRModule
from ..target import Target, as_target
from ..tir.interp import run as run_loop_ir
from .executor import ExecStep, ValueInfo
from .lower_group import LoweredGroup


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

    def interpret(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run the model with every kernel in the loop-IR interpreter, block by block and
        thread by thread as a GPU runs it (slow: small models and shapes only)."""
        if len(inputs) != len(self.input_names):
            raise OpfusionError(f"the model takes {len(self.input_names)} inputs "
                                f"({', '.join(self.input_names)}), got {len(inputs)}")
        arrays: dict[int, np.ndarray] = {}
        for index, info in enumerate(self.values):
            if info.constant is not None:
                arrays[index] = np.asarray(info.constant)
            elif info.input_index is not None:
                arrays[index] = np.ascontiguousarray(inputs[info.input_index],
                                                     dtype=info.type.dtype)
        for step in self.steps:
            reads = [arrays[v] for v in step.reads]
            group = step.group
            if group.prim_func is None:
                assert group.reference_function is not None
                result = evaluate(group.reference_function, reads)
                results = list(result) if isinstance(result, tuple) else [result]
            else:
                results = [np.empty(tuple(int(d) for d in self.values[v].type.shape),
                                    self.values[v].type.dtype) for v in step.writes]
                run_loop_ir(group.prim_func, *[np.array(r, order="C") for r in reads],
                            *results)
            for value, array in zip(step.writes, results):
                arrays[value] = np.asarray(array)
        return [arrays[v] for v in self.outputs]


def build_gpu_model(mod: IRModule | Function, params: Mapping[str, Any] | None = None,
                    target: str | Target = "cuda", opt_level: int | None = None,
                    fusion: str | None = None) -> GPUModel:
    """``mod`` optimized, fused and lowered for the GPU ``target`` (see the module
    docstring)."""
    from .compile import _ExecutorBuilder, fused_module

    resolved = as_target(target)
    if resolved.device != "cuda":
        raise OpfusionError(f"build_gpu_model needs a CUDA target (e.g. 'cuda -arch=sm_90'), "
                            f"not {resolved}")
    backend = get_backend(resolved)
    if isinstance(mod, Function):
        mod = IRModule.from_expr(mod)
    mod = fused_module(mod, params, resolved, opt_level, fusion)
    with resolved:
        builder = _ExecutorBuilder(mod["main"], backend)
    return GPUModel(resolved, builder.values, builder.steps,
                    [group for _, group in builder.kernels], builder.outputs,
                    builder.input_names)


def interpret_inputs(model: GPUModel, seed: int = 0) -> Sequence[np.ndarray]:
    """Standard-normal inputs (small non-negative integers for integer ones) for ``model``."""
    from .compile import random_array

    rng = np.random.default_rng(seed)
    ordered = sorted((v for v in model.values if v.input_index is not None),
                     key=lambda v: v.input_index)
    return [random_array(rng, info.type.shape, info.type.dtype) for info in ordered]


__all__ = ["GPUModel", "build_gpu_model", "interpret_inputs"]
