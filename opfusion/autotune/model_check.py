"""The model check: the last step of ``opf.tune``, which keeps a tuned config only where it
is faster in the model.

A candidate is measured alone: its kernel runs again and again on the same inputs, with the
caches to itself (or flushed before each run). In the model it runs after other kernels,
which leave other data in the caches and the threads in another state. On ResNet-50 the
configs that won alone left the model 3% slower (0.973x) than the heuristic's. So after the
search, the model is compiled twice — every task with its heuristic config, and every task
with its best record — both are checked to compute the same outputs, and their kernels are
timed in the model's order (``exe.profile``), the two builds alternating, one run each, for
``rounds`` rounds. A task's time in the model is the sum, over the kernels that are its
group, of each kernel's median. The heuristic's and the tuned config's in-model times are
appended to the records as ``in_model`` records, which ``TuningRecords.best`` prefers to any
other: a config slower than the heuristic where it runs is not chosen again. Last, the whole
model is timed with the heuristic's configs and with the kept ones, alternating, so the
result says what tuning bought the model, not its groups alone."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..compiler.compile import random_inputs
from ..ir.expr import Function
from ..ir.module import IRModule
from ..target import Target
from .records import Record, TuningRecords
from .task import Task, target_key, task_key

logger = logging.getLogger("opfusion.autotune")

#: Runs of each build, alternating, for the per-kernel and the whole-model times.
DEFAULT_ROUNDS = 15
#: Outputs of the two builds must agree to this fraction of the largest output.
AGREEMENT = 1e-4


@dataclass
class TaskCheck:
    """One task in the model: its kernels' summed median times with the heuristic's config
    and with the tuned one, and whether the tuned config was kept (it was faster there)."""

    task: Task
    config: Any
    untuned_seconds: float
    tuned_seconds: float

    @property
    def kept(self) -> bool:
        return self.tuned_seconds < self.untuned_seconds


@dataclass
class ModelCheck:
    """What the model check measured: each checked task (those whose best record is not
    the heuristic's config), and the whole model's median run with the heuristic's configs
    and with the kept ones (None when nothing was kept: the two are the same build)."""

    tasks: list[TaskCheck]
    untuned_seconds: float | None = None
    tuned_seconds: float | None = None
    note: str = ""

    @property
    def kept(self) -> int:
        return sum(entry.kept for entry in self.tasks)

    def render(self) -> str:
        if self.note:
            return f"model check: {self.note}"
        lines = [f"model check ({self.kept} of {len(self.tasks)} tuned groups kept):"]
        for entry in self.tasks:
            verdict = "kept" if entry.kept else "dropped"
            lines.append(f"  {entry.task.name[:44]:44} {entry.untuned_seconds * 1e3:>9.3f} ms "
                         f"-> {entry.tuned_seconds * 1e3:>9.3f} ms in the model, {verdict}")
        if self.untuned_seconds is not None and self.tuned_seconds is not None:
            lines.append(f"  the model: {self.untuned_seconds * 1e3:.2f} ms untuned -> "
                         f"{self.tuned_seconds * 1e3:.2f} ms tuned "
                         f"({self.untuned_seconds / self.tuned_seconds:.3f}x)")
        return "\n".join(lines)


def check_in_model(mod: IRModule | Function, params: Mapping[str, Any] | None,
                   target: Target, tasks: Sequence[Task], records: TuningRecords,
                   opt_level: int | None = None, fusion: str | None = None,
                   rounds: int = DEFAULT_ROUNDS, runner: str = "local") -> ModelCheck:
    """Time each task's best record against its heuristic config in the compiled model and
    append the two in-model times to ``records`` (see the module docstring)."""
    key = target_key(target)
    chosen = _candidates(tasks, records, key)
    if not chosen:
        return ModelCheck([], note="no group has a tuned config other than the heuristic's")
    untuned = _build(mod, params, target, opt_level, fusion, TuningRecords())
    candidates = TuningRecords()
    for record in chosen.values():
        candidates.append(record)
    tuned = _build(mod, params, target, opt_level, fusion, candidates)
    if untuned is None or tuned is None:
        return ModelCheck([], note="the model's shapes are not all known (a specializing "
                                   "build): not checked")
    feeds = random_inputs(untuned)
    agree = _agree(untuned, tuned, feeds)
    if not agree:
        logger.warning("the tuned model's outputs differ from the untuned one's by more than "
                       "%g of the largest; every group keeps its heuristic config", AGREEMENT)
    per_task = _in_model_times(untuned, tuned, feeds, target, rounds, set(chosen))
    checks = []
    for task in tasks:
        if task.key not in chosen or task.key not in per_task:
            continue
        before, after = per_task[task.key]
        if not agree:
            after = float("inf")  # never kept
        checks.append(TaskCheck(task, chosen[task.key].config, before, after))
        _append(records, task, task.default, before, runner, key)
        if np.isfinite(after):
            _append(records, task, chosen[task.key].config, after, runner, key)
    result = ModelCheck(checks)
    if result.kept:
        final = tuned if result.kept == len(checks) else _build(
            mod, params, target, opt_level, fusion, records)
        result.untuned_seconds, result.tuned_seconds = _whole_runs(untuned, final, feeds,
                                                                   rounds)
    return result


def _candidates(tasks: Sequence[Task], records: TuningRecords, key: str) -> dict[str, Record]:
    """Per task key, the best record other than the heuristic's config (from the search and
    the confirmations: earlier model checks do not decide what is checked now)."""
    chosen = {}
    for task in tasks:
        record = records.best(task.key, key, in_model=False)
        if record is None or record.rule != task.rule or record.knobs not in task.space:
            continue
        if task.space.check(record.knobs) != task.default:
            chosen[task.key] = record
    return chosen


def _build(mod: IRModule | Function, params: Mapping[str, Any] | None, target: Target,
           opt_level: int | None, fusion: str | None, records: TuningRecords) -> Any:
    """The model compiled with ``records`` (an empty set: every heuristic config); None for
    a build whose shapes are decided per call."""
    from ..compiler.compile import compile as compile_model
    from ..compiler.executor import Executor

    exe = compile_model(mod, target=target, params=dict(params or {}), opt_level=opt_level,
                        fusion=fusion, records=records)
    return exe if isinstance(exe, Executor) else None


def _agree(first: Any, second: Any, feeds: Sequence[np.ndarray]) -> bool:
    """Whether the two builds compute the same outputs on ``feeds`` (to AGREEMENT of the
    largest output, NaN and infinities in the same places)."""
    from ..compiler.executor import _relative_error

    return all(_relative_error(got, want) <= AGREEMENT for got, want in
               zip(second.run(None, feeds), first.run(None, feeds), strict=True))


def _in_model_times(untuned: Any, tuned: Any, feeds: Sequence[np.ndarray], target: Target,
                    rounds: int, keys: set[str]) -> dict[str, tuple[float, float]]:
    """Per task key in ``keys``: the summed per-kernel medians in the untuned and the tuned
    build, timed in the model's order, the builds alternating run by run."""
    builds = (untuned, tuned)
    kernel_keys = [_kernel_keys(exe, target) for exe in builds]
    for exe in builds:
        exe.profile(feeds, repeat=1)  # warm: first touches of the workspace and weights
    times: list[list[list[float]]] = [[[] for _ in exe.steps] for exe in builds]
    for _ in range(max(1, rounds)):
        for exe, slots in zip(builds, times):
            for slot, row in zip(slots, exe.profile(feeds, repeat=1).rows):
                slot.append(row[2])
    sums: list[dict[str, float]] = []
    for slots, keyed in zip(times, kernel_keys):
        total: dict[str, float] = {}
        for slot, key in zip(slots, keyed):
            if key in keys:
                total[key] = total.get(key, 0.0) + float(np.median(slot))
        sums.append(total)
    return {key: (sums[0][key], sums[1][key]) for key in sums[0] if key in sums[1]}


def _kernel_keys(exe: Any, target: Target) -> list[str | None]:
    """Each step's task key (None for a step without a kernel of its own)."""
    keys: dict[str, str | None] = {}
    found = []
    for step in exe.steps:
        group = step.group
        if group.name not in keys:
            func = group.function
            keys[group.name] = (task_key(func, target)
                                if func is not None and step.function is not None else None)
        found.append(keys[group.name])
    return found


def _whole_runs(first: Any, second: Any, feeds: Sequence[np.ndarray],
                rounds: int) -> tuple[float, float]:
    """The median time of a whole run of each build, alternating run by run."""
    spent: tuple[list[float], list[float]] = ([], [])
    for exe in (first, second):
        exe.run(None, feeds)
    for _ in range(max(1, rounds)):
        for exe, slot in zip((first, second), spent):
            start = time.perf_counter()
            exe.run(None, feeds)
            slot.append(time.perf_counter() - start)
    return float(np.median(spent[0])), float(np.median(spent[1]))


def _append(records: TuningRecords, task: Task, config: Any, seconds: float, runner: str,
            key: str) -> None:
    records.append(Record(task.key, key, task.rule, dict(config), seconds, None, task.op_names,
                          task.weight, runner, time.time(), confirmed=True, in_model=True))
