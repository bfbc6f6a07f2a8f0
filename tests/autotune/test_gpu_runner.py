"""opf.tune for a CUDA target: candidates measured by the GPU runner, here on the loop-IR
interpreter's device (every launch run block by block, races checked), so that the whole
path (generate, measure, check, record, compile with the records) runs without a GPU; on a
machine with one, the same on the GPU."""

import numpy as np
import pytest

import opfusion as opf
from opfusion import op
from opfusion.autotune.gpu_runner import GPURunner
from opfusion.autotune.measure import MeasureOptions, generate_candidates, task_data
from opfusion.autotune.task import extract_tasks
from opfusion.backend.cuda.runtime import InterpretedDevice, gpu_unavailable
from opfusion.compiler.gpu import GPUExecutor, build_gpu_model
from opfusion.errors import DeviceError
from opfusion.ir.evaluate import evaluate
from opfusion.ir.expr import Function, Var
from opfusion.ir.types import TensorType
from opfusion.testing import assert_close

TARGET = "cuda -arch=sm_90"
QUICK = MeasureOptions(repeat=1, min_repeat_seconds=0.0)


def _dense_relu() -> Function:
    x = Var("x", TensorType((8, 24), "float32"))
    w = Var("w", TensorType((20, 24), "float32"))
    return Function([x, w], op.nn.relu(op.nn.dense(x, w)))


def _candidates(count: int):
    (task,) = extract_tasks(_dense_relu(), None, TARGET)
    configs = [task.default, *[c for c in task.space if c != task.default][:count - 1]]
    return task, generate_candidates(task, configs)


def test_tuning_for_a_gpu_records_checked_configs_that_compile_uses():
    func = _dense_relu()
    result = opf.tune(func, target=TARGET, trials=4, batch=2, records=None,
                      runner=GPURunner(InterpretedDevice()), options=QUICK, confirm=1)
    (task,) = result.tasks
    assert task.trials == 4 and task.failed == 0 and task.best_config is not None
    records = result.records.records
    assert records and all(r.ok and r.runner == "gpu" and r.rule == "gpu_matmul"
                           for r in records)
    assert {r.target for r in records} == {TARGET}  # not the host's cores: any host applies
    model = build_gpu_model(func, target=TARGET, records=result.records)
    (group,) = model.kernels
    assert group.schedule_config == task.best_config.to_dict()
    inputs = [np.random.default_rng(1).standard_normal(p.type_annotation.shape)
              .astype("float32") for p in func.params]
    (got,) = GPUExecutor(model, InterpretedDevice()).run(*inputs)
    assert_close(got, evaluate(func, inputs), 1e-5)


def test_a_candidate_with_other_numbers_is_wrong_not_timed():
    task, candidates = _candidates(2)
    data = task_data(task)
    data.expected = [e + 1.0 for e in data.expected]
    results = GPURunner(InterpretedDevice()).run(data, candidates, QUICK)
    assert all(r.seconds is None and r.error.startswith("wrong: output 0 differs")
               for r in results)


def test_every_launch_argument_is_in_bounds_and_written():
    task, candidates = _candidates(3)
    results = GPURunner(InterpretedDevice()).run(task_data(task), candidates, QUICK,
                                                 reference=candidates[0])
    assert all(r.ok and r.reference is not None for r in results)


def test_truncating_tensor_cores_are_checked_within_their_arithmetic():
    """A task built for ``-tf32=fast`` (operands truncated, about 8e-4 of the largest output
    from float32) checks its candidates within TRUNCATED_TF32_RTOL, a wrong one still
    fails; other tasks keep the options' tolerance."""
    from opfusion.autotune.measure import TRUNCATED_TF32_RTOL

    x = Var("x", TensorType((32, 64), "float32"))
    w = Var("w", TensorType((32, 64), "float32"))
    func = Function([x, w], op.nn.dense(x, w))
    (task,) = extract_tasks(func, None, "cuda -arch=sm_90 -tf32=fast")
    assert task.rule == "gpu_mma"
    data = task_data(task)
    assert data.tolerance(QUICK) == TRUNCATED_TF32_RTOL > QUICK.rtol
    (plain,) = extract_tasks(func, None, "cuda -arch=sm_90 -tf32=1")
    assert task_data(plain).tolerance(QUICK) == QUICK.rtol
    (result,) = GPURunner(InterpretedDevice()).run(
        data, generate_candidates(task, [task.default]), QUICK)
    assert result.ok
    data.expected = [e * 1.01 for e in data.expected]
    (result,) = GPURunner(InterpretedDevice()).run(
        data, generate_candidates(task, [task.default]), QUICK)
    assert result.error.startswith("wrong: output 0 differs")


class _FaultingDevice(InterpretedDevice):
    """A device whose first launch faults, as a kernel with a bad address does."""

    def launch(self, *args, **kwargs):
        raise DeviceError("cuCtxSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS")


def test_a_fault_fails_that_candidate_and_stops_measuring_on_the_broken_context():
    task, candidates = _candidates(3)
    results = GPURunner(_FaultingDevice()).run(task_data(task), candidates, QUICK)
    assert results[0].error.startswith("crashed: ") and "ILLEGAL_ADDRESS" in results[0].error
    assert all(r.error.startswith("failed: an earlier candidate broke the GPU context")
               for r in results[1:])


@pytest.mark.skipif(gpu_unavailable() is not None, reason=str(gpu_unavailable()))
def test_tuning_on_the_gpu():
    func = _dense_relu()
    result = opf.tune(func, target=TARGET, trials=8, records=None, options=QUICK)
    (task,) = result.tasks
    assert task.failed == 0 and task.best_seconds is not None and task.best_seconds > 0


def test_a_model_with_nothing_to_tune_tunes_nothing():
    x = Var("x", TensorType((64,), "float32"))  # on a CPU, an elementwise group has no knobs
    result = opf.tune(Function([x], op.sigmoid(x)), target="c", trials=4, records=None)
    assert result.tasks == [] and result.trials == 0


def test_elementwise_groups_are_tuned_on_a_gpu():
    x = Var("x", TensorType((6, 40), "float32"))
    func = Function([x], op.nn.relu(op.sigmoid(x)))
    result = opf.tune(func, target=TARGET, trials=5, batch=5, records=None, confirm=0,
                      runner=GPURunner(InterpretedDevice()), options=QUICK)
    (task,) = result.tasks
    assert task.task.rule == "gpu_default" and task.trials == 5 and task.failed == 0
    model = build_gpu_model(func, target=TARGET, records=result.records)
    (group,) = model.kernels
    assert group.schedule_config == task.best_config.to_dict()
    data = np.random.default_rng(2).standard_normal((6, 40)).astype("float32")
    (got,) = GPUExecutor(model, InterpretedDevice()).run(data)
    assert_close(got, evaluate(func, [data]), 1e-6)
