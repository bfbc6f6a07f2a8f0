"""Resource bombs: models whose kernels would run for hours or whose memory would not fit are
refused at compile time with a ResourceLimitError naming the kernel and the PassContext key
that raises the limit; a strided convolution's scratch is proportional to its output, not to
its stride."""

import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.limits import (
    MAX_ALLOCATION_BYTES,
    MAX_KERNEL_WORK,
    kernel_allocations,
    kernel_work,
)
from opfusion.errors import ResourceLimitError
from opfusion.ir.expr import Constant, Function, Var
from opfusion.ir.types import TensorType
from opfusion.tir import expr as E
from opfusion.tir import stmt as S
from opfusion.tir.expr import Var as TirVar
from opfusion.transform import PassContext

needs_cc = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")


def _expand_sum_model(shape):
    """ONNX ReduceSum(Expand(x, shape)) over a 1x1 input."""
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"]),
             helper.make_node("ReduceSum", ["e"], ["y"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "expand_sum", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        [helper.make_tensor("shape", TensorProto.INT64, [len(shape)], list(shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _strided_conv_model(stride, pad=0):
    """ONNX Conv of a 1x4x1x1 input with a 1x1 kernel, ``stride`` and ``pad`` rows."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[stride, stride],
                            pads=[pad, 0, pad, 0])
    weight = np.arange(16, dtype=np.float32).reshape(4, 4, 1, 1)
    graph = helper.make_graph(
        [node], "strided_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                               [1, 4, 1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [4, 4, 1, 1], weight.ravel())])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), weight


def _compile_onnx(model):
    mod, params = opf.frontend.from_onnx(model)
    return opf.compile(mod, params=params)


def test_reduce_sum_of_a_huge_expand_is_refused_quickly():
    start = time.perf_counter()
    with pytest.raises(ResourceLimitError) as info:
        _compile_onnx(_expand_sum_model([10**6, 10**6]))
    assert time.perf_counter() - start < 2.0
    message = str(info.value)
    assert "broadcast_to" in message and "sum" in message and "1e+12" in message
    assert MAX_KERNEL_WORK in message and "PassContext" in message


def test_a_constant_expand_is_not_folded_into_a_huge_constant():
    """Expand of a constant to 10^12 elements stays a kernel (FoldConstant leaves results
    above FoldConstant.max_elements unfolded), which the work limit then refuses."""
    ones = Constant(np.ones((1, 1), np.float32))
    func = Function([], opf.op.sum(opf.op.broadcast_to(ones, shape=[10**6, 10**6])))
    start = time.perf_counter()
    with pytest.raises(ResourceLimitError):
        opf.compile(func)
    assert time.perf_counter() - start < 2.0


@needs_cc
def test_raising_the_work_limit_changes_the_outcome():
    model = _expand_sum_model([300, 400])
    with PassContext(config={MAX_KERNEL_WORK: 10**4}), pytest.raises(ResourceLimitError):
        _compile_onnx(model)
    with PassContext(config={MAX_KERNEL_WORK: 10**6}):
        exe = _compile_onnx(model)
    x = np.full((1, 1), 0.5, np.float32)
    np.testing.assert_allclose(exe(x=x), 0.5 * 300 * 400, rtol=1e-6)


@needs_cc
def test_the_allocation_limit_covers_results_and_the_memory_plan():
    var = Var("x", TensorType((1, 1), "float32"))
    big = opf.op.broadcast_to(var, shape=[512, 1024])  # 2 MiB, an intermediate
    func = Function([var], opf.op.sum(opf.op.exp(big), axis=[1]))
    with PassContext(config={MAX_ALLOCATION_BYTES: 1 << 20}), \
            pytest.raises(ResourceLimitError, match=MAX_ALLOCATION_BYTES):
        opf.compile(func, fusion="none")
    with PassContext(config={MAX_ALLOCATION_BYTES: 4 << 20}):
        exe = opf.compile(func, fusion="none")
    got = exe(x=np.zeros((1, 1), np.float32))
    np.testing.assert_allclose(got, np.full(512, 1024.0, np.float32))


@needs_cc
@pytest.mark.parametrize("stride", [10**8, 10**9])
def test_a_huge_stride_convolution_needs_scratch_for_its_output_only(stride):
    """The padded, column-phased copy keeps only the phases the 1x1 kernel reads: the
    result is computed at once instead of allocating gigabytes."""
    model, weight = _strided_conv_model(stride)
    start = time.perf_counter()
    exe = _compile_onnx(model)
    x = np.random.default_rng(0).standard_normal((1, 4, 1, 1)).astype(np.float32)
    got = exe(x=x)
    assert time.perf_counter() - start < 5.0
    scratch = sum(nbytes for step in exe.steps if step.group.prim_func is not None
                  for _, nbytes in kernel_allocations(step.group.prim_func.body))
    assert scratch < 1 << 20
    want = np.einsum("oc,nc->no", weight[:, :, 0, 0], x[:, :, 0, 0])[:, :, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_convolution_padded_by_a_billion_rows_is_refused():
    model, _ = _strided_conv_model(10**9, pad=10**9)
    start = time.perf_counter()
    with pytest.raises(ResourceLimitError, match="conv2d"):
        _compile_onnx(model)
    assert time.perf_counter() - start < 2.0


def test_a_blocked_convolution_padded_by_two_billion_rows_is_refused_quickly():
    """A 3x3 convolution (blocked channels on the CPU) whose rows a hostile model pads by
    2^31: the schedule's tile choices for that axis take its divisors in the square root
    of its length, so the kernel's work is refused in a second, not after minutes."""
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[2**31, 1, 1, 1])
    weight = np.ones((4, 3, 3, 3), np.float32)
    graph = helper.make_graph(
        [node, helper.make_node("Relu", ["y"], ["z"])], "padded_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], weight.ravel())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    start = time.perf_counter()
    with pytest.raises(ResourceLimitError, match="conv2d"):
        _compile_onnx(model)
    assert time.perf_counter() - start < 5.0


def test_kernel_work_multiplies_nested_extents_and_adds_siblings():
    i, j, k = TirVar("i", "int32"), TirVar("j", "int32"), TirVar("k", "int32")
    leaf = S.Evaluate(0)
    inner = S.SeqStmt([S.For(j, 0, 10**6, S.ForKind.SERIAL, leaf),
                       S.For(k, 0, 3, S.ForKind.SERIAL, leaf)])
    assert kernel_work(S.For(i, 0, 10**6, S.ForKind.PARALLEL, inner)) == 10**12 + 3 * 10**6


def test_kernel_work_counts_a_split_remainder_loop_by_its_largest_extent():
    # for o in 0..4: for v in 0..min(32, 100 - 32 * o): the inner loop's extent depends on
    # o; it counts as 32 (its bound), not once, so the kernel is not taken for a tiny one.
    o, v = TirVar("o", "int32"), TirVar("v", "int32")
    extent = E.Min(E.IntImm(32), E.IntImm(100) - o * 32)
    inner = S.For(v, 0, extent, S.ForKind.VECTORIZED, S.Evaluate(0))
    assert kernel_work(S.For(o, 0, 4, S.ForKind.PARALLEL, inner)) == 4 * 32


def test_limits_are_declared_pass_configs():
    with pytest.raises(opf.errors.OpfusionError, match="takes a int"):
        PassContext(config={MAX_KERNEL_WORK: "many"})


def test_a_result_no_allocation_holds_is_refused_before_lowering():
    """A graph built without the ONNX importer: the kernel's result, wider than an int64
    counts, is a ResourceLimitError naming the kernel, not an overflow in lowering."""
    var = Var("x", TensorType((1, 1, 2, 2), "float32"))
    func = Function([var], opf.op.nn.pad(var, 0.0, pad_width=(0, 0, 0, 0, 0, 0, 0,
                                                              2**63 - 1)))
    with pytest.raises(ResourceLimitError, match=r"the result of kernel fused_nn_pad_0 "
                       rf".*{MAX_ALLOCATION_BYTES}"):
        opf.compile(func)
