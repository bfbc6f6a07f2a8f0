"""The fuzzer's mutations: each edits an ONNX model in place, drawing from a seeded
``random.Random``, and says what it did (None: nothing of its kind to mutate)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np

from .seeds import _onnx

# An int64 value that protobuf accepts but no tensor can have.
HUGE = 2**62

_INT_VALUES = (0, -1, -2, 1, 2, 3, 7, 65536, 2**31, -(2**31), HUGE, -HUGE, 2**63 - 1)
_FLOAT_VALUES = (0.0, -1.0, 1e-30, 1e30, -1e30, math.nan, math.inf, -math.inf, 3.5)
_ODD_NAMES = ("", "\x00", "a\x00b", "new\nline", "\x1b[31mred", "tab\there", "'quote\"",
              "../../etc", "x" * 300, "\u00e9\u4e2d", "{}%s%n", "\\")
_ELEM_TYPES = tuple(range(0, 24)) + (99, -1)
_OP_TYPES = ("Relu", "Add", "Conv", "MatMul", "Gemm", "Softmax", "Reshape", "Transpose",
             "Concat", "Slice", "Gather", "Resize", "Cast", "Range", "Pow", "Div", "ReduceMean",
             "MaxPool", "AveragePool", "BatchNormalization", "Split", "Where", "TopK",
             "Expand", "Tile", "Pad", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Einsum",
             "LayerNormalization", "CumSum", "NonZero", "OneHot", "ConstantOfShape", "Shape",
             "Size", "GatherND", "ScatterND", "Loop", "If", "NotAnOp", "")


def _graph_values(graph: Any) -> list[str]:
    names = [value.name for value in graph.input]
    names += [tensor.name for tensor in graph.initializer]
    names += [out for node in graph.node for out in node.output if out]
    return list(dict.fromkeys(names))


def _node_label(node: Any) -> str:
    return f"{node.op_type}(node {node.name!r})"


def _pick_node(model: Any, rng: random.Random, needs: Callable[[Any], bool] = bool) -> Any:
    nodes = [node for node in model.graph.node if needs(node)]
    return rng.choice(nodes) if nodes else None


def _int_value(rng: random.Random) -> int:
    """Half the time an extreme integer, half the time a plausible one (a small axis, size
    or index that gets past validation and reaches the compiler)."""
    return rng.choice(_INT_VALUES) if rng.random() < 0.5 else rng.randint(-4, 12)


def _set_attribute(attr: Any, rng: random.Random) -> str:
    onnx = _onnx()
    kind = onnx.AttributeProto
    if attr.type == kind.INT:
        attr.i = _int_value(rng)
        return str(attr.i)
    if attr.type == kind.FLOAT:
        attr.f = rng.choice(_FLOAT_VALUES)
        return str(attr.f)
    if attr.type == kind.INTS:
        values = list(attr.ints)
        choice = rng.randrange(4)
        if choice == 0 and values:
            values[rng.randrange(len(values))] = _int_value(rng)
        elif choice == 1:
            values = values[:-1]
        elif choice == 2:
            values = values + [_int_value(rng)]
        else:
            values = [_int_value(rng) for _ in values]
        del attr.ints[:]
        attr.ints.extend(values)
        return str(values)
    if attr.type == kind.FLOATS:
        values = [rng.choice(_FLOAT_VALUES) for _ in attr.floats] or [math.nan]
        del attr.floats[:]
        attr.floats.extend(values)
        return str(values)
    if attr.type == kind.STRING:
        attr.s = rng.choice((b"", b"bogus", b"\x00", b"\xff\xfe", b"linear", b"cubic"))
        return repr(attr.s)
    if attr.type == kind.TENSOR:
        return "tensor: " + _mutate_tensor(attr.t, rng)
    attr.type = rng.choice(_ELEM_TYPES[:14])
    return f"type {attr.type}"


def mutate_attribute_value(model: Any, rng: random.Random) -> str | None:
    """An attribute of a node gets an extreme value: 0, negative, huge, NaN, Inf, a list one
    too short or too long, a bad string."""
    node = _pick_node(model, rng, lambda n: len(n.attribute) > 0)
    if node is None:
        return None
    attr = rng.choice(node.attribute)
    return f"{_node_label(node)}.{attr.name} = {_set_attribute(attr, rng)}"


def mutate_attribute_kind(model: Any, rng: random.Random) -> str | None:
    """An attribute changes kind (an int becomes a float, a string or a list), or a node
    gains an unknown or duplicated attribute."""
    onnx = _onnx()
    node = _pick_node(model, rng)
    if node is None:
        return None
    choice = rng.randrange(3)
    if choice == 0 and node.attribute:
        attr = rng.choice(node.attribute)
        value = rng.choice((1.5, 3, "str", [1, 2], [0.5], b"\x00"))
        new = onnx.helper.make_attribute(attr.name, value)
        attr.CopyFrom(new)
        return f"{_node_label(node)}.{attr.name} becomes {value!r}"
    if choice == 1 and node.attribute:
        node.attribute.append(node.attribute[0])
        return f"{_node_label(node)}: attribute {node.attribute[0].name!r} given twice"
    name = rng.choice(("axis", "bogus", "to", "perm", "\x00", "kernel_shape"))
    node.attribute.append(onnx.helper.make_attribute(name, rng.choice((-1, 2**40, [7]))))
    return f"{_node_label(node)}: extra attribute {name!r}"


def _mutate_tensor(tensor: Any, rng: random.Random) -> str:
    onnx = _onnx()
    choice = rng.randrange(6)
    if choice == 0:
        dims = list(tensor.dims)
        if dims and rng.random() < 0.6:
            axis = rng.randrange(len(dims))
            dims[axis] = rng.choice((0, -1, -5, dims[axis] + 1, 2**31, HUGE))
        elif dims and rng.random() < 0.5:
            dims.pop()
        else:
            dims.append(rng.choice((1, 2, 0)))
        del tensor.dims[:]
        tensor.dims.extend(dims)
        return f"dims {dims}"
    if choice == 1:
        tensor.data_type = rng.choice(_ELEM_TYPES)
        return f"data_type {tensor.data_type}"
    if choice == 2 and tensor.raw_data:
        raw = tensor.raw_data
        cut = rng.choice((1, 3, len(raw) // 2, len(raw)))
        tensor.raw_data = raw[:-cut] if rng.random() < 0.6 else raw + raw[:cut]
        return f"raw_data {len(raw)} -> {len(tensor.raw_data)} bytes"
    if choice == 3:
        try:
            array = onnx.numpy_helper.to_array(tensor).copy()
        except Exception:  # noqa: BLE001 - already broken by an earlier mutation
            return _mutate_tensor(tensor, rng)
        if array.size == 0:
            return "values (empty)"
        flat = array.reshape(-1)
        index = rng.randrange(flat.size)
        if flat.dtype.kind == "f":
            flat[index] = rng.choice(_FLOAT_VALUES)
        elif flat.dtype.kind in "iu":
            info = np.iinfo(flat.dtype)
            flat[index] = max(info.min, min(info.max, _int_value(rng)))
        else:
            flat[index] = not flat[index]
        tensor.CopyFrom(onnx.numpy_helper.from_array(array, tensor.name))
        return f"value [{index}] = {flat[index]}"
    if choice == 4:
        tensor.ClearField("raw_data")
        if rng.random() < 0.5:
            tensor.float_data.extend([1.0, 2.0])
        return "data moved/cleared"
    array = np.asarray(rng.choice((np.zeros((0,), np.float32), np.zeros((0, 3), np.int64),
                                   np.float32(np.nan), np.ones((2, 2), np.float16),
                                   np.array([True, False]))))
    tensor.CopyFrom(onnx.numpy_helper.from_array(array, tensor.name))
    return f"replaced by {array.dtype} {array.shape}"


def mutate_initializer(model: Any, rng: random.Random) -> str | None:
    """An initializer's dims, dtype, raw data length or values change (values: 0, -1, huge,
    NaN, Inf; initializers are also shapes, axes and indices)."""
    graph = model.graph
    if not graph.initializer:
        return None
    tensor = rng.choice(graph.initializer)
    return f"initializer {tensor.name!r}: {_mutate_tensor(tensor, rng)}"


def drop_initializer(model: Any, rng: random.Random) -> str | None:
    """An initializer disappears: its consumers read a dangling name."""
    graph = model.graph
    if not graph.initializer:
        return None
    index = rng.randrange(len(graph.initializer))
    name = graph.initializer[index].name
    del graph.initializer[index]
    return f"initializer {name!r} dropped"


def mutate_opset(model: Any, rng: random.Random) -> str | None:
    """The default domain's opset becomes 0, negative, ancient or from the future; or the
    opset import is duplicated or removed; or the IR version is odd."""
    choice = rng.randrange(4)
    if choice == 0:
        model.ClearField("opset_import")
        return "opset_import removed"
    if choice == 1:
        model.opset_import.add(domain="", version=rng.choice((1, 11, 13, 18)))
        return "second default-domain opset_import"
    if choice == 2:
        model.ir_version = rng.choice((0, -1, 1, 3, 99, HUGE))
        return f"ir_version {model.ir_version}"
    version = rng.choice((0, -1, 1, 6, 9, 11, 12, 13, 18, 19, 21, 99, 10**6, -HUGE))
    if not model.opset_import:
        model.opset_import.add(domain="")
    model.opset_import[0].version = version
    return f"opset {version}"


def mutate_input_type(model: Any, rng: random.Random) -> str | None:
    """A graph input's declared shape (a dim 0, negative, huge, symbolic; one more or fewer)
    or element type changes, or its type disappears."""
    graph = model.graph
    if not graph.input:
        return None
    value = rng.choice(graph.input)
    tensor_type = value.type.tensor_type
    choice = rng.randrange(5)
    if choice == 0:
        tensor_type.elem_type = rng.choice(_ELEM_TYPES)
        return f"input {value.name!r} elem_type {tensor_type.elem_type}"
    if choice == 1:
        value.type.ClearField("tensor_type")
        if rng.random() < 0.5:
            value.type.sequence_type.elem_type.tensor_type.elem_type = 1
        return f"input {value.name!r} is not a tensor"
    dims = tensor_type.shape.dim
    if choice == 2 or not dims:
        if dims and rng.random() < 0.5:
            del dims[-1]
            return f"input {value.name!r} loses a dim"
        dims.add().dim_value = rng.choice((1, 2, 3))
        return f"input {value.name!r} gains a dim"
    dim = rng.choice(dims)
    if choice == 3:
        dim.dim_param = rng.choice(("N", "", "\x00"))
        return f"input {value.name!r} dim symbolic {dim.dim_param!r}"
    dim.dim_value = rng.choice((0, -1, -7, 2**20, 2**31, HUGE, 1, 1, 2, 3, 5, 7, 9, 16))
    return f"input {value.name!r} dim = {dim.dim_value}"


def mutate_node_input(model: Any, rng: random.Random) -> str | None:
    """A node input is renamed to nothing known, replaced by another value (of another shape
    or dtype), removed, emptied (an absent optional input), or one is added."""
    graph = model.graph
    node = _pick_node(model, rng)
    if node is None:
        return None
    values = _graph_values(graph)
    choice = rng.randrange(5)
    if choice == 0 and node.input:
        index = rng.randrange(len(node.input))
        node.input[index] = rng.choice(("missing", "", "\x00"))
        return f"{_node_label(node)}.input[{index}] = {node.input[index]!r}"
    if choice == 1 and node.input:
        index = rng.randrange(len(node.input))
        node.input[index] = rng.choice(values)
        return f"{_node_label(node)}.input[{index}] = {node.input[index]!r}"
    if choice == 2 and node.input:
        index = rng.randrange(len(node.input))
        del node.input[index]
        return f"{_node_label(node)}.input[{index}] removed"
    node.input.append(rng.choice(values) if values else "x")
    return f"{_node_label(node)} gains input {node.input[-1]!r}"


def mutate_node_output(model: Any, rng: random.Random) -> str | None:
    """A node output is renamed (its consumers dangle), takes another node's output name
    (two producers), is removed, or an extra output is added."""
    graph = model.graph
    node = _pick_node(model, rng)
    if node is None:
        return None
    choice = rng.randrange(4)
    if choice == 0 and node.output:
        index = rng.randrange(len(node.output))
        node.output[index] = rng.choice(("renamed", "", "\x00"))
        return f"{_node_label(node)}.output[{index}] = {node.output[index]!r}"
    if choice == 1 and node.output:
        names = _graph_values(graph)
        node.output[0] = rng.choice(names)
        return f"{_node_label(node)}.output[0] = {node.output[0]!r} (shadowing)"
    if choice == 2 and node.output:
        del node.output[-1]
        return f"{_node_label(node)} loses its last output"
    node.output.append(rng.choice(("extra", "")))
    return f"{_node_label(node)} gains output {node.output[-1]!r}"


def swap_op_type(model: Any, rng: random.Random) -> str | None:
    """A node's op_type becomes another (other arity and attributes), an unknown one, or its
    domain changes."""
    node = _pick_node(model, rng)
    if node is None:
        return None
    old = node.op_type
    if rng.random() < 0.15:
        node.domain = rng.choice(("com.microsoft", "ai.onnx.ml", "bogus", "ai.onnx"))
        return f"{_node_label(node)} domain {node.domain!r}"
    node.op_type = rng.choice(_OP_TYPES)
    return f"node {node.name!r}: {old} -> {node.op_type!r}"


def odd_names(model: Any, rng: random.Random) -> str | None:
    """Control characters, NULs, quotes, very long or empty names: a value renamed
    consistently everywhere, or a node or the graph renamed."""
    graph = model.graph
    new = rng.choice(_ODD_NAMES)
    choice = rng.randrange(3)
    if choice == 0:
        node = _pick_node(model, rng)
        if node is None:
            return None
        node.name = new
        return f"node {node.op_type} renamed {new!r}"
    if choice == 1:
        graph.name = new
        return f"graph renamed {new!r}"
    values = _graph_values(graph)
    if not values:
        return None
    old = rng.choice(values)
    for value in list(graph.input) + list(graph.output):
        if value.name == old:
            value.name = new
    for tensor in graph.initializer:
        if tensor.name == old:
            tensor.name = new
    for node in graph.node:
        for names in (node.input, node.output):
            for index, name in enumerate(names):
                if name == old:
                    names[index] = new
    return f"value {old!r} renamed {new!r} everywhere"


def external_data(model: Any, rng: random.Random) -> str | None:
    """An initializer claims external data: a path outside the model's directory, absolute,
    empty, with a NUL, or the real data file with a bad offset or length. The case is then
    imported from a file (the only way external data is read)."""
    onnx = _onnx()
    graph = model.graph
    if not graph.initializer:
        return None
    tensor = rng.choice(graph.initializer)
    location = rng.choice(("../../../etc/passwd", "/etc/passwd", "weights.bin", "",
                           "missing.bin", "nul\x00.bin", "sub/../weights.bin", "/dev/zero",
                           "weights.bin", "."))
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    entries = {"location": location}
    if rng.random() < 0.5:
        entries["offset"] = str(rng.choice((0, 8, -1, 60, HUGE)))
    if rng.random() < 0.5:
        entries["length"] = rng.choice(("4", "0", "-4", "999999", "abc", str(HUGE)))
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    return f"initializer {tensor.name!r} external data {entries}"


def mutate_graph_output(model: Any, rng: random.Random) -> str | None:
    """A graph output is removed, or one is added naming an intermediate, an input, an
    initializer or nothing at all."""
    onnx = _onnx()
    graph = model.graph
    if graph.output and rng.random() < 0.4:
        name = graph.output[0].name
        del graph.output[0]
        return f"graph output {name!r} removed"
    name = rng.choice(_graph_values(graph) + ["nowhere"])
    graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return f"graph output {name!r} added"


def restructure(model: Any, rng: random.Random) -> str | None:
    """The node list changes shape: a node is removed, duplicated, moved before its
    producers, or feeds on a later node's output (a cycle)."""
    nodes = model.graph.node
    if len(nodes) < 2:
        return None
    choice = rng.randrange(4)
    index = rng.randrange(len(nodes))
    label = _node_label(nodes[index])
    if choice == 0:
        del nodes[index]
        return f"{label} removed"
    if choice == 1:
        nodes.add().CopyFrom(nodes[index])
        return f"{label} duplicated at the end"
    if choice == 2:
        node = type(nodes[index])()
        node.CopyFrom(nodes[index])
        del nodes[index]
        nodes.insert(0, node)
        return f"{label} moved first"
    first = rng.randrange(len(nodes) - 1)
    later = rng.randrange(first + 1, len(nodes))
    if not nodes[first].input or not nodes[later].output:
        return None
    nodes[first].input[0] = nodes[later].output[0]
    return f"cycle: {_node_label(nodes[first])} reads {nodes[later].output[0]!r}"


def mutate_cast(model: Any, rng: random.Random) -> str | None:
    """A Cast's ``to`` becomes another element type (string, bfloat16, complex, float8,
    undefined, out of range), or a Cast is inserted after a node."""
    onnx = _onnx()
    node = _pick_node(model, rng, lambda n: n.op_type == "Cast")
    to = rng.choice(_ELEM_TYPES)
    if node is not None and rng.random() < 0.7:
        for attr in node.attribute:
            if attr.name == "to":
                attr.i = to
        return f"{_node_label(node)}.to = {to}"
    target = _pick_node(model, rng, lambda n: len(n.output) > 0 and bool(n.output[0]))
    if target is None:
        return None
    old = target.output[0]
    target.output[0] = old + "_precast"
    cast = onnx.helper.make_node("Cast", [old + "_precast"], [old], name="fuzz_cast", to=to)
    nodes = model.graph.node
    position = list(nodes).index(target) + 1
    nodes.insert(position, cast)
    return f"Cast(to={to}) inserted after {_node_label(target)}"


def constant_node(model: Any, rng: random.Random) -> str | None:
    """An initializer is replaced by a Constant node whose value tensor has odd dims or
    dtype, or a node input is fed by a Constant of a sparse/odd attribute kind."""
    onnx = _onnx()
    graph = model.graph
    if not graph.initializer:
        return None
    index = rng.randrange(len(graph.initializer))
    tensor = type(graph.initializer[index])()
    tensor.CopyFrom(graph.initializer[index])
    del graph.initializer[index]
    detail = _mutate_tensor(tensor, rng) if rng.random() < 0.7 else "unchanged"
    kind = rng.choice(("value", "value", "value_float", "value_ints", "value_string"))
    if kind == "value":
        node = onnx.helper.make_node("Constant", [], [tensor.name], name="fuzz_const",
                                     value=tensor)
    elif kind == "value_float":
        node = onnx.helper.make_node("Constant", [], [tensor.name], name="fuzz_const",
                                     value_float=rng.choice(_FLOAT_VALUES))
    elif kind == "value_ints":
        node = onnx.helper.make_node("Constant", [], [tensor.name], name="fuzz_const",
                                     value_ints=[rng.choice(_INT_VALUES) for _ in range(2)])
    else:
        node = onnx.helper.make_node("Constant", [], [tensor.name], name="fuzz_const",
                                     value_string="str")
    graph.node.insert(0, node)
    return f"initializer {tensor.name!r} -> Constant({kind}; {detail})"


MUTATIONS: dict[str, Callable[[Any, random.Random], str | None]] = {
    "attribute_value": mutate_attribute_value,
    "attribute_kind": mutate_attribute_kind,
    "initializer": mutate_initializer,
    "drop_initializer": drop_initializer,
    "opset": mutate_opset,
    "input_type": mutate_input_type,
    "node_input": mutate_node_input,
    "node_output": mutate_node_output,
    "op_type": swap_op_type,
    "odd_names": odd_names,
    "external_data": external_data,
    "graph_output": mutate_graph_output,
    "restructure": restructure,
    "cast": mutate_cast,
    "constant_node": constant_node,
}
"""Model mutations by name: ``mutation(model, rng)`` edits the ``ModelProto`` in place and
returns a one-line description, or None when the model has nothing it applies to."""

# How often each mutation is drawn (the semantic ones, which get past import, more often).
_WEIGHTS = {"attribute_value": 6, "initializer": 6, "input_type": 3, "node_input": 3,
            "op_type": 3, "cast": 2, "constant_node": 2, "restructure": 2}


def _mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    if rng.random() < 0.3:
        cut = rng.randrange(1, max(2, len(data)))
        return data[:cut], f"bytes truncated to {cut} of {len(data)}"
    out = bytearray(data)
    positions = sorted(rng.randrange(len(out)) for _ in range(rng.choice((1, 2, 4, 16))))
    for position in positions:
        out[position] = rng.randrange(256)
    return bytes(out), f"bytes changed at {positions[:4]}{'...' if len(positions) > 4 else ''}"


