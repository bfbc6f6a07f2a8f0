"""opf.tune end to end on a small ResNet: it measures the heuristic's config of every task
first, keeps every result in the records, continues from them, never picks a broken
candidate; opf.compile with the records builds each group with its best config, and the
tuned model computes the reference's numbers."""

import json

import numpy as np
import pytest

import opfusion as opf
from opfusion.autotune import MeasureOptions, TuningRecords, extract_tasks, task_key, tune
from opfusion.autotune.task import target_key
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.ir.evaluate import evaluate
from opfusion.testing import assert_close, workload_input

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

FAST = MeasureOptions(repeat=2, min_repeat_seconds=0.002, timeout=5.0)


def test_tuning_measures_defaults_first_and_records_every_trial(small_resnet, tmp_path):
    mod, params = small_resnet
    path = tmp_path / "tune.json"
    progress = []
    result = tune(mod, params, trials=24, records=path, batch=3, options=FAST,
                  callback=progress.append, confirm=0,
                  model_check=False)
    tasks = extract_tasks(mod, params)
    assert result.trials == 24 == len(path.read_text().splitlines())
    counts = [p.trials for p in progress]
    assert counts == sorted(set(counts)) and counts[-1] == 24
    assert all(0 < b - a <= 3 for a, b in zip([0, *counts], counts))
    # the first rounds go to the heaviest tasks, each starting with the heuristic's config
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for task, start, status in zip(tasks, [0, *counts], progress):
        assert status.task.task.key == task.key
        assert lines[start]["task"] == task.key
        assert lines[start]["knobs"] == dict(task.default)
    for entry in result.tasks[:len(progress)]:
        assert entry.default_seconds is not None
        assert entry.best_seconds <= entry.default_seconds  # the default is a candidate
    assert "tuned groups per run" in result.render()


def test_the_best_configs_are_timed_again_and_the_confirmed_best_chosen(small_resnet,
                                                                       tmp_path):
    mod, params = small_resnet
    path = tmp_path / "tune.json"
    result = tune(mod, params, trials=16, records=path, batch=8, options=FAST, confirm=2,
                  model_check=False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    searched = [line for line in lines if not line["confirmed"]]
    confirmed = [line for line in lines if line["confirmed"]]
    assert len(searched) == 16 == result.trials
    records = TuningRecords.load(path)
    for entry in result.tasks:
        mine = [line for line in confirmed if line["task"] == entry.task.key]
        if not mine:  # nothing beat the heuristic in the search
            continue
        assert mine[0]["knobs"] == dict(entry.task.default)  # the heuristic, beside them
        assert mine[0]["seconds"] == pytest.approx(entry.default_seconds)
        assert 2 <= len(mine) <= 3
        best = records.best(entry.task.key, mine[0]["target"])
        assert best.confirmed and best.seconds == min(line["seconds"] for line in mine)
        assert entry.best_seconds == best.seconds and entry.best_config == best.config


def test_tuning_continues_from_its_records(small_resnet, tmp_path):
    mod, params = small_resnet
    path = tmp_path / "tune.json"
    tune(mod, params, trials=6, records=path, batch=3, options=FAST, confirm=0)
    second = tune(mod, params, trials=6, records=path, batch=3, options=FAST, confirm=0,
                  model_check=False)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines = [line for line in lines if not line["in_model"]]  # the first run's model check
    assert len(lines) == 12 and second.trials == 6
    measured = [(line["task"], json.dumps(line["knobs"], sort_keys=True)) for line in lines]
    assert len(set(measured)) == len(measured)  # nothing measured twice
    # the second run started where the first stopped: its first task's results came back
    first = second.tasks[0]
    assert first.trials >= 3 and first.default_seconds is not None


def test_compile_with_records_builds_each_group_with_its_best_config(small_resnet, tmp_path):
    mod, params = small_resnet
    path = tmp_path / "tune.json"
    tune(mod, params, trials=12, records=path, batch=3, options=FAST)
    records = TuningRecords.load(path)
    exe = opf.compile(mod, params=params, records=path)
    tasks = {t.key: t for t in extract_tasks(mod, params)}
    target = target_key(exe.target)
    checked = 0
    for step in exe.steps:
        func = step.group.function
        key = task_key(func, exe.target) if func is not None else None
        best = records.best(key, target) if key in tasks else None
        if best is not None:
            assert step.group.schedule_config == {"rule": best.rule, "knobs": best.knobs}
            checked += 1
    assert checked >= 2
    feeds = workload_input(mod, params)
    assert_close(exe(**feeds), evaluate(mod, {**feeds, **params}), rtol=1e-4)


def test_a_broken_candidate_is_recorded_failed_and_never_chosen(small_resnet, tmp_path,
                                                               break_configs, breaks):
    mod, params = small_resnet
    task = extract_tasks(mod, params)[0]
    # break every config of the first task but its default, by each way of failing in turn
    others = [c for c in task.space if c != task.default]
    breaks = {c: list(breaks.values())[i % 3] for i, c in enumerate(others)}
    break_configs(breaks)
    path = tmp_path / "tune.json"
    result = tune(mod, params, trials=7, records=path, batch=7,
                  options=MeasureOptions(repeat=2, min_repeat_seconds=0.002, timeout=3.0),
                  confirm=0, model_check=False)
    first = result.tasks[0]
    assert first.task.key == task.key and first.trials == 7 and first.failed == 6
    assert first.best_config == task.default
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    errors = [line["error"].split(":")[0] for line in lines if line["error"]]
    assert len(errors) == 6 and set(errors) <= {"crashed", "timeout", "wrong"}
    best = TuningRecords.load(path).best(task.key, target_key(opf.Target.current()))
    assert best.knobs == dict(task.default)


def test_records_that_no_longer_fit_fall_back_to_the_heuristic(small_resnet, tmp_path,
                                                               caplog):
    mod, params = small_resnet
    task = extract_tasks(mod, params)[0]
    path = tmp_path / "tune.json"
    line = {"version": 1, "task": task.key, "target": target_key(opf.Target.current()),
            "rule": task.rule, "knobs": {"channel_tile": 12345}, "seconds": 1e-9,
            "error": None, "ops": [], "weight": 1, "runner": "local", "time": 0}
    path.write_text(json.dumps(line) + "\n")
    exe = opf.compile(mod, params=params, records=path)
    configs = [s.group.schedule_config for s in exe.steps if s.group.schedule_config]
    assert {"channel_tile": 12345} not in [c["knobs"] for c in configs]
    assert "does not fit its schedule now" in caplog.text
    feeds = workload_input(mod, params)
    np.testing.assert_allclose(exe(**feeds), opf.compile(mod, params=params)(**feeds), rtol=1e-6)


def test_tune_arguments_are_checked(small_resnet):
    mod, params = small_resnet
    with pytest.raises(opf.OpfusionError, match="trials >= 0"):
        tune(mod, params, trials=-1, records=None)
    with pytest.raises(opf.OpfusionError, match="unknown runner"):
        tune(mod, params, trials=1, records=None, runner="carrier pigeon")
