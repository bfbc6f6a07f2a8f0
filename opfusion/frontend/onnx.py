"""from_onnx: import an ONNX model into the graph IR.

Initializers become constants (or parameters), every node goes through its converter in
:mod:`opfusion.frontend.onnx_registry`, and any call whose operands are all constants is
evaluated at once with the operator's reference. That last step is what resolves shape
arithmetic (Shape -> Gather -> Concat -> Reshape) on static shapes: the imported graph holds
only the computation that depends on the model's inputs."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OnnxImportError, OpfusionError
from ..ir.expr import Constant, Expr, Function, Tuple, Var
from ..ir.module import IRModule
from ..ir.types import TensorType
from ..transform.fold_constant import ConstantFolder
from . import converters  # noqa: F401  (registers the converters)
from .onnx_functions import expand_function, has_function_body
from .onnx_registry import OnnxNode, lookup_converter
from .onnx_tensors import first_external_tensor, inline_external_data, read_tensor


class UnsupportedOnnxError(OnnxImportError):
    """The model uses operators opfusion cannot import; the message lists all of them."""


def from_onnx(
    model: Any,
    shape: Mapping[str, Sequence[int]] | None = None,
    dtype: str | Mapping[str, str] | None = None,
    freeze_params: bool = True,
    base_dir: str | os.PathLike | None = None,
) -> tuple[IRModule, dict[str, np.ndarray]]:
    """Import an ONNX model (a ``ModelProto``, serialized bytes or a path) as an IRModule.

    ``shape`` gives input shapes by name (needed for symbolic dimensions); ``dtype`` overrides
    input dtypes (one for all, or by name). With ``freeze_params=False`` initializers become
    parameters of ``@main`` and are returned in ``params``; otherwise they are constants and
    ``params`` is empty.

    Tensors stored as external data are read only from inside one directory: the model file's
    when ``model`` is a path, else ``base_dir``, which a ``ModelProto`` or bytes with external
    data must give (there is no model directory to trust; opfusion never reads relative to the
    current directory). Every tensor is checked before it is read (see
    :mod:`opfusion.frontend.onnx_tensors`); a malformed model raises
    :class:`~opfusion.errors.OnnxImportError` naming the tensor or node."""
    proto = _load(model, base_dir)
    return _Importer(proto, dict(shape or {}), dtype, freeze_params).run()


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
        raise OpfusionError(f"{where} is not a valid ONNX model (protobuf decoding failed: "
                            f"{err}); check that the file is complete") from None
    _check_graph(proto, where)
    return proto


def _check_graph(proto: Any, where: str) -> None:
    if not proto.HasField("graph") or not proto.graph.node and not proto.graph.output:
        raise OpfusionError(f"{where} holds no ONNX graph; is it an ONNX model file?")


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
        self.opset = _default_opset(proto)
        self.env: dict[str, Expr] = {}
        self.folder = ConstantFolder()

    def run(self) -> tuple[IRModule, dict[str, np.ndarray]]:
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
        known_inputs = [value.name for value in self.graph.input]
        for name in self.shape:
            if name not in known_inputs:
                raise OpfusionError(f"shape= names {name!r}, which is not a graph input; the "
                                    f"inputs are {', '.join(map(repr, known_inputs))}")
        # Models of IR version < 4 also list their initializers among the graph inputs.
        initializer_names = {tensor.name for tensor in self.graph.initializer}
        inputs = [self.input_var(value) for value in self.graph.input
                  if value.name not in initializer_names]
        self.check_supported()
        # A worklist, not recursion: a function operator is replaced in place by its body's
        # nodes (which may be function operators again), each with the opset it is written in.
        pending = deque((node, self.opset) for node in self.graph.node)
        while pending:
            node, opset = pending.popleft()
            if lookup_converter(node.op_type, opset) is None and (node.domain or "") in ("",
                                                                                       "ai.onnx"):
                types = [self.env[name].checked_type if name in self.env else None
                         for name in node.input]
                body, body_opset = expand_function(node, opset, types)
                pending.extendleft((inner, body_opset) for inner in reversed(body))
                continue
            self.convert(node, opset)
        outputs = [self.lookup(value.name, "graph output") for value in self.graph.output]
        body = outputs[0] if len(outputs) == 1 else Tuple(outputs)
        func = Function(inputs + param_vars, body)
        _ = func.checked_type
        return IRModule.from_expr(func), params

    # -- inputs ---------------------------------------------------------------------------
    def input_var(self, value: Any) -> Var:
        onnx = _onnx()
        name = value.name
        tensor_type = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise OpfusionError(f"graph input {name!r} is not a tensor (sequences, maps and "
                                "optionals are not supported)")
        if name in self.shape:
            dims = tuple(int(d) for d in self.shape[name])
            declared = len(tensor_type.shape.dim)
            if tensor_type.HasField("shape") and declared != len(dims):
                raise OpfusionError(f"shape= gives graph input {name!r} {len(dims)} dimensions "
                                    f"{dims} but the model declares {declared}")
        else:
            dims = []
            for axis, dim in enumerate(tensor_type.shape.dim):
                if dim.HasField("dim_value"):
                    dims.append(dim.dim_value)
                else:
                    label = dim.dim_param or "?"
                    raise OpfusionError(f"graph input {name!r} has a symbolic dimension "
                                        f"{label!r} at axis {axis}; give its shape: "
                                        f"from_onnx(model, shape={{{name!r}: (...)}})")
            dims = tuple(dims)
        elem = tensor_type.elem_type
        if isinstance(self.dtype, str):
            dtype = self.dtype
        elif isinstance(self.dtype, Mapping) and name in self.dtype:
            dtype = self.dtype[name]
        else:
            try:
                dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
            except Exception:  # noqa: BLE001 - an undefined or unknown element type
                raise OpfusionError(f"graph input {name!r} has an unsupported element type "
                                    f"{elem}") from None
        var = Var(name, TensorType(dims, dtype))
        self.env[name] = var
        return var

    # -- nodes ----------------------------------------------------------------------------
    def check_supported(self) -> None:
        missing: list[str] = []
        for node in self.graph.node:
            domain = node.domain or "ai.onnx"
            if domain != "ai.onnx" or (lookup_converter(node.op_type, self.opset) is None
                                       and not has_function_body(node.op_type, self.opset)):
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
            raise OpfusionError(f"{what} {name!r} is not produced by any node, initializer or "
                                "graph input (a dangling name; nodes must be in topological "
                                "order)") from None

    def convert(self, node: Any, opset: int) -> None:
        inputs = [self.lookup(name, f"input of node {node.name!r} ({node.op_type}):")
                  if name else None for name in node.input]
        _check_attribute_kinds(node, opset)
        attrs = {attr.name: _attribute_value(attr, node) for attr in node.attribute}
        # Trailing outputs with an empty name are not requested: a converter sees how many
        # outputs the model actually uses (BatchNormalization ["y", "", ""] asks for one).
        requested = len(node.output)
        while requested and not node.output[requested - 1]:
            requested -= 1
        view = OnnxNode(node.name or node.output[0], node.op_type, inputs, attrs, opset,
                        requested)
        fn = lookup_converter(node.op_type, opset)
        assert fn is not None
        try:
            result = fn(view)
            outputs = [result] if isinstance(result, Expr) else list(result)
            outputs = [self.folder.visit(out) if out is not None else None for out in outputs]
            for out in outputs:
                if out is not None:
                    _ = out.checked_type
        except OpfusionError as err:
            if f"(node {view.name!r}" in str(err):
                raise
            raise type(err)(f"{node.op_type} (node {view.name!r}): {err}") from None
        if any(node.output[len(outputs):]):
            raise OpfusionError(f"{node.op_type} (node {view.name!r}): the node has "
                                f"{len(node.output)} outputs but opfusion produces only "
                                f"{len(outputs)}; the extra outputs are not supported")
        for name, out in zip(node.output, outputs):
            if name and out is not None:
                self.env[name] = out


def _default_opset(proto: Any) -> int:
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    if proto.ir_version and proto.ir_version < 3:
        return 1
    raise OpfusionError("the model imports no version of the default ONNX domain (opset_import "
                        "is empty)")


def _check_attribute_kinds(node: Any, opset: int) -> None:
    """An attribute whose kind is not the one the op's schema declares (a float where an int
    is due, a string for a list) is a malformed model; converters may rely on the kinds."""
    onnx = _onnx()
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except onnx.defs.SchemaError:
        return  # not an op of this opset's standard; its converter checks what it reads
    names = onnx.AttributeProto.AttributeType.Name
    for attr in node.attribute:
        declared = schema.attributes.get(attr.name)
        if declared is not None and attr.type != int(declared.type):
            raise OpfusionError(f"{node.op_type} (node {node.name!r}, opset {opset}): attribute "
                                f"{attr.name!r} must be {names(int(declared.type))} but the model "
                                f"gives {names(attr.type)}; the model is malformed")


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
    raise OpfusionError(f"{node.op_type} (node {node.name!r}): attribute {attr.name!r} has a "
                        f"kind opfusion does not read ({types.AttributeType.Name(kind)})")




