"""The model check, opf.tune's last step: each tuned group's kernels are timed in the
compiled model beside the heuristic's, both times are kept as in-model records, and a config
slower there than the heuristic's is never chosen again — so tuning cannot leave the model
slower than it found it (configs that won alone, with the caches to themselves, can lose in
the model's sequence)."""

import json

import pytest

import opfusion as opf
import opfusion.autotune.model_check as model_check
from opfusion.autotune import MeasureOptions, TuningRecords, extract_tasks, task_key, tune
from opfusion.autotune.task import target_key
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.ir.evaluate import evaluate
from opfusion.testing import assert_close, workload_input

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

FAST = MeasureOptions(repeat=2, min_repeat_seconds=0.002, timeout=5.0)


def chosen_configs(exe):
    """Task key -> the schedule config the compiled model built its kernel with."""
    return {task_key(s.group.function, exe.target): s.group.schedule_config
            for s in exe.steps if s.group.function is not None and s.group.schedule_config}


def tune_two_tasks(mod, params, path, monkeypatch, faster_in_model):
    """Records in which the two heaviest tasks each have a tuned config other than the
    heuristic's; then the model check, its in-model times made up so that the first task's
    tuned kernel is faster in the model and the second's slower (or as ``faster_in_model``
    says)."""
    tasks = extract_tasks(mod, params)[:2]
    target = target_key(opf.Target.current())
    records = TuningRecords.load(path, create=True)
    for task in tasks:
        other = next(c for c in task.space if c != task.default)
        for config, seconds in ((task.default, 2e-3), (other, 1e-3)):
            records.append(opf.autotune.Record(task.key, target, task.rule, dict(config),
                                               seconds, confirmed=True))
    real = model_check._in_model_times

    def made_up(untuned, tuned, feeds, target, rounds, keys):
        times = real(untuned, tuned, feeds, target, 1, keys)  # (the kernels really run)
        assert set(times) == {t.key for t in tasks}
        return {t.key: (1e-3, 0.5e-3 if fast else 2e-3)
                for t, fast in zip(tasks, faster_in_model)}

    monkeypatch.setattr(model_check, "_in_model_times", made_up)
    return tasks, model_check.check_in_model(mod, params, opf.Target.current(),
                                             extract_tasks(mod, params), records, rounds=2)


def test_a_config_slower_in_the_model_is_dropped_and_a_faster_one_kept(small_resnet, tmp_path,
                                                                      monkeypatch):
    mod, params = small_resnet
    path = tmp_path / "tune.json"
    tasks, check = tune_two_tasks(mod, params, path, monkeypatch, (True, False))
    assert [c.task.key for c in check.tasks] == [t.key for t in tasks]
    assert [c.kept for c in check.tasks] == [True, False] and check.kept == 1
    assert check.untuned_seconds > 0 and check.tuned_seconds > 0  # the whole model, timed
    assert "1 of 2 tuned groups kept" in check.render()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    in_model = [line for line in lines if line["in_model"]]
    assert len(in_model) == 4 and all(line["confirmed"] for line in in_model)
    exe = opf.compile(mod, params=params, records=path)
    built = chosen_configs(exe)
    kept, dropped = tasks
    assert built[kept.key]["knobs"] != dict(kept.default)
    assert built[dropped.key]["knobs"] == dict(dropped.default)  # won alone, lost in place
    feeds = workload_input(mod, params)
    assert_close(exe(**feeds), evaluate(mod, {**feeds, **params}), rtol=1e-4)


def test_nothing_kept_leaves_the_heuristics_model(small_resnet, tmp_path, monkeypatch):
    mod, params = small_resnet
    path = tmp_path / "tune.json"
    tasks, check = tune_two_tasks(mod, params, path, monkeypatch, (False, False))
    assert check.kept == 0 and check.tuned_seconds is None
    built = chosen_configs(opf.compile(mod, params=params, records=path))
    assert all(built[t.key]["knobs"] == dict(t.default) for t in tasks)


def test_tune_ends_with_the_model_check_and_its_choice_is_built(small_resnet, tmp_path):
    mod, params = small_resnet
    path = tmp_path / "tune.json"
    result = tune(mod, params, trials=16, records=path, batch=8, options=FAST, confirm=2,
                  check_rounds=3)
    assert result.model is not None
    records = TuningRecords.load(path)
    target = target_key(opf.Target.current())
    built = chosen_configs(opf.compile(mod, params=params, records=path))
    for entry in result.model.tasks:
        best = records.best(entry.task.key, target)
        assert best.in_model
        want = entry.config if entry.kept else entry.task.default
        assert best.config == want and built[entry.task.key]["knobs"] == dict(want)
    assert "model check" in result.render()
    # a second run resumes from the search's records, not the check's (another scale)
    again = tune(mod, params, trials=0, records=path, confirm=0, model_check=False)
    assert all(a.default_seconds == b.default_seconds
               for a, b in zip(result.tasks, again.tasks))


def test_a_model_with_nothing_tuned_is_not_checked(small_resnet):
    mod, params = small_resnet
    check = model_check.check_in_model(mod, params, opf.Target.current(),
                                       extract_tasks(mod, params), TuningRecords())
    assert check.tasks == [] and "no group has a tuned config" in check.render()
