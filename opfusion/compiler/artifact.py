"""Export and load compiled models: one self-contained file, run without recompiling.

The file is a zip archive: ``manifest.json`` (format, the CPU features the kernels were built
for, inputs, values, steps, memory plan), ``kernels.so`` (the shared library), ``kernels.c``
(its source, for reading) and ``constants.npz`` (the weights). Loading checks the format and
that this CPU has every instruction-set feature the library was compiled for *before* the
library is loaded: code built with ``-march=native`` elsewhere could otherwise die with an
illegal instruction."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OpfusionError
from ..ir.expr import Function
from ..ir.module import IRModule
from ..ir.parser import parse
from ..ir.types import TensorType
from ..runtime.compiler import CompiledLibrary, cache_dir, host_cpu_features
from ..runtime.module import KernelParam, Module
from .executor import ExecStep, Executor, ValueInfo
from .lower_group import LoweredGroup
from .memory_plan import MemoryPlan

FORMAT = "opfusion-artifact-1"


class ArtifactError(OpfusionError):
    """A file that is not a usable opfusion artifact (corrupt, foreign, or built for a CPU
    with features this one lacks)."""


def export_executor(exe: Executor, path: str | os.PathLike[str]) -> None:
    """Write ``exe`` to ``path`` (atomically)."""
    library_bytes = b""
    library_paths = {str(m.library.path) for m in exe.modules.values()}
    if len(library_paths) > 1:
        raise ArtifactError("this executor's kernels live in several libraries; export needs "
                            "one (compile the model with opf.compile)")
    if library_paths:
        library_bytes = Path(library_paths.pop()).read_bytes()
    constants: dict[str, np.ndarray] = {}
    values = []
    for index, info in enumerate(exe.values):
        entry: dict[str, Any] = {"shape": list(info.type.shape), "dtype": str(info.type.dtype),
                                 "input_index": info.input_index, "constant": None}
        if info.constant is not None:
            key = f"v{index}"
            constants[key] = np.require(info.constant, requirements="C")
            entry["constant"] = key
        values.append(entry)
    steps = []
    for step in exe.steps:
        module = exe.modules.get(step.group.name)
        ref = step.group.reference_function
        steps.append({
            "name": step.group.name,
            "ops": step.group.op_names,
            "entry": module.entry_name if module else None,
            "params": [[p.name, list(p.shape), p.dtype, p.written] for p in module.params]
            if module else [],
            "reads": step.reads, "writes": step.writes,
            "output_types": [[list(t.shape), str(t.dtype)] for t in step.group.output_types],
            "reference": IRModule.from_expr(ref).astext() if ref is not None else None,
        })
    manifest = {
        "format": FORMAT, "opfusion_version": _version(),
        "cpu_features": host_cpu_features(),
        "library_sha256": hashlib.sha256(library_bytes).hexdigest(),
        "input_names": exe.input_names, "values": values, "steps": steps,
        "outputs": exe.outputs, "tuple_output": exe.tuple_output,
        "plan": {"block_of": {str(k): v for k, v in exe.plan.block_of.items()},
                 "block_sizes": exe.plan.block_sizes, "naive_bytes": exe.plan.naive_bytes},
    }
    buffer = io.BytesIO()
    np.savez(buffer, **constants)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("manifest.json", json.dumps(manifest, indent=1))
            archive.writestr("kernels.so", library_bytes)
            archive.writestr("kernels.c", exe.source_code)
            archive.writestr("constants.npz", buffer.getvalue())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _version() -> str:
    from .. import __version__

    return __version__


def load(path: str | os.PathLike[str]) -> Executor:
    """Load a model written by ``exe.export(path)``; nothing is recompiled."""
    archive = _open(path)
    with archive:
        manifest = _manifest(archive, path)
        _check_cpu(manifest, path)
        library_bytes = archive.read("kernels.so")
        source = archive.read("kernels.c").decode()
        with archive.open("constants.npz") as handle:
            constants = dict(np.load(io.BytesIO(handle.read()), allow_pickle=False))
    if hashlib.sha256(library_bytes).hexdigest() != manifest["library_sha256"]:
        raise ArtifactError(f"{path}: the kernel library does not match its checksum; the file "
                            f"is corrupt, export the model again")
    try:
        return _rebuild(manifest, library_bytes, source, constants)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ArtifactError(f"{path}: the manifest is inconsistent ({type(err).__name__}: "
                            f"{err}); export the model again") from None


def _open(path: str | os.PathLike[str]) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, OSError) as err:
        raise ArtifactError(f"{path} is not an opfusion artifact ({err}); write one with "
                            f"exe.export(path)") from None


def _manifest(archive: zipfile.ZipFile, path: Any) -> dict[str, Any]:
    names = set(archive.namelist())
    missing = {"manifest.json", "kernels.so", "kernels.c", "constants.npz"} - names
    if missing:
        raise ArtifactError(f"{path} is not an opfusion artifact (it lacks "
                            f"{', '.join(sorted(missing))})")
    try:
        manifest = json.loads(archive.read("manifest.json"))
    except (ValueError, zipfile.BadZipFile) as err:
        raise ArtifactError(f"{path}: the manifest cannot be read ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ArtifactError(f"{path} has format {found!r}; this opfusion reads {FORMAT!r}")
    return manifest


def _check_cpu(manifest: dict[str, Any], path: Any) -> None:
    needed = set(str(manifest.get("cpu_features", "")).split())
    missing = sorted(needed - set(host_cpu_features().split()))
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ArtifactError(f"{path} was compiled for a CPU with features this one lacks "
                            f"({shown}); compile the model again on this machine")


def _rebuild(manifest: dict[str, Any], library_bytes: bytes, source: str,
             constants: dict[str, np.ndarray]) -> Executor:
    values = []
    for entry in manifest["values"]:
        ty = TensorType(tuple(entry["shape"]), entry["dtype"])
        constant = constants[entry["constant"]] if entry["constant"] is not None else None
        values.append(ValueInfo(ty, entry["input_index"], constant))
    library = _install_library(library_bytes, source, manifest["library_sha256"])
    steps, modules = [], {}
    for entry in manifest["steps"]:
        output_types = [TensorType(tuple(shape), dtype) for shape, dtype in entry["output_types"]]
        reference = _parse_function(entry["reference"]) if entry["reference"] else None
        prim = None
        group = LoweredGroup(entry["name"], prim, output_types, reference_function=reference,
                             op_names=list(entry["ops"]))
        function = None
        if entry["entry"] is not None:
            module = modules.get(entry["name"])
            if module is None:
                params = [KernelParam(n, tuple(shape), dtype, written)
                          for n, shape, dtype, written in entry["params"]]
                module = Module(entry["name"], entry["entry"], params, source, library)
                modules[entry["name"]] = module
            function = module._function
        steps.append(ExecStep(group, function, list(entry["reads"]), list(entry["writes"])))
    plan_entry = manifest["plan"]
    plan = MemoryPlan({int(k): v for k, v in plan_entry["block_of"].items()},
                      list(plan_entry["block_sizes"]), plan_entry["naive_bytes"])
    exe = Executor(manifest["input_names"], values, steps, manifest["outputs"], plan,
                   manifest["tuple_output"])
    exe.modules = modules
    exe.source_code = source
    return exe


def _install_library(data: bytes, source: str, digest: str) -> CompiledLibrary:
    """Put the library in the cache directory under its checksum (atomically) and say where."""
    directory = cache_dir() / "artifacts"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{digest[:40]}.so"
    if not path.is_file():
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    return CompiledLibrary(path, path.with_suffix(".c"), digest[:40], True, 0.0)


def _parse_function(text: str) -> Function:
    return parse(text)["main"]
