"""Fuzzing the ONNX pipeline: seeded mutations of small valid models, each one imported,
compiled, run and checked against the reference interpreter in an isolated worker process.

The contract under test: for any bytes handed to ``from_onnx``, every stage either succeeds or
raises an :class:`~opfusion.errors.OpfusionError`. Anything else is a bug: another exception
type, a crash of the process (a signal), a hang, or a compiled model whose outputs differ from
the reference interpreter's ("wrong answer").

A case is fully determined by ``(seed, number)``: :func:`make_case` picks a seed model from
:data:`SEED_MODELS` and one to three mutations from :data:`MUTATIONS` with a
``random.Random`` seeded by both, so any outcome replays with :func:`run_case` in-process
(``python benchmarks/fuzz_models.py --case N --seed S`` shows its traceback). Cases numbered
below ``len(SEED_MODELS)`` are the unmutated seeds: the baseline must pass.

:func:`run_cases` runs cases in worker processes (``spawn``), one case at a time per worker: a
worker that dies is recorded as a crash with its signal and restarted, one that passes the
per-case timeout is killed and recorded as a hang. Workers run with one OpenMP thread and a
cap on their address space, so a model that declares a huge tensor fails inside the worker
instead of exhausting the machine."""

from __future__ import annotations

import contextlib
import faulthandler
import math
import multiprocessing
import os
import random
import resource
import signal
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait as wait_connections
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "MUTATIONS", "SEED_MODELS", "FuzzCase", "Outcome", "is_acceptable", "make_case",
    "run_case", "run_cases", "summarize",
]

# The outcome categories. Only the first two are acceptable.
OK = "ok"
OPFUSION_ERROR = "opfusion-error"
EXCEPTION = "exception"
WRONG_ANSWER = "wrong-answer"
CRASH = "crash"
HANG = "hang"
HARNESS = "harness-error"  # the fuzzer itself failed: a bug here, not in opfusion

# The finite values agree but NaN/Inf do not: the optimizer's algebra (batch norm folded into
# a scale and shift, x/c into x*(1/c)) legitimately propagates Inf and NaN differently from the
# model as written, so this is recorded as a kind of success, not a wrong answer.
NONFINITE = "non-finite values differ"

# A graph input with more elements than this is not fed (the run stage is skipped).
MAX_INPUT_ELEMENTS = 1 << 22
# Relative tolerance (to the largest magnitude of the reference output) of the comparison.
RTOL = 1e-3
# An int64 value that protobuf accepts but no tensor can have.
HUGE = 2**62


# ---------------------------------------------------------------------------------------------
# seed models: small, valid, fast to compile


def _onnx() -> Any:
    import onnx

    return onnx


def _model(name: str, nodes: list[Any], inputs: list[Any], outputs: list[str],
           inits: dict[str, np.ndarray], opset: int = 17) -> Any:
    onnx = _onnx()
    helper = onnx.helper
    graph = helper.make_graph(
        nodes, name, inputs,
        [helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None) for out in outputs],
        initializer=[onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=8, producer_name="opfusion-fuzz")
    # The outputs' types as ONNX infers them, so the seeds pass onnx.checker.
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model.graph.ClearField("value_info")
    return model


def _input(name: str, shape: Sequence[int], elem: str = "FLOAT") -> Any:
    onnx = _onnx()
    return onnx.helper.make_tensor_value_info(name, getattr(onnx.TensorProto, elem), shape)


def _node(op_type: str, inputs: list[str], outputs: list[str], name: str = "",
          **attrs: Any) -> Any:
    return _onnx().helper.make_node(op_type, inputs, outputs, name=name or outputs[0], **attrs)


def _weights(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.5


def _i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _conv_net() -> Any:
    nodes = [
        _node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[1, 1]),
        _node("Relu", ["c1"], ["r1"]),
        _node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        _node("Conv", ["p1", "w2"], ["c2"], kernel_shape=[1, 1]),
        _node("Add", ["c2", "p1"], ["a1"]),
        _node("GlobalAveragePool", ["a1"], ["g1"]),
        _node("Flatten", ["g1"], ["f1"], axis=1),
        _node("Gemm", ["f1", "w3", "b3"], ["m1"], transB=1, alpha=1.0, beta=1.0),
        _node("Softmax", ["m1"], ["y"], axis=-1),
    ]
    inits = {"w1": _weights(1, 4, 3, 3, 3), "b1": _weights(2, 4), "w2": _weights(3, 4, 4, 1, 1),
             "w3": _weights(4, 5, 4), "b3": _weights(5, 5)}
    return _model("conv_net", nodes, [_input("x", [1, 3, 8, 8])], ["y"], inits)


def _mlp() -> Any:
    nodes = [
        _node("MatMul", ["x", "w1"], ["m1"]),
        _node("Add", ["m1", "b1"], ["a1"]),
        _node("Relu", ["a1"], ["r1"]),
        _node("MatMul", ["r1", "w2"], ["m2"]),
        _node("Softmax", ["m2"], ["y"], axis=1),
    ]
    inits = {"w1": _weights(6, 6, 8), "b1": _weights(7, 8), "w2": _weights(8, 8, 4)}
    return _model("mlp", nodes, [_input("x", [2, 6])], ["y"], inits)


def _tensor_ops() -> Any:
    nodes = [
        _node("Transpose", ["x"], ["t1"], perm=[0, 2, 1, 3]),
        _node("Reshape", ["t1", "shape"], ["s1"]),
        _node("Concat", ["s1", "s1"], ["c1"], axis=2),
        _node("Slice", ["c1", "starts", "ends", "axes", "steps"], ["l1"]),
        _node("Unsqueeze", ["l1", "uaxes"], ["u1"]),
        _node("Squeeze", ["u1", "uaxes"], ["q1"]),
        _node("Pad", ["q1", "pads"], ["y"], mode="constant"),
    ]
    inits = {"shape": _i64(1, 3, 8), "starts": _i64(1), "ends": _i64(12), "axes": _i64(2),
             "steps": _i64(2), "uaxes": _i64(0), "pads": _i64(0, 1, 0, 0, 0, 2)}
    return _model("tensor_ops", nodes, [_input("x", [1, 2, 3, 4])], ["y"], inits)


def _gather_cast() -> Any:
    nodes = [
        _node("Gather", ["x", "idx"], ["g1"], axis=0),
        _node("Mul", ["g1", "ten"], ["m1"]),
        _node("Cast", ["m1"], ["i1"], to=6),  # int32
        _node("Cast", ["i1"], ["f1"], to=1),
        _node("Pow", ["f1", "two"], ["p1"]),
        _node("Abs", ["x"], ["ab"]),
        _node("Add", ["ab", "one"], ["d0"]),
        _node("ReduceSum", ["d0", "raxes"], ["d1"], keepdims=1),
        _node("Div", ["p1", "d1"], ["y"]),
    ]
    inits = {"idx": _i64(3, 0, 1), "ten": np.float32(10.0), "two": np.float32(2.0),
             "one": np.float32(1.0), "raxes": _i64(0)}
    return _model("gather_cast", nodes, [_input("x", [4, 5])], ["y"], inits)


def _layernorm() -> Any:
    nodes = [
        _node("ReduceMean", ["x"], ["mu"], axes=[-1], keepdims=1),
        _node("Sub", ["x", "mu"], ["d"]),
        _node("Pow", ["d", "two"], ["sq"]),
        _node("ReduceMean", ["sq"], ["var"], axes=[-1], keepdims=1),
        _node("Add", ["var", "eps"], ["ve"]),
        _node("Sqrt", ["ve"], ["sd"]),
        _node("Div", ["d", "sd"], ["n"]),
        _node("Mul", ["n", "gamma"], ["s"]),
        _node("Add", ["s", "beta"], ["y"]),
    ]
    inits = {"two": np.float32(2.0), "eps": np.float32(1e-5), "gamma": _weights(9, 8),
             "beta": _weights(10, 8)}
    return _model("layernorm", nodes, [_input("x", [2, 4, 8])], ["y"], inits)


def _resize_pool() -> Any:
    nodes = [
        _node("Resize", ["x", "", "scales"], ["r1"], mode="nearest"),
        _node("AveragePool", ["r1"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
              strides=[2, 2], count_include_pad=0),
        _node("BatchNormalization", ["p1", "bn_s", "bn_b", "bn_m", "bn_v"], ["b1"],
              epsilon=1e-5),
        _node("Clip", ["b1", "lo", "hi"], ["y"]),
    ]
    inits = {"scales": np.array([1, 1, 2, 2], np.float32), "bn_s": _weights(11, 2),
             "bn_b": _weights(12, 2), "bn_m": _weights(13, 2),
             "bn_v": np.abs(_weights(14, 2)) + 0.5, "lo": np.float32(0.0),
             "hi": np.float32(6.0)}
    return _model("resize_pool", nodes, [_input("x", [1, 2, 4, 4])], ["y"], inits)


def _range_shape() -> Any:
    nodes = [
        _node("Shape", ["x"], ["sh"]),
        _node("Gather", ["sh", "one_i"], ["n"], axis=0),
        _node("Range", ["zero_i", "n", "one_i"], ["rg"]),
        _node("Cast", ["rg"], ["rf"], to=1),
        _node("Add", ["x", "rf"], ["a1"]),
        _node("Tanh", ["a1"], ["t1"]),
        _node("ReduceSum", ["t1", "axes"], ["y"], keepdims=0),
    ]
    inits = {"one_i": np.int64(1), "zero_i": np.int64(0), "axes": _i64(1)}
    return _model("range_shape", nodes, [_input("x", [3, 6])], ["y"], inits)


def _int_gather() -> Any:
    nodes = [
        _node("Gather", ["table", "ids"], ["g1"], axis=0),
        _node("ReduceMax", ["g1"], ["m1"], axes=[-1], keepdims=0),
        _node("Sigmoid", ["m1"], ["y"]),
    ]
    inits = {"table": _weights(15, 10, 4)}
    return _model("int_gather", nodes, [_input("ids", [2, 3], "INT64")], ["y"], inits)


def _attention() -> Any:
    nodes = [
        _node("MatMul", ["x", "wq"], ["q"]),
        _node("MatMul", ["x", "wk"], ["k"]),
        _node("MatMul", ["x", "wv"], ["v"]),
        _node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        _node("MatMul", ["q", "kt"], ["s"]),
        _node("Mul", ["s", "scale"], ["ss"]),
        _node("Softmax", ["ss"], ["p"], axis=-1),
        _node("MatMul", ["p", "v"], ["y"]),
    ]
    inits = {"wq": _weights(16, 8, 8), "wk": _weights(17, 8, 8), "wv": _weights(18, 8, 8),
             "scale": np.float32(0.35)}
    return _model("attention", nodes, [_input("x", [1, 4, 8])], ["y"], inits)


def _split_where() -> Any:
    nodes = [
        _node("Split", ["x", "split"], ["a", "b"], axis=1),
        _node("Greater", ["a", "b"], ["gt"]),
        _node("Where", ["gt", "a", "b"], ["w"]),
        _node("Exp", ["w"], ["e"]),
        _node("Log", ["e"], ["l"]),
        _node("Neg", ["l"], ["n"]),
        _node("Max", ["n", "a", "b"], ["y"]),
    ]
    inits = {"split": _i64(3, 3)}
    return _model("split_where", nodes, [_input("x", [2, 6])], ["y"], inits)


def _norm_ops() -> Any:
    nodes = [
        _node("LayerNormalization", ["x", "ln_s", "ln_b"], ["ln"], axis=-1, epsilon=1e-5),
        _node("Sigmoid", ["ln"], ["sg"]),
        _node("Mul", ["ln", "sg"], ["sw"]),
        _node("Expand", ["sw", "eshape"], ["ex"]),
        _node("Tile", ["ex", "reps"], ["ti"]),
        _node("CumSum", ["ti", "caxis"], ["y"]),
    ]
    inits = {"ln_s": _weights(19, 8), "ln_b": _weights(20, 8), "eshape": _i64(2, 2, 8),
             "reps": _i64(1, 2, 1), "caxis": np.int64(2)}
    return _model("norm_ops", nodes, [_input("x", [2, 8])], ["y"], inits)


def _conv_transpose() -> Any:
    nodes = [
        _node("ConvTranspose", ["x", "w"], ["ct"], strides=[2, 2], pads=[1, 1, 1, 1],
              output_padding=[1, 1]),
        _node("LeakyRelu", ["ct"], ["lr"], alpha=0.1),
        _node("DepthToSpace", ["lr"], ["ds"], blocksize=2),
        _node("GlobalMaxPool", ["ds"], ["y"]),
    ]
    inits = {"w": _weights(21, 2, 4, 3, 3)}
    return _model("conv_transpose", nodes, [_input("x", [1, 2, 4, 4])], ["y"], inits)


def _topk_argmax() -> Any:
    nodes = [
        _node("TopK", ["x", "k"], ["vals", "idx"], axis=-1),
        _node("ArgMax", ["x"], ["am"], axis=1, keepdims=1),
        _node("Cast", ["am"], ["amf"], to=1),
        _node("Cast", ["idx"], ["idf"], to=1),
        _node("Add", ["vals", "amf"], ["s"]),
        _node("Sub", ["s", "idf"], ["y"]),
    ]
    inits = {"k": _i64(3)}
    return _model("topk_argmax", nodes, [_input("x", [3, 7])], ["y"], inits)


def _grouped_conv() -> Any:
    nodes = [
        _node("Pad", ["x", "pads"], ["pd"], mode="reflect"),
        _node("Conv", ["pd", "w"], ["c1"], group=2, dilations=[2, 2], strides=[2, 1],
              pads=[1, 0, 1, 0]),
        _node("InstanceNormalization", ["c1", "in_s", "in_b"], ["n1"], epsilon=1e-5),
        _node("PRelu", ["n1", "slope"], ["pr"]),
        _node("LRN", ["pr"], ["lrn"], size=3),
        _node("MaxPool", ["lrn"], ["mp"], kernel_shape=[2, 2], ceil_mode=1, strides=[2, 2]),
        _node("HardSwish", ["mp"], ["y"]),
    ]
    inits = {"pads": _i64(0, 0, 1, 2, 0, 0, 1, 2), "w": _weights(22, 4, 2, 3, 3),
             "in_s": _weights(23, 4), "in_b": _weights(24, 4),
             "slope": np.full((4, 1, 1), 0.2, np.float32)}
    return _model("grouped_conv", nodes, [_input("x", [1, 4, 7, 7])], ["y"], inits)


def _index_ops() -> Any:
    nodes = [
        _node("GatherElements", ["x", "ge_idx"], ["ge"], axis=1),
        _node("Einsum", ["ge", "mat"], ["es"], equation="ij,jk->ik"),
        _node("Trilu", ["es"], ["tr"], upper=1),
        _node("OneHot", ["ids", "depth", "onoff"], ["oh"], axis=-1),
        _node("MatMul", ["oh", "tr"], ["mm"]),
        _node("GatherND", ["mm", "nd_idx"], ["y"]),
    ]
    inits = {"ge_idx": np.array([[0, 4], [1, 1], [3, 2]], np.int64),
             "mat": _weights(25, 2, 3), "depth": np.int64(3),
             "onoff": np.array([0.0, 1.0], np.float32), "nd_idx": np.array([[1], [0]], np.int64)}
    return _model("index_ops", nodes, [_input("x", [3, 5]), _input("ids", [2], "INT64")],
                  ["y"], inits)


def _reductions() -> Any:
    nodes = [
        _node("ReduceL2", ["x"], ["l2"], axes=[1], keepdims=1),
        _node("ReduceLogSumExp", ["x"], ["lse"], axes=[0], keepdims=1),
        _node("Add", ["l2", "lse"], ["s1"]),
        _node("ReduceProd", ["s1"], ["pr"], axes=[0, 1], keepdims=1),
        _node("LogSoftmax", ["x"], ["ls"], axis=0),
        _node("Hardmax", ["ls"], ["hm"], axis=1),
        _node("ArgMin", ["x"], ["am"], axis=1, keepdims=1, select_last_index=1),
        _node("Cast", ["am"], ["amf"], to=1),
        _node("Erf", ["ls"], ["er"]),
        _node("Round", ["er"], ["rd"]),
        _node("Sign", ["x"], ["sg"]),
        _node("Sum", ["hm", "amf", "rd", "sg", "pr"], ["y"]),
    ]
    return _model("reductions", nodes, [_input("x", [4, 6])], ["y"], {})


def _int_arith() -> Any:
    nodes = [
        _node("Mul", ["a", "three"], ["m1"]),
        _node("Mod", ["m1", "five"], ["md"], fmod=0),
        _node("Div", ["m1", "two"], ["dv"]),
        _node("Abs", ["dv"], ["ab"]),
        _node("Clip", ["ab", "lo", "hi"], ["cl"]),
        _node("Equal", ["md", "cl"], ["eq"]),
        _node("Not", ["eq"], ["ne"]),
        _node("Where", ["ne", "md", "cl"], ["w"]),
        _node("Cast", ["w"], ["y"], to=1),
    ]
    inits = {"three": np.int32(3), "five": np.int32(5), "two": np.int32(-2),
             "lo": np.int32(1), "hi": np.int32(4)}
    return _model("int_arith", nodes, [_input("a", [2, 4], "INT32")], ["y"], inits)


def _strided_slice() -> Any:
    nodes = [
        _node("Slice", ["x", "starts", "ends", "axes", "steps"], ["sl"]),
        _node("Resize", ["sl", "", "", "sizes"], ["rs"], mode="linear",
              coordinate_transformation_mode="half_pixel"),
        _node("SpaceToDepth", ["rs"], ["sd"], blocksize=2),
        _node("ReduceMean", ["sd"], ["rm"], axes=[1], keepdims=0),
        _node("Softplus", ["rm"], ["y"]),
    ]
    inits = {"starts": _i64(-1, 0), "ends": _i64(-12, 10), "axes": _i64(3, 2),
             "steps": _i64(-2, 3), "sizes": _i64(1, 2, 6, 4)}
    return _model("strided_slice", nodes, [_input("x", [1, 2, 10, 10])], ["y"], inits)


SEED_MODELS: dict[str, Callable[[], Any]] = {
    "conv_net": _conv_net, "mlp": _mlp, "tensor_ops": _tensor_ops,
    "gather_cast": _gather_cast, "layernorm": _layernorm, "resize_pool": _resize_pool,
    "range_shape": _range_shape, "int_gather": _int_gather, "attention": _attention,
    "split_where": _split_where, "norm_ops": _norm_ops, "conv_transpose": _conv_transpose,
    "topk_argmax": _topk_argmax, "grouped_conv": _grouped_conv, "index_ops": _index_ops,
    "reductions": _reductions, "int_arith": _int_arith, "strided_slice": _strided_slice,
}
"""Seed model builders by name: each returns a fresh, valid ``onnx.ModelProto`` with a few
nodes on tensors of at most a few hundred elements."""


# ---------------------------------------------------------------------------------------------
# mutations: each edits a model in place and says what it did (None: nothing to mutate)

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


# ---------------------------------------------------------------------------------------------
# cases


@dataclass(frozen=True)
class FuzzCase:
    """One fuzz case: the model's bytes and how they were made."""

    number: int
    seed: int
    model_name: str
    mutations: tuple[str, ...]
    data: bytes
    from_file: bool  # import from a file on disk (so external data is read) rather than bytes
    wide_ints: bool = False  # integer inputs drawn from [-16, 16): indices out of range
    fusion: str = "tvm"  # opf.compile's fusion strategy
    opt_level: int = 3


def make_case(number: int, seed: int = 0) -> FuzzCase:
    """Build case ``number`` of the run seeded ``seed``: deterministic in both.

    Cases below ``len(SEED_MODELS)`` are the seed models themselves; the others are a seed
    model with one mutation (most cases), two or three, and occasionally byte-level damage
    of the serialized model, out-of-range integer feeds, or another fusion strategy and
    opt_level for the compile."""
    names = list(SEED_MODELS)
    if number < len(names):
        model = SEED_MODELS[names[number]]()
        return FuzzCase(number, seed, names[number], (), model.SerializeToString(), False)
    rng = random.Random(seed * 1_000_003 + number)
    name = rng.choice(names)
    model = SEED_MODELS[name]()
    mutation_names = list(MUTATIONS)
    weights = [_WEIGHTS.get(m, 1) for m in mutation_names]
    count = rng.choices((1, 2, 3), weights=(6, 3, 1))[0]
    done: list[str] = []
    attempts = 0
    while len(done) < count and attempts < 50:
        attempts += 1
        mutation = rng.choices(mutation_names, weights=weights)[0]
        description = MUTATIONS[mutation](model, rng)
        if description is not None:
            done.append(f"{mutation}: {description}")
    data = model.SerializeToString()
    if rng.random() < 0.04:
        data, description = _mutate_bytes(data, rng)
        done.append(f"bytes: {description}")
    wide_ints = rng.random() < 0.1
    if wide_ints:
        done.append("feeds: integer inputs in [-16, 16)")
    fusion = rng.choices(("tvm", "cinn", "none"), weights=(6, 3, 1))[0]
    opt_level = rng.choices((3, 2, 1, 0), weights=(6, 2, 1, 1))[0]
    if (fusion, opt_level) != ("tvm", 3):
        done.append(f"compile: fusion={fusion}, opt_level={opt_level}")
    from_file = any(item.startswith("external_data") for item in done)
    return FuzzCase(number, seed, name, tuple(done), data, from_file, wide_ints, fusion,
                    opt_level)


@dataclass
class Outcome:
    """What one case did. ``category`` is one of ok, opfusion-error, exception,
    wrong-answer, crash, hang, harness-error; ``kind`` refines it (the exception class, the
    signal); ``stage`` is the pipeline stage it reached (import, compile, run, reference,
    compare); ``where`` is the innermost opfusion frame of the traceback."""

    case: int
    seed: int
    model_name: str
    mutations: tuple[str, ...]
    category: str
    kind: str = ""
    stage: str = ""
    message: str = ""
    where: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The category and kind: the unit the summary counts."""
        return f"{self.category}: {self.kind}" if self.kind else self.category


def is_acceptable(outcome: Outcome) -> bool:
    """True for success and for an :class:`~opfusion.errors.OpfusionError`."""
    return outcome.category in (OK, OPFUSION_ERROR)


def _innermost_opfusion_frame(tb: Any) -> str:
    frames = traceback.extract_tb(tb)
    for frame in reversed(frames):
        path = frame.filename.replace(os.sep, "/")
        if "/opfusion/" in path and "/opfusion/testing/fuzz.py" not in path:
            short = path[path.rindex("/opfusion/") + 1:]
            return f"{short}:{frame.lineno} in {frame.name}"
    if frames:
        frame = frames[-1]
        return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return ""


# The part of opf.compile a failure is in, by the package of its innermost frame.
_COMPILE_PARTS = (("opfusion/transform/fuse", "fuse"), ("opfusion/transform/fusion", "fuse"),
                  ("opfusion/transform/", "optimize"), ("opfusion/compiler/lower_group", "lower"),
                  ("opfusion/te/", "lower"), ("opfusion/tir/", "lower"),
                  ("opfusion/topi/", "lower"), ("opfusion/codegen/", "codegen"),
                  ("opfusion/runtime/", "build"), ("opfusion/compiler/", "build"))


def _substage(stage: str, where: str) -> str:
    if stage != "compile":
        return stage
    for prefix, part in _COMPILE_PARTS:
        if where.startswith(prefix):
            return f"compile/{part}"
    return stage


def _compare(got: Sequence[Any], want: Any) -> str:
    """'' when the compiled outputs match the reference, :data:`NONFINITE` when only their
    NaN/Inf differ, else what differs."""
    wants = list(want) if isinstance(want, tuple) else [want]
    if len(got) != len(wants):
        return f"{len(got)} outputs, the reference gives {len(wants)}"
    for index, (g, w) in enumerate(zip(got, wants)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return (f"output {index}: {g.dtype}{list(g.shape)}, the reference gives "
                    f"{w.dtype}{list(w.shape)}")
        if w.dtype.kind != "f":
            if not np.array_equal(g, w):
                bad = int(np.sum(g != w))
                return f"output {index}: {bad} of {w.size} {w.dtype} elements differ"
            continue
        finite = np.isfinite(w)
        both = finite & np.isfinite(g)
        if both.any():
            scale = float(np.max(np.abs(w[both].astype(np.float64)))) or 1.0
            error = float(np.max(np.abs(g[both].astype(np.float64) - w[both]))) / scale
            if error > RTOL:
                return f"output {index}: max error {error:.3g} x max|reference|"
        if not np.array_equal(np.isfinite(g), finite) or not np.array_equal(
                g[~finite], w[~finite], equal_nan=True):
            return NONFINITE
    return ""


def _inputs_for(mod: Any, wide_ints: bool = False) -> dict[str, np.ndarray] | None:
    """Standard-normal floats, integers in [0, 4) (in [-16, 16) with ``wide_ints``) and
    random bools for ``@main``'s parameters; None when they would be too large to feed."""
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for param in mod["main"].params:
        ty = param.checked_type
        shape = tuple(int(d) for d in ty.shape)
        if any(d < 0 for d in shape) or math.prod(shape) > MAX_INPUT_ELEMENTS:
            return None
        dtype = np.dtype(ty.dtype)
        if dtype.kind == "f":
            feeds[param.name_hint] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[param.name_hint] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            low, high = (-16, 16) if wide_ints else (0, 4)
            feeds[param.name_hint] = rng.integers(low, high, shape).astype(dtype)
        else:
            return None
    return feeds


def _import(case: FuzzCase) -> tuple[Any, dict[str, np.ndarray]]:
    from ..frontend import from_onnx

    if not case.from_file:
        return from_onnx(case.data)
    with tempfile.TemporaryDirectory(prefix="opf-fuzz-") as folder:
        path = Path(folder) / "model.onnx"
        path.write_bytes(case.data)
        weights = np.arange(16, dtype=np.float32).tobytes()
        (Path(folder) / "weights.bin").write_bytes(weights)
        return from_onnx(path)


def run_case(case: FuzzCase, *, compile_model: bool = True, reraise: bool = False) -> Outcome:
    """Run one case in this process: import, compile, run, reference, compare.

    Returns the outcome; with ``reraise=True`` an exception propagates instead (to read its
    traceback). ``compile_model=False`` stops after import (type-checked by the import)."""
    from .. import compile as opf_compile
    from ..errors import OpfusionError
    from ..ir.evaluate import evaluate

    outcome = Outcome(case.number, case.seed, case.model_name, case.mutations, OK)
    start = time.perf_counter()
    stage = "import"
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            mod, params = _import(case)
            if compile_model:
                stage = "compile"
                exe = opf_compile(mod, params=params, opt_level=case.opt_level,
                                  fusion=case.fusion)
                stage = "inputs"
                feeds = _inputs_for(mod, case.wide_ints)
                if feeds is None:
                    outcome.notes.append("inputs too large or unsupported: not run")
                else:
                    stage = "run"
                    got = exe.run(feeds)
                    stage = "reference"
                    want = evaluate(mod, {**feeds, **params})
                    stage = "compare"
                    difference = _compare(got, want)
                    if difference == NONFINITE:
                        outcome.kind = NONFINITE
                    elif difference:
                        outcome.category = WRONG_ANSWER
                        outcome.message = difference
            outcome.stage = stage
    except OpfusionError as err:
        if reraise:
            raise
        outcome.category, outcome.kind = OPFUSION_ERROR, type(err).__name__
        outcome.where = _innermost_opfusion_frame(err.__traceback__)
        outcome.stage, outcome.message = _substage(stage, outcome.where), str(err)
    except Exception as err:  # noqa: BLE001 - the point: any other type is a finding
        if reraise:
            raise
        outcome.category, outcome.kind = EXCEPTION, type(err).__name__
        outcome.where = _innermost_opfusion_frame(err.__traceback__)
        outcome.stage, outcome.message = _substage(stage, outcome.where), str(err)
    outcome.message = outcome.message[:2000]
    outcome.seconds = time.perf_counter() - start
    return outcome


# ---------------------------------------------------------------------------------------------
# isolation: worker processes


@dataclass
class _Config:
    seed: int
    compile_every: int
    memory_limit: int
    cache_dir: str | None
    faults: dict[int, str] = field(default_factory=dict)


def _inject_fault(fault: str) -> None:
    """Fail the way a broken kernel would (to test the harness itself)."""
    if fault == "segfault":
        import ctypes

        ctypes.string_at(0)
    elif fault == "abort":
        os.abort()
    elif fault == "hang":
        time.sleep(3600)
    raise ValueError(f"unknown fault {fault!r}")


def _limit_worker(config: _Config) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    if config.cache_dir:
        os.environ["OPFUSION_CACHE_DIR"] = config.cache_dir
    if config.memory_limit > 0:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (config.memory_limit, config.memory_limit))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _worker_main(conn: Any, config: _Config, log_path: str) -> None:
    """A worker: runs the case numbers it receives and sends back each outcome as a dict.
    Its stdout and stderr go to ``log_path`` (emptied before each case), where faulthandler
    writes the Python stack of a crash."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    faulthandler.enable()
    _limit_worker(config)
    from .. import compile as _  # noqa: F401  (import the pipeline before saying ready)

    conn.send("ready")
    while True:
        number = conn.recv()
        if number is None:
            return
        os.ftruncate(2, 0)
        os.lseek(2, 0, os.SEEK_SET)
        if number in config.faults:
            _inject_fault(config.faults[number])
        try:
            case = make_case(number, config.seed)
        except Exception as err:  # noqa: BLE001 - a bug of the fuzzer, reported as such
            outcome = Outcome(number, config.seed, "?", (), HARNESS, type(err).__name__,
                              "make_case", f"{err}\n{traceback.format_exc()}")
        else:
            compile_model = config.compile_every > 0 and number % config.compile_every == 0
            outcome = run_case(case, compile_model=compile_model)
        conn.send(asdict(outcome))


class _Worker:
    def __init__(self, context: Any, config: _Config, log_path: str) -> None:
        self.conn, child = context.Pipe()
        self.log_path = log_path
        self.process = context.Process(target=_worker_main, args=(child, config, log_path),
                                       daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self.number: int | None = None
        self.deadline = time.monotonic() + 120.0  # the start, imports included

    def send(self, number: int, timeout: float) -> None:
        self.number = number
        self.deadline = time.monotonic() + timeout
        self.conn.send(number)

    def kill(self) -> int | None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()
        return self.process.exitcode

    def crash_log(self) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        lines = [line for line in text.splitlines() if line.strip()]
        return "\n".join(lines[-12:])


def _lost_outcome(number: int, config: _Config, category: str, kind: str, message: str,
                  seconds: float) -> Outcome:
    try:
        case = make_case(number, config.seed)
        name, mutations = case.model_name, case.mutations
    except Exception:  # noqa: BLE001 - the worker reports harness errors itself
        name, mutations = "?", ()
    return Outcome(number, config.seed, name, mutations, category, kind, "", message[:2000],
                   seconds=seconds)


def run_cases(numbers: Iterable[int], seed: int = 0, *, jobs: int = 1,
              timeout: float = 20.0, compile_every: int = 1,
              memory_limit: int = 4 << 30, cache_dir: str | None = None,
              progress: Callable[[Outcome], None] | None = None,
              faults: dict[int, str] | None = None) -> list[Outcome]:
    """Run cases in ``jobs`` isolated worker processes; outcomes in case order.

    A case that has not answered after ``timeout`` seconds is a hang (its worker is killed
    and replaced); a worker that dies is a crash of its case (by signal, with the tail of
    faulthandler's stack). ``compile_every=k`` compiles and runs only cases whose number is
    a multiple of k (the others are imported only); 0 imports only. ``memory_limit`` caps
    each worker's address space (bytes; 0: no cap); ``cache_dir`` sets its
    OPFUSION_CACHE_DIR (None: inherited). ``progress`` is called with each outcome.
    ``faults`` maps case numbers to "segfault", "abort" or "hang": the worker fails that way
    instead of running the case (to test this harness)."""
    config = _Config(seed, compile_every, memory_limit, cache_dir, dict(faults or {}))
    context = multiprocessing.get_context("spawn")
    pending = list(numbers)
    pending.reverse()
    results: dict[int, Outcome] = {}
    with tempfile.TemporaryDirectory(prefix="opf-fuzz-logs-") as logs:
        serial = 0

        def start() -> _Worker:
            nonlocal serial
            serial += 1
            return _Worker(context, config, str(Path(logs) / f"worker{serial}.log"))

        workers = [start() for _ in range(max(1, min(jobs, len(pending))))]

        def finish(outcome: Outcome) -> None:
            results[outcome.case] = outcome
            if progress is not None:
                progress(outcome)

        try:
            while pending or any(w.number is not None for w in workers):
                for worker in workers:
                    if worker.ready and worker.number is None and pending:
                        worker.send(pending.pop(), timeout)
                now = time.monotonic()
                wait_for = max(0.0, min(w.deadline for w in workers) - now)
                ready = wait_connections([w.conn for w in workers], timeout=wait_for)
                for index, worker in enumerate(workers):
                    number = worker.number
                    if worker.conn in ready:
                        try:
                            message = worker.conn.recv()
                        except (EOFError, OSError):
                            message = None
                        if message == "ready":
                            worker.ready = True
                            worker.deadline = math.inf
                            continue
                        if message is not None:
                            finish(Outcome(**{**message, "mutations": tuple(
                                message["mutations"])}))
                            worker.number = None
                            worker.deadline = math.inf
                            continue
                        code = worker.kill()
                        log = worker.crash_log()
                        if number is None:  # died at start or between cases
                            raise RuntimeError(f"a fuzz worker died outside a case "
                                               f"(exit code {code}):\n{log}")
                        elapsed = timeout - (worker.deadline - time.monotonic())
                        kind = (signal.Signals(-code).name if code is not None and code < 0
                                else f"exit {code}")
                        finish(_lost_outcome(number, config, CRASH, kind, log, elapsed))
                        workers[index] = start()
                    elif time.monotonic() >= worker.deadline:
                        worker.kill()
                        if number is None:
                            raise RuntimeError("a fuzz worker did not start within 120 s")
                        finish(_lost_outcome(number, config, HANG, f"> {timeout:g} s",
                                             worker.crash_log(), timeout))
                        workers[index] = start()
        finally:
            for worker in workers:
                if worker.process.is_alive():
                    with contextlib.suppress(OSError, BrokenPipeError):
                        worker.conn.send(None)
                    worker.process.join(2)
                worker.kill()
    return [results[number] for number in sorted(results)]


# ---------------------------------------------------------------------------------------------
# reporting


def summarize(outcomes: Sequence[Outcome], examples: int = 3) -> str:
    """A table of counts by category and kind, then, for every category that is not
    acceptable, its first ``examples`` cases with their mutations, stage and message."""
    counts = Counter(outcome.key for outcome in outcomes)
    order = sorted(counts, key=lambda key: (not key.startswith(OK),
                                            not key.startswith(OPFUSION_ERROR), -counts[key]))
    lines = [f"{len(outcomes)} cases"]
    lines += [f"  {counts[key]:6d}  {key}" for key in order]
    bad = [outcome for outcome in outcomes if not is_acceptable(outcome)]
    if bad:
        sites = Counter((o.key, o.stage, o.where) for o in bad)
        lines.append(f"{len(bad)} unacceptable outcomes (not ok, not an OpfusionError) at "
                     f"{len(sites)} sites (category, stage, innermost opfusion frame):")
        lines += [f"  {count:6d}  {key} | {stage or '?'} | {where or '?'}"
                  for (key, stage, where), count in sites.most_common()]
        lines.append("first examples:")
    shown: Counter[str] = Counter()
    for outcome in bad:
        if shown[outcome.key] >= examples:
            continue
        shown[outcome.key] += 1
        message = outcome.message.strip().replace("\n", "\n      ")
        if len(message) > 600:
            message = message[:600] + " ..."
        lines.append(f"- [{outcome.key}] case {outcome.case} (seed {outcome.seed}), model "
                     f"{outcome.model_name}, stage {outcome.stage or '?'}"
                     + (f", at {outcome.where}" if outcome.where else ""))
        for mutation in outcome.mutations:
            lines.append(f"    mutation {mutation!r}")
        lines.append(f"    message: {message}")
        lines.append(f"    replay: python benchmarks/fuzz_models.py --case {outcome.case} "
                     f"--seed {outcome.seed}")
    return "\n".join(lines)
