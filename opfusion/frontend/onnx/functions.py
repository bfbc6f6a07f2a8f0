"""Expand ONNX function operators into the nodes of their function body.

Many newer ONNX operators (Attention, RotaryEmbedding, CenterCropPad, the losses, Celu, ...)
are defined by the ONNX standard itself as a function: a small graph of simpler operators,
fixed or specialized to the node's attributes and input types. When opfusion has no converter
for such an operator, the importer replaces the node by that body, with names made unique,
and converts the body's nodes instead. This is how ONNX Runtime runs them too."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from ...errors import OpfusionError
from ...ir.types import TensorType, Type

_fresh = itertools.count()


def _schema(op_type: str, opset: int) -> Any:
    from onnx import defs

    try:
        return defs.get_schema(op_type, opset, "")
    except Exception:  # noqa: BLE001 - SchemaError: no such operator at this opset
        return None


def has_function_body(op_type: str, opset: int) -> bool:
    """True if the ONNX standard defines ``op_type`` at ``opset`` by a function body."""
    schema = _schema(op_type, opset)
    return schema is not None and (schema.has_function or schema.has_context_dependent_function)


def expand_function(node: Any, opset: int,
                    input_types: Sequence[Type | None]) -> tuple[list[Any], int]:
    """The body nodes that replace ``node`` and the opset they are written in.

    Names inside the body are prefixed so they cannot collide with the model's; the body's
    inputs and outputs are renamed to the node's."""
    import onnx

    schema = _schema(node.op_type, opset)
    assert schema is not None
    function = onnx.FunctionProto()
    if schema.has_function:
        body = schema.get_function_with_opset_version(
            _body_version(schema.function_opset_versions, opset)) or b""
        if body:
            function.ParseFromString(body)
        else:
            function.CopyFrom(schema.function_body)
    else:
        types = [_type_proto(ty).SerializeToString() for ty in input_types]
        try:
            body = schema.get_context_dependent_function_with_opset_version(
                _body_version(schema.context_dependent_function_opset_versions, opset),
                node.SerializeToString(), types)
        except Exception as err:  # noqa: BLE001 - ONNX rejects the node's attributes/types
            raise OpfusionError(f"{node.op_type} (node {node.name!r}): ONNX could not build its "
                                f"function body ({err})") from None
        function.ParseFromString(body)
    if not function.node:
        raise OpfusionError(f"{node.op_type} (node {node.name!r}): ONNX gives no function body "
                            f"at opset {opset}")
    return _instantiate(function, node, schema), _function_opset(function, opset)


def _body_version(versions: Sequence[int], opset: int) -> int:
    """The version to ask ONNX for a function body by: ONNX keys bodies by the opset they are
    written in (Celu's by 12 only), so a model of a later opset gets the newest body not newer
    than its opset (asking by the model's opset returns nothing)."""
    return max((v for v in versions if v <= opset), default=opset)


def _instantiate(function: Any, node: Any, schema: Any) -> list[Any]:
    import onnx

    prefix = f"__{node.op_type}{next(_fresh)}__"
    rename = {name: (node.input[i] if i < len(node.input) else "")
              for i, name in enumerate(function.input)}
    rename.update({name: (node.output[i] if i < len(node.output) and node.output[i]
                          else f"{prefix}{name}")
                   for i, name in enumerate(function.output)})
    given = {attr.name: attr for attr in node.attribute}
    # Defaults of attributes the node leaves out: the function's own, else the schema's.
    defaults = {name: spec.default_value for name, spec in schema.attributes.items()
                if spec.default_value.type}
    defaults.update({attr.name: attr for attr in function.attribute_proto})
    expanded = []
    for inner in function.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.name = f"{node.name or node.output[0]}/{inner.name or inner.op_type}"
        for field in (copy.input, copy.output):
            for index, name in enumerate(field):
                if name:
                    field[index] = rename.setdefault(name, f"{prefix}{name}")
        attributes = []
        for attr in copy.attribute:
            if attr.ref_attr_name:
                source = given.get(attr.ref_attr_name) or defaults.get(attr.ref_attr_name)
                if source is None:
                    continue  # not set on the node and no default: the inner op's default
                bound = onnx.AttributeProto()
                bound.CopyFrom(source)
                bound.name = attr.name
                attributes.append(bound)
            else:
                if attr.type == onnx.AttributeProto.GRAPH:
                    _rename_captures(attr.g, rename)
                attributes.append(attr)
        del copy.attribute[:]
        copy.attribute.extend(attributes)
        expanded.append(copy)
    return expanded


def outer_scope_reads(graph: Any) -> Iterator[tuple[Any, int | None, str]]:
    """Every read, in a control-flow body ``graph`` and the bodies inside it, of a name the
    body does not define (its inputs, initializers and node outputs shadow the enclosing
    scope's): ``(node, input index, name)``, or ``(output value, None, name)`` for a body
    output that is an enclosing value. A worklist over nested bodies."""
    import onnx

    pending = [(graph, frozenset())]
    while pending:
        body, shadowed = pending.pop()
        local = set(shadowed)
        local.update(value.name for value in body.input)
        local.update(tensor.name for tensor in body.initializer)
        for node in body.node:
            local.update(node.output)
        for node in body.node:
            for index, name in enumerate(node.input):
                if name and name not in local:
                    yield node, index, name
            pending.extend((attr.g, frozenset(local)) for attr in node.attribute
                           if attr.type == onnx.AttributeProto.GRAPH)
        for value in body.output:
            if value.name not in local:
                yield value, None, value.name


def _rename_captures(graph: Any, rename: dict[str, str]) -> None:
    """Rename, in a control-flow body inside a function, the names it reads from the
    function's scope, as the function's own nodes were renamed."""
    for holder, index, name in list(outer_scope_reads(graph)):
        if name in rename:
            if index is None:
                holder.name = rename[name]
            else:
                holder.input[index] = rename[name]


def _function_opset(function: Any, default: int) -> int:
    for entry in function.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return default


def _type_proto(ty: Type | None) -> Any:
    import onnx

    if not isinstance(ty, TensorType):
        return onnx.TypeProto()
    elem = onnx.helper.np_dtype_to_tensor_dtype(__import__("numpy").dtype(ty.dtype))
    return onnx.helper.make_tensor_type_proto(elem, ty.shape)
