"""``exe.export_library(directory)``: a compiled model as a shared library, a C header and an
example program, run without Python, opfusion or NumPy.

The library is built from the same generated C as the executor's kernels, with the same
compiler flags, plus the API of :mod:`opfusion.backend.cpu.export` (what the directory holds
is described there), so that its outputs are the executor's bit for bit. Building needs the C
compiler, once; the library needs only the C library and the OpenMP runtime it was linked
with (``libgomp``) on the machine that runs it, and a CPU with the target's ISA features."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.cpu.export import (
    TensorSpec,
    example_c,
    header_c,
    wrapper_c,
)
from ..backend.cpu.toolchain import build_shared_library, target_flags
from ..errors import OpfusionError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


class ExportError(OpfusionError):
    """A model that cannot be exported as a library (a kernel without native code, a bad
    name), or a library that could not be built."""


@dataclass(frozen=True)
class ExportedLibrary:
    """What ``export_library`` wrote: the directory, the library, the header, the example
    program's source and the command that builds it (run in the directory)."""

    directory: Path
    library: Path
    header: Path
    example: Path
    build_command: str


def export_library(exe: Any, directory: str | os.PathLike[str],
                   name: str = "model") -> ExportedLibrary:
    """Write ``exe`` (a compiled or loaded Executor) to ``directory`` as ``lib<name>.so``,
    ``<name>.h``, ``<name>.c``, ``weights.bin``, ``example.c`` and ``README.txt`` (see
    :mod:`opfusion.backend.cpu.export`). ``name`` must be a C identifier (it prefixes the
    API). Raises ExportError when a step of the model has no native code (they are named),
    CompilerNotFoundError or CompileError when the library cannot be built."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name.startswith("opf_"):
        raise ExportError(f"the library name {name!r} must be a C identifier of at most 63 "
                          f"characters, not starting with opf_ (e.g. 'model' or 'resnet50')")
    python_steps = [f"{step.group.name} ({', '.join(dict.fromkeys(step.group.op_names))})"
                    for step in exe.steps if step.function is None]
    if python_steps:
        raise ExportError(f"{len(python_steps)} kernel(s) of this model run in Python (the "
                          f"NumPy reference) and cannot be exported: "
                          f"{'; '.join(python_steps[:5])}")
    if exe._native_plan() is None or not exe.source_code:
        raise ExportError("this executor's kernels have no native model entry (built by an "
                          "older opfusion, or with replaced kernels); compile it again")
    layout = exe.model_layout()
    constants = list(exe._constants.values())  # value order: the constants' slots
    offsets, weights = _weights(constants)
    inputs = [_spec(name, exe.values[index].type)
              for name, index in zip(exe.input_names, exe._input_values)]
    outputs = [_spec(name, exe.values[index].type)
               for name, index in zip(exe.output_names, exe.outputs)]
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "weights.bin", "wb") as handle:
        for chunk in weights:
            handle.write(chunk)
    description = f"target {exe.target.explicit()}"
    (folder / f"{name}.h").write_text(header_c(name, inputs, outputs, layout, description))
    source = exe.source_code + wrapper_c(name, inputs, outputs, layout, offsets,
                                         has_weights=bool(constants))
    (folder / f"{name}.c").write_text(source)
    library = folder / f"lib{name}.so"
    # Only the API is exported (-fvisibility=hidden), so that two models linked into one
    # program cannot call each other's kernels; -lm: the kernels call libm (expf, ...), which
    # a program linking the library may not.
    build_shared_library(folder / f"{name}.c", library,
                         [*target_flags(exe.target), "-fvisibility=hidden"], ["-lm"])
    build = f"cc -O2 -o example example.c -L. -l{name} -Wl,-rpath,'$ORIGIN'"
    (folder / "example.c").write_text(example_c(name, build))
    (folder / "README.txt").write_text(_readme(name, build, description))
    return ExportedLibrary(folder, library, folder / f"{name}.h", folder / "example.c", build)


def _spec(name: str, ty: Any) -> TensorSpec:
    return TensorSpec(name, str(ty.dtype), tuple(int(d) for d in ty.shape), ty.nbytes)


def _weights(constants: list[np.ndarray]) -> tuple[list[int], list[memoryview]]:
    """The constants' offsets in ``weights.bin`` and its contents (the layout of an
    artifact's weights: native byte order, each array at a multiple of 64 bytes)."""
    from .artifact import weights_layout

    index, chunks = weights_layout({str(i): array for i, array in enumerate(constants)})
    return [index["arrays"][str(i)]["offset"] for i in range(len(constants))], chunks


def _readme(name: str, build: str, description: str) -> str:
    return f"""{name}: a model compiled by opfusion ({description}).

lib{name}.so   the model (kernels, weights embedded); its API is in {name}.h
{name}.h       {name}_run(inputs, outputs, workspace), {name}_set_num_threads(n),
               the inputs' and outputs' names, dtypes, shapes and sizes
example.c      reads each input from a raw little-endian file, writes each output to one
{name}.c, weights.bin   the source lib{name}.so was built from (to read or rebuild it)

Build the example (in this directory):
    {build}
Run it:
    ./example INPUT_0.bin ... OUTPUT_0.bin ...
"""
