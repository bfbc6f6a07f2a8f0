"""exe.verify compares every kernel with the reference interpreter under every fusion strategy,
tuple operands (concatenate's, unfused) included, and names a kernel that computes wrong
numbers."""

import ctypes

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.compile import random_inputs
from opfusion.compiler.executor import KernelMismatchError
from opfusion.ir.expr import Tuple
from opfusion.testing.workloads import SMALL_WORKLOAD_ARGS, WORKLOADS

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")


def concatenate_of_two_branches():
    """relu(x) and sigmoid(x) concatenated on the channels, then scaled: unfused, the
    concatenate kernel takes one tuple parameter of two tensors."""
    x = opf.var("x", (1, 4, 5, 5), "float32")
    joined = opf.op.concatenate(Tuple([opf.op.nn.relu(x), opf.op.sigmoid(x)]), axis=1)
    body = opf.op.multiply(joined, opf.const(np.float32(2.0)))
    return opf.IRModule.from_expr(opf.Function([x], body))


@pytest.mark.parametrize("fusion", ["none", "tvm", "cinn"])
def test_verify_passes_on_a_concatenate_of_a_tuple(fusion):
    exe = opf.compile(concatenate_of_two_branches(), fusion=fusion, verify=True)
    report = exe.verify(random_inputs(exe, seed=1))
    assert report and all(line.endswith(": ok") for line in report)


COPIED_CONCATENATIONS = {"compile.inplace_concatenate": False}


@pytest.mark.parametrize("in_place", [True, False], ids=["in place", "copied"])
@pytest.mark.parametrize("fusion", ["none", "tvm", "cinn"])
def test_verify_passes_on_squeezenet(fusion, in_place):
    mod, params = WORKLOADS["squeezenet"](**SMALL_WORKLOAD_ARGS["squeezenet"])
    with opf.transform.PassContext(config={"compile.inplace_concatenate": in_place}):
        exe = opf.compile(mod, params=params, fusion=fusion, verify=True)
    concatenations = [s for s in exe.steps if "concatenate" in s.group.op_names]
    if not in_place:
        assert concatenations
    elif fusion == "none":
        assert not concatenations and exe.plan.aliases


def test_verify_names_a_concatenate_kernel_that_writes_zeros():
    with opf.transform.PassContext(config=COPIED_CONCATENATIONS):
        exe = opf.compile(concatenate_of_two_branches(), fusion="none")
    step = next(s for s in exe.steps if s.group.op_names == ["concatenate"])
    (out,) = step.writes
    nbytes = int(np.prod(exe.values[out].type.shape)) * 4

    def zeros_kernel(*pointers):
        ctypes.memset(pointers[-1], 0, nbytes)
        return 0

    step.function = zeros_kernel
    with pytest.raises(KernelMismatchError, match=rf"kernel {step.group.name} \(concatenate\)"):
        exe.verify(random_inputs(exe))
