"""Pass instruments: observers the PassContext notifies around every pass.

* :class:`PassTimingInstrument` — wall time per pass, nested under the Sequential that ran it;
  ``print(timing)`` shows the table.
* :class:`PrintIR` — prints the module before and/or after chosen passes.
* :class:`DumpIR` — writes the module after every pass to ``NNN_<pass>.txt`` in a directory,
  numbered in the order the passes ran.

Write your own by subclassing :class:`PassInstrument` and overriding what you need."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from ..ir.module import IRModule
from .pass_infra import PassInfo


class PassInstrument:
    """Hooks called by the pass infrastructure; every method does nothing by default."""

    def enter_pass_ctx(self) -> None:
        """The PassContext holding this instrument was entered."""

    def exit_pass_ctx(self) -> None:
        """The PassContext holding this instrument was left."""

    def should_run(self, mod: IRModule, info: PassInfo) -> bool:
        """Return False to skip the pass (the module passes through unchanged)."""
        return True

    def run_before_pass(self, mod: IRModule, info: PassInfo) -> None:
        """Called just before the pass runs on ``mod``."""

    def run_after_pass(self, mod: IRModule, info: PassInfo, seconds: float) -> None:
        """Called after the pass produced ``mod``, with the pass's own wall time."""


@dataclass
class PassTiming:
    """One run of one pass, with the runs it contained (a Sequential's passes)."""

    name: str
    seconds: float = 0.0
    children: list[PassTiming] = field(default_factory=list)


class PassTimingInstrument(PassInstrument):
    """Records the wall time of every pass. ``print(instrument)`` (or :meth:`render`) gives an
    indented table, one line per pass run, with the share of its parent's time."""

    def __init__(self) -> None:
        self.runs: list[PassTiming] = []
        self._open: list[PassTiming] = []

    def enter_pass_ctx(self) -> None:
        self.runs.clear()
        self._open.clear()

    def run_before_pass(self, mod: IRModule, info: PassInfo) -> None:
        run = PassTiming(info.name)
        (self._open[-1].children if self._open else self.runs).append(run)
        self._open.append(run)

    def run_after_pass(self, mod: IRModule, info: PassInfo, seconds: float) -> None:
        if self._open:
            self._open.pop().seconds = seconds

    def totals(self) -> dict[str, float]:
        """Seconds spent in each pass name (summed over runs, outermost runs only for nested
        passes of the same name), in first-run order."""
        totals: dict[str, float] = {}
        stack = list(reversed(self.runs))
        while stack:
            run = stack.pop()
            totals[run.name] = totals.get(run.name, 0.0) + run.seconds
            stack.extend(reversed(run.children))
        return totals

    def render(self) -> str:
        lines = ["pass timings:"]
        stack: list[tuple[PassTiming, int, float]] = [
            (run, 0, run.seconds) for run in reversed(self.runs)]
        while stack:
            run, depth, parent_seconds = stack.pop()
            share = 100.0 * run.seconds / parent_seconds if parent_seconds > 0 else 100.0
            lines.append(f"{'  ' * (depth + 1)}{run.name}: {run.seconds * 1e3:.3f} ms "
                         f"({share:.1f}%)")
            stack.extend((child, depth + 1, run.seconds) for child in reversed(run.children))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


class PrintIR(PassInstrument):
    """Print the module before and/or after passes (all passes, or those named in ``passes``)."""

    def __init__(self, passes: Iterable[str] | None = None, before: bool = False,
                 after: bool = True, stream: TextIO | None = None,
                 show_meta_data: bool = False) -> None:
        self.passes = None if passes is None else tuple(passes)
        self.before, self.after = before, after
        self.stream = stream
        self.show_meta_data = show_meta_data

    def _wanted(self, info: PassInfo) -> bool:
        return info.kind != "sequential" and (self.passes is None or info.name in self.passes)

    def _print(self, when: str, mod: IRModule, info: PassInfo) -> None:
        stream = self.stream or sys.stdout
        stream.write(f"# IR {when} {info.name}\n{mod.astext(self.show_meta_data)}\n")

    def run_before_pass(self, mod: IRModule, info: PassInfo) -> None:
        if self.before and self._wanted(info):
            self._print("before", mod, info)

    def run_after_pass(self, mod: IRModule, info: PassInfo, seconds: float) -> None:
        if self.after and self._wanted(info):
            self._print("after", mod, info)


class DumpIR(PassInstrument):
    """Write the module after every pass (not after the Sequentials that group them) to
    ``directory/NNN_<pass name>.txt``; ``000_input.txt`` holds the module the first pass saw.
    Entering the context again starts a fresh numbering in an emptied set of dump files."""

    def __init__(self, directory: str | os.PathLike[str],
                 show_meta_data: bool = False) -> None:
        self.directory = Path(directory)
        self.show_meta_data = show_meta_data
        self.count = 0
        self.files: list[Path] = []

    def enter_pass_ctx(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        for old in sorted(self.directory.glob("[0-9][0-9][0-9]_*.txt")):
            old.unlink()
        self.count = 0
        self.files = []

    def run_before_pass(self, mod: IRModule, info: PassInfo) -> None:
        if self.count == 0 and info.kind != "sequential":
            self._write("input", mod)

    def run_after_pass(self, mod: IRModule, info: PassInfo, seconds: float) -> None:
        if info.kind != "sequential":
            self._write(info.name, mod)

    def _write(self, label: str, mod: IRModule) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:80]
        path = self.directory / f"{self.count:03d}_{safe}.txt"
        path.write_text(mod.astext(self.show_meta_data) + "\n")
        self.files.append(path)
        self.count += 1
