"""Export and load compiled models: one self-contained file, run without recompiling.

The file is a zip archive: ``manifest.json`` (format, the target the kernels were built for
and the ISA features that target let the compiler use, inputs, values, steps, memory plan),
``kernels.so`` (the shared library), ``kernels.c`` (its source, for reading), and the weights:
``weights.bin``, every constant's raw bytes, stored uncompressed with each array at a
multiple of :data:`WEIGHTS_ALIGNMENT` bytes from the start of the *file*, and
``weights.json``, its index (each array's dtype, shape, offset and byte count). Loading maps
``weights.bin`` into memory (``mmap``) and the constants are read-only views of that map:
nothing is decompressed or copied, and pages are read when a run first touches them. Loading
checks the format and that this CPU has every ISA feature the library's code may use
*before* the library is loaded: code for a feature the CPU lacks would die with an illegal
instruction. Only those features count (the compiler was given exactly them, never
``-march=native``): a file built on an AVX-512 machine for ``c -mattr=+avx2,+fma`` loads on
any AVX2 machine.

**Loading an artifact runs its native code**: the library's initializers run when it is
loaded, so only load artifacts from a source you trust, as with pickle or
``torch.load(weights_only=False)``. What loading does guarantee is that an artifact can do no
more than its own library: kernels are taken from the library's own kernel table (see
:mod:`opfusion.backend.cpu.module`), never by a symbol name from the manifest, and every shape,
dtype, index, memory block and constant in the manifest is checked against that table and
against each other before anything runs, so a damaged or edited manifest is an
:class:`ArtifactError`, not a call into libc or an out-of-bounds access. Sizes are checked
before reading: a member larger than its limit (:data:`MAX_MANIFEST_BYTES`,
:data:`MAX_LIBRARY_BYTES`, :data:`MAX_SOURCE_BYTES`, and ``max_bytes`` in all) or compressed
beyond what deflate can do (a zip bomb) is refused without being expanded; every weight's
offset and length is checked against the file's size before it is mapped, and its bytes
against the CRC-32 the archive records (unless ``verify_weights=False``).

Loading needs no C compiler. It writes one file: the library, which ``dlopen`` can only load
from a file, is extracted to ``<kernel cache>/artifacts/<checksum>.so`` (the kernel cache is
``$OPFUSION_CACHE_DIR/kernels`` or ``~/.cache/opfusion/kernels``) and reused by later loads;
when that directory cannot be written, to a private temporary directory removed at exit.

The weights stay mapped while the loaded model lives. :meth:`Executor.export` replaces a file
atomically (a new file renamed over the old), so exporting over a loaded model's file is
safe; truncating or rewriting that file *in place* while the model runs is not (the process
would fault on the vanished pages, as with any memory-mapped file)."""

from __future__ import annotations

import atexit
import hashlib
import json
import mmap
import os
import re
import shutil
import struct
import tempfile
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..backend.cpu.module import DTYPE_CODES, KernelParam, LibraryKernels, LibraryLoadError, Module
from ..backend.cpu.toolchain import (
    CompiledLibrary,
    cache_dir,
    has_recorded_digest,
    store_library,
    touch,
)
from ..errors import OpfusionError
from ..ir.expr import Function
from ..ir.module import IRModule
from ..ir.parser import parse
from ..ir.types import TensorType, TupleType
from ..target import Target
from ..target.host import host_arch, host_features
from .executor import ExecStep, Executor, ValueInfo
from .lower_group import LoweredGroup
from .memory_plan import ALIGNMENT, MemoryPlan, resolve_aliases
from .signature import check_output_names

#: Version 2: the library exports a kernel table (files of version 1 lack it). Version 3: the
#: manifest records the target and the ISA features its code uses, instead of every flag of
#: the building machine's CPU. Version 4: the weights are ``weights.bin`` (stored, aligned,
#: mapped at load) with its index ``weights.json``, instead of ``constants.npz``. Version 5:
#: the library holds the model's native entry (kernel table version 3), checked at load
#: against the manifest's steps, values and memory plan.
FORMAT = "opfusion-artifact-5"
#: Formats this opfusion recognizes as older versions of its own (told to export again).
_OLD_FORMATS = ("opfusion-artifact-1", "opfusion-artifact-2", "opfusion-artifact-3",
                "opfusion-artifact-4")

#: Largest ``manifest.json`` accepted (uncompressed).
MAX_MANIFEST_BYTES = 64 << 20
#: Largest ``kernels.so`` accepted.
MAX_LIBRARY_BYTES = 1 << 30
#: Largest ``kernels.c`` accepted.
MAX_SOURCE_BYTES = 256 << 20
#: Largest ``weights.json`` accepted.
MAX_WEIGHTS_INDEX_BYTES = 64 << 20
#: Every weight starts at a multiple of this many bytes from the start of the file, so that
#: its mapped view is as aligned as the arrays the compiler allocates (a cache line, and the
#: widest vector).
WEIGHTS_ALIGNMENT = 64
#: Default limit on everything an artifact expands to (``opf.load(path, max_bytes=...)``).
DEFAULT_MAX_BYTES = 16 << 30
#: Deflate expands at most about 1032:1; a member that claims more is damaged or a zip bomb.
_MAX_DEFLATE_RATIO = 1100
#: Highest rank of a tensor in an artifact.
_MAX_RANK = 64
_MEMBERS = ("manifest.json", "kernels.so", "kernels.c", "weights.json", "weights.bin")
#: The id of the zip "extra field" that pads the local header of ``weights.bin`` to align
#: its data (the id Android's zipalign uses for the same purpose).
_PADDING_EXTRA_ID = 0xD935
#: Bytes of a local file header before its name (PKWARE APPNOTE 4.3.7).
_LOCAL_HEADER = struct.Struct("<4s5H3I2H")


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
        "target": str(exe.target.explicit()), "arch": exe.target.arch,
        "isa_features": sorted(exe.target.features),
        "library_sha256": hashlib.sha256(library_bytes).hexdigest(),
        "input_names": exe.input_names, "values": values, "steps": steps,
        "outputs": exe.outputs, "tuple_output": exe.tuple_output,
        "output_names": exe.output_names,
        "plan": {"block_of": {str(k): v for k, v in exe.plan.block_of.items()},
                 "block_sizes": exe.plan.block_sizes, "naive_bytes": exe.plan.naive_bytes,
                 "aliases": {str(k): list(v) for k, v in exe.plan.aliases.items()},
                 "views": list(exe.plan.views)},
    }
    index, weights = weights_layout(constants)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        write_archive(tmp, {"manifest.json": json.dumps(manifest, indent=1).encode(),
                            "kernels.so": library_bytes,
                            "kernels.c": exe.source_code.encode(),
                            "weights.json": json.dumps(index).encode()}, weights)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def weights_layout(constants: dict[str, np.ndarray]
                    ) -> tuple[dict[str, Any], list[memoryview]]:
    """The index of ``weights.bin`` and its contents as chunks: each array at the next
    multiple of :data:`WEIGHTS_ALIGNMENT` (zero bytes between)."""
    arrays: dict[str, Any] = {}
    chunks: list[memoryview] = []
    offset = 0
    for key, array in constants.items():
        # Native byte order: the index names the dtype, and load views the bytes as native.
        array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
        padding = -offset % WEIGHTS_ALIGNMENT
        if padding:
            chunks.append(memoryview(bytes(padding)))
            offset += padding
        arrays[key] = {"dtype": array.dtype.name, "shape": list(array.shape),
                       "offset": offset, "nbytes": array.nbytes}
        chunks.append(memoryview(array.reshape(-1).view(np.uint8)))
        offset += array.nbytes
    return {"alignment": WEIGHTS_ALIGNMENT, "arrays": arrays}, chunks


def write_archive(path: str | os.PathLike[str], members: dict[str, bytes],
                  weights: list[memoryview] | list[bytes]) -> None:
    """Write an artifact's zip: ``members`` compressed, then ``weights.bin`` (the
    concatenation of ``weights``) stored uncompressed, its data starting at a multiple of
    :data:`WEIGHTS_ALIGNMENT` in the file (the local header is padded with an extra field,
    as zipalign does), so that offsets aligned within it are aligned in the file."""
    size = sum(len(chunk) for chunk in weights)
    with open(path, "wb") as handle:
        with zipfile.ZipFile(handle, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name, data in members.items():
                archive.writestr(name, data)
            info = zipfile.ZipInfo("weights.bin")
            info.compress_type = zipfile.ZIP_STORED
            info.file_size = size
            # The local header: fixed part, name, our padding field, and (forced, so that its
            # length is known here) the 20-byte zip64 field.
            header = _LOCAL_HEADER.size + len(info.filename.encode()) + 4 + 20
            padding = -(handle.tell() + header) % WEIGHTS_ALIGNMENT
            info.extra = struct.pack("<HH", _PADDING_EXTRA_ID, padding) + bytes(padding)
            with archive.open(info, "w", force_zip64=True) as out:
                if handle.tell() % WEIGHTS_ALIGNMENT:
                    raise ArtifactError("internal error: weights.bin is not aligned in the "
                                        "archive (zipfile wrote another local header)")
                for chunk in weights:
                    out.write(chunk)


def _version() -> str:
    from .. import __version__

    return __version__


def load(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_MAX_BYTES,
         verify_weights: bool = True) -> Executor:
    """Load a model written by ``exe.export(path)``; nothing is recompiled.

    **Only load artifacts you trust.** An artifact holds a native shared library, and loading
    it runs that library's code, just as unpickling runs code (``pickle.load``,
    ``torch.load(weights_only=False)``). Loading does make sure that the artifact can do no
    more than its own library: kernels come from the library's own kernel table, and the
    manifest's shapes, dtypes, indices, memory plan and constants are checked against the
    table and each other before anything runs.

    ``max_bytes`` bounds what the file may expand to (default 16 GiB); larger or
    over-compressed members are refused before they are read. The weights are not read but
    mapped: the model's constants are read-only views of the file (see the module's
    docstring). ``verify_weights`` (default) checks their bytes against the archive's CRC-32,
    which reads them once (about 0.5 ms per MB); without it a damaged weight is found by
    no one. Loading needs no C compiler; it extracts the library into the kernel cache
    (``<cache>/artifacts``), or a temporary directory when that cannot be written.

    Raises :class:`ArtifactError` for a missing, damaged, truncated, foreign, older-format or
    inconsistent file and for one built for a CPU with features this one lacks."""
    try:
        return _load(path, max_bytes, verify_weights)
    except ArtifactError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, EOFError, OSError,
            RecursionError, zipfile.BadZipFile, zlib.error, OpfusionError) as err:
        raise ArtifactError(f"{path} is damaged or not an opfusion artifact "
                            f"({type(err).__name__}: {err}); export the model again") from None


def _load(path: str | os.PathLike[str], max_bytes: int, verify_weights: bool) -> Executor:
    handle, archive = _open(path)
    with handle, archive:
        budget = _Budget(path, max_bytes)
        members = _members(archive, path, budget)
        manifest = _manifest(_read(archive, members["manifest.json"], MAX_MANIFEST_BYTES, path),
                             path)
        _require_members(members, path)
        target = _check_cpu(manifest, path)
        library_bytes = _read(archive, members["kernels.so"], MAX_LIBRARY_BYTES, path)
        digest = _field(manifest, "library_sha256", str, "manifest")
        if hashlib.sha256(library_bytes).hexdigest() != digest:
            raise ArtifactError(f"{path}: the kernel library does not match its checksum; the "
                                f"file is corrupt, export the model again")
        try:
            source = _read(archive, members["kernels.c"], MAX_SOURCE_BYTES, path).decode()
        except UnicodeDecodeError:
            raise ArtifactError(f"{path}: kernels.c is not text; the file is corrupt") from None
        index = _read(archive, members["weights.json"], MAX_WEIGHTS_INDEX_BYTES, path)
        constants = _map_weights(handle, members["weights.bin"], index, path, verify_weights)
    executor = _rebuild(manifest, library_bytes, digest, source, constants, path)
    executor.target = target
    return executor


class _Budget:
    """What is left of ``max_bytes`` for the members still to be read."""

    def __init__(self, path: Any, max_bytes: int) -> None:
        self.path = path
        self.left = max_bytes

    def take(self, nbytes: int, what: str) -> None:
        if nbytes > self.left:
            raise ArtifactError(f"{self.path}: {what} would expand beyond the limit on what an "
                                f"artifact may hold; pass a larger max_bytes to opf.load if "
                                f"the file is trusted and really that large")
        self.left -= nbytes


def _open(path: str | os.PathLike[str]) -> tuple[Any, zipfile.ZipFile]:
    """The open file and the archive read from it (one file, so that the weights mapped
    later are those of the archive checked now, even if ``path`` is replaced meanwhile)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file") from None
    try:
        return handle, zipfile.ZipFile(handle)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        handle.close()
        raise ArtifactError(f"{path} is not an opfusion artifact ({err}); write one with "
                            f"exe.export(path)") from None


def _members(archive: zipfile.ZipFile, path: Any, budget: _Budget
             ) -> dict[str, zipfile.ZipInfo]:
    """The members by name, after checking every member's sizes (see :func:`_check_sizes`)
    and that there is a manifest (the rest are required once its format is known)."""
    infos = archive.infolist()
    found = {info.filename: info for info in infos}
    if "manifest.json" not in found or len(found) != len(infos):
        lacking = "manifest.json" if len(found) == len(infos) else "unique member names"
        raise ArtifactError(f"{path} is not an opfusion artifact (it lacks {lacking})")
    for info in infos:
        _check_sizes(info, path, budget)
    return found


def _require_members(members: dict[str, zipfile.ZipInfo], path: Any) -> None:
    missing = [name for name in _MEMBERS if name not in members]
    if missing:
        raise ArtifactError(f"{path} is not an opfusion artifact (it lacks "
                            f"{', '.join(missing)})")


def _check_sizes(info: zipfile.ZipInfo, path: Any, budget: _Budget) -> None:
    """Refuse, before reading it, a member that is too large or claims more expansion than its
    compression method can give (a zip bomb)."""
    if info.compress_type == zipfile.ZIP_STORED:
        honest = info.file_size == info.compress_size
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        honest = info.file_size <= _MAX_DEFLATE_RATIO * info.compress_size + 1024
    else:
        honest = False
    if not honest:
        raise ArtifactError(f"{path}: member {info.filename!r} claims {info.file_size} bytes "
                            f"from {info.compress_size} (method {info.compress_type}); the file "
                            f"is damaged or a zip bomb")
    budget.take(info.file_size, f"member {info.filename!r} ({info.file_size} bytes)")


def _read(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, path: Any) -> bytes:
    """The member's bytes, read in bounded chunks: never more than ``limit`` or than the size
    its header declares."""
    if info.file_size > limit:
        raise ArtifactError(f"{path}: member {info.filename!r} is {info.file_size} bytes, more "
                            f"than the {limit} an artifact's {info.filename} may have")
    chunks, total = [], 0
    with archive.open(info) as handle:
        while True:
            chunk = handle.read(min(1 << 20, info.file_size - total + 1))
            if not chunk:
                break
            total += len(chunk)
            if total > info.file_size:
                raise ArtifactError(f"{path}: member {info.filename!r} expands beyond its "
                                    f"declared size; the file is damaged")
            chunks.append(chunk)
    if total != info.file_size:
        raise ArtifactError(f"{path}: member {info.filename!r} is truncated")
    return b"".join(chunks)


def _manifest(data: bytes, path: Any) -> dict[str, Any]:
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise ArtifactError(f"{path}: the manifest cannot be read ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        if found in _OLD_FORMATS:
            raise ArtifactError(f"{path} was written by an older opfusion (format {found!r}; "
                                f"this one reads {FORMAT!r}); export the model again")
        raise ArtifactError(f"{path} has format {found!r}; this opfusion reads {FORMAT!r}")
    return manifest


def _check_cpu(manifest: dict[str, Any], path: Any) -> Target:
    """The artifact's target, once this machine is known to run its code: same architecture,
    and every ISA feature the code may use."""
    arch = _field(manifest, "arch", str, "manifest")
    needed = _field(manifest, "isa_features", list, "manifest")
    if not all(isinstance(f, str) for f in needed):
        raise ArtifactError(f"{path}: the manifest's isa_features are not names")
    if arch != host_arch():
        raise ArtifactError(f"{path} was compiled for {arch}, and this machine is "
                            f"{host_arch()}; compile the model again on this machine")
    missing = sorted(set(needed) - host_features())
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise ArtifactError(f"{path} was compiled for a CPU with features this one lacks "
                            f"({shown}); compile the model again on this machine, or for a "
                            f"target it has (e.g. target='c -mattr=+avx2,+fma')")
    try:
        return Target(_field(manifest, "target", str, "manifest"))
    except OpfusionError as err:
        raise ArtifactError(f"{path}: the manifest's target is not one this opfusion "
                            f"knows ({err})") from None


_WEIGHT_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")


def _map_weights(handle: Any, info: zipfile.ZipInfo, index: bytes, path: Any,
                 verify: bool) -> dict[str, np.ndarray]:
    """The constants as read-only views of ``weights.bin`` mapped from the file: its data
    found through its local header and checked to lie within the file, each array of the
    index checked to lie within it, aligned, and exactly as large as its shape needs."""
    if info.compress_type != zipfile.ZIP_STORED:
        raise ArtifactError(f"{path}: weights.bin is compressed, and artifacts store it as it "
                            f"is to map it (was the file rewritten by another zip tool?); "
                            f"export the model again")
    arrays = _weights_index(index, info.file_size, path)
    size = os.fstat(handle.fileno()).st_size
    start = _data_start(handle, info, size, path)
    mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if info.file_size else b""
    if verify:
        with memoryview(mapped) as view:
            crc = zlib.crc32(view[start:start + info.file_size])
        if crc != info.CRC:
            raise ArtifactError(f"{path}: the weights do not match their CRC-32; the file is "
                                f"corrupt, export the model again")
    constants: dict[str, np.ndarray] = {}
    for key, (dtype, shape, offset, count) in arrays.items():
        if (start + offset) % WEIGHTS_ALIGNMENT:
            raise ArtifactError(f"{path}: weight {key!r} is not aligned to "
                                f"{WEIGHTS_ALIGNMENT} bytes in the file (was it rewritten by "
                                f"another zip tool?); export the model again")
        if count:
            array = np.frombuffer(mapped, dtype, count, start + offset).reshape(shape)
        else:
            array = np.empty(shape, dtype)
            array.flags.writeable = False
        constants[key] = array
    return constants


def _data_start(handle: Any, info: zipfile.ZipInfo, size: int, path: Any) -> int:
    """Where the member's data starts in the file (after its local header, whose name and
    extra field may differ in length from the central directory's), checked to end within
    the file's ``size``."""
    if info.header_offset + _LOCAL_HEADER.size > size:
        raise ArtifactError(f"{path}: weights.bin lies beyond the end of the file; it is "
                            f"truncated")
    handle.seek(info.header_offset)
    fields = _LOCAL_HEADER.unpack(handle.read(_LOCAL_HEADER.size))
    signature, method, name_length, extra_length = fields[0], fields[3], fields[9], fields[10]
    name = handle.read(name_length)
    if signature != b"PK\x03\x04" or method != zipfile.ZIP_STORED or name != b"weights.bin":
        raise ArtifactError(f"{path}: the local header of weights.bin is damaged")
    start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
    if start + info.file_size > size:
        raise ArtifactError(f"{path}: weights.bin ends {start + info.file_size - size} bytes "
                            f"beyond the end of the file; it is truncated")
    return start


def _weights_index(data: bytes, region: int, path: Any
                   ) -> dict[str, tuple[np.dtype, tuple[int, ...], int, int]]:
    """``weights.json`` checked: for each array a name, a plain dtype, a shape, an offset and
    exactly the byte count the shape needs, lying within ``weights.bin`` (``region`` bytes).
    Returns name -> (dtype, shape, offset, element count)."""
    try:
        index = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise ArtifactError(f"{path}: weights.json cannot be read ({err})") from None
    entries = index.get("arrays") if isinstance(index, dict) else None
    if not isinstance(entries, dict):
        raise ArtifactError(f"{path}: weights.json has no table of arrays")
    arrays = {}
    for key, entry in entries.items():
        where = f"{path}: weight {key!r}"
        if not _WEIGHT_NAME.fullmatch(key) or not isinstance(entry, dict):
            raise ArtifactError(f"{where} is not a name with an entry")
        dtype, shape = entry.get("dtype"), entry.get("shape")
        offset, nbytes = entry.get("offset"), entry.get("nbytes")
        if dtype not in DTYPE_CODES:
            raise ArtifactError(f"{where} has dtype {dtype!r}, not one opfusion compiles")
        count = _element_count(shape, where)
        for name, number in (("offset", offset), ("nbytes", nbytes)):
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise ArtifactError(f"{where} has {name} {number!r}, not a byte count")
        itemsize = np.dtype(dtype).itemsize
        if nbytes != count * itemsize:
            raise ArtifactError(f"{where} has {nbytes} bytes of data, not the "
                                f"{count * itemsize} its shape {tuple(shape)} needs")
        if offset + nbytes > region:
            raise ArtifactError(f"{where} ({nbytes} bytes at {offset}) lies beyond the "
                                f"{region} bytes of weights.bin; the file is damaged")
        arrays[key] = (np.dtype(dtype), tuple(shape), offset, count)
    return arrays


# -- checking the manifest ------------------------------------------------------------------

def _field(entry: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``entry[key]``, which must be of ``kind`` (a bool is not an int)."""
    owner = "the manifest" if where == "manifest" else f"the manifest's {where}"
    if not isinstance(entry, dict) or key not in entry:
        raise ArtifactError(f"{owner} lacks {key!r}")
    value = entry[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        name = f"the manifest's {key}" if where == "manifest" else f"{owner}.{key}"
        raise ArtifactError(f"{name} is {value!r}, not a "
                            f"{'/'.join(k.__name__ for k in kinds)}")
    return value


def _index(value: Any, size: int, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < size:
        raise ArtifactError(f"the manifest's {where} is {value!r}, not an index below {size}")
    return value


def _element_count(shape: Any, where: str) -> int:
    if not isinstance(shape, (list, tuple)) or len(shape) > _MAX_RANK:
        raise ArtifactError(f"{where}: shape {shape!r} is not a list of dimensions")
    count = 1
    for dim in shape:
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
            raise ArtifactError(f"{where}: shape {shape!r} has a dimension that is not a "
                                f"non-negative integer")
        count *= dim
    if count >= 1 << 48:
        raise ArtifactError(f"{where}: shape {shape!r} is impossibly large")
    return count


def _tensor_type(shape: Any, dtype: Any, where: str) -> TensorType:
    _element_count(shape, where)
    if dtype not in DTYPE_CODES:
        raise ArtifactError(f"{where}: dtype {dtype!r} is not one opfusion compiles")
    return TensorType(tuple(shape), dtype)


def _rebuild(manifest: dict[str, Any], library_bytes: bytes, digest: str, source: str,
             constants: dict[str, np.ndarray], path: Any) -> Executor:
    input_names = _field(manifest, "input_names", list, "manifest")
    if not all(isinstance(n, str) for n in input_names) or len(set(input_names)) != len(
            input_names):
        raise ArtifactError("the manifest's input_names are not distinct strings")
    values = _values(manifest, input_names, constants)
    entries = _field(manifest, "steps", list, "manifest")
    library = None
    if any(isinstance(e, dict) and e.get("entry") is not None for e in entries):
        if not library_bytes:
            raise ArtifactError(f"{path}: steps call kernels but the artifact has no library")
        library = _install_library(library_bytes, source, digest)
    aliases = _aliases(manifest, values)
    views = _views(manifest, aliases)
    steps, modules = _steps(entries, values, library, source, path, aliases, views)
    outputs, tuple_output = _outputs(manifest, values, steps)
    plan = _plan(manifest, values, steps, outputs, aliases, views)
    exe = Executor(input_names, values, steps, outputs, plan, tuple_output,
                   _output_names(manifest, len(outputs)))
    exe.modules = modules
    exe.source_code = source
    mismatch = exe.native_mismatch()
    if mismatch:  # the entry would read or write by the library's tables, not the manifest's
        raise ArtifactError(f"{path}: the manifest does not match the library: {mismatch}")
    return exe


def _values(manifest: dict[str, Any], input_names: list[str],
            constants: dict[str, np.ndarray]) -> list[ValueInfo]:
    values = []
    seen_inputs: set[int] = set()
    for index, entry in enumerate(_field(manifest, "values", list, "manifest")):
        where = f"values[{index}]"
        ty = _tensor_type(_field(entry, "shape", list, where),
                          _field(entry, "dtype", str, where), where)
        input_index = _field(entry, "input_index", (int, type(None)), where)
        key = _field(entry, "constant", (str, type(None)), where)
        constant = None
        if input_index is not None:
            _index(input_index, len(input_names), f"{where}.input_index")
            if input_index in seen_inputs or key is not None:
                raise ArtifactError(f"the manifest's {where} is input {input_index} twice over "
                                    f"or also a constant")
            seen_inputs.add(input_index)
        if key is not None:
            constant = constants.get(key)
            if constant is None:
                raise ArtifactError(f"the manifest's {where} names constant {key!r}, which "
                                    f"weights.json lacks")
            if constant.shape != ty.shape or constant.dtype != np.dtype(ty.dtype):
                raise ArtifactError(f"constant {key!r} is {constant.dtype}{constant.shape} but "
                                    f"the manifest's {where} is {ty.dtype}{ty.shape}")
        values.append(ValueInfo(ty, input_index, constant))
    if len(seen_inputs) != len(input_names):
        raise ArtifactError(f"the manifest has {len(input_names)} inputs but "
                            f"{len(seen_inputs)} input values")
    return values


def _aliases(manifest: dict[str, Any], values: list[ValueInfo]) -> dict[int, tuple[int, int]]:
    """The memory plan's aliases (value: [the value holding it, byte offset]), checked: in
    range, aligned, each inside its holder, of the holder's dtype, no cycle."""
    entry = _field(manifest, "plan", dict, "manifest")
    raw = entry.get("aliases", {})
    if not isinstance(raw, dict):
        raise ArtifactError("the manifest's plan.aliases is not an object")
    aliases: dict[int, tuple[int, int]] = {}
    for key, pair in raw.items():
        if not isinstance(key, str) or not key.isdigit() or not isinstance(pair, list) \
                or len(pair) != 2:
            raise ArtifactError(f"the manifest's plan.aliases holds {key!r}: {pair!r}, not "
                                f"value: [holder, offset]")
        value = _index(int(key), len(values), "plan.aliases")
        holder = _index(pair[0], len(values), f"plan.aliases[{key}]")
        offset = pair[1]
        inner, outer = values[value].type, values[holder].type
        if (not isinstance(offset, int) or isinstance(offset, bool) or offset < 0
                or offset % ALIGNMENT or offset + inner.nbytes > outer.nbytes
                or inner.dtype != outer.dtype or value == holder):
            raise ArtifactError(f"the manifest's plan places value {value} at byte {offset!r} "
                                f"of value {holder}, which does not hold it there")
        aliases[value] = (holder, offset)
    try:
        resolve_aliases(aliases)
    except ValueError as err:
        raise ArtifactError(f"the manifest's plan: {err}") from None
    return aliases


def _views(manifest: dict[str, Any], aliases: dict[int, tuple[int, int]]) -> tuple[int, ...]:
    """The aliased values that are views (slices read in place), checked: each one of the
    aliases, once."""
    raw = _field(manifest, "plan", dict, "manifest").get("views", [])
    if not isinstance(raw, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v in aliases for v in raw) \
            or len(set(raw)) != len(raw):
        raise ArtifactError(f"the manifest's plan.views is {raw!r}, not a list of distinct "
                            "aliased values")
    return tuple(raw)


def _steps(entries: list[Any], values: list[ValueInfo], library: CompiledLibrary | None,
           source: str, path: Any, aliases: dict[int, tuple[int, int]],
           views: tuple[int, ...]) -> tuple[list[ExecStep], dict[str, Module]]:
    """The steps, each checked: values in range, read after they are made and written once;
    a kernel from the library's table whose parameters are exactly the step's values (and
    which writes none of the values it reads); a reference function typed like its values.
    A value that ``aliases`` places others in (an in-place concatenation) is made when they
    all are, and no step writes it; a view is made when the value holding it is, and no
    step writes it."""
    kernels = None
    if library is not None:
        try:
            kernels = LibraryKernels(library)
        except LibraryLoadError as err:
            raise ArtifactError(f"{path}: {err}") from None
    ready = {i for i, v in enumerate(values) if v.input_index is not None or v.constant is not None}
    is_view = set(views)
    missing: dict[int, int] = {}  # holder: its aliased values not made yet
    viewed: dict[int, list[int]] = {}  # holder: its views
    for value, (holder, _) in aliases.items():
        if value in is_view:
            viewed.setdefault(holder, []).append(value)
        else:
            missing[holder] = missing.get(holder, 0) + 1
    steps, modules = [], {}
    for number, entry in enumerate(entries):
        where = f"steps[{number}]"
        name = _field(entry, "name", str, where)
        ops = _field(entry, "ops", list, where)
        reads = [_index(v, len(values), f"{where}.reads") for v in _field(entry, "reads", list,
                                                                         where)]
        writes = [_index(v, len(values), f"{where}.writes")
                  for v in _field(entry, "writes", list, where)]
        for value in reads:
            if value not in ready:
                raise ArtifactError(f"the manifest's {where} reads value {value} before any "
                                    f"step makes it")
        for value in writes:
            if value in ready or writes.count(value) > 1 or value in missing or value in is_view:
                raise ArtifactError(f"the manifest's {where} writes value {value}, an input, a "
                                    f"constant, a value written before or assembled in place")
        output_types = []
        for pair in _field(entry, "output_types", list, where):
            if not isinstance(pair, list) or len(pair) != 2:
                raise ArtifactError(f"the manifest's {where}.output_types holds {pair!r}, not "
                                    f"[shape, dtype]")
            output_types.append(_tensor_type(*pair, f"{where}.output_types"))
        if output_types != [values[v].type for v in writes]:
            raise ArtifactError(f"the manifest's {where}.output_types differ from the types of "
                                f"the values it writes")
        entry_name = _field(entry, "entry", (str, type(None)), where)
        reference_text = _field(entry, "reference", (str, type(None)), where)
        function, reference = None, None
        if entry_name is not None:
            module = _kernel_module(entry, name, entry_name, reads, writes, values, source,
                                    library, kernels, modules, where)
            function = module._function
        elif reference_text is not None:
            reference = _reference(reference_text, reads, writes, values, where)
        else:
            raise ArtifactError(f"the manifest's {where} has neither a kernel nor a reference")
        group = LoweredGroup(name, None, output_types, reference_function=reference,
                             op_names=[str(op) for op in ops])
        steps.append(ExecStep(group, function, reads, writes))
        _make_ready(writes, ready, aliases, missing, viewed, is_view)
    return steps, modules


def _make_ready(made: list[int], ready: set[int], aliases: dict[int, tuple[int, int]],
                missing: dict[int, int], viewed: dict[int, list[int]],
                is_view: set[int]) -> None:
    """Mark ``made`` ready, the views of each value made, and every in-place concatenation
    whose last piece that was."""
    pending = list(made)
    while pending:
        value = pending.pop()
        ready.add(value)
        pending.extend(view for view in viewed.get(value, ()) if view not in ready)
        if value in aliases and value not in is_view:
            holder = aliases[value][0]
            missing[holder] -= 1
            if missing[holder] == 0:
                pending.append(holder)


def _kernel_module(entry: dict[str, Any], name: str, entry_name: str, reads: list[int],
                   writes: list[int], values: list[ValueInfo], source: str,
                   library: CompiledLibrary | None, kernels: LibraryKernels | None,
                   modules: dict[str, Module], where: str) -> Module:
    params = []
    for number, param in enumerate(_field(entry, "params", list, where)):
        if not isinstance(param, list) or len(param) != 4 or not isinstance(param[0], str) \
                or not isinstance(param[3], bool):
            raise ArtifactError(f"the manifest's {where}.params[{number}] is not "
                                f"[name, shape, dtype, written]")
        ty = _tensor_type(param[1], param[2], f"{where}.params[{number}]")
        params.append(KernelParam(param[0], ty.shape, ty.dtype, param[3]))
    operands = reads + writes
    if len(params) != len(operands):
        raise ArtifactError(f"the manifest's {where} passes {len(operands)} values to a kernel "
                            f"of {len(params)} parameters")
    for number, (param, value) in enumerate(zip(params, operands)):
        ty = values[value].type
        if (tuple(param.shape), param.dtype) != (tuple(ty.shape), ty.dtype):
            raise ArtifactError(f"the manifest's {where} passes value {value} ({ty.dtype}"
                                f"{list(ty.shape)}) as parameter {number} ({param.dtype}"
                                f"{list(param.shape)})")
        if param.written and number < len(reads):
            raise ArtifactError(f"the manifest's {where}: the kernel writes parameter {number}, "
                                f"which the step reads (value {value})")
    module = modules.get(name)
    if module is not None:
        if module.entry_name != entry_name or module.params != tuple(params):
            raise ArtifactError(f"the manifest's {where} calls kernel {name!r} with another "
                                f"entry or parameters than an earlier step")
        return module
    assert library is not None and kernels is not None
    try:
        module = Module(name, entry_name, params, source, library, kernels)
    except LibraryLoadError as err:  # no such kernel in the table, or other parameters
        raise ArtifactError(f"the manifest's {where} does not match the library: "
                            f"{err}") from None
    modules[name] = module
    return module


def _flat_types(ty: Any) -> list[Any]:
    return [t for field in ty.fields for t in _flat_types(field)] if isinstance(
        ty, TupleType) else [ty]


def _reference(text: str, reads: list[int], writes: list[int], values: list[ValueInfo],
               where: str) -> Function:
    function = _parse_function(text)
    params = [t for p in function.params for t in _flat_types(p.type_annotation)]
    results = _flat_types(function.ret_type)
    if params != [values[v].type for v in reads] or results != [values[v].type for v in writes]:
        raise ArtifactError(f"the manifest's {where}: the reference function's types differ "
                            f"from the values the step reads and writes")
    return function


def _outputs(manifest: dict[str, Any], values: list[ValueInfo], steps: list[ExecStep]
             ) -> tuple[list[int], bool]:
    made = {v for step in steps for v in step.writes}
    outputs = [_index(v, len(values), "outputs") for v in _field(manifest, "outputs", list,
                                                                 "manifest")]
    for value in outputs:
        info = values[value]
        if value not in made and info.input_index is None and info.constant is None:
            raise ArtifactError(f"the manifest's output value {value} is made by no step")
    tuple_output = _field(manifest, "tuple_output", bool, "manifest")
    if not tuple_output and len(outputs) != 1:
        raise ArtifactError(f"the manifest has {len(outputs)} outputs but no tuple output")
    return outputs, tuple_output


def _output_names(manifest: dict[str, Any], count: int) -> list[str] | None:
    """The manifest's output names; None (output_0, ...) for a file written before they were
    recorded."""
    if "output_names" not in manifest:
        return None
    names = check_output_names(manifest["output_names"], count)
    if names is None:
        raise ArtifactError(f"the manifest's output_names are not {count} strings (one per "
                            f"output)")
    return names


def _plan(manifest: dict[str, Any], values: list[ValueInfo], steps: list[ExecStep],
          outputs: list[int], aliases: dict[int, tuple[int, int]],
          views: tuple[int, ...]) -> MemoryPlan:
    """The memory plan, checked: exactly the intermediate values are planned (and the
    in-place concatenations), an aliased value in its holder's block, each block as large as
    its largest storage (a value with all those aliased into it), and no two storages of one
    block alive together."""
    entry = _field(manifest, "plan", dict, "manifest")
    sizes = _field(entry, "block_sizes", list, "plan")
    for size in sizes:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ArtifactError(f"the manifest's plan has a block of size {size!r}")
    block_of: dict[int, int] = {}
    for key, block in _field(entry, "block_of", dict, "plan").items():
        if not isinstance(key, str) or not key.isdigit():
            raise ArtifactError(f"the manifest's plan names value {key!r}")
        block_of[_index(int(key), len(values), "plan.block_of")] = _index(
            block, len(sizes), f"plan.block_of[{key}]")
    naive = _field(entry, "naive_bytes", int, "plan")
    kept = set(outputs)
    holders = {holder for holder, _ in aliases.values()}
    intermediates = ({v for step in steps for v in step.writes if v not in kept} | holders
                     | set(views))
    if set(block_of) != intermediates or any(v in kept for v in (*aliases, *holders)):
        raise ArtifactError("the manifest's memory plan does not place exactly the "
                            "intermediate values")
    storage = resolve_aliases(aliases)
    for value, (root, _) in storage.items():
        if block_of[value] != block_of[root]:
            raise ArtifactError(f"the manifest's memory plan puts value {value} in another "
                                f"block than value {root}, which holds it")
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for number, step in enumerate(steps):
        for value in (*step.writes, *step.reads):
            if value in block_of:
                root = storage[value][0] if value in storage else value
                first.setdefault(root, number)
                last[root] = number
    needed = [0] * len(sizes)
    spans: dict[int, list[tuple[int, int, int]]] = {}
    for value, block in block_of.items():
        if value in storage:
            continue  # lives in its holder's storage
        aligned = -(-max(values[value].type.nbytes, 1) // ALIGNMENT) * ALIGNMENT
        needed[block] = max(needed[block], aligned)
        spans.setdefault(block, []).append((first.get(value, -1), last.get(value, -1), value))
    if needed != sizes:
        raise ArtifactError("the manifest's memory plan has blocks of other sizes than their "
                            "values need")
    for block, live in spans.items():
        live.sort()
        for (_, end, value), (start, _, other) in zip(live, live[1:]):
            if start <= end:
                raise ArtifactError(f"the manifest's memory plan puts values {value} and "
                                    f"{other}, alive together, in block {block}")
    return MemoryPlan(block_of, list(sizes), naive, dict(aliases), views)


def _install_library(data: bytes, source: str, digest: str) -> CompiledLibrary:
    """Put the library in the kernel cache (``<cache_dir()>/artifacts``, where ``dlopen`` can
    load it) under its checksum and say where; when that directory cannot be written, in a
    temporary directory of this process instead.

    A copy already there is used only if it and the digest recorded beside it match
    ``digest``; anything else (a truncated, damaged or replaced copy) is written again, with
    its digest, atomically (see :func:`opfusion.backend.cpu.toolchain.store_library`)."""
    directory = cache_dir() / "artifacts"
    path = directory / f"{digest[:40]}.so"
    if has_recorded_digest(path, digest):
        touch(path)
    else:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            store_library(path, data)
        except OSError:  # a read-only or unwritable cache
            path = _private_directory() / f"{digest[:40]}.so"
            if not path.exists():  # only this process writes there
                path.write_bytes(data)
    return CompiledLibrary(path, path.with_suffix(".c"), digest[:40], True, 0.0)


_private: list[Path] = []


def _private_directory() -> Path:
    """A temporary directory for the libraries of this process, removed at exit (a library
    stays loaded after its file is gone)."""
    if not _private:
        _private.append(Path(tempfile.mkdtemp(prefix="opfusion-artifacts-")))
        atexit.register(shutil.rmtree, _private[0], ignore_errors=True)
    return _private[0]


def _parse_function(text: str) -> Function:
    return parse(text)["main"]
