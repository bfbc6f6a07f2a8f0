"""The ONNX backend API for opfusion, in the convention of ``onnxruntime.backend``.

    from opfusion.frontend.onnx import backend as onnx_backend
    rep = onnx_backend.prepare(model)              # model: ModelProto, path or bytes
    outputs = rep.run([x])                         # a list (or dict by name) of arrays
    outputs = onnx_backend.run_model(model, [x])   # prepare + run in one call

Execution goes through one switch, the ``engine`` keyword: the name of an entry in
:data:`ENGINES`, a table from name to a function ``(IRModule, params) -> runner``:

* ``"compiled"`` (the default): :func:`opfusion.compile` at its defaults (opt_level 3, the
  pass context's fusion strategy), one C kernel per fused group, run by the executor;
* ``"reference"``: the NumPy interpreter, :func:`opfusion.ir.evaluate` (the oracle).

A model that imports but does not compile is an error, never a silent fall back to the
interpreter: the backend's answer must come from the engine that was asked for, or the
suite that runs it would count interpreter passes as compiler passes. The error says to pass
``engine="reference"`` to run such a model anyway.

Symbolic dimensions: ``prepare`` imports the model at once when every input shape is static
(or is given with ``shape=``), so import errors surface there. When an input has a symbolic
or unknown dimension, import is deferred to ``run`` and done with the shapes of the arrays
actually passed; one import (and prepared engine) is kept per distinct set of input shapes,
the ``max_specializations`` (default 8) most recently used, in the
:class:`~opfusion.compiler.specialize.SpecializationCache` that ``opf.compile``'s executor
of a symbolic model keeps its specializations in.

Value specialization: opfusion compiles static shapes, so the values that decide a shape (a
Reshape's target shape, Slice bounds, a TopK's k, Resize scales) must be known at import. A
real model holds them as initializers; ONNX's node tests pass them as graph inputs. When the
plain import fails (not for an unsupported op), the backend imports again with candidate
inputs frozen to the values passed to ``run``: first the integer and bool inputs, then also
the small float inputs that are not data (scalars, or never a node's first operand). The
first set that imports is kept, with one import per distinct set of values (in the same
cache as the shapes);
if none does, the last error is raised. Only import errors lead to specialization: when the
engine fails on a module that imported, that error is raised. ``specialize=False`` turns this
off; ``rep.frozen_inputs`` names the inputs it froze.

Inputs are checked (shape; a dtype of the same kind is converted) by the backend, before any
engine sees them, so every engine takes the same arrays and reports the same mistakes.

Every failure is an :class:`opfusion.OpfusionError`; an unexpected Python exception from
inside opfusion is re-raised as one, with the original chained as its cause."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper
from onnx.backend.base import Backend, BackendRep, namedtupledict

from ...compiler.compile import compile as compile_model
from ...compiler.specialize import DEFAULT_MAX_SPECIALIZATIONS, SpecializationCache
from ...compiler.staged import CompileSettings
from ...errors import DataDependentError, OpfusionError
from ...ir.evaluate import evaluate
from ...ir.module import IRModule
from ...ir.types import TensorType
from ...target import host_target
from .importer import UnsupportedOnnxError, _load, from_onnx
from .staged import OnnxStagedModel

Runner = Callable[[Sequence[np.ndarray]], Any]
"""Runs a prepared module on its inputs (in graph-input order); returns an array or a tuple."""

Engine = Callable[[IRModule, Mapping[str, np.ndarray]], Runner]
"""Prepares an imported module (and its params) for repeated execution."""


def _reference_engine(mod: IRModule, params: Mapping[str, np.ndarray]) -> Runner:
    if isinstance(mod, OnnxStagedModel):  # stages evaluated by the interpreter
        staged = mod.compile(CompileSettings(host_target(), reference=True))
        return lambda inputs: tuple(staged.run(list(inputs)))
    bound = list(params.values())  # @main takes the inputs, then the params in this order
    return lambda inputs: evaluate(mod, [*inputs, *bound])


def _compiled_engine(mod: IRModule, params: Mapping[str, np.ndarray]) -> Runner:
    try:
        executor = compile_model(mod, params=params)
    except OpfusionError as err:
        # Says which engine failed and what to do; the compiler's error stays as the cause.
        raise OpfusionError(f"the compiled engine cannot build this model: "
                            f"{type(err).__name__}: {err}\n(prepare(model, "
                            f"engine='reference') runs it with the NumPy interpreter)") from err
    return lambda inputs: tuple(executor.run(list(inputs)))


ENGINES: dict[str, Engine] = {
    "compiled": _compiled_engine,
    "reference": _reference_engine,
}
"""The execution engines by name; the ``engine`` keyword of :func:`prepare` picks one."""

DEFAULT_ENGINE = "compiled"

_PREPARE_OPTIONS = ("engine", "shape", "specialize", "max_specializations")

_SMALL = 16
"""Inputs of at most this many elements are candidates for value specialization."""


class OpfusionBackendRep(BackendRep):
    """A prepared ONNX model: ``run(inputs)`` returns its outputs in graph-output order."""

    def __init__(self, model: ModelProto, engine: str = DEFAULT_ENGINE,
                 shape: Mapping[str, Sequence[int]] | None = None,
                 specialize: bool = True,
                 max_specializations: int = DEFAULT_MAX_SPECIALIZATIONS) -> None:
        if engine not in ENGINES:
            raise OpfusionError(f"unknown engine {engine!r}; the engines are "
                                f"{', '.join(map(repr, ENGINES))}")
        self.model = model
        self.engine = engine
        self.shape = {name: tuple(int(d) for d in dims) for name, dims in (shape or {}).items()}
        self.specialize = specialize
        initializers = {tensor.name for tensor in model.graph.initializer}
        self.inputs = [value for value in model.graph.input if value.name not in initializers]
        self.input_names = [value.name for value in self.inputs]
        self.output_names = [value.name for value in model.graph.output]
        self._outputs_type = namedtupledict("Outputs", self.output_names)
        # The inputs whose shape the model leaves open: their shape comes from run's arrays.
        self.open_inputs = [value.name for value in self.inputs
                            if value.name not in self.shape and not _static_shape(value)]
        # The inputs whose values the import needs; None until a plain import has been tried.
        self.frozen_inputs: list[str] | None = None
        self._plain_error: OpfusionError | None = None
        # Runners by input shapes (and frozen values), least recently used evicted.
        self._runners: SpecializationCache[tuple, Runner] = SpecializationCache(
            max_specializations)
        if not self.open_inputs:
            self._prepare_static()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run the model on ``inputs``: a list of arrays in graph-input order, a dict by input
        name, or one array for a one-input model. Returns a tuple of arrays in graph-output
        order that can also be indexed by output name."""
        if kwargs:
            raise OpfusionError(f"run takes no options, got {', '.join(sorted(kwargs))}")
        arrays = dict(zip(self.input_names, self._arrays(inputs)))
        runner = self._runner_for(arrays)
        frozen = set(self.frozen_inputs or ())
        with _as_opfusion_error("running the model"):
            result = runner([array for name, array in arrays.items() if name not in frozen])
        outputs = result if isinstance(result, tuple) else (result,)
        return self._outputs_type(*(np.asarray(out) for out in outputs))

    # -- import, once per shape (and frozen values) -----------------------------------------
    # Only import errors decide whether to specialize: an engine's failure on a module that
    # imported is raised as it is, never answered by freezing more inputs (which could fold
    # the failing kernel away and hide the bug).
    def _prepare_static(self) -> None:
        """All shapes are known: import now, so that import errors surface in prepare."""
        try:
            imported = self._import({})
        except OpfusionError as err:
            if not self._may_specialize(err):
                raise
            self._plain_error = err  # specialized in run, where the values are known
            return
        self._runners.put((), self._prepare_engine(imported, {}))
        self.frozen_inputs = []

    def _runner_for(self, arrays: dict[str, np.ndarray]) -> Runner:
        shapes = tuple((name, arrays[name].shape) for name in self.open_inputs)
        if self.frozen_inputs is None:
            self._choose_frozen(arrays, shapes)
        assert self.frozen_inputs is not None
        names = self.frozen_inputs
        frozen = {name: arrays[name] for name in names}
        return self._runners.get(self._key(shapes, arrays, names), lambda: self._prepare_engine(
            self._import(dict(shapes), frozen), frozen))

    def _choose_frozen(self, arrays: dict[str, np.ndarray], shapes: tuple) -> None:
        """Freeze nothing if the plain import works, else the first candidate set that makes
        it work; if none does, raise the last error (it names the real blocker, where the
        first one may only say that a value is not known at import)."""
        error = self._plain_error
        if error is None:
            try:
                imported = self._import(dict(shapes))
            except OpfusionError as err:
                if not self._may_specialize(err):
                    raise
                error = err
            else:
                self._runners.put(self._key(shapes, arrays, []),
                                  self._prepare_engine(imported, {}))
                self.frozen_inputs = []
                return
        plain = error
        for names in self._candidate_sets():
            frozen = {name: arrays[name] for name in names}
            try:
                imported = self._import(dict(shapes), frozen)
            except OpfusionError as err:
                error = err
                continue
            self._runners.put(self._key(shapes, arrays, names),
                              self._prepare_engine(imported, frozen))
            self.frozen_inputs = names
            return
        if isinstance(plain, DataDependentError) and plain.graph_index is not None:
            # Values decide shapes that no frozen input settles (NonMaxSuppression's boxes):
            # run the model in stages, computing those values first.
            imported = self._import(dict(shapes), stage=True)
            self._runners.put(self._key(shapes, arrays, []), self._prepare_engine(imported, {}))
            self.frozen_inputs = []
            return
        raise error

    @staticmethod
    def _key(shapes: tuple, arrays: dict[str, np.ndarray], frozen: list[str]) -> tuple:
        return shapes + tuple((name, arrays[name].dtype.str, arrays[name].shape,
                               arrays[name].tobytes()) for name in frozen)

    def _import(self, shape: dict[str, tuple[int, ...]],
                frozen: Mapping[str, np.ndarray] | None = None, stage: bool = False
                ) -> tuple[IRModule, dict]:
        model = _freeze(self.model, frozen) if frozen else self.model
        shape = {**self.shape, **{name: dims for name, dims in shape.items()
                                  if name not in (frozen or {})}}
        with _as_opfusion_error("importing the model"):
            return from_onnx(model, shape=shape or None,  # type: ignore[return-value]
                             data_dependent="stage" if stage else "raise")

    def _prepare_engine(self, imported: tuple[IRModule, dict],
                        frozen: Mapping[str, np.ndarray]) -> Runner:
        mod, params = imported
        with _as_opfusion_error(f"preparing the {self.engine!r} engine"):
            runner = ENGINES[self.engine](mod, params)
        # The inputs are checked here, not by each engine, so that every engine takes the
        # same arrays (and says the same about the wrong ones).
        if isinstance(mod, OnnxStagedModel):
            types = [TensorType(mod.input_shapes[name], mod.input_dtypes[name])
                     for name in mod.input_names]
        else:
            types = [param.type_annotation for param in mod["main"].params]
        names = [name for name in self.input_names if name not in frozen]
        return lambda inputs: runner([_conform(name, ty, array) for name, ty, array
                                      in zip(names, types, inputs)])

    def _may_specialize(self, err: OpfusionError) -> bool:
        # Not for unsupported ops, nor for internal errors (wrapped, with a cause).
        return (self.specialize and not isinstance(err, UnsupportedOnnxError)
                and err.__cause__ is None
                and (bool(self._candidate_sets()) or isinstance(err, DataDependentError)))

    def _candidate_sets(self) -> list[list[str]]:
        """The inputs to try freezing, smallest set first: the integer and bool inputs; then
        also the small float inputs that are scalars or never a node's first operand (Resize
        scales, Range bounds; not the data)."""
        first_operands = {node.input[0] for node in self.model.graph.node if node.input}
        integers, small = [], []
        for value in self.inputs:
            tensor_type = value.type.tensor_type
            dims = [dim.dim_value for dim in tensor_type.shape.dim]
            if tensor_type.elem_type in _INDEX_TYPES:
                integers.append(value.name)
            elif (_static_shape(value) and int(np.prod(dims)) <= _SMALL
                  and (not dims or value.name not in first_operands)):
                small.append(value.name)
        sets = [integers] if integers else []
        if small:
            sets.append([name for name in self.input_names if name in integers + small])
        return sets

    def _arrays(self, inputs: Any) -> list[np.ndarray]:
        names = self.input_names
        if isinstance(inputs, Mapping):
            unknown = [key for key in inputs if key not in names]
            missing = [name for name in names if name not in inputs]
            if unknown or missing:
                raise OpfusionError(f"the model's inputs are {', '.join(names) or 'none'}; "
                                    + (f"got unknown {', '.join(map(repr, unknown))}"
                                       if unknown else
                                       f"{', '.join(map(repr, missing))} missing"))
            values = [inputs[name] for name in names]
        elif isinstance(inputs, np.ndarray) and len(names) == 1:
            values = [inputs]
        elif isinstance(inputs, Sequence):
            values = list(inputs)
        else:
            raise OpfusionError(f"run takes a list or dict of arrays, got "
                                f"{type(inputs).__name__}")
        if len(values) != len(names):
            raise OpfusionError(f"the model takes {len(names)} input(s) "
                                f"({', '.join(names) or 'none'}), got {len(values)}")
        return [np.asarray(value) for value in values]


_INDEX_TYPES = {TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
                TensorProto.UINT64, TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8,
                TensorProto.BOOL}


def _freeze(model: ModelProto, values: Mapping[str, np.ndarray]) -> ModelProto:
    """A copy of ``model`` in which the graph inputs ``values`` names are initializers."""
    frozen = ModelProto()
    frozen.CopyFrom(model)
    graph = frozen.graph
    kept = [value for value in graph.input if value.name not in values]
    del graph.input[:]
    graph.input.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(array, name)
                             for name, array in values.items())
    return frozen


class OpfusionBackend(Backend):
    """``onnx.backend.base.Backend`` for opfusion (CPU only).

    Keywords of :meth:`prepare`: ``engine`` (a key of :data:`ENGINES`, default
    ``"compiled"``), ``shape`` (input shapes by name, as for :func:`from_onnx`),
    ``specialize`` (default True: freeze shape-deciding inputs to their values when the
    plain import needs them; see the module's docstring) and ``max_specializations`` (how
    many imports by shape and frozen values to keep, default 8)."""

    @classmethod
    def is_compatible(cls, model: ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.split(":")[0].upper() == "CPU"

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> OpfusionBackendRep:
        """Import ``model`` (a ``ModelProto``, a path or serialized bytes) for ``device``."""
        if isinstance(model, OpfusionBackendRep):
            return model
        if not cls.supports_device(device):
            raise OpfusionError(f"opfusion runs ONNX models on the CPU only, not {device!r}")
        unknown = sorted(set(kwargs) - set(_PREPARE_OPTIONS))
        if unknown:
            raise OpfusionError(f"prepare has no option {', '.join(map(repr, unknown))}; "
                                f"it takes {', '.join(_PREPARE_OPTIONS)}")
        with _as_opfusion_error("loading the model"):
            proto = _load(model)
        return OpfusionBackendRep(proto, **kwargs)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Run one node on ``inputs`` (arrays in the order of the node's non-empty inputs),
        as a one-node model of opset ``opset_version`` (default: the newest onnx knows)."""
        opset = kwargs.pop("opset_version", None) or _newest_opset()
        arrays = [np.asarray(value) for value in
                  (inputs.values() if isinstance(inputs, Mapping) else inputs)]
        names = [name for name in node.input if name]
        if len(arrays) != len(names):
            raise OpfusionError(f"{node.op_type} node {node.name!r} has {len(names)} input(s), "
                                f"got {len(arrays)} array(s)")
        with _as_opfusion_error(f"building a model of the {node.op_type} node"):
            graph_inputs = [helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
                for name, array in zip(names, arrays)]
            graph_outputs = [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None)
                             for name in node.output if name]
            graph = helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs,
                                      graph_outputs)
            model = helper.make_model(graph, opset_imports=[
                helper.make_opsetid(node.domain or "", opset)])
        return cls.run_model(model, arrays, device, **kwargs)


def _conform(name: str, ty: Any, array: np.ndarray) -> np.ndarray:
    """``array`` as model input ``name`` of type ``ty`` takes it: the shape must match; a dtype
    of the same kind (float64 for float32) is converted, as the reference interpreter does."""
    if not isinstance(ty, TensorType):
        return array
    if array.shape != ty.shape:
        raise OpfusionError(f"input %{name} expects shape {ty.shape}, got {array.shape}")
    if array.dtype != ty.dtype:
        if not np.can_cast(array.dtype, ty.dtype, casting="same_kind"):
            raise OpfusionError(f"input %{name} expects {ty.dtype}, got {array.dtype}; "
                                f"convert it with .astype({ty.dtype!r})")
        array = array.astype(ty.dtype)
    return array


def _static_shape(value: Any) -> bool:
    tensor_type = value.type.tensor_type
    return (value.type.HasField("tensor_type") and tensor_type.HasField("shape")
            and all(dim.HasField("dim_value") for dim in tensor_type.shape.dim))


def _newest_opset() -> int:
    from onnx import defs

    return defs.onnx_opset_version()


@contextmanager
def _as_opfusion_error(doing: str) -> Iterator[None]:
    try:
        yield
    except OpfusionError:
        raise
    except Exception as err:  # noqa: BLE001 - the backend promises opfusion exceptions only
        raise OpfusionError(f"internal error while {doing} ({type(err).__name__}: {err}); "
                            "this is a bug in opfusion, not in the model") from err


is_compatible = OpfusionBackend.is_compatible
prepare = OpfusionBackend.prepare
run_model = OpfusionBackend.run_model
run_node = OpfusionBackend.run_node
supports_device = OpfusionBackend.supports_device
