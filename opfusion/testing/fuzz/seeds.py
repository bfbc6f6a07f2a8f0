"""The fuzzer's seed models: small valid ONNX models built with onnx.helper, each fast to
import and compile, that together cover the operator families the mutations reach."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


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


