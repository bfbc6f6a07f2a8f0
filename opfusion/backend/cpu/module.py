"""Module: a compiled kernel loaded with ctypes, callable from Python on arrays.

The kernel's C signature is ``int32_t name(T0* p0, T1* p1, ...)``: one pointer per buffer
parameter, in the PrimFunc's order; it returns 0, or -1 when it could not allocate scratch
memory. Before the call every argument is checked against its parameter — dtype, shape,
C-contiguity, alignment, writability and overlap with the other arguments — because a mismatch
that reached the C code would read or write out of bounds instead of failing.

Every generated library exports ``opf_kernel_table()``, a table of the kernels it holds: name,
function pointer, and per parameter dtype code, rank, dimensions and written flag (emitted by
:func:`opfusion.backend.cpu.emitter.kernel_table_c`). Kernels are taken from that table only: a
name is never looked up with ``dlsym``, which would also find any global symbol of the process
(libc's ``system``, say), and a kernel whose table entry has other parameters than the caller
expects is refused, because calling it would read or write out of bounds."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import KernelArgumentError, OpfusionError, OutOfMemoryError, RunInterrupted
from ...runtime.interrupt import KERNEL_CANCELLED
from ...runtime.model_layout import NO_KERNEL, ModelArg, ModelCopy, ModelLayout
from ...runtime.ndarray import NDArray
from ...runtime.openmp import configure_wait_policy
from .toolchain import CompiledLibrary, compile_source, evict

#: The function every generated library exports to describe its kernels.
KERNEL_TABLE_SYMBOL = "opf_kernel_table"
#: First field of a kernel table ("OPFT"), then its layout version.
KERNEL_TABLE_MAGIC = 0x4F504654
#: Version 2: each kernel has a thunk (a uniform ``int32_t(void* const*)`` entry) and the
#: table points at the step runner, so that a model runs in one foreign call. Version 3: the
#: step runner is replaced by the model's native entry and its tables (``opf_model_info_t``,
#: see :mod:`opfusion.backend.cpu.model_entry`), null in a library of loose kernels.
KERNEL_TABLE_VERSION = 3
#: Dtype codes of kernel-table parameters.
DTYPE_CODES = {dtype: code for code, dtype in enumerate(
    ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "float32", "float64"), start=1)}
_DTYPE_OF_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}

# Bounds a table must respect (a generated one is far below them): a damaged table must not
# make the loader read without end.
_MAX_KERNELS = 1 << 20
_MAX_PARAMS = 1 << 16
_MAX_RANK = 64
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class KernelParam:
    """One buffer parameter of a compiled kernel: its name (for messages), static shape and
    dtype; ``written`` marks the buffers the kernel stores to (outputs)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    written: bool


def _describe(value: object) -> str:
    return type(value).__module__ + "." + type(value).__qualname__


class Module:
    """A compiled kernel: call it with ``opf.nd.array``s or NumPy arrays, one per parameter.

    ``name`` is the kernel's name as given to ``build``, ``entry_name`` the exported C
    symbol, ``get_source()`` the generated C. ``kernels`` is the library's table when the
    caller has loaded it already (several modules of one library share it).

    Raises :class:`KernelTableError` when the library's table has no kernel ``entry_name`` or
    lists it with other parameters than ``params``."""

    def __init__(self, name: str, entry_name: str, params: Sequence[KernelParam], source: str,
                 library: CompiledLibrary, kernels: LibraryKernels | None = None) -> None:
        self.name = name
        self.entry_name = entry_name
        self.params = tuple(params)
        self.library = library
        self._source = source
        self._kernels = kernels if kernels is not None else LibraryKernels(library)
        self._function = self._kernels.function(entry_name, self.params)
        #: Position of the kernel in the library's table (what the model's tables name).
        self.table_index = self._kernels.entry(entry_name).index

    @property
    def kernels(self) -> LibraryKernels:
        """The library's kernel table (shared by every module of the library)."""
        return self._kernels

    def get_source(self, fmt: str = "c") -> str:
        """Return the generated C source of this kernel."""
        if fmt not in ("c", ""):
            raise OpfusionError(f"a C module has source in format 'c' only, not {fmt!r}")
        return self._source

    def get_function(self, name: str) -> Module:
        """Return the kernel called ``name`` (this module holds one function)."""
        if name not in (self.name, self.entry_name):
            raise OpfusionError(f"module {self.name!r} has no function {name!r}")
        return self

    __getitem__ = get_function

    def __call__(self, *args: object) -> None:
        arrays = self._check_arguments(args)
        status = self._function(*[a.ctypes.data for a in arrays])
        if status == KERNEL_CANCELLED:  # only when an executor connected this library
            raise RunInterrupted(f"kernel {self.name!r} was interrupted (Ctrl-C)")
        if status != 0:
            raise OutOfMemoryError(f"kernel {self.name!r} could not allocate its scratch buffers "
                                   f"(malloc failed); free memory, or use smaller shapes")

    def _check_arguments(self, args: Sequence[object]) -> list[np.ndarray]:
        if len(args) != len(self.params):
            expected = ", ".join(p.name for p in self.params)
            raise KernelArgumentError(
                f"kernel {self.name!r} takes {len(self.params)} arguments ({expected}) but was "
                f"given {len(args)}"
            )
        arrays: list[np.ndarray] = []
        for position, (param, arg) in enumerate(zip(self.params, args)):
            where = f"kernel {self.name!r}, argument {position} ({param.name!r})"
            if isinstance(arg, NDArray):
                array = np.asarray(arg)
            elif isinstance(arg, np.ndarray):
                array = arg
            else:
                raise KernelArgumentError(
                    f"{where}: expected an opf.nd.array or numpy.ndarray, got {_describe(arg)}"
                )
            if array.dtype.name != param.dtype or not array.dtype.isnative:
                raise KernelArgumentError(
                    f"{where}: expected dtype {param.dtype}, got {array.dtype}. Convert it with "
                    f".astype('{param.dtype}')."
                )
            if array.shape != param.shape:
                raise KernelArgumentError(
                    f"{where}: expected shape {param.shape}, got {array.shape}"
                )
            if not array.flags.c_contiguous or not array.flags.aligned:
                raise KernelArgumentError(
                    f"{where}: the array is not C-contiguous and aligned (a strided view or "
                    "Fortran-ordered array?). Pass np.ascontiguousarray(x) or opf.nd.array(x)."
                )
            if param.written and not array.flags.writeable:
                raise KernelArgumentError(
                    f"{where}: the kernel writes this argument but the array is read-only"
                )
            arrays.append(array)
        self._check_overlap(arrays)
        return arrays

    def _check_overlap(self, arrays: list[np.ndarray]) -> None:
        # The C parameters are `restrict`: an output that shares memory with another argument
        # would give wrong numbers, not an error, so it is refused here.
        for i, param in enumerate(self.params):
            if not param.written or arrays[i].size == 0:
                continue
            for j, other in enumerate(arrays):
                if j != i and other.size and np.may_share_memory(arrays[i], other):
                    raise KernelArgumentError(
                        f"kernel {self.name!r}: argument {i} ({param.name!r}) is written and "
                        f"shares memory with argument {j} ({self.params[j].name!r}); pass "
                        "separate arrays (in-place calls are not supported)"
                    )

    def __repr__(self) -> str:
        args = ", ".join(f"{p.name}: {p.dtype}{list(p.shape)}" for p in self.params)
        return f"<opf.Module {self.name}({args}) from {self.library.path}>"


def load_kernel(name: str, entry_name: str, params: Sequence[KernelParam],
                source: str, flags: tuple[str, ...] | None = None) -> Module:
    """Compile ``source`` (or find it in the cache) and load it as a :class:`Module`.

    A cached library that the dynamic loader rejects (a truncated or foreign file), or whose
    kernel table does not list this kernel with these parameters, is removed from the cache
    and compiled once more."""
    return load_kernels(source, [(name, entry_name, params)], flags)[0]


def load_kernels(source: str, kernels: Sequence[tuple[str, str, Sequence[KernelParam]]],
                 flags: tuple[str, ...] | None = None) -> list[Module]:
    """Compile one source holding several kernels (or find it in the cache) and load each
    ``(name, entry_name, params)`` as a :class:`Module`; all share one shared library.

    A cached library that cannot be loaded or whose table does not match ``kernels`` is
    evicted and compiled again; a freshly compiled one that does not match is an error.
    ``flags``: the compiler flags (default: those of the current target)."""
    library = compile_source(source, flags=flags)
    try:
        return _modules(source, library, kernels)
    except LibraryLoadError:
        if not library.from_cache:
            raise
        evict(library)
    return _modules(source, compile_source(source, flags=flags), kernels)


def _modules(source: str, library: CompiledLibrary,
             kernels: Sequence[tuple[str, str, Sequence[KernelParam]]]) -> list[Module]:
    table = LibraryKernels(library)
    try:
        return [Module(name, entry, params, source, library, table)
                for name, entry, params in kernels]
    except LibraryLoadError:
        table.close()  # nothing of it was handed out; a rebuilt file must load afresh
        raise


class LibraryLoadError(OpfusionError):
    """A shared library that the dynamic loader rejects, or whose kernel table is missing or
    unreadable."""


class KernelTableError(LibraryLoadError):
    """A library's kernel table does not hold the kernel asked for, with the parameters asked
    for."""


class _ParamInfo(ctypes.Structure):
    _fields_ = [("dtype", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("written", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("dims", ctypes.POINTER(ctypes.c_int64))]


class _KernelInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("function", ctypes.c_void_p),
                ("num_params", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("params", ctypes.POINTER(_ParamInfo)), ("thunk", ctypes.c_void_p)]


class _ModelArg(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("index", ctypes.c_int32),
                ("offset", ctypes.c_int64)]


class _ModelCopy(ctypes.Structure):
    _fields_ = [("output", ctypes.c_int32), ("reserved", ctypes.c_int32),
                ("source", _ModelArg), ("nbytes", ctypes.c_int64)]


class _ModelInfo(ctypes.Structure):
    _fields_ = [("num_steps", ctypes.c_int64),
                ("step_kernels", ctypes.POINTER(ctypes.c_int32)),
                ("step_args", ctypes.POINTER(ctypes.c_int64)),
                ("args", ctypes.POINTER(_ModelArg)),
                ("num_copies", ctypes.c_int64), ("copies", ctypes.POINTER(_ModelCopy)),
                ("num_constants", ctypes.c_int64),
                ("constant_bytes", ctypes.POINTER(ctypes.c_int64)),
                ("num_inputs", ctypes.c_int64), ("input_bytes", ctypes.POINTER(ctypes.c_int64)),
                ("num_outputs", ctypes.c_int64),
                ("output_bytes", ctypes.POINTER(ctypes.c_int64)),
                ("workspace_bytes", ctypes.c_int64), ("max_args", ctypes.c_int64),
                ("run", ctypes.c_void_p)]


class _TableInfo(ctypes.Structure):
    _fields_ = [("magic", ctypes.c_uint32), ("version", ctypes.c_uint32),
                ("num_kernels", ctypes.c_int64), ("kernels", ctypes.POINTER(_KernelInfo)),
                ("model", ctypes.POINTER(_ModelInfo))]


#: ``opf_model_run(first, stop, call) -> status``; ``call`` is passed as an address.
MODEL_RUN_PROTOTYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_void_p)

# Bounds on a model's tables (a generated one is far below them).
_MAX_STEPS = 1 << 24
_MAX_ARGS = 1 << 28


@dataclass(frozen=True)
class LibraryModel:
    """A library's model entry: its layout as the library's tables hold it, and the entry
    (``run``, a ctypes function of :data:`MODEL_RUN_PROTOTYPE`)."""

    layout: ModelLayout
    run: Any


@dataclass(frozen=True)
class TableEntry:
    """One kernel as its library's table lists it: exported name, parameters (named p0,
    p1, ...) and the function's address."""

    name: str
    params: tuple[KernelParam, ...]
    address: int
    thunk: int
    index: int


MAX_CTYPES_ARGS = 1000
"""Kernels with more parameters are called through their thunk (ctypes' limit is 1024)."""

_THUNK_PROTOTYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


class _ThunkCall:
    """A kernel called through its thunk: ``call(*pointers)`` as a ctypes function is."""

    def __init__(self, thunk: Any, library: LibraryKernels) -> None:
        self._thunk = thunk
        self._opf_library = library  # the library stays loaded while the call lives

    def __call__(self, *pointers: int) -> int:
        array = (ctypes.c_void_p * len(pointers))(*pointers)
        return int(self._thunk(array))


class LibraryKernels:
    """A shared library loaded with ctypes and the kernels its table lists, by name.

    Raises :class:`LibraryLoadError` when the loader rejects the file or the table is
    missing, damaged, or points outside the library."""

    def __init__(self, library: CompiledLibrary) -> None:
        self.library = library
        configure_wait_policy()  # before the first library brings libgomp in
        try:
            self._handle: ctypes.CDLL | None = ctypes.CDLL(str(library.path))
        except OSError as err:
            raise LibraryLoadError(
                f"could not load the compiled kernels {library.path} ({err}); delete it from "
                "the cache directory and build again"
            ) from err
        try:
            self.entries = self._read_table()
        except LibraryLoadError:
            self.close()
            raise

    def _read_table(self) -> dict[str, TableEntry]:
        path = self.library.path
        try:
            getter = getattr(self._handle, KERNEL_TABLE_SYMBOL)
        except AttributeError:
            raise LibraryLoadError(f"{path} has no kernel table ({KERNEL_TABLE_SYMBOL}); it "
                                   f"was not built by this opfusion") from None
        base = _object_base(ctypes.cast(getter, ctypes.c_void_p).value, path, check_file=True)
        getter.restype = ctypes.POINTER(_TableInfo)
        getter.argtypes = []
        table = getter()
        if not table or table.contents.magic != KERNEL_TABLE_MAGIC:
            raise LibraryLoadError(f"{path}: the kernel table is damaged")
        info = table.contents
        if info.version != KERNEL_TABLE_VERSION:
            raise LibraryLoadError(f"{path} has a kernel table of version {info.version}; this "
                                   f"opfusion reads version {KERNEL_TABLE_VERSION}")
        if not 0 <= info.num_kernels <= _MAX_KERNELS or (info.num_kernels and not info.kernels):
            raise LibraryLoadError(f"{path}: the kernel table is damaged")
        #: The model's native entry, or None for a library of loose kernels.
        self.model = _read_model(info.model.contents, info.num_kernels, path, base,
                                 self) if info.model else None
        entries: dict[str, TableEntry] = {}
        for k in range(info.num_kernels):
            entry = _read_entry(info.kernels[k], k, path, base)
            if entry.name in entries:
                raise LibraryLoadError(f"{path}: the kernel table lists {entry.name!r} twice")
            entries[entry.name] = entry
        return entries

    def entry(self, name: str) -> TableEntry:
        """The table entry of kernel ``name``; KernelTableError if there is none."""
        entry = self.entries.get(name)
        if entry is None:
            shown = ", ".join(sorted(self.entries)[:8]) or "none"
            raise KernelTableError(f"the compiled library {self.library.path} has no kernel "
                                   f"{name!r} (its kernels: {shown})")
        return entry

    def function(self, name: str, params: Sequence[KernelParam]) -> Any:
        """A ctypes function for kernel ``name``, after checking that the table lists it with
        ``params`` (count, dtypes, shapes, written flags)."""
        entry = self.entry(name)
        mismatch = _param_mismatch(entry.params, params)
        if mismatch:
            raise KernelTableError(f"kernel {name!r} in {self.library.path}: {mismatch}")
        if len(params) > MAX_CTYPES_ARGS:
            # ctypes refuses prototypes of more than 1024 arguments (a concatenation of
            # thousands of values): call the kernel's thunk with one array of pointers.
            return _ThunkCall(_THUNK_PROTOTYPE(entry.thunk), self)
        prototype = ctypes.CFUNCTYPE(ctypes.c_int32, *[ctypes.c_void_p] * len(params))
        function = prototype(entry.address)
        function._opf_library = self  # the library stays loaded while the function lives
        return function

    def close(self) -> None:
        """Unload the library; only while no function of it has been handed out."""
        handle, self._handle = self._handle, None
        if handle is not None:
            import _ctypes

            _ctypes.dlclose(handle._handle)


def _read_model(info: _ModelInfo, num_kernels: int, path: Any, base: int | None,
                owner: LibraryKernels) -> LibraryModel:
    """The model's tables read back into a :class:`ModelLayout`, after checking every count
    and pointer (a damaged table must not make the loader read without end), and its entry.
    The caller still compares the layout with the one it derives itself."""
    def damaged(what: str) -> LibraryLoadError:
        return LibraryLoadError(f"{path}: the model table is damaged ({what})")

    steps = info.num_steps
    if not 0 <= steps <= _MAX_STEPS or not info.step_kernels or not info.step_args:
        raise damaged("steps")
    counts = [info.num_copies, info.num_constants, info.num_inputs, info.num_outputs]
    if not all(0 <= n <= _MAX_ARGS for n in counts) or info.workspace_bytes < 0:
        raise damaged("counts")
    starts = [int(info.step_args[s]) for s in range(steps + 1)]
    if starts[0] != 0 or any(b < a for a, b in zip(starts, starts[1:])) \
            or starts[-1] > _MAX_ARGS or (starts[-1] and not info.args):
        raise damaged("argument ranges")
    kernels = tuple(int(info.step_kernels[s]) for s in range(steps))
    if any(not NO_KERNEL <= k < num_kernels for k in kernels):
        raise damaged("kernel index")

    def arg(a: _ModelArg) -> ModelArg:
        return ModelArg(int(a.kind), int(a.index), int(a.offset))

    args = tuple(tuple(arg(info.args[i]) for i in range(starts[s], starts[s + 1]))
                 for s in range(steps))
    if info.num_copies and not info.copies:
        raise damaged("copies")
    copies = tuple(ModelCopy(int(c.output), arg(c.source), int(c.nbytes))
                   for c in (info.copies[i] for i in range(info.num_copies)))

    def sizes(pointer: Any, count: int) -> tuple[int, ...]:
        if count and not pointer:
            raise damaged("sizes")
        return tuple(int(pointer[i]) for i in range(count))

    layout = ModelLayout(kernels, args, copies,
                         sizes(info.constant_bytes, info.num_constants),
                         sizes(info.input_bytes, info.num_inputs),
                         sizes(info.output_bytes, info.num_outputs), int(info.workspace_bytes))
    if info.max_args != layout.max_args:
        raise damaged("argument count")
    if not info.run or (base is not None and _object_base(info.run, path) != base):
        raise LibraryLoadError(f"{path}: the model's entry is missing or points outside the "
                               f"library")
    run = MODEL_RUN_PROTOTYPE(info.run)
    run._opf_library = owner  # the library stays loaded while the entry lives
    return LibraryModel(layout, run)


def _read_entry(info: _KernelInfo, index: int, path: Any, base: int | None) -> TableEntry:
    name = (info.name or b"").decode("ascii", "replace")
    if not _IDENTIFIER.fullmatch(name) or not info.function or not info.thunk:
        raise LibraryLoadError(f"{path}: the kernel table is damaged (entry {name!r})")
    if base is not None and (_object_base(info.function, path) != base
                             or _object_base(info.thunk, path) != base):
        raise LibraryLoadError(f"{path}: the kernel table points outside the library "
                               f"(entry {name!r})")
    if not 0 <= info.num_params <= _MAX_PARAMS or (info.num_params and not info.params):
        raise LibraryLoadError(f"{path}: the kernel table is damaged (entry {name!r})")
    params = []
    for p in range(info.num_params):
        param = info.params[p]
        dtype = _DTYPE_OF_CODE.get(param.dtype)
        if (dtype is None or not 0 <= param.rank <= _MAX_RANK or param.written not in (0, 1)
                or (param.rank and not param.dims)):
            raise LibraryLoadError(f"{path}: the kernel table is damaged (entry {name!r})")
        shape = tuple(int(param.dims[d]) for d in range(param.rank))
        if any(d < 0 for d in shape):
            raise LibraryLoadError(f"{path}: the kernel table is damaged (entry {name!r})")
        params.append(KernelParam(f"p{p}", shape, dtype, bool(param.written)))
    return TableEntry(name, tuple(params), int(info.function), int(info.thunk), index)


def _param_mismatch(have: Sequence[KernelParam], want: Sequence[KernelParam]) -> str:
    """Why parameters ``want`` cannot be passed to a kernel taking ``have`` ("" if they can)."""
    if len(have) != len(want):
        return f"the library's kernel takes {len(have)} parameters, not {len(want)}"
    for position, (a, b) in enumerate(zip(have, want)):
        if (a.dtype, tuple(a.shape), a.written) != (b.dtype, tuple(b.shape), b.written):
            def show(p: KernelParam) -> str:
                return f"{p.dtype}{list(p.shape)}{' written' if p.written else ''}"

            return (f"parameter {position} is {show(a)} in the library, not {show(b)}; the "
                    f"library was built for other shapes")
    return ""


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


@functools.lru_cache(maxsize=1)
def _dladdr() -> Any:
    """libc's dladdr (libdl's before glibc 2.34), or None on a system without it."""
    for name in (None, ctypes.util.find_library("dl")):
        try:
            function = ctypes.CDLL(name).dladdr
        except (OSError, AttributeError, TypeError):
            continue
        function.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        function.restype = ctypes.c_int
        return function
    return None


def _object_base(address: int | None, path: Any, check_file: bool = False) -> int | None:
    """The load address of the shared object holding ``address`` (with ``check_file``, after
    checking that the object is the file at ``path``); None where the system has no dladdr
    (then the table is trusted as the library's own)."""
    dladdr = _dladdr()
    if dladdr is None:
        return None
    info = _DlInfo()
    if not address or not dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        raise LibraryLoadError(f"{path}: the kernel table points outside any library")
    found = os.fsdecode(info.dli_fname)
    if check_file and os.path.realpath(found) != os.path.realpath(os.fspath(path)):
        raise LibraryLoadError(f"{path}: its kernel table was found in {found}, another "
                               f"library; it was not built by this opfusion")
    return int(info.dli_fbase or 0)
