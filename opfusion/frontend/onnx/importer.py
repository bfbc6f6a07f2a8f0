"""from_onnx: import an ONNX model into the graph IR.

Initializers become constants (or parameters), every node goes through its converter in
:mod:`opfusion.frontend.onnx.registry`, and any call whose operands are all constants is
evaluated at once with the operator's reference. That last step is what resolves shape
arithmetic (Shape -> Gather -> Concat -> Reshape) on static shapes: the imported graph holds
only the computation that depends on the model's inputs.

A model whose inputs have symbolic dimensions that ``shape=`` does not fix is not imported at
once: :func:`from_onnx` returns an :class:`OnnxSymbolicModule`, which imports it for each
concrete set of input shapes (see :mod:`opfusion.ir.symbolic`)."""

from __future__ import annotations

import collections
import contextlib
import functools
import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...compiler.limits import check_allocation
from ...errors import DataDependentError, OnnxImportError, OpfusionError
from ...ir.expr import Constant, Expr, Function, Tuple, Var
from ...ir.module import IRModule
from ...ir.symbolic import Dim, SymbolicModule, SymbolicTensor
from ...ir.types import TensorType, TupleType
from ...transform.fold_constant import ConstantFolder
from . import converters  # noqa: F401  (registers the converters)
from .functions import expand_function, has_function_body
from .registry import ONNX_DOMAIN, OnnxNode, lookup_converter
from .staged import OnnxStagedModel
from .tensors import (
    ONNX_DTYPES,
    first_external_tensor,
    inline_external_data,
    onnx_dtype,
    read_tensor,
)

MAX_GRAPH_DEPTH = 32
"""How deep control-flow bodies (If, Loop, Scan) may nest inside one another."""


class UnsupportedOnnxError(OnnxImportError):
    """The model uses operators opfusion cannot import; the message lists all of them."""


def from_onnx(
    model: Any,
    shape: Mapping[str, Sequence[int]] | None = None,
    dtype: str | Mapping[str, str] | None = None,
    freeze_params: bool = True,
    base_dir: str | os.PathLike | None = None,
    data_dependent: str = "stage",
) -> tuple[IRModule | OnnxSymbolicModule | OnnxStagedModel, dict[str, np.ndarray]]:
    """Import an ONNX model (a ``ModelProto``, serialized bytes or a path) as an IRModule.

    ``shape`` gives input shapes by name; ``dtype`` overrides input dtypes (one for all, or by
    name). With ``freeze_params=False`` initializers become parameters of ``@main`` and are
    returned in ``params``; otherwise they are constants and ``params`` is empty.

    When an input has a symbolic or unknown dimension (or an unknown rank) that ``shape`` does
    not fix, the result is ``(OnnxSymbolicModule, params)`` instead: the model checked
    (names, opset, input types, supported operators) but imported only when shapes are known.
    ``opf.compile`` makes it an executor that specialises on each run's input shapes
    (:class:`~opfusion.compiler.specialize.SpecializingExecutor`); ``mod.specialize(shapes)``
    imports it for given shapes; what needs a graph (passes, the interpreter) refuses it,
    saying to pass ``shape=``.

    When the import needs a value the model computes from its inputs (a shape, a NonZero's
    input, a Loop's trip count: :class:`~opfusion.errors.DataDependentError`), the result is
    ``(OnnxStagedModel, {})``, which ``opf.compile`` runs in stages
    (:mod:`opfusion.frontend.onnx.staged`); ``data_dependent="raise"`` raises the error
    instead.

    Tensors stored as external data are read only from inside one directory: the model file's
    when ``model`` is a path, else ``base_dir``, which a ``ModelProto`` or bytes with external
    data must give (there is no model directory to trust; opfusion never reads relative to the
    current directory). Every tensor is checked before it is read (see
    :mod:`opfusion.frontend.onnx.tensors`); a malformed model raises
    :class:`~opfusion.errors.OnnxImportError` naming the tensor or node."""
    proto = _load(model, base_dir)
    importer = _Importer(proto, dict(shape or {}), dtype, freeze_params)
    inputs = importer.declared_inputs()
    if data_dependent not in ("stage", "raise"):
        raise OpfusionError(f"data_dependent={data_dependent!r}: use 'stage' or 'raise'")
    if all(tensor.is_static for tensor in inputs):
        return _run_or_stage(importer, proto, model, data_dependent)
    importer.check_supported()  # an unsupported operator is reported now, not at first run
    params = importer.read_params() if not freeze_params else {}
    if proto is model:  # kept for later imports: the caller's changes must not reach them
        proto = _onnx().ModelProto()
        proto.CopyFrom(model)
    return OnnxSymbolicModule(proto, importer.shape, dtype, freeze_params, inputs,
                              declared_outputs(proto.graph)), params


def _run_or_stage(importer: _Importer, proto: Any, model: Any, data_dependent: str
                  ) -> tuple[IRModule | OnnxStagedModel, dict[str, np.ndarray]]:
    """The import, or the staged model when it needs values computed at run time."""
    try:
        return importer.run()
    except DataDependentError as err:
        if data_dependent == "raise" or err.graph_index is None:
            raise
        if proto is model:  # kept for the stages: the caller's changes must not reach them
            proto = _onnx().ModelProto()
            proto.CopyFrom(model)
        declared = importer.declared_inputs()
        return OnnxStagedModel(proto, {t.name: tuple(t.dims) for t in declared},  # type: ignore[arg-type]
                               {t.name: t.dtype for t in declared}, err), {}


class OnnxSymbolicModule(SymbolicModule):
    """An ONNX model with symbolic input dimensions: :func:`from_onnx`'s result when
    ``shape=`` leaves some open. Holds the model (a copy, its external data already read)
    and the import options; :meth:`specialize` imports it for concrete shapes. Each specialization
    reads the initializers again (its constants are its own)."""

    def __init__(self, proto: Any, shape: Mapping[str, Sequence[int]],
                 dtype: str | Mapping[str, str] | None, freeze_params: bool,
                 inputs: Sequence[SymbolicTensor], outputs: Sequence[SymbolicTensor]) -> None:
        super().__init__(inputs, outputs)
        self.proto = proto
        self.shape = dict(shape)
        self.dtype = dtype
        self.freeze_params = freeze_params

    def specialize(self, shapes: Mapping[str, Sequence[int]]
                   ) -> tuple[IRModule, dict[str, np.ndarray]]:
        """``from_onnx(model, shape=...)`` with these shapes (on top of the ``shape=`` given
        at first), without loading the model again."""
        merged = {**self.shape, **{name: tuple(dims) for name, dims in shapes.items()}}
        importer = _Importer(self.proto, merged, self.dtype, self.freeze_params)
        for tensor in importer.declared_inputs():
            if not tensor.is_static:
                raise self.static_error(f"importing with shapes for "
                                        f"{', '.join(map(repr, shapes)) or 'no input'}")
        return _run_or_stage(importer, self.proto, None, "stage")  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# loading


def _onnx():
    try:
        import onnx
    except ImportError as err:  # pragma: no cover - the onnx extra is a documented requirement
        raise OpfusionError("importing ONNX models needs the onnx package: "
                            "pip install 'opfusion[onnx]'") from err
    return onnx


def _load(model: Any, base_dir: str | os.PathLike | None = None) -> Any:
    """The ``ModelProto`` of ``model`` with all its data in memory (external data inlined from
    the trusted directory; a given ``ModelProto`` is copied first, never changed)."""
    onnx = _onnx()
    if isinstance(model, onnx.ModelProto):
        proto, where = model, "the given ModelProto"
        _check_graph(proto, where)
    elif isinstance(model, (bytes, bytearray)):
        proto, where = _parse_bytes(bytes(model), "the given bytes"), "the given bytes"
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise OpfusionError(f"no ONNX model at {str(path)!r}")
        where = repr(str(path))
        proto = _parse_bytes(path.read_bytes(), where)
        if base_dir is None:
            base_dir = path.resolve().parent
    else:
        raise OpfusionError(f"from_onnx takes an onnx.ModelProto, bytes or a path, got "
                            f"{type(model).__name__}")
    external = first_external_tensor(proto)
    if external is not None:
        if base_dir is None:
            raise OnnxImportError(f"{external} keeps its data in an external file but {where} "
                                  "comes with no directory to read it from: pass base_dir= "
                                  "(the directory holding the model's data files) to from_onnx, "
                                  "or give the model's path")
        if proto is model:
            proto = onnx.ModelProto()
            proto.CopyFrom(model)
        inline_external_data(proto, Path(base_dir))
    return proto


def _parse_bytes(data: bytes, where: str) -> Any:
    onnx = _onnx()
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as err:  # noqa: BLE001 - protobuf raises its own DecodeError types
        raise OnnxImportError(f"{where} is not a valid ONNX model (protobuf decoding failed: "
                              f"{err}); check that the file is complete") from None
    _check_graph(proto, where)
    return proto


def _check_graph(proto: Any, where: str) -> None:
    if not proto.HasField("graph") or not proto.graph.node and not proto.graph.output:
        raise OnnxImportError(f"{where} holds no ONNX graph; is it an ONNX model file?")


# ---------------------------------------------------------------------------------------------
# the importer


class _Importer:
    def __init__(self, proto: Any, shape: dict[str, Sequence[int]],
                 dtype: str | Mapping[str, str] | None, freeze_params: bool) -> None:
        self.proto = proto
        self.graph = proto.graph
        self.shape = shape
        self.dtype = dtype
        self.freeze_params = freeze_params
        self.opset = _model_opset(proto)
        self.env: dict[str, Expr] = {}
        self.depth = 0  # how many control-flow bodies the node being converted is inside
        self.folder = ConstantFolder()

    def run(self) -> tuple[IRModule, dict[str, np.ndarray]]:
        _check_names(self.graph)
        params: dict[str, np.ndarray] = {}
        param_vars: list[Var] = []
        for tensor in self.graph.initializer:
            array = read_tensor(tensor, f"initializer {tensor.name!r}")
            if self.freeze_params:
                self.env[tensor.name] = Constant(array)
            else:
                var = Var(tensor.name, TensorType(array.shape, array.dtype))
                self.env[tensor.name] = var
                param_vars.append(var)
                params[tensor.name] = array
        self.check_shape_names()
        inputs = [self.input_var(value) for value in self.graph_inputs()]
        self.check_supported()
        self.convert_nodes(self.graph.node, self.opset)
        outputs = [self.lookup(value.name, "graph output") for value in self.graph.output]
        body = outputs[0] if len(outputs) == 1 else Tuple(outputs)
        # The graph's output names travel with @main, so the executor can report outputs by
        # the names ONNX Runtime uses.
        names = tuple(value.name for value in self.graph.output)
        func = Function(inputs + param_vars, body, attrs={"output_names": names})
        try:
            _ = func.checked_type
        except OpfusionError:
            raise
        except Exception as err:  # noqa: BLE001 - the last line: see _converting
            raise OnnxImportError(f"type inference of the imported graph failed with "
                                  f"{type(err).__name__}: {err}") from err
        return IRModule.from_expr(func), params

    def convert_nodes(self, nodes: Sequence[Any], opset: int) -> None:
        """Convert ``nodes`` in order into ``self.env``.

        A worklist, not recursion: a function operator is replaced in place by its body's
        nodes (which may be function operators again), each with the opset it is written in.
        Each node keeps the index of the graph's node it comes from, for error messages."""
        pending = deque((node, opset, index) for index, node in enumerate(nodes))
        while pending:
            node, node_opset, index = pending.popleft()
            try:
                self.convert_node(node, node_opset, index, pending)
            except DataDependentError as err:
                if self.depth == 0:  # which of the model's nodes: where a staged run cuts
                    err.graph_index = index
                raise

    def convert_node(self, node: Any, opset: int, index: int, pending: deque) -> None:
        """Convert one node, or put its function body's nodes in front of ``pending``."""
        with _converting(node, index):
            standard = _domain(node) == ONNX_DOMAIN
            if lookup_converter(node.op_type, opset) is None and standard:
                self.expand(node, opset, index, pending)
                return
            try:
                if not self.convert(node, opset):  # the converter declined this form
                    self.expand(node, opset, index, pending)
            except DataDependentError as err:
                # The value's name, for a staged run to compute first and freeze.
                if (err.input_index is not None and err.value_name is None
                        and err.input_index < len(node.input)):
                    err.value_name = node.input[err.input_index]
                raise

    def expand(self, node: Any, opset: int, index: int, pending: deque) -> None:
        """Put ``node``'s function body (ONNX's definition of it) in front of ``pending``."""
        types = [self.env[name].checked_type if name in self.env else None
                 for name in node.input]
        body, body_opset = expand_function(node, opset, types)
        pending.extendleft((inner, body_opset, index) for inner in reversed(body))

    def run_subgraph(self, graph: Any, inputs: list[Expr], what: str) -> list[Expr]:
        """Convert a control-flow body ``graph`` with its formal inputs bound to ``inputs``.

        The body sees the enclosing graphs' values (ONNX's outer scope) and its own names
        shadow them; what it defines is dropped afterwards. Bodies nest as deep as the model
        nests them (``MAX_GRAPH_DEPTH``), never as deep as a graph is long."""
        if len(graph.input) != len(inputs):
            raise OnnxImportError(f"{what}: the body graph declares {len(graph.input)} inputs "
                                  f"but the operator gives it {len(inputs)}")
        if self.depth >= MAX_GRAPH_DEPTH:
            raise OnnxImportError(f"{what}: control-flow bodies nest deeper than "
                                  f"{MAX_GRAPH_DEPTH} levels")
        outer = self.env
        local: dict[str, Expr] = {}
        for tensor in graph.initializer:
            local[tensor.name] = Constant(read_tensor(tensor, f"initializer {tensor.name!r} of "
                                                              f"{what}"))
        for value, expr in zip(graph.input, inputs):
            local[value.name] = expr
        self.env = collections.ChainMap(local, outer)  # type: ignore[assignment]
        self.depth += 1
        try:
            self.convert_nodes(graph.node, self.opset)
            return [self.lookup(value.name, f"output of {what}") for value in graph.output]
        finally:
            self.env = outer
            self.depth -= 1

    # -- inputs ---------------------------------------------------------------------------
    def read_params(self) -> dict[str, np.ndarray]:
        """Every initializer as an array, by name (the params of ``freeze_params=False``)."""
        return {tensor.name: read_tensor(tensor, f"initializer {tensor.name!r}")
                for tensor in self.graph.initializer}

    def graph_inputs(self) -> list[Any]:
        """The graph inputs that are not initializers (models of IR version < 4 also list
        their initializers among the graph inputs)."""
        initializer_names = {tensor.name for tensor in self.graph.initializer}
        return [value for value in self.graph.input if value.name not in initializer_names]

    def check_shape_names(self) -> None:
        known_inputs = [value.name for value in self.graph.input]
        for name in self.shape:
            if name not in known_inputs:
                raise OpfusionError(f"shape= names {name!r}, which is not a graph input; the "
                                    f"inputs are {', '.join(map(repr, known_inputs))}")

    def declared_inputs(self) -> list[SymbolicTensor]:
        """Each graph input's name, dims (``shape=``'s, else the model's, symbolic ones
        included) and dtype, checked; nothing is imported."""
        _check_names(self.graph)
        self.check_shape_names()
        return [SymbolicTensor(value.name, self.input_dims(value), self.input_dtype(value))
                for value in self.graph_inputs()]

    def input_dims(self, value: Any) -> tuple[Dim, ...] | None:
        """Graph input ``value``'s dims: ``shape=``'s, else the model's (an int, a
        ``dim_param``'s name, or None for an unnamed unknown dim; None for an unknown rank)."""
        name = value.name
        if not value.type.HasField("tensor_type"):
            raise OnnxImportError(f"graph input {name!r} is not a tensor (sequences, maps and "
                                  "optionals are not supported)")
        tensor_type = value.type.tensor_type
        if name in self.shape:
            dims = tuple(int(d) for d in self.shape[name])
            declared = len(tensor_type.shape.dim)
            if tensor_type.HasField("shape") and declared != len(dims):
                raise OpfusionError(f"shape= gives graph input {name!r} {len(dims)} dimensions "
                                    f"{dims} but the model declares {declared}")
            return dims
        if not tensor_type.HasField("shape"):
            return None
        found: list[Dim] = []
        for axis, dim in enumerate(tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value < 0:
                raise OnnxImportError(f"graph input {name!r} has the negative dimension "
                                      f"{dim.dim_value} at axis {axis}; the model is malformed")
            found.append(int(dim.dim_value) if dim.HasField("dim_value")
                         else dim.dim_param or None)
        return tuple(found)

    def input_dtype(self, value: Any) -> str:
        name = value.name
        if isinstance(self.dtype, str):
            return self.dtype
        if isinstance(self.dtype, Mapping) and name in self.dtype:
            return self.dtype[name]
        return onnx_dtype(value.type.tensor_type.elem_type, f"graph input {name!r}")

    def input_var(self, value: Any) -> Var:
        name = value.name
        dims = self.input_dims(value)
        if dims is None or not all(isinstance(d, int) for d in dims):
            # from_onnx returns a symbolic module for these; the importer never sees one.
            raise OpfusionError(f"graph input {name!r} has symbolic dimensions; give its "
                                f"shape: from_onnx(model, shape={{{name!r}: (...)}})")
        dtype = self.input_dtype(value)
        # An input no machine of this size could hold is refused here, naming it, rather
        # than as the kernels and results its shape makes too large.
        check_allocation(f"graph input {name!r} of shape {list(dims)} and dtype {dtype}", dims,
                         dtype, raise_with="opf.frontend.from_onnx(...)")
        var = Var(name, TensorType(dims, dtype))
        self.env[name] = var
        return var

    # -- nodes ----------------------------------------------------------------------------
    def check_supported(self) -> None:
        missing: list[str] = []
        for node in _nodes_with_bodies(self.graph):
            domain = _domain(node)
            if lookup_converter(node.op_type, self.opset, domain) is None and (
                    domain != ONNX_DOMAIN or not has_function_body(node.op_type, self.opset)):
                where = f"{node.op_type} (node {node.name!r}, domain {domain}, opset {self.opset})"
                missing.append(where)
        if missing:
            listing = "\n  ".join(missing)
            raise UnsupportedOnnxError(f"the model uses {len(missing)} node(s) opfusion cannot "
                                       f"import:\n  {listing}")

    def lookup(self, name: str, what: str) -> Expr:
        try:
            return self.env[name]
        except KeyError:
            raise OnnxImportError(f"{what} {name!r} is not produced by any node, initializer or "
                                "graph input (a dangling name; nodes must be in topological "
                                "order)") from None

    def convert(self, node: Any, opset: int) -> bool:
        """Convert ``node`` into ``self.env``; False when its converter declines the form it
        has (returns ``NotImplemented``: the node's function body is converted instead)."""
        inputs = [self.lookup(name, f"input of node {node.name!r} ({node.op_type}):")
                  if name else None for name in node.input]
        _check_attribute_kinds(node, opset)
        _check_input_types(node, opset, inputs)
        attrs = {attr.name: _attribute_value(attr, node) for attr in node.attribute}
        # Trailing outputs with an empty name are not requested: a converter sees how many
        # outputs the model actually uses (BatchNormalization ["y", "", ""] asks for one).
        requested = len(node.output)
        while requested and not node.output[requested - 1]:
            requested -= 1
        view = OnnxNode(_node_name(node), node.op_type, inputs, attrs, opset, requested,
                        run_graph=self.run_subgraph)
        fn = lookup_converter(node.op_type, opset, _domain(node))
        assert fn is not None
        result = fn(view)
        if result is NotImplemented:
            if _domain(node) != ONNX_DOMAIN or not has_function_body(node.op_type, opset):
                raise OnnxImportError(f"{node.op_type} (node {view.name!r}): this form of the "
                                      "operator is not supported")
            return False
        outputs = [result] if isinstance(result, Expr) else list(result)
        outputs = [self.folder.visit(out) if out is not None else None for out in outputs]
        for name, out in zip(node.output, outputs):
            if out is not None:
                _check_indexable(name, out.checked_type)
        if any(node.output[len(outputs):]):
            raise OnnxImportError(f"{node.op_type} (node {view.name!r}): the node has "
                                f"{len(node.output)} outputs but opfusion produces only "
                                f"{len(outputs)}; the extra outputs are not supported")
        for name, out in zip(node.output, outputs):
            if name and out is not None:
                self.env[name] = out
        return True


def evaluate_node(node: Any, model: Any, values: Mapping[str, np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """ONNX ``node`` (of ``model``, for its opset) computed from ``values`` given as
    constants: converted and folded as the import does, the interpreter running what does
    not fold. Returns its outputs by name; a staged run's way to compute a cut node."""
    from ...ir.evaluate import evaluate

    stub = _onnx().ModelProto()
    stub.opset_import.extend(model.opset_import)
    importer = _Importer(stub, {}, None, True)
    importer.env = {name: Constant(np.asarray(value)) for name, value in values.items()}
    importer.convert_nodes([node], importer.opset)
    outputs = [name for name in node.output if name]
    exprs = [importer.lookup(name, "output") for name in outputs]
    if all(isinstance(expr, Constant) for expr in exprs):
        return {name: expr.data for name, expr in zip(outputs, exprs)}
    body = exprs[0] if len(exprs) == 1 else Tuple(exprs)
    result = evaluate(IRModule.from_expr(Function([], body)), [])
    results = result if isinstance(result, tuple) else (result,)
    return {name: np.asarray(value) for name, value in zip(outputs, results)}


def _nodes_with_bodies(graph: Any) -> Iterator[Any]:
    """The graph's nodes and those of every control-flow body inside it (a worklist)."""
    onnx = _onnx()
    pending = deque([graph])
    while pending:
        for node in pending.popleft().node:
            yield node
            pending.extend(attr.g for attr in node.attribute
                           if attr.type == onnx.AttributeProto.GRAPH)


def declared_outputs(graph: Any) -> list[SymbolicTensor]:
    """Each graph output's name, declared dims (as :meth:`_Importer.input_dims` reads an
    input's) and dtype (None when undeclared or not one opfusion holds)."""
    outputs = []
    for value in graph.output:
        tensor_type = value.type.tensor_type
        dims: tuple[Dim, ...] | None = None
        if value.type.HasField("tensor_type") and tensor_type.HasField("shape"):
            dims = tuple(int(d.dim_value) if d.HasField("dim_value") else d.dim_param or None
                         for d in tensor_type.shape.dim)
        outputs.append(SymbolicTensor(value.name, dims, ONNX_DTYPES.get(tensor_type.elem_type)))
    return outputs


def _domain(node: Any) -> str:
    """The domain of ``node``'s operator (ONNX's own for an empty one)."""
    return node.domain or ONNX_DOMAIN


def _model_opset(proto: Any) -> int:
    """The model's version of the default ONNX domain, checked once here: one version, from 1
    to the newest the installed onnx package knows (its schemas define the operators)."""
    onnx = _onnx()
    versions = list(dict.fromkeys(int(entry.version) for entry in proto.opset_import
                                  if entry.domain in ("", "ai.onnx")))
    if not versions:
        if proto.ir_version and proto.ir_version < 3:
            return 1
        raise OnnxImportError("the model imports no version of the default ONNX domain "
                              "(opset_import is empty)")
    if len(versions) > 1:
        raise OnnxImportError(f"the model imports the default ONNX domain at several versions "
                              f"{versions}; the model is malformed")
    newest = onnx.defs.onnx_opset_version()
    version = versions[0]
    if not 1 <= version <= newest:
        hint = "; upgrade the onnx package" if version > newest else ""
        raise OnnxImportError(f"the model imports opset {version} of the default ONNX domain; "
                              f"opfusion reads opsets 1 to {newest} (the newest the installed "
                              f"onnx package defines){hint}")
    return version


def _check_names(graph: Any) -> None:
    """Every value is named once (SSA): initializers, graph inputs and node outputs; graph
    inputs and outputs and initializers have names. (An input may repeat an initializer's name:
    models of IR version < 4 list initializers among the inputs.) Every name is text."""
    _check_text(graph)
    defined: dict[str, str] = {}
    for index, tensor in enumerate(graph.initializer):
        if not tensor.name:
            raise OnnxImportError(f"initializer {index} has no name; the model is malformed")
        if tensor.name in defined:
            raise OnnxImportError(f"initializer {tensor.name!r} is defined twice")
        defined[tensor.name] = "an initializer"
    inputs: set[str] = set()
    for index, value in enumerate(graph.input):
        if not value.name:
            raise OnnxImportError(f"graph input {index} has no name; the model is malformed")
        if value.name in inputs:
            raise OnnxImportError(f"graph input {value.name!r} is listed twice")
        inputs.add(value.name)
        defined.setdefault(value.name, "a graph input")
    for index, node in enumerate(graph.node):
        for name in node.output:
            if name in defined:
                raise OnnxImportError(f"{_node_label(node, index)}: output {name!r} is already "
                                      f"defined by {defined[name]}; every value must have one "
                                      "producer")
            if name:
                defined[name] = f"node {_node_name(node)!r} ({node.op_type})"
    for index, value in enumerate(graph.output):
        if not value.name:
            raise OnnxImportError(f"graph output {index} has no name; the model is malformed")


def _check_text(graph: Any) -> None:
    """The names of ``graph``'s inputs, outputs and initializers, which callers give and get
    back, are text: protobuf hands over the bytes of a string field that is not UTF-8 (a
    damaged model) as they are, which would become a name like ``"b'x\\xf6'"``, or one no
    keyword can give. (Node and value names inside stay as protobuf gives them: the importer
    only matches them with each other, and a node's messages show them as they are.)"""
    for kind, values in (("graph input", graph.input), ("graph output", graph.output),
                         ("initializer", graph.initializer)):
        for index, value in enumerate(values):
            if type(value.name) is not str:
                raise OnnxImportError(f"{kind} {index} is named {value.name!r}, not UTF-8 "
                                      "text; the model is damaged")


#: The most elements a value may have: every index into it is an int64.
MAX_INDEXABLE_ELEMENTS = 2**63 - 1


def _check_indexable(name: str, ty: Any) -> None:
    """A node's output whose elements an int64 cannot count (a padding or a size of 2^63 in
    a damaged model) is refused here, where the node is known: no kernel could index it,
    and lowering would meet the overflow without knowing which node made it."""
    for item in ty.fields if isinstance(ty, TupleType) else [ty]:
        if not isinstance(item, TensorType):
            continue
        count = 1
        for dim in item.shape:
            count *= int(dim)
        if count > MAX_INDEXABLE_ELEMENTS or any(int(d) > MAX_INDEXABLE_ELEMENTS
                                                 for d in item.shape):
            raise OnnxImportError(f"output {name!r} would have shape {list(item.shape)}, "
                                  f"more elements than an int64 index counts; check the "
                                  "node's attributes and inputs (pads, sizes, repeats)")


def _node_name(node: Any) -> str:
    """The name messages use for ``node``: its own, else its first output's."""
    return node.name or next((name for name in node.output if name), "")


def _node_label(node: Any, index: int) -> str:
    return f"{node.op_type} (node {_node_name(node)!r}, #{index} in the graph)"


@contextlib.contextmanager
def _converting(node: Any, index: int) -> Iterator[None]:
    """Errors while converting ``node`` name it. An opfusion error gets the node's name when
    its message lacks it; any other exception (a converter or type inference meeting a value
    no specific check caught) becomes an :class:`OnnxImportError` chained to it: the last line,
    so that a malformed model never escapes as a bare TypeError or KeyError."""
    try:
        yield
    except OpfusionError as err:
        name = _node_name(node)
        if f"(node {name!r}" in str(err):
            raise
        message = f"{node.op_type} (node {name!r}): {err}"
        try:
            renamed = type(err)(message)
        except TypeError:  # an error class with more constructor arguments
            renamed = OnnxImportError(message)
        raise renamed from None
    except Exception as err:  # noqa: BLE001 - see the docstring
        raise OnnxImportError(f"{_node_label(node, index)}: importing it failed with "
                              f"{type(err).__name__}: {err} (the model is probably malformed; "
                              "if it passes onnx.checker, please report it)") from err


def _kind_name(kind: int) -> str:
    try:
        return _onnx().AttributeProto.AttributeType.Name(kind)
    except ValueError:
        return f"unknown kind {kind}"


def _check_attribute_kinds(node: Any, opset: int) -> None:
    """An attribute whose kind is not the one the op's schema declares (a float where an int
    is due, a string for a list) is a malformed model; converters may rely on the kinds."""
    onnx = _onnx()
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except onnx.defs.SchemaError:
        return  # not an op of this opset's standard; its converter checks what it reads
    for attr in node.attribute:
        declared = schema.attributes.get(attr.name)
        if declared is not None and attr.type != int(declared.type):
            raise OnnxImportError(f"{node.op_type} (node {node.name!r}, opset {opset}): "
                                  f"attribute {attr.name!r} must be "
                                  f"{_kind_name(int(declared.type))} but the model gives "
                                  f"{_kind_name(attr.type)}; the model is malformed")


#: opfusion's tensor dtypes as ONNX's schemas name them.
_ONNX_TYPE_NAMES = {"float32": "float", "float64": "double", "bool": "bool",
                    **{name: name for name in ("float16", "bfloat16", "int8", "int16", "int32",
                                               "int64", "uint8", "uint16", "uint32",
                                               "uint64")}}


def _check_input_types(node: Any, opset: int, inputs: Sequence[Expr | None]) -> None:
    """A tensor input of a type the op's schema does not allow (HardSwish of int16 values,
    which a damaged model may hold) is refused naming the node and the types it takes, as
    ONNX Runtime refuses the model: the converters may rely on the schema's types."""
    rules = _input_type_rules(node.op_type, opset, node.domain or "")
    if rules is None:
        return
    formals, variadic = rules
    for index, value in enumerate(inputs):
        if value is None or (index >= len(formals) and not variadic):
            continue
        formal, types = formals[min(index, len(formals) - 1)]
        ty = value.checked_type
        name = _ONNX_TYPE_NAMES.get(getattr(ty, "dtype", ""))
        if types is None or not isinstance(ty, TensorType) or name is None:
            continue
        if name not in types:
            raise OnnxImportError(
                f"{node.op_type} (node {node.name!r}, opset {opset}): input {index} "
                f"({formal}) is {ty.dtype}, but the operator takes {', '.join(types)}; the "
                "model is malformed")


@functools.lru_cache(maxsize=1024)
def _input_type_rules(op_type: str, opset: int, domain: str
                      ) -> tuple[tuple[tuple[str, tuple[str, ...] | None], ...], bool] | None:
    """Per formal input of an op's schema, its name and the tensor element types it takes
    (None: also other kinds, sequences or optionals, left to the converter), and whether the
    last one is variadic; None for an op with no schema at this opset."""
    onnx = _onnx()
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None  # not an op of this opset's standard; its converter checks what it reads
    if not schema.inputs:
        return None
    allowed = {c.type_param_str: list(c.allowed_type_strs) for c in schema.type_constraints}
    formals = []
    for formal in schema.inputs:
        types = allowed.get(formal.type_str, [formal.type_str])
        tensors = all(t.startswith("tensor(") for t in types)
        formals.append((formal.name, tuple(t[7:-1] for t in types) if tensors else None))
    variadic = schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
    return tuple(formals), variadic


def _attribute_value(attr: Any, node: Any) -> Any:
    onnx = _onnx()
    kind = attr.type
    types = onnx.AttributeProto
    if kind == types.FLOAT:
        return float(attr.f)
    if kind == types.INT:
        return int(attr.i)
    if kind == types.STRING:
        return attr.s.decode("utf-8", errors="replace")
    if kind == types.TENSOR:
        return read_tensor(attr.t, f"attribute {attr.name!r} of {node.op_type} "
                                   f"(node {node.name!r})")
    if kind == types.FLOATS:
        return [float(v) for v in attr.floats]
    if kind == types.INTS:
        return [int(v) for v in attr.ints]
    if kind == types.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in attr.strings]
    if kind == types.GRAPH:
        return attr.g  # a control-flow body, converted by the converter (OnnxNode.run_graph)
    raise OnnxImportError(f"{node.op_type} (node {node.name!r}): attribute {attr.name!r} has a "
                          f"kind opfusion does not read ({_kind_name(kind)})")




