"""``opf.tune``: search the schedule knobs of a model's fused groups and keep the records.

    result = opf.tune(mod, params, trials=800, records="tune.json")   # measures, appends
    exe = opf.compile(mod, params=params, records="tune.json")      # best config per group

The model's tasks (:mod:`.task`) are tuned in rounds of ``batch`` candidates. The first
round of each task measures the heuristic's config with a few others; after that the task
scheduler gives the next round to the task where the estimated gain is largest — its weight
(how often the model calls it) times its best time so far times its recent relative
improvement plus an exploration term that shrinks with each round (TVM's task-scheduler
idea: spend the trials where the model's latency can drop most). Each round proposes configs
(:mod:`.search`), builds them in parallel, checks them one at a time and times them
interleaved with the task's heuristic config (:mod:`.runner`), scales their times by the
heuristic's first measured time (so rounds taken minutes apart, on a machine whose speed
drifts, compare), and appends every result — failures too — to the records. Records
already in the file are reused, never measured again: a second ``tune`` with the same file
continues."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import DeviceError, OpfusionError
from ..ir.expr import Function
from ..ir.module import IRModule
from ..target import Target, as_target
from .measure import (
    Candidate,
    MeasureOptions,
    MeasureResult,
    TaskData,
    generate_candidates,
    task_data,
)
from .model_check import DEFAULT_ROUNDS, ModelCheck, check_in_model
from .records import Record, TuningRecords
from .runner import LocalRunner, Runner
from .search import TaskSearch
from .task import Task, extract_tasks, target_key

logger = logging.getLogger("opfusion.autotune")

#: Candidates per round of one task (built together, then measured one by one).
DEFAULT_BATCH = 8
#: How many of each task's best configs the last step times again (beside the heuristic's).
DEFAULT_CONFIRM = 3
#: Timing rounds of a confirmation: three times a search round's, so noise cannot pick.
CONFIRM_REPEAT = 15
#: The share of a ``seconds`` budget kept for the confirmations.
CONFIRM_SHARE = 0.1
#: The share of a ``seconds`` budget kept for the model check (a few builds of the model).
MODEL_CHECK_SHARE = 0.05


@dataclass
class TaskResult:
    """Where one task stands: its heuristic's time, its best time and config, its trials."""

    task: Task
    default_seconds: float | None
    best_seconds: float | None
    best_config: Any
    trials: int
    failed: int

    @property
    def speedup(self) -> float | None:
        if self.default_seconds is None or self.best_seconds is None:
            return None
        return self.default_seconds / self.best_seconds


@dataclass
class TuneResult:
    """What a tuning run found: one :class:`TaskResult` per task, the trials it measured
    (``trials``, this run only) and the records (every run's)."""

    tasks: list[TaskResult]
    trials: int
    seconds: float
    records: TuningRecords
    model: ModelCheck | None = None

    def estimated_seconds(self, tuned: bool = True) -> float:
        """The tuned groups' share of one model run: sum over tasks of weight x best time
        (``tuned=False``: x the heuristic's time)."""
        total = 0.0
        for entry in self.tasks:
            chosen = entry.best_seconds if tuned else entry.default_seconds
            if chosen is not None:
                total += entry.task.weight * chosen
        return total

    def render(self) -> str:
        """A table: per task its weight, heuristic and best time, speedup and trials."""
        lines = [f"{'task':44} {'w':>3} {'default ms':>11} {'best ms':>9} {'x':>6} "
                 f"{'trials':>6}"]
        for entry in self.tasks:
            default = _ms(entry.default_seconds)
            best = _ms(entry.best_seconds)
            speedup = f"{entry.speedup:.2f}" if entry.speedup is not None else "-"
            lines.append(f"{entry.task.name[:44]:44} {entry.task.weight:>3} {default:>11} "
                         f"{best:>9} {speedup:>6} {entry.trials:>6}")
        before, after = self.estimated_seconds(False), self.estimated_seconds(True)
        lines.append(f"tuned groups per run: {before * 1e3:.2f} ms untuned -> "
                     f"{after * 1e3:.2f} ms tuned ({self.trials} trials this run, "
                     f"{self.seconds:.0f} s)")
        if self.model is not None:
            lines.append(self.model.render())
        return "\n".join(lines)


@dataclass
class TuneProgress:
    """Reported after every round: trials done and allowed, the task just tuned and the
    estimated time of the tuned groups per model run."""

    trials: int
    total_trials: int
    elapsed: float
    task: TaskResult
    estimated_seconds: float
    untuned_seconds: float


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


@dataclass
class _Tuning:
    """The state of one ``tune`` call."""

    tasks: list[Task]
    searches: list[TaskSearch]
    records: TuningRecords
    runner: Runner
    options: MeasureOptions
    target: str
    batch: int
    workers: int | None
    rounds: list[int] = field(default_factory=list)
    gains: list[float] = field(default_factory=list)
    done: set[int] = field(default_factory=set)
    references: dict[str, tuple[Candidate, float]] = field(default_factory=dict)
    data: dict[str, TaskData] = field(default_factory=dict)
    trials: int = 0

    def result(self, index: int) -> TaskResult:
        search = self.searches[index]
        best = search.best()
        default = search.seconds.get(search.task.default)
        return TaskResult(search.task, default, best[1] if best else None,
                          best[0] if best else None, search.trials, len(search.failed))

    def run_round(self, index: int, count: int) -> int:
        """Measure up to ``count`` new configs of task ``index``; how many it measured."""
        search = self.searches[index]
        task = search.task
        configs = search.propose(count)
        if not configs:
            self.done.add(index)  # nothing left to try
            return 0
        before = search.best()
        data = self.data.get(task.key)
        if data is None:
            data = self.data[task.key] = task_data(task)
        candidates = generate_candidates(task, configs)
        self.runner.build(candidates, self.workers)
        reference = None if task.default in configs else self._reference(index)
        results = self.runner.run(data, candidates, self.options,
                                  reference[0] if reference else None)
        for candidate, outcome in zip(candidates, results, strict=True):
            if reference is not None and outcome.ok and outcome.reference:
                # timed beside the default: on the scale of the default's first time
                outcome.seconds = outcome.seconds / outcome.reference * reference[1]
            features = None
            if candidate.prim_func is not None and outcome.ok:
                features = search.features(candidate.config, candidate.prim_func)
            search.add(candidate.config, outcome.seconds, outcome.error, features)
            self.records.append(self._record(task, outcome))
        after = search.best()
        self.rounds[index] += 1
        if before is not None and after is not None:
            self.gains[index] = (before[1] - after[1]) / before[1]
        self.trials += len(configs)
        return len(configs)

    def _reference(self, index: int) -> tuple[Candidate, float] | None:
        """The task's heuristic config built, and its measured time: every later round is
        timed interleaved with it and scaled to that time (None when it did not run)."""
        task = self.tasks[index]
        known = self.references.get(task.key)
        if known is None:
            seconds = self.searches[index].seconds.get(task.default)
            if seconds is None:
                return None
            candidate = generate_candidates(task, [task.default])[0]
            self.runner.build([candidate], self.workers)
            if candidate.error is not None:
                return None
            known = self.references[task.key] = (candidate, seconds)
        return known

    def _record(self, task: Task, outcome: MeasureResult, confirmed: bool = False) -> Record:
        return Record(task.key, self.target, task.rule, dict(outcome.config), outcome.seconds,
                      outcome.error, task.op_names, task.weight, self.runner.name, time.time(),
                      confirmed)

    def confirm(self, index: int, count: int) -> None:
        """Time the heuristic's config and the task's ``count`` best others again, side by
        side and ``CONFIRM_REPEAT`` rounds long, and record them as confirmed: the best of a
        few hundred noisy measurements is too often lucky (on ResNet-50, configs measured
        1.10-1.32x faster than the heuristic's were 0.97-1.10x when timed again)."""
        search = self.searches[index]
        task = search.task
        first = search.seconds.get(task.default)
        if first is None:
            return
        ranked = sorted((c for c in search.seconds if c != task.default),
                        key=lambda c: search.seconds[c])[:count]
        if not ranked or search.seconds[ranked[0]] >= first:
            return  # nothing measured beats the heuristic: nothing to confirm
        configs = [task.default, *ranked]
        candidates = generate_candidates(task, configs)
        self.runner.build(candidates, self.workers)
        options = dataclasses.replace(self.options,
                                      repeat=max(self.options.repeat, CONFIRM_REPEAT))
        data = self.data.get(task.key)
        if data is None:
            data = self.data[task.key] = task_data(task)
        results = self.runner.run(data, candidates, options)
        baseline = results[0].seconds
        if baseline is None:
            return
        for outcome in results:
            if outcome.ok:
                outcome.seconds = outcome.seconds / baseline * first
                search.confirm(outcome.config, outcome.seconds)
            self.records.append(self._record(task, outcome, confirmed=True))

    def priority(self, index: int) -> float:
        """The estimated gain of one more round of task ``index`` (see the module
        docstring)."""
        search = self.searches[index]
        if search.exhausted or index in self.done:
            return -1.0
        best = search.best()
        if best is None:  # nothing ran correctly yet: worth one more look, not many
            return float("inf") if self.rounds[index] < 2 else -1.0
        explore = 0.5 / (1 + self.rounds[index])
        return search.task.weight * best[1] * (self.gains[index] + explore)


def tune(mod: IRModule | Function, params: Mapping[str, Any] | None = None,
         target: str | Target | None = None, trials: int = 1000,
         records: str | TuningRecords | None = "tune.json", runner: str | Runner = "local",
         *, seconds: float | None = None, batch: int = DEFAULT_BATCH,
         options: MeasureOptions | None = None, opt_level: int | None = None,
         fusion: str | None = None, seed: int = 0, workers: int | None = None,
         confirm: int = DEFAULT_CONFIRM, model_check: bool = True,
         check_rounds: int = DEFAULT_ROUNDS,
         callback: Callable[[TuneProgress], None] | None = None) -> TuneResult:
    """Tune the schedule knobs of ``mod``'s fused groups on ``target`` (default: the host).

    Measures at most ``trials`` new candidates (and stops after the round that passes
    ``seconds`` of wall time, when given), appending every result to ``records`` (a JSON-lines
    path, created when missing; a :class:`TuningRecords`; None keeps them in memory).
    ``runner`` is ``"local"`` (a worker process on this machine; for a CUDA target, this
    machine's GPU through a :class:`~opfusion.autotune.gpu_runner.GPURunner`), ``"ray"`` (a
    :class:`~opfusion.autotune.ray_runner.RayRunner` on ``ray.init()``'s cluster) or a
    :class:`Runner`. ``options`` say how candidates are timed and checked; ``opt_level``
    and ``fusion`` must be those the model will be compiled with (they decide the groups).
    ``confirm``: after the search, each task's ``confirm`` best configs are timed again
    beside the heuristic's, longer, and the best of those is the task's best (0: the
    search's fastest measurement is; a ``seconds`` budget keeps ``CONFIRM_SHARE`` for this).
    ``model_check``: last, the model is built with the heuristic's configs and with the best
    ones, and each tuned group's kernels are timed where they run, in the model, for
    ``check_rounds`` runs (:mod:`.model_check`); a config slower there than the heuristic's
    is not kept (``TuneResult.model`` says what the model gained; ``MODEL_CHECK_SHARE`` of a
    ``seconds`` budget is kept for it).
    ``callback`` gets a :class:`TuneProgress` after every round. Compile with
    ``opf.compile(mod, params=params, records=records)`` to use the best configs."""
    if trials < 0 or batch < 1:
        raise OpfusionError(f"tune needs trials >= 0 and batch >= 1, not {trials} and {batch}")
    start = time.monotonic()
    resolved = as_target(target)
    active = make_runner(runner, resolved)  # a GPU target without a GPU fails here, early
    tasks = extract_tasks(mod, params, resolved, opt_level, fusion)
    store = _records(records)
    own_runner = isinstance(runner, str)
    state = _Tuning(tasks, [TaskSearch(t, seed + i) for i, t in enumerate(tasks)], store,
                    active, options or MeasureOptions(), target_key(resolved), batch, workers,
                    [0] * len(tasks), [0.0] * len(tasks))
    _resume(state)
    try:
        search_seconds = None if seconds is None else seconds * (
            1 - (CONFIRM_SHARE if confirm else 0) - (MODEL_CHECK_SHARE if model_check else 0))
        _search(state, trials, search_seconds, start, callback)
        if confirm:
            for index in range(len(tasks)):
                state.confirm(index, confirm)
    finally:
        if own_runner:
            active.close()
    checked = None
    if model_check and resolved.device != "cuda":  # (GPU builds run through their own executor)
        checked = check_in_model(mod, params, resolved, tasks, store, opt_level, fusion,
                                 check_rounds, active.name)
    return TuneResult([state.result(i) for i in range(len(tasks))], state.trials,
                      time.monotonic() - start, store, checked)


def _records(records: str | TuningRecords | None) -> TuningRecords:
    if records is None:
        return TuningRecords()
    if isinstance(records, TuningRecords):
        return records
    return TuningRecords.load(records, create=True)


def make_runner(runner: str | Runner, target: Target | None = None) -> Runner:
    """``"local"`` or ``"ray"`` as a runner for ``target`` (a Runner is returned as it is).
    For a CUDA target, ``"local"`` is this machine's GPU (a
    :class:`~opfusion.autotune.gpu_runner.GPURunner`; a DeviceError without one)."""
    if isinstance(runner, Runner):
        return runner
    if target is not None and target.device == "cuda":
        if runner != "local":
            raise DeviceError(f"target {target}: GPU candidates are measured on this "
                              f"machine's GPU (runner='local'), not with runner {runner!r}")
        from ..backend.cuda.runtime import cuda_device
        from .gpu_runner import GPURunner

        return GPURunner(cuda_device())
    if runner == "local":
        return LocalRunner()
    if runner == "ray":
        from .ray_runner import RayRunner

        return RayRunner()
    raise OpfusionError(f"unknown runner {runner!r}: use 'local', 'ray' or a Runner")


def _resume(state: _Tuning) -> None:
    """Feed the records already kept for these tasks to their searches (configs outside a
    task's space now, e.g. from another opfusion version, are ignored)."""
    for search in state.searches:
        task = search.task
        for record in state.records.for_task(task.key, state.target):
            if record.rule != task.rule or record.knobs not in task.space:
                continue
            config = task.space.check(record.knobs)
            if record.in_model:
                continue  # the model check's times: another scale, and the check's to read
            if record.confirmed:
                if record.ok:
                    search.confirm(config, record.seconds)
                continue
            if search.tried(config):
                continue
            features = search.features(config) if record.ok else None
            search.add(config, record.seconds, record.error, features)


def _search(state: _Tuning, trials: int, seconds: float | None, start: float,
            callback: Callable[[TuneProgress], None] | None) -> None:
    """Rounds until the trials or the time are spent or every space is measured: first one
    round per task (heaviest first), then by priority."""
    first = list(range(len(state.tasks)))
    while state.trials < trials and state.tasks:  # (a model with nothing to tune has none)
        if seconds is not None and time.monotonic() - start >= seconds:
            break
        if first:
            index = first.pop(0)
        else:
            index = max(range(len(state.tasks)), key=lambda i: (state.priority(i), -i))
            if state.priority(index) < 0:
                break
        count = state.run_round(index, min(state.batch, trials - state.trials))
        if count == 0:
            continue
        if callback is not None:
            results = [state.result(i) for i in range(len(state.tasks))]
            estimate = TuneResult(results, state.trials, 0.0, state.records)
            callback(TuneProgress(state.trials, trials, time.monotonic() - start,
                                  results[index], estimate.estimated_seconds(True),
                                  estimate.estimated_seconds(False)))
