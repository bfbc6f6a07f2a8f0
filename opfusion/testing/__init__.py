"""Helpers for tests and benchmarks: closeness checks, one-operator evaluation, and workloads
whose numbers prove something (random-weight copies of the onnx light models, ONNX builds of
four torchvision classifiers, TVM-style builders of real architectures; see :mod:`.light`,
:mod:`.vision` and :mod:`.workloads`).

Closeness is measured relative to the largest magnitude of the expected output, never by an
absolute tolerance that could be as large as the values under test."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..ir.evaluate import evaluate
from ..ir.expr import Expr, Function, Var
from ..ir.module import IRModule
from ..ir.types import TensorType
from .light import LIGHT_MODEL_NAMES, light_model, light_model_tolerance, shipped_light_model
from .transformer import TRANSFORMER_MODEL_NAMES, transformer_model
from .vision import VISION_MODEL_NAMES, vision_model
from .workloads import (
    SMALL_WORKLOAD_ARGS,
    WORKLOADS,
    mlp,
    mobilenet_v2,
    resnet,
    shufflenet_v2,
    squeezenet,
    transformer_encoder,
    workload_input,
)

__all__ = [
    "LIGHT_MODEL_NAMES", "SMALL_WORKLOAD_ARGS", "TRANSFORMER_MODEL_NAMES", "VISION_MODEL_NAMES",
    "WORKLOADS",
    "assert_close", "eval_op", "light_model", "light_model_tolerance", "mlp", "mobilenet_v2",
    "resnet", "run_in_threads",
    "run_onnx_node", "shipped_light_model", "shufflenet_v2", "squeezenet",
    "transformer_encoder", "transformer_model", "vision_model", "workload_input",
]


def assert_close(got: Any, want: Any, rtol: float = 1e-5) -> None:
    """Assert that ``got`` matches ``want`` in shape, dtype and value.

    Values may differ by ``rtol * max|want|`` (plus ``rtol`` for outputs that are all
    zero); integer and bool outputs must match exactly. Tuples are compared fieldwise."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (type(got), len(want))
        for g, w in zip(got, want):
            assert_close(g, w, rtol)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != expected {want.shape}"
    assert got.dtype == want.dtype, f"dtype {got.dtype} != expected {want.dtype}"
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want)
        return
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isfinite(got), finite, err_msg="non-finite positions differ")
    np.testing.assert_array_equal(got[~finite], want[~finite])
    if not finite.any():
        return
    scale = float(np.max(np.abs(want[finite]))) or 1.0
    error = float(np.max(np.abs(got[finite].astype(np.float64) - want[finite])))
    assert error <= rtol * scale, (
        f"max abs error {error:.3g} exceeds {rtol:g} x max|want| = {rtol * scale:.3g}")


def eval_op(builder: Callable[..., Expr], *arrays: Any, **attrs: Any) -> Any:
    """Build ``builder(*vars, **attrs)`` over variables shaped like ``arrays`` and run it
    through the reference interpreter. A list of arrays becomes one tuple-input argument
    (for concatenate-style ops)."""
    params: list[Var] = []
    args: list[Any] = []
    values: list[np.ndarray] = []
    for index, item in enumerate(arrays):
        if isinstance(item, list):
            group = []
            for sub, array in enumerate(item):
                array = np.asarray(array)
                param = Var(f"x{index}_{sub}", TensorType(array.shape, array.dtype))
                params.append(param)
                values.append(array)
                group.append(param)
            args.append(group)
        else:
            array = np.asarray(item)
            param = Var(f"x{index}", TensorType(array.shape, array.dtype))
            params.append(param)
            values.append(array)
            args.append(param)
    body = builder(*args, **attrs)
    return evaluate(IRModule.from_expr(Function(params, body)), values)


def run_onnx_node(op_type: str, feeds: dict[str, np.ndarray], num_outputs: int = 1,
                  opset: int = 18, **attrs: Any) -> list[np.ndarray]:
    """Run one ONNX node through ``onnx.reference.ReferenceEvaluator`` (an independent oracle
    for operator tests; needs the ``onnx`` extra). ``feeds`` maps input names to arrays, in
    the node's input order."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    outputs = [f"y{i}" for i in range(num_outputs)]
    graph = helper.make_graph(
        [helper.make_node(op_type, list(feeds), outputs, **attrs)], "one_node",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                       value.shape) for name, value in feeds.items()],
        [helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None)
         for name in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, feeds)


def run_in_threads(count: int, work: Callable[[int], Any]) -> None:
    """Run ``work(index)`` for index 0..count-1 in ``count`` threads started together (at a
    barrier, so that they overlap); re-raise the first failure in the calling thread."""
    failures: list[BaseException] = []
    start = threading.Barrier(count)

    def guarded(index: int) -> None:
        try:
            start.wait()
            work(index)
        except BaseException as err:  # noqa: BLE001 - handed to the calling thread
            failures.append(err)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
