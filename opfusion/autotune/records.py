"""Tuning records: a JSON-lines file, one measured candidate per line.

Each line is an object::

    {"version": 1, "task": "<32 hex>", "target": "c -mcpu=... cores=2", "rule": "conv2d_nchwc",
     "knobs": {"channel_tile": 4, ...}, "seconds": 0.00067, "error": null,
     "ops": ["nn.conv2d_nchwc", "add"], "weight": 6, "runner": "local", "time": 1764172800.0,
     "confirmed": false, "in_model": false}

``seconds`` is the kernel's median time when it ran and matched the reference (on the scale
of the task's heuristic config's first measured time: every later candidate is timed beside
the heuristic and scaled by it), else null with ``error`` saying why (``build:``,
``crashed:``, ``timeout:``, ``wrong:``, ``failed:``). ``confirmed`` marks the times of a
tuning run's last step, which times the few best configs of each task again, longer and side
by side with the heuristic's: the best confirmed record is the task's best, unless
``in_model`` records say otherwise. Those come from the model check (:mod:`.model_check`),
which times the tuned and the heuristic's kernels where they run, in the whole model, one
after another, and has the last word: a config that wins alone, with its caches to itself,
can lose in the model's sequence. Lines are only ever appended, so a tuning run that stops
anywhere leaves a usable file, and a second run with the same file continues from it.

A records file is read as untrusted data: a line that is not such an object (a damaged
write, another program's file, hostile values) is skipped with a warning naming the line,
and the config a record names is checked against the group's config space before
``opf.compile`` uses it (a schedule outside the space is never built)."""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backend.schedule_rule import Config
from ..errors import OpfusionError

logger = logging.getLogger("opfusion.autotune")

RECORD_VERSION = 1

#: Bounds on what a record may hold, so a hostile file cannot make a reader hold much.
MAX_LINE_BYTES = 1 << 16
MAX_KNOBS = 64

_TASK_KEY = re.compile(r"^[0-9a-f]{32}$")


class RecordsError(OpfusionError):
    """A records file that cannot be opened or written."""


@dataclass(frozen=True)
class Record:
    """One measured candidate (see the module docstring)."""

    task: str
    target: str
    rule: str
    knobs: dict[str, Any]
    seconds: float | None
    error: str | None = None
    ops: tuple[str, ...] = ()
    weight: int = 1
    runner: str = ""
    time: float = 0.0
    confirmed: bool = False
    in_model: bool = False

    @property
    def ok(self) -> bool:
        return self.seconds is not None and self.error is None

    @property
    def config(self) -> Config:
        return Config(self.knobs, self.rule)

    def to_json(self) -> str:
        return json.dumps({"version": RECORD_VERSION, "task": self.task, "target": self.target,
                           "rule": self.rule, "knobs": self.knobs, "seconds": self.seconds,
                           "error": self.error, "ops": list(self.ops), "weight": self.weight,
                           "runner": self.runner, "time": self.time,
                           "confirmed": self.confirmed, "in_model": self.in_model})


def parse_record(line: str) -> Record:
    """The record on one line; ValueError saying what is wrong with it otherwise."""
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"longer than {MAX_LINE_BYTES} characters")
    data = json.loads(line)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("version") != RECORD_VERSION:
        raise ValueError(f"version {data.get('version')!r}, this opfusion reads "
                         f"{RECORD_VERSION}")
    task, target, rule = data.get("task"), data.get("target"), data.get("rule")
    if not isinstance(task, str) or not _TASK_KEY.match(task):
        raise ValueError(f"task {task!r} is not a task key")
    if not isinstance(target, str) or not isinstance(rule, str):
        raise ValueError("target and rule must be strings")
    knobs = data.get("knobs")
    if not isinstance(knobs, dict) or len(knobs) > MAX_KNOBS or not all(
            isinstance(k, str) and isinstance(v, (int, str)) for k, v in knobs.items()):
        raise ValueError("knobs must be an object of ints, bools and strings")
    seconds, error = data.get("seconds"), data.get("error")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not math.isfinite(seconds) or seconds <= 0):
        raise ValueError(f"seconds {seconds!r} is not a positive time")
    if error is not None and not isinstance(error, str):
        raise ValueError("error must be a string or null")
    if seconds is None and error is None:
        raise ValueError("neither a time nor an error")
    ops = data.get("ops", [])
    weight = data.get("weight", 1)
    if not isinstance(ops, list) or not all(isinstance(o, str) for o in ops):
        raise ValueError("ops must be a list of operator names")
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
        raise ValueError(f"weight {weight!r} is not a positive count")
    stamp = data.get("time", 0.0)
    confirmed = data.get("confirmed", False)
    in_model = data.get("in_model", False)
    if not isinstance(confirmed, bool) or not isinstance(in_model, bool):
        raise ValueError("confirmed and in_model must be true or false")
    return Record(task, target, rule, dict(knobs), None if seconds is None else float(seconds),
                  error, tuple(ops), weight, str(data.get("runner", "")),
                  float(stamp) if isinstance(stamp, (int, float)) else 0.0, confirmed,
                  in_model)


@dataclass
class TuningRecords:
    """The records of one file (or none: ``TuningRecords()``), by task and target.

    ``opf.compile(..., records=TuningRecords.load(path))`` (or the path itself) builds each
    group with :meth:`best`; :meth:`append` adds a record and, with a ``path``, writes its
    line at once."""

    path: Path | None = None
    records: list[Record] = field(default_factory=list)
    skipped: int = 0
    _best: dict[tuple[str, str], Record] = field(default_factory=dict, repr=False)
    _confirmed: dict[tuple[str, str], Record] = field(default_factory=dict, repr=False)
    _in_model: dict[tuple[str, str], Record] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: str | os.PathLike[str], create: bool = False) -> TuningRecords:
        """The records of the file at ``path`` (an empty set when it does not exist and
        ``create``; else a RecordsError). Bad lines are skipped with a warning."""
        file = Path(path)
        records = cls(file)
        if not file.exists():
            if create:
                return records
            raise RecordsError(f"no tuning records at {file}; run `opfusion tune` (or "
                               f"opf.tune) to write them")
        try:
            with open(file, encoding="utf-8", errors="replace") as stream:
                records._read(stream, str(file))
        except OSError as err:
            raise RecordsError(f"cannot read tuning records {file}: {err}") from None
        return records

    def _read(self, lines: Iterable[str], where: str) -> None:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = parse_record(line)
            except (ValueError, RecursionError) as err:
                self.skipped += 1
                logger.warning("%s line %d is not a tuning record (%s); skipped", where,
                               number, str(err)[:200])
                continue
            self._add(record)

    def _add(self, record: Record) -> None:
        self.records.append(record)
        if record.ok:
            key = (record.task, record.target)
            table = (self._in_model if record.in_model
                     else self._confirmed if record.confirmed else self._best)
            best = table.get(key)
            if best is None or record.seconds < best.seconds:  # type: ignore[operator]
                table[key] = record

    def append(self, record: Record) -> None:
        """Add ``record`` and append its line to the file (when there is one)."""
        if self.path is not None:
            try:
                with open(self.path, "a", encoding="utf-8") as stream:
                    stream.write(record.to_json() + "\n")
            except OSError as err:
                raise RecordsError(f"cannot write tuning records {self.path}: {err}") from None
        self._add(record)

    def best(self, task: str, target: str, in_model: bool = True) -> Record | None:
        """The fastest correct record of ``task`` on ``target``, if any: among the model
        check's when there are (and ``in_model``), else among the confirmed ones when there
        are (a search's fastest of hundreds of noisy measurements is too often lucky; a
        confirmation times the few best again, side by side)."""
        key = (task, target)
        checked = self._in_model.get(key) if in_model else None
        return checked or self._confirmed.get(key) or self._best.get(key)

    def for_task(self, task: str, target: str) -> Iterator[Record]:
        """Every record (failed ones too) of ``task`` on ``target``, in file order."""
        return (r for r in self.records if r.task == task and r.target == target)

    def __len__(self) -> int:
        return len(self.records)


def as_records(records: TuningRecords | str | os.PathLike[str] | None
               ) -> TuningRecords | None:
    """``records`` as a TuningRecords (a path is loaded; None stays None)."""
    if records is None or isinstance(records, TuningRecords):
        return records
    if isinstance(records, (str, os.PathLike)):
        return TuningRecords.load(records)
    raise RecordsError(f"records must be a path or TuningRecords, not {type(records).__name__}")
