"""The search of one task's config space: an evolutionary proposal ranked by a cost model.

Each round, :meth:`TaskSearch.propose` gathers a pool of unmeasured configs — mutations of
the best ones measured so far (one or two knobs moved to a neighbouring or random candidate
value) and fresh random points of the space — lowers each to loop IR for its features
(:mod:`.features`), ranks the pool by the task's cost model (:mod:`.cost_model`, trained on
every measurement of the task so far) and returns the best-ranked few plus a few random ones
(exploration: the model only knows what it has seen). The first round holds the heuristic's
config, so the best a task reports is never slower than untuned."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np

from ..backend import get_backend
from ..backend.schedule_rule import Config
from ..compiler.lower_group import lower_primitive_function
from ..errors import OpfusionError
from .cost_model import CostModel, default_cost_model
from .features import candidate_features
from .task import Task

#: Pool size per proposed config: the model ranks this many candidates for each it keeps.
POOL_FACTOR = 4
#: Share of each round drawn at random from the pool rather than by the model's rank.
EXPLORE_SHARE = 0.25
#: How many of the best measured configs seed the mutations.
PARENTS = 4


class TaskSearch:
    """The search state of one task: what was measured, what failed, the cost model."""

    def __init__(self, task: Task, seed: int = 0,
                 model_factory: Callable[[], CostModel] = default_cost_model) -> None:
        self.task = task
        self.rng = random.Random(seed)
        self.model = model_factory()
        self.seconds: dict[Config, float] = {}
        self.failed: dict[Config, str] = {}
        self.confirmed: dict[Config, float] = {}
        self._features: dict[Config, np.ndarray] = {}
        self._points = list(task.space)
        self._position = {c: i for i, c in enumerate(self._points)}
        self._dirty = False

    # -- what is known -----------------------------------------------------------------------

    @property
    def trials(self) -> int:
        return len(self.seconds) + len(self.failed)

    @property
    def exhausted(self) -> bool:
        return self.trials >= len(self._points)

    def best(self) -> tuple[Config, float] | None:
        """The fastest correct config measured and its time: among the confirmed ones when
        there are (see :meth:`confirm`)."""
        times = self.confirmed or self.seconds
        if not times:
            return None
        config = min(times, key=lambda c: (times[c], self._index(c)))
        return config, times[config]

    def confirm(self, config: Config, seconds: float) -> None:
        """Record a confirmation: ``config`` timed again beside the others confirmed."""
        self.confirmed[config] = seconds

    def tried(self, config: Config) -> bool:
        return config in self.seconds or config in self.failed

    def add(self, config: Config, seconds: float | None, error: str | None = None,
            features: np.ndarray | None = None) -> None:
        """Record one measurement (``seconds``) or failure (``error``)."""
        if seconds is None:
            self.failed[config] = error or "failed"
            return
        self.seconds[config] = seconds
        if features is not None:
            self._features[config] = features
        self._dirty = True

    # -- proposals ----------------------------------------------------------------------------

    def propose(self, count: int) -> list[Config]:
        """Up to ``count`` unmeasured configs to measure next (the default first, while it is
        unmeasured)."""
        chosen: list[Config] = []
        if not self.tried(self.task.default):
            chosen.append(self.task.default)
        want = count - len(chosen)
        if want <= 0:
            return chosen
        pool = [c for c in self._pool(want * POOL_FACTOR) if c not in chosen]
        if len(pool) <= want:
            return chosen + pool
        self._train()
        explore = min(len(pool), max(1, round(want * EXPLORE_SHARE))) if self.seconds else want
        ranked = self._rank(pool) if explore < want else []
        picks = ranked[:want - explore]
        rest = [c for c in pool if c not in picks and not self.tried(c)]
        picks += self.rng.sample(rest, min(explore, len(rest)))
        return chosen + picks

    def _pool(self, size: int) -> list[Config]:
        """Unmeasured configs: mutations of the best measured ones, then random points."""
        pool: dict[Config, None] = {}
        parents = sorted(self.seconds, key=lambda c: self.seconds[c])[:PARENTS]
        attempts = 0
        while parents and len(pool) < size // 2 and attempts < size * 8:
            attempts += 1
            child = self._mutate(self.rng.choice(parents))
            if child is not None and not self.tried(child):
                pool[child] = None
        untried = [c for c in self._points if not self.tried(c) and c not in pool]
        room = size - len(pool)
        for config in self.rng.sample(untried, min(room, len(untried))):
            pool[config] = None
        return list(pool)

    def _mutate(self, parent: Config) -> Config | None:
        """``parent`` with one or two knobs moved: to a neighbouring candidate value mostly,
        to any candidate value sometimes; None when the result is outside the space."""
        values = dict(parent)
        knobs = [k for k in self.task.space.knobs if len(k.values) > 1]
        if not knobs:
            return None
        for knob in self.rng.sample(knobs, min(len(knobs), self.rng.choice((1, 1, 2)))):
            index = knob.values.index(values[knob.name])
            if self.rng.random() < 0.7:
                index = min(max(index + self.rng.choice((-1, 1)), 0), len(knob.values) - 1)
            else:
                index = self.rng.randrange(len(knob.values))
            values[knob.name] = knob.values[index]
        try:
            return self.task.space.check(Config(values, self.task.space.rule))
        except OpfusionError:
            return None

    def _train(self) -> None:
        if not self._dirty:
            return
        measured = [c for c in self.seconds if c in self._features]
        if measured:
            features = np.stack([self._features[c] for c in measured])
            self.model.fit(features, np.array([self.seconds[c] for c in measured]))
        self._dirty = False

    def _rank(self, pool: list[Config]) -> list[Config]:
        """``pool`` best predicted first (ties in space order); a config that does not lower
        is recorded as failed and left out."""
        lowered = []
        for config in pool:
            try:
                self.features(config)
                lowered.append(config)
            except OpfusionError as err:
                self.failed[config] = f"build: {err}"
        pool = lowered
        if not pool:
            return []
        scores = self.model.predict(np.stack([self.features(c) for c in pool]))
        order = sorted(range(len(pool)), key=lambda i: (-scores[i], self._index(pool[i])))
        return [pool[i] for i in order]

    def features(self, config: Config, prim_func: object = None) -> np.ndarray:
        """The cost model's features of ``config`` (lowered here unless ``prim_func`` is
        given), cached."""
        cached = self._features.get(config)
        if cached is None:
            if prim_func is None:
                prim_func = lower_primitive_function(
                    self.task.func, "features", get_backend(self.task.target), config).prim_func
            cached = candidate_features(prim_func, config, self.task.space)
            self._features[config] = cached
        return cached

    def _index(self, config: Config) -> int:
        return self._position.get(config, len(self._points))
