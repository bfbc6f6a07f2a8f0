"""Module: a compiled kernel loaded with ctypes, callable from Python on arrays.

The kernel's C signature is ``int32_t name(T0* p0, T1* p1, ...)``: one pointer per buffer
parameter, in the PrimFunc's order; it returns 0, or -1 when it could not allocate scratch
memory. Before the call every argument is checked against its parameter — dtype, shape,
C-contiguity, alignment, writability and overlap with the other arguments — because a mismatch
that reached the C code would read or write out of bounds instead of failing."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KernelArgumentError, OpfusionError
from .compiler import CompiledLibrary, compile_source, evict
from .ndarray import NDArray


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
    symbol, ``get_source()`` the generated C."""

    def __init__(self, name: str, entry_name: str, params: Sequence[KernelParam], source: str,
                 library: CompiledLibrary) -> None:
        self.name = name
        self.entry_name = entry_name
        self.params = tuple(params)
        self.library = library
        self._source = source
        self._function = _load(library, entry_name)
        self._function.restype = ctypes.c_int32
        self._function.argtypes = [ctypes.c_void_p] * len(self.params)

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
        if status != 0:
            raise MemoryError(f"kernel {self.name!r} could not allocate its scratch buffers")

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
                source: str) -> Module:
    """Compile ``source`` (or find it in the cache) and load it as a :class:`Module`.

    A cached library that the dynamic loader rejects (a truncated or foreign file) is removed
    from the cache and compiled once more."""
    library = compile_source(source)
    try:
        return Module(name, entry_name, params, source, library)
    except _LoadError:
        if not library.from_cache:
            raise
        evict(library)
    return Module(name, entry_name, params, source, compile_source(source))


def load_kernels(source: str, kernels: Sequence[tuple[str, str, Sequence[KernelParam]]]
                 ) -> list[Module]:
    """Compile one source holding several kernels (or find it in the cache) and load each
    ``(name, entry_name, params)`` as a :class:`Module`; all share one shared library."""
    library = compile_source(source)
    try:
        return [Module(name, entry, params, source, library) for name, entry, params in kernels]
    except _LoadError:
        if not library.from_cache:
            raise
        evict(library)
    library = compile_source(source)
    return [Module(name, entry, params, source, library) for name, entry, params in kernels]


class _LoadError(OpfusionError):
    pass


def _load(library: CompiledLibrary, entry_name: str) -> Any:
    try:
        handle = ctypes.CDLL(str(library.path))
    except OSError as err:
        raise _LoadError(
            f"could not load the compiled kernel {library.path} ({err}); delete it from the "
            "cache directory and build again"
        ) from err
    try:
        return getattr(handle, entry_name)
    except AttributeError as err:
        raise OpfusionError(
            f"the compiled library {library.path} has no function {entry_name!r}"
        ) from err
