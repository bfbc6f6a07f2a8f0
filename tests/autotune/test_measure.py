"""Measuring candidates safely: every config of a task builds and times right, and a
candidate that crashes the worker, hangs or computes other numbers is a failed result of its
kind, costs one trial, and leaves the runner working for the next one."""

import numpy as np
import pytest

from opfusion.autotune.measure import MeasureOptions, build_candidates, task_data
from opfusion.autotune.runner import LocalRunner
from opfusion.autotune.task import extract_tasks, task_inputs, task_key
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.testing import resnet

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

@pytest.fixture(scope="module")
def conv_task(small_resnet):
    mod, params = small_resnet
    return next(t for t in extract_tasks(mod, params) if t.rule == "conv2d_nchwc")


def test_tasks_are_the_distinct_groups_with_knobs_heaviest_first(small_resnet):
    mod, params = small_resnet
    tasks = extract_tasks(mod, params)
    assert tasks and all(len(t.space) >= 2 for t in tasks)
    assert [t.weight for t in tasks] == sorted((t.weight for t in tasks), reverse=True)
    assert len({t.key for t in tasks}) == len(tasks)
    assert all(t.default in t.space for t in tasks)
    # the same model, extracted again, has the same keys (content hashes, not ids)
    again = extract_tasks(*resnet(num_layers=18, image_shape=(3, 32, 32), num_classes=10))
    assert [t.key for t in again] == [t.key for t in tasks]
    assert task_key(tasks[0].func, tasks[0].target) == tasks[0].key


def test_every_sampled_config_measures_with_a_positive_time(conv_task):
    configs = [conv_task.default, *conv_task.space.sample(3, seed=1)]
    candidates = build_candidates(conv_task, configs)
    assert all(c.error is None and c.prim_func is not None for c in candidates)
    data = task_data(conv_task)
    with LocalRunner() as runner:
        results = runner.run(data, candidates, MeasureOptions(repeat=3))
    assert [r.config for r in results] == configs
    for result in results:
        assert result.ok, result.error
        assert 0 < result.seconds < 1 and len(result.repeats) == 3


def test_cold_cache_measurements_time_single_calls_after_a_bounded_flush(conv_task):
    from opfusion.autotune.worker import FLUSH_MAX_BYTES, flush_bytes

    assert 0 < flush_bytes() <= FLUSH_MAX_BYTES
    configs = [conv_task.default, *conv_task.space.sample(1, seed=2)]
    candidates = build_candidates(conv_task, configs)
    with LocalRunner() as runner:
        results = runner.run(task_data(conv_task), candidates,
                             MeasureOptions(repeat=2, flush_cache=True))
    assert [r.config for r in results] == configs
    for result in results:
        assert result.ok, result.error
        assert 0 < result.seconds < 1 and len(result.repeats) == 2


def test_a_loaded_candidate_reads_and_writes_buffers_at_cache_line_boundaries(conv_task):
    """As the executor's arena and constants are: NumPy's own arrays start 16 bytes into a
    line, where each vector load of a weight spans two lines (a ResNet-50 1x1 layer measured
    1.1x slower than the model runs it)."""
    from opfusion.autotune.runner import request_for
    from opfusion.autotune.worker import load
    from opfusion.runtime.ndarray import ALIGNMENT

    data = task_data(conv_task)
    # the task's arrays moved 16 bytes off a line boundary, as NumPy's large arrays are
    shifted = []
    for array in data.inputs:
        raw = np.empty(array.nbytes + 2 * ALIGNMENT, np.uint8)
        start = (-raw.ctypes.data) % ALIGNMENT + 16
        view = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
        view[...] = array
        shifted.append(view)
    assert all(a.ctypes.data % ALIGNMENT == 16 for a in shifted)
    data.inputs = shifted
    candidate = build_candidates(conv_task, [conv_task.default])[0]
    loaded = load(request_for(candidate, MeasureOptions(repeat=1)), data)
    assert all(pointer % ALIGNMENT == 0 for pointer in loaded.pointers)
    assert all(np.array_equal(a, b) for a, b in zip(loaded.inputs, shifted))


def test_a_reference_is_timed_beside_the_candidates(conv_task):
    candidates = build_candidates(conv_task, conv_task.space.sample(2, seed=7))
    reference = build_candidates(conv_task, [conv_task.default])[0]
    with LocalRunner() as runner:
        results = runner.run(task_data(conv_task), candidates, MeasureOptions(repeat=3),
                             reference)
    assert len(results) == 2
    assert all(r.ok and r.reference is not None and r.reference > 0 for r in results)


def test_task_data_is_the_reference_on_seeded_normal_inputs(conv_task):
    data = task_data(conv_task, seed=3)
    again = task_inputs(conv_task, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(data.inputs, again))
    assert len(data.expected) == 1 and np.isfinite(data.expected[0]).all()
    assert np.abs(data.expected[0]).max() > 0


def test_crashing_hanging_and_wrong_candidates_fail_by_kind(conv_task, break_configs, breaks):
    good, *bad = [conv_task.default, *conv_task.space.sample(3, seed=2)]
    break_configs(dict(zip(bad, breaks.values())))
    order = [bad[0], good, bad[1], good, bad[2], good]
    candidates = build_candidates(conv_task, order)
    with LocalRunner() as runner:
        results = runner.run(task_data(conv_task), candidates, MeasureOptions(timeout=3.0))
    kinds = [r.error.split(":")[0] if r.error else "ok" for r in results]
    assert kinds == ["crashed", "ok", "timeout", "ok", "wrong", "ok"]
    assert "SIGILL" in results[0].error or "signal" in results[0].error
    assert "differs from the reference" in results[4].error
    assert all(r.seconds is None for r in results[::2])


def test_a_candidate_that_does_not_compile_is_a_build_failure(conv_task, break_configs):
    config = conv_task.space.sample(1, seed=5)[0]
    break_configs({config: "this is not C"})
    candidates = build_candidates(conv_task, [config])
    assert candidates[0].error.startswith("build:")
    with LocalRunner() as runner:
        result, = runner.run(task_data(conv_task), candidates, MeasureOptions())
    assert result.error.startswith("build:") and result.seconds is None


def test_measure_options_are_checked():
    with pytest.raises(Exception, match="repeat >= 1"):
        MeasureOptions(repeat=0)
    with pytest.raises(Exception, match="positive timeout"):
        MeasureOptions(timeout=float("inf"))
