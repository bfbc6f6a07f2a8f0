"""Every allocation of the executor (the memory plan's blocks, a run's results, copies of
inputs, a kernel's scratch) and of the reference interpreter reports a failure as an
opfusion error naming the value or kernel and the bytes asked for, never a bare MemoryError
or NumPy's ValueError for a size past its range."""

import dataclasses

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.limits import (
    MAX_ALLOCATION_BYTES,
    MAX_KERNEL_WORK,
    check_values,
    physical_memory_bytes,
)
from opfusion.errors import EvaluationError, OpfusionError, OutOfMemoryError, ResourceLimitError
from opfusion.ir.expr import Function, Var
from opfusion.ir.types import TensorType
from opfusion.runtime.model_layout import ModelCall
from opfusion.transform import PassContext

needs_cc = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")
UNLIMITED = {MAX_ALLOCATION_BYTES: 2**80, MAX_KERNEL_WORK: 2**80}


def _exp_exp(shape):
    x = Var("x", TensorType(shape, "float32"))
    return Function([x], opf.op.exp(opf.op.exp(x)))


@needs_cc
@pytest.mark.parametrize("dim", [2**61, 2**62])
def test_a_block_past_numpys_range_is_an_opfusion_error(dim):
    """With the limits lifted, a 2**63-byte or larger block is more than NumPy can make
    (ValueError "Maximum allowed dimension exceeded"): the error names the values it holds."""
    with PassContext(config=UNLIMITED), pytest.raises(OutOfMemoryError) as info:
        opf.compile(_exp_exp((dim,)), fusion="none")
    message = str(info.value)
    assert "block 0 of the memory plan (holding result 0 of kernel fused_exp_0 (exp)" in message
    assert f"{dim * 4} bytes" in message and "NumPy" in message


def _refuse(wanted_shape):
    """An np.empty that raises MemoryError for arrays of ``wanted_shape`` (of any dtype)."""
    real = np.empty

    def empty(shape, *args, **kwargs):
        if tuple(np.atleast_1d(shape)) == tuple(wanted_shape):
            raise MemoryError(f"Unable to allocate an array with shape {shape}")
        return real(shape, *args, **kwargs)

    return empty


@needs_cc
def test_a_result_the_machine_does_not_give_names_it(monkeypatch):
    exe = opf.compile(_exp_exp((3, 5)))
    monkeypatch.setattr(np, "empty", _refuse((3, 5)))
    with pytest.raises(OutOfMemoryError) as info:
        exe(np.zeros((3, 5), np.float32))
    assert isinstance(info.value, OpfusionError) and isinstance(info.value, MemoryError)
    message = str(info.value)
    assert "60 bytes for output 'output_0', result 0 of kernel fused_exp_exp_0 (exp)" in message
    assert "Tensor[(3, 5), float32]" in message


@needs_cc
def test_a_block_the_machine_does_not_give_names_its_values(monkeypatch):
    monkeypatch.setattr(np, "empty", _refuse((4 * 64 + 64,)))  # one 64-row float32 block
    with pytest.raises(OutOfMemoryError, match=r"256 bytes for block 0 of the memory plan "
                                               r"\(holding result 0 of kernel fused_exp_0"):
        opf.compile(_exp_exp((64,)), fusion="none")


@needs_cc
def test_a_kernel_whose_scratch_malloc_fails_is_an_opfusion_error():
    message = r"kernel fused_exp_exp_0 \(exp\) could not allocate its scratch memory"
    exe = opf.compile(_exp_exp((3,)))
    exe.steps[0].function = lambda *pointers: 1  # the status of a failed malloc
    with pytest.raises(OutOfMemoryError, match=message):
        exe.profile([np.zeros(3, np.float32)])  # kernel by kernel
    exe = opf.compile(_exp_exp((3,)))
    plan = exe._native_plan()

    def run(first, stop, call):
        ModelCall.from_address(call).failed = 0  # as the native entry reports it
        return 1

    exe._native = dataclasses.replace(plan, run=run)
    with pytest.raises(OutOfMemoryError, match=message):
        exe(np.zeros(3, np.float32))  # one native call for the whole run


def test_the_reference_interpreter_names_the_operator_out_of_memory(monkeypatch):
    x = Var("x", TensorType((2, 3), "float32"))
    func = Function([x], opf.op.exp(opf.op.broadcast_to(x, shape=[7, 2, 3])))

    def broadcast_to(*args, **kwargs):
        raise MemoryError("Unable to allocate")

    monkeypatch.setattr(np, "broadcast_to", broadcast_to)
    with pytest.raises(EvaluationError, match=r"the reference of broadcast_to could not "
                                              r"allocate its result of type "
                                              r"Tensor\[\(7, 2, 3\), float32\] \(168 bytes\)"):
        opf.ir.evaluate(func, [np.zeros((2, 3), np.float32)])


def test_a_reference_result_past_numpys_range_is_an_evaluation_error():
    x = Var("x", TensorType((1,), "float32"))
    func = Function([x], opf.op.broadcast_to(x, shape=[2**62, 4]))
    with pytest.raises(EvaluationError, match=r"the reference of broadcast_to .* "
                                              r"\(73786976294838206464 bytes\)"):
        opf.ir.evaluate(func, [np.zeros(1, np.float32)])


def test_sizes_past_int64_are_refused_not_wrapped():
    """2**40 x 2**40 float32 is 2**82 bytes: an int64 product wraps it to 0, which any limit
    would let through; the limits count in Python ints."""
    huge = TensorType((2**40, 2**40), "float32")
    with PassContext(config={MAX_ALLOCATION_BYTES: 2**80}), \
            pytest.raises(ResourceLimitError, match=r"4835703278458516698824704 bytes"):
        check_values([("the value v", huge)])


def test_the_allocation_limit_defaults_to_the_physical_memory():
    default = PassContext().get_config(MAX_ALLOCATION_BYTES)
    assert default == physical_memory_bytes() > 0
