"""Models with symbolic input dimensions: one compiled specialization per input shape.

    mod, params = opf.frontend.from_onnx("model.onnx")  # x: float32[N, 3, 224, 224]
    exe = opf.compile(mod, params=params)               # a SpecializingExecutor; compiles nothing
    (y1,) = exe.run({"x": batch_of_1})                  # imports and compiles N=1, then runs
    (y8,) = exe.run({"x": batch_of_8})                  # the same for N=8
    exe.specializations                                 # [{'x': (1, 3, 224, 224)}, {'x': (8, ...)}]

Kernels are compiled for static shapes, so a :class:`SpecializingExecutor` compiles the model
again for each new set of input shapes, with the target, opt_level, fusion strategy and pass
context of the ``opf.compile`` call, and keeps the executors in a :class:`SpecializationCache`
(least recently used evicted beyond ``max_specializations``). The C compiler's work is cached
on disk by source (``backend/cpu/toolchain.py``), so a shape compiled once, in any process,
costs only import, passes and code generation the next time.

Runs are checked against the model's declared inputs before anything is compiled: names,
rank, static dimensions, dtype, and dimensions that share a name (two inputs of batch ``N``
must agree on ``N``); each mistake is an :class:`~opfusion.compiler.executor.InputError`
naming the input."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np

from ..errors import OpfusionError
from ..ir.symbolic import SymbolicModule, SymbolicTensor
from ..target import Target
from ..transform.context import PassContext
from .compile import compile as compile_model
from .executor import (
    Executor,
    InputError,
    KernelProfile,
    check_num_threads,
    ordered_feeds,
)
from .signature import NodeArg, output_positions, parse_run_arguments

log = logging.getLogger("opfusion.specialize")

#: How many specializations an executor keeps unless told otherwise.
DEFAULT_MAX_SPECIALIZATIONS = 8

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MISSING: Any = object()


class SpecializationCache(Generic[K, V]):
    """A thread-safe map from a key (a set of input shapes, say) to a value built on its
    first use, holding at most ``capacity`` values: beyond that the least recently used goes.

    :meth:`get` builds a missing value once however many threads ask for it at the same time
    (they wait for the one that builds it), while values of different keys build in
    parallel. A build that raises leaves nothing behind: the next ``get`` tries again."""

    def __init__(self, capacity: int = DEFAULT_MAX_SPECIALIZATIONS) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise OpfusionError(f"a specialization cache holds at least 1 entry; "
                                f"max_specializations={capacity!r}")
        self.capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._building: dict[K, threading.Lock] = {}
        self._lock = threading.Lock()  # guards _entries, _building and builds
        self.builds = 0

    def get(self, key: K, build: Callable[[], V]) -> V:
        """The value of ``key``, built with ``build()`` when the cache does not hold it."""
        value = self._lookup(key)
        if value is not _MISSING:
            return value
        with self._lock:
            building = self._building.setdefault(key, threading.Lock())
        with building:
            value = self._lookup(key)  # built by another thread while this one waited
            if value is not _MISSING:
                return value
            try:
                value = build()
                with self._lock:
                    self.builds += 1
                self.put(key, value)
            finally:
                with self._lock:
                    if self._building.get(key) is building:
                        del self._building[key]
        return value

    def put(self, key: K, value: V) -> None:
        """Hold ``value`` for ``key`` as the most recently used; evict beyond capacity."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                evicted, _ = self._entries.popitem(last=False)
                log.debug("evicted the specialization %s", evicted)

    def keys(self) -> list[K]:
        """The keys held, least recently used first (the first is the next to go)."""
        with self._lock:
            return list(self._entries)

    def values(self) -> list[V]:
        """The values held, least recently used first."""
        with self._lock:
            return list(self._entries.values())

    def _lookup(self, key: K) -> V:
        with self._lock:
            if key not in self._entries:
                return _MISSING
            self._entries.move_to_end(key)
            return self._entries[key]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


Shapes = tuple[tuple[int, ...], ...]
"""Every input's shape, in the model's input order: a specialization's key."""


class SpecializingExecutor:
    """Runs a :class:`~opfusion.ir.symbolic.SymbolicModule`: compiles it for each new set of
    input shapes on first use, keeps the executors (at most ``max_specializations``, least
    recently used evicted) and runs the one for each run's shapes. Built by
    :func:`opfusion.compile` for a symbolic module.

    It answers the calls an :class:`~opfusion.compiler.executor.Executor` does (``run``,
    ``__call__``, ``get_inputs``, ``get_outputs``, ``profile``, ``verify``), from many threads
    at once; :attr:`specializations` lists the shapes held and :meth:`specialize` compiles one
    ahead of a run. An ahead-of-time file holds one shape: export a specialization
    (``exe.specialize({"x": (8, 3, 224, 224)}).export(path)``)."""

    def __init__(self, module: SymbolicModule, *, target: Target,
                 params: Mapping[str, Any] | None = None, opt_level: int, fusion: str,
                 verify: bool = False, context: PassContext | None = None,
                 max_specializations: int = DEFAULT_MAX_SPECIALIZATIONS,
                 num_threads: int = 0, records: Any = None) -> None:
        self.module = module
        #: The tuning records every specialization is compiled with (None: the heuristics).
        self.records = records
        #: The target every specialization is compiled for.
        self.target = target
        self.params = dict(params or {})
        self.opt_level = opt_level
        self.fusion = fusion
        self.verify_kernels = verify
        # Entered around each compile, so that a later one sees the configuration (limits,
        # disabled passes) that opf.compile was called under, whatever the caller's now.
        self._context = context if context is not None else PassContext.current()
        self._cache: SpecializationCache[Shapes, Executor] = SpecializationCache(
            max_specializations)
        self._profiles = threading.local()
        self._num_threads = num_threads
        self.input_names = module.input_names
        self.output_names = module.output_names

    # -- the specializations ---------------------------------------------------------------
    @property
    def max_specializations(self) -> int:
        return self._cache.capacity

    @property
    def specializations(self) -> list[dict[str, tuple[int, ...]]]:
        """The input shapes of the specializations held (input name -> shape), least recently
        used first: the first is the next to be evicted."""
        return [dict(zip(self.input_names, key)) for key in self._cache.keys()]

    @property
    def compiled(self) -> int:
        """How many specializations this executor has compiled (evicted ones included)."""
        return self._cache.builds

    def specialize(self, shapes: Mapping[str, Sequence[int]]) -> Executor:
        """The executor for these input shapes (inputs of static shape may be left out),
        compiled now unless it is held: to compile ahead of the first run, or to export."""
        return self._executor_for(check_shapes(self.module, shapes))

    def _executor_for(self, key: Shapes) -> Executor:
        return self._cache.get(key, lambda: self._compile(key))

    def _compile(self, key: Shapes) -> Executor:
        shapes = {tensor.name: shape for tensor, shape in zip(self.module.inputs, key)
                  if not tensor.is_static}
        start = time.perf_counter()
        with self._context:
            mod, params = self.module.specialize(shapes)
            executor = compile_model(mod, target=self.target, params={**params, **self.params},
                                     opt_level=self.opt_level, fusion=self.fusion,
                                     verify=self.verify_kernels, num_threads=self._num_threads,
                                     records=self.records)
        log.info("compiled the specialization %s in %.2f s", _shapes_text(shapes),
                 time.perf_counter() - start)
        return executor

    def set_num_threads(self, num_threads: int) -> None:
        """Run the kernels of every specialization, held or compiled later, on
        ``num_threads`` threads (0: every core)."""
        check_num_threads(num_threads)
        self._num_threads = num_threads
        for executor in self._cache.values():
            executor.set_num_threads(num_threads)

    @property
    def num_threads(self) -> int:
        return self._num_threads

    # -- running ---------------------------------------------------------------------------
    def run(self, output_names: Any = None, input_feed: Any = None, run_options: Any = None,
            *, profile: bool = False) -> list[np.ndarray]:
        """Run on the specialization for the inputs' shapes (compiled first if not held) and
        return the outputs; the same forms as :meth:`Executor.run` (``run(feeds)``,
        ``run(output_names, feeds)``)."""
        wanted, feeds = parse_run_arguments(output_names, input_feed, run_options)
        output_positions(self.output_names, wanted)  # an unknown name fails before compiling
        arrays = bind_inputs(self.module, feeds)
        executor = self._executor_for(tuple(array.shape for array in arrays))
        outputs = executor.run(wanted, arrays, profile=profile)
        if profile:
            self._profiles.timings = executor.last_profile
        return outputs

    def __call__(self, *arrays: Any, **named: Any) -> Any:
        """Run with positional and/or named inputs; one output comes back as an array,
        several as a tuple (as :meth:`Executor.__call__`)."""
        if arrays and named:
            feeds: Any = dict(zip(self.input_names, arrays))
            feeds.update(named)
        else:
            feeds = named if named else list(arrays)
        bound = bind_inputs(self.module, feeds)
        return self._executor_for(tuple(array.shape for array in bound))(*bound)

    @property
    def last_profile(self) -> list[tuple[str, float]] | None:
        """(kernel, seconds) of each step of the calling thread's last ``run(...,
        profile=True)``; None before one."""
        return getattr(self._profiles, "timings", None)

    def profile(self, feeds: Mapping[str, Any] | Sequence[Any], repeat: int = 10
                ) -> KernelProfile:
        """:meth:`Executor.profile` of the specialization for ``feeds``' shapes."""
        arrays = bind_inputs(self.module, feeds)
        return self._executor_for(tuple(a.shape for a in arrays)).profile(arrays, repeat)

    def verify(self, feeds: Mapping[str, Any] | Sequence[Any], rtol: float = 1e-4
               ) -> list[str]:
        """:meth:`Executor.verify` of the specialization for ``feeds``' shapes."""
        arrays = bind_inputs(self.module, feeds)
        return self._executor_for(tuple(a.shape for a in arrays)).verify(arrays, rtol)

    def get_inputs(self) -> list[NodeArg]:
        """The model's inputs as declared: a symbolic dimension is shown by its name, an
        unnamed one as None (as ONNX Runtime shows them)."""
        return [NodeArg.symbolic(t.name, t.dims, t.dtype) for t in self.module.inputs]

    def get_outputs(self) -> list[NodeArg]:
        """The model's outputs as declared (see :meth:`get_inputs`)."""
        return [NodeArg.symbolic(t.name, t.dims, t.dtype) for t in self.module.outputs]

    def export(self, path: Any) -> None:
        """Refused: a file holds compiled code for one shape."""
        example = {t.name: tuple(d if isinstance(d, int) else 1 for d in (t.dims or ()))
                   for t in self.module.symbolic_inputs()}
        raise OpfusionError(f"a model with symbolic input dimensions cannot be exported as "
                            f"such: a .opf file holds code for one shape. Export one "
                            f"specialization (exe.specialize({example!r}).export(path)), or "
                            f"import the model with shape= (opfusion compile --shape ...)")

    def __repr__(self) -> str:
        inputs = ", ".join(f"{t.name}: {t.shape_text()}" for t in self.module.inputs)
        return (f"SpecializingExecutor(inputs: {inputs}; {len(self._cache)} of "
                f"{self.max_specializations} specializations held)")


# ---------------------------------------------------------------------------------------------
# checking a run's inputs against the declared ones


def bind_inputs(module: SymbolicModule, feeds: Mapping[str, Any] | Sequence[Any] | None
                ) -> list[np.ndarray]:
    """``feeds`` (input name -> array, or the arrays in input order) as arrays in input
    order, checked against ``module``'s declared inputs (see :func:`check_shapes`) and
    dtypes; a mistake is an :class:`InputError` naming the input."""
    names = module.input_names
    ordered = ordered_feeds(feeds, names)
    arrays = [np.asarray(value.numpy() if hasattr(value, "numpy") else value)
              for value in ordered]
    for tensor, array in zip(module.inputs, arrays):
        if array.dtype != np.dtype(tensor.dtype):
            raise InputError(f"input {tensor.name!r} must be {tensor.dtype}, got {array.dtype}; "
                             f"convert it with .astype('{tensor.dtype}')")
    check_shapes(module, {name: array.shape for name, array in zip(names, arrays)})
    return arrays


def check_shapes(module: SymbolicModule, shapes: Mapping[str, Sequence[int]]) -> Shapes:
    """Every input's shape in input order: ``shapes``' (checked against the declared rank,
    static dimensions, and each named dimension's size wherever it appears), or the declared
    one of an input with a static shape that ``shapes`` leaves out."""
    unknown = [name for name in shapes if name not in module.input_names]
    if unknown:
        raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are "
                         f"{', '.join(map(repr, module.input_names))}")
    named: dict[str, tuple[int, str, int]] = {}  # dimension name -> (size, input, axis)
    key = []
    for tensor in module.inputs:
        if tensor.name not in shapes:
            if not tensor.is_static:
                raise InputError(f"input {tensor.name!r} ({tensor.shape_text()}) needs a "
                                 f"shape")
            key.append(tuple(int(d) for d in tensor.dims or ()))
            continue
        shape = _concrete_shape(tensor, shapes[tensor.name])
        for axis, (dim, size) in enumerate(zip(tensor.dims or (), shape)):
            if isinstance(dim, int) and dim != size:
                raise InputError(f"input {tensor.name!r} must have shape "
                                 f"{_dims_text(tensor)}, got {shape}: axis {axis} is {dim}")
            if isinstance(dim, str):
                size0, input0, axis0 = named.setdefault(dim, (size, tensor.name, axis))
                if size0 != size:
                    raise InputError(f"input {tensor.name!r} has {size} at axis {axis}, the "
                                     f"dimension {dim!r}, which input {input0!r} gives as "
                                     f"{size0} (axis {axis0}); inputs must agree on it")
        key.append(shape)
    return tuple(key)


def _concrete_shape(tensor: SymbolicTensor, given: Sequence[int]) -> tuple[int, ...]:
    try:
        shape = tuple(given)
    except TypeError:
        raise InputError(f"the shape of input {tensor.name!r} must be a sequence of ints, got "
                         f"{given!r}") from None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0
               for d in shape):
        raise InputError(f"the shape of input {tensor.name!r} must be non-negative ints, got "
                         f"{given!r}")
    shape = tuple(int(d) for d in shape)
    if tensor.dims is not None and len(shape) != len(tensor.dims):
        raise InputError(f"input {tensor.name!r} must have {len(tensor.dims)} dimensions "
                         f"{_dims_text(tensor)}, got shape {shape}")
    return shape


def _dims_text(tensor: SymbolicTensor) -> str:
    """``(N, 3, 16, 16)``, ``?`` for an unnamed unknown dim."""
    return "(" + ", ".join("?" if d is None else str(d) for d in tensor.dims or ()) + ")"


def _shapes_text(shapes: Mapping[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{name}: {list(shape)}" for name, shape in shapes.items())
