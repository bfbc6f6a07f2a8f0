"""Schedule rules with knobs: the contract between a backend's schedules and a tuner.

A **schedule rule** arranges the loops of one fused group anchored at one of its operators
(``ops``). Everything it could choose differently (tile sizes, the register tile, unrolling,
the vector width, loop order, an algorithm) is a **knob**, declared as data: a name, the
candidate values and what it does. The knobs of one group make its :class:`ConfigSpace`;
one point of it is a :class:`Config` (a mapping knob -> value, JSON-serialisable)::

    rule = registry.find("nn.conv2d", anchor, output, target)   # (rule, space) or None
    space = rule.space(anchor, output, target)       # None: the rule declines this group
    config = rule.default_config(anchor, output, target)   # the heuristic, from the target
    for config in space.sample(8, seed=0): ...        # what a tuner tries
    rule.apply(s, anchor, output, target, config)

The candidates are legal for the group's shapes (divisors and the like), so *every* point of
a space computes the right numbers; only its speed differs. A config that is not a point of
the space (an unknown or missing knob, a value not among the candidates, a combination the
space's filter refuses) is a :class:`ScheduleError` naming the knob."""

from __future__ import annotations

import itertools
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BuildError

#: The JSON types a knob's value may have (a tuner writes and reads them back).
KnobValue = int | bool | str


class ScheduleError(BuildError):
    """A schedule config that does not fit its rule's space, or a rule that cannot apply."""


@dataclass(frozen=True)
class Knob:
    """One choice of a schedule rule: ``name``, its candidate ``values`` (in a fixed order,
    each legal for the group) and ``doc``, what it changes."""

    name: str
    values: tuple[KnobValue, ...]
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.values:
            raise ScheduleError(f"knob {self.name!r} has no candidate values")
        for value in self.values:
            if not isinstance(value, (int, str)):  # bool is an int
                raise ScheduleError(f"knob {self.name!r}: value {value!r} is not an int, bool "
                                    f"or str (configs are JSON)")


class Config(Mapping[str, KnobValue]):
    """One point of a :class:`ConfigSpace`: knob name -> value, in the space's knob order,
    with the ``rule`` it is for. Immutable, hashable, and JSON (``to_json``/``from_json``)."""

    def __init__(self, values: Mapping[str, KnobValue], rule: str = "") -> None:
        self._values = dict(values)
        self.rule = rule

    def __getitem__(self, name: str) -> KnobValue:
        if name not in self._values:
            raise ScheduleError(f"config of rule {self.rule!r} has no knob {name!r}; it has "
                                f"{', '.join(self._values) or 'none'}")
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        # (Mapping's own calls __getitem__ and expects a KeyError, not a ScheduleError)
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Config):
            return self.rule == other.rule and self._values == other._values
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.rule, tuple(self._values.items())))

    def __repr__(self) -> str:
        knobs = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"Config({self.rule}: {knobs})"

    def to_dict(self) -> dict[str, Any]:
        """``{"rule": name, "knobs": {knob: value, ...}}``: plain JSON data."""
        return {"rule": self.rule, "knobs": dict(self._values)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Config:
        """The config :meth:`to_dict` wrote (a ScheduleError for anything else)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("knobs"), Mapping):
            raise ScheduleError(f"a schedule config is {{'rule': ..., 'knobs': {{...}}}}, not "
                                f"{data!r}")
        rule = data.get("rule", "")
        if not isinstance(rule, str):
            raise ScheduleError(f"a schedule config's rule must be a name, not {rule!r}")
        for name, value in data["knobs"].items():
            if not isinstance(name, str) or not isinstance(value, (int, str)):
                raise ScheduleError(f"knob {name!r} of a config of rule {rule!r} has value "
                                    f"{value!r}; knob values are ints, bools or strings")
        return cls(data["knobs"], rule)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> Config:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ScheduleError(f"a schedule config is not JSON: {err}") from None
        return cls.from_dict(data)


def as_config(config: Any, rule: str) -> Config:
    """``config`` as a :class:`Config` for ``rule``: a Config already, its ``to_dict()``
    form, or a plain mapping of knob values."""
    if isinstance(config, Config):
        return config
    if isinstance(config, Mapping) and isinstance(config.get("knobs"), Mapping):
        return Config.from_dict(config)
    if isinstance(config, Mapping):
        return Config(config, rule)
    raise ScheduleError(f"a schedule config for rule {rule!r} is a Config or a mapping of "
                        f"knob values, not {config!r}")


class ConfigSpace:
    """The knobs of one rule for one group, in order: their product, less the combinations
    ``valid`` refuses (e.g. a register tile wider than the registers). Enumeration is in
    knob order (the last knob fastest) and deterministic; so is :meth:`sample`."""

    def __init__(self, rule: str, knobs: Sequence[Knob],
                 valid: Callable[[Mapping[str, KnobValue]], bool] | None = None) -> None:
        names = [k.name for k in knobs]
        if len(set(names)) != len(names):
            raise ScheduleError(f"rule {rule!r} declares a knob twice: {names}")
        self.rule = rule
        self.knobs = tuple(knobs)
        self.valid = valid
        self._points: list[Config] | None = None

    def knob(self, name: str) -> Knob:
        for knob in self.knobs:
            if knob.name == name:
                return knob
        raise ScheduleError(f"rule {self.rule!r} has no knob {name!r}; its knobs: "
                            f"{', '.join(k.name for k in self.knobs) or 'none'}")

    def __iter__(self) -> Iterator[Config]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, config: object) -> bool:
        if not isinstance(config, Mapping):
            return False
        try:
            self.check(config)
        except ScheduleError:
            return False
        return True

    def is_empty(self) -> bool:
        """Whether no combination of the knobs is valid: the first valid one ends the
        search, so that a rule can decline a group without enumerating a large space."""
        if self._points is not None:
            return not self._points
        names = [k.name for k in self.knobs]
        for values in itertools.product(*(k.values for k in self.knobs)):
            if self.valid is None or self.valid(dict(zip(names, values))):
                return False
        return True

    def _all(self) -> list[Config]:
        if self._points is None:
            names = [k.name for k in self.knobs]
            points = (dict(zip(names, values))
                      for values in itertools.product(*(k.values for k in self.knobs)))
            self._points = [Config(p, self.rule) for p in points
                            if self.valid is None or self.valid(p)]
        return self._points

    def sample(self, n: int, seed: int = 0) -> list[Config]:
        """``n`` distinct configs (all of them when the space is smaller), the same for the
        same seed, in enumeration order."""
        points = self._all()
        if n >= len(points):
            return list(points)
        picks = sorted(random.Random(seed).sample(range(len(points)), n))
        return [points[i] for i in picks]

    def config(self, **values: KnobValue) -> Config:
        """The config with these knob values (checked)."""
        return self.check(Config(values, self.rule))

    def check(self, config: Mapping[str, Any]) -> Config:
        """``config`` as a point of this space, or a ScheduleError naming what does not fit:
        another rule's config, an unknown or missing knob, a value not among a knob's
        candidates, or a combination the space refuses."""
        rule = getattr(config, "rule", self.rule) or self.rule
        if rule != self.rule:
            raise ScheduleError(f"a config of rule {rule!r} was given to rule {self.rule!r}")
        known = [k.name for k in self.knobs]
        for name in config:
            if name not in known:
                raise ScheduleError(f"rule {self.rule!r} has no knob {name!r}; its knobs: "
                                    f"{', '.join(known) or 'none'}")
        values: dict[str, KnobValue] = {}
        for knob in self.knobs:
            if knob.name not in config:
                raise ScheduleError(f"config of rule {self.rule!r} lacks knob {knob.name!r} "
                                    f"(one of {list(knob.values)})")
            value = config[knob.name]
            if not any(type(value) is type(v) and value == v for v in knob.values):
                raise ScheduleError(f"knob {knob.name!r} of rule {self.rule!r} cannot be "
                                    f"{value!r} for this group; candidates: "
                                    f"{list(knob.values)}")
            values[knob.name] = value
        if self.valid is not None and not self.valid(values):
            raise ScheduleError(f"rule {self.rule!r}: the combination {values} is outside "
                                f"its space ({self.valid.__doc__ or 'refused by its filter'})")
        return Config(values, self.rule)

    def __repr__(self) -> str:
        knobs = ", ".join(f"{k.name}={list(k.values)}" for k in self.knobs)
        return f"ConfigSpace({self.rule}: {knobs})"


class ScheduleRule(ABC):
    """Arranges the loops of a fused group anchored at one of ``ops``; see the module
    docstring. ``anchor`` is the anchor operator's result tensor, ``output`` the group's
    result (the anchor itself or an epilogue of it); ``target`` an :class:`opfusion.Target`.

    Subclasses define ``name``, ``ops``, :meth:`space` (None to decline a group),
    :meth:`default_config` (the heuristic: a point of the space, chosen from the target) and
    :meth:`apply`."""

    name: str = ""
    ops: tuple[str, ...] = ()

    @abstractmethod
    def space(self, anchor: Any, output: Any, target: Any) -> ConfigSpace | None:
        """The knobs for this group, or None when the rule does not schedule it."""

    @abstractmethod
    def default_config(self, anchor: Any, output: Any, target: Any) -> Config:
        """The config the heuristic picks for this group on ``target``."""

    @abstractmethod
    def apply(self, s: Any, anchor: Any, output: Any, target: Any, config: Config) -> None:
        """Arrange schedule ``s`` as ``config`` (a point of :meth:`space`) says."""

    def __repr__(self) -> str:
        return f"<schedule rule {self.name} for {', '.join(self.ops) or 'any group'}>"


class RuleRegistry:
    """The schedule rules of one backend, by anchor operator, in registration order, and its
    fallback (the default schedule, for groups no rule takes)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._rules: list[ScheduleRule] = []
        self.fallback: ScheduleRule | None = None

    def register(self, rule: ScheduleRule) -> ScheduleRule:
        if any(r.name == rule.name for r in self._rules):
            raise ScheduleError(f"{self.backend} already has a schedule rule {rule.name!r}")
        self._rules.append(rule)
        return rule

    def set_fallback(self, rule: ScheduleRule) -> ScheduleRule:
        self.fallback = rule
        return rule

    def rules(self, op_name: str | None = None) -> list[ScheduleRule]:
        """The rules for ``op_name`` (every rule, fallback excluded, for None)."""
        return [r for r in self._rules if op_name is None or op_name in r.ops]

    def get(self, name: str) -> ScheduleRule:
        """The rule (or the fallback) called ``name``."""
        for rule in [*self._rules, *([self.fallback] if self.fallback else [])]:
            if rule.name == name:
                return rule
        raise ScheduleError(f"{self.backend} has no schedule rule {name!r}")

    def find(self, op_name: str | None, anchor: Any, output: Any,
             target: Any) -> tuple[ScheduleRule, ConfigSpace] | None:
        """The first rule for ``op_name`` that does not decline the group, with its space."""
        if op_name is None:
            return None
        for rule in self.rules(op_name):
            space = rule.space(anchor, output, target)
            if space is not None:
                return rule, space
        return None


__all__ = ["Config", "ConfigSpace", "Knob", "KnobValue", "RuleRegistry", "ScheduleError",
           "ScheduleRule", "as_config"]
