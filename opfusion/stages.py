"""Stages of a compile, for whoever listens: where the time went, and how far the C build is.

The compiler marks its stages (``with stage("lower"): ...``) and the toolchain reports the
translation units it has compiled (:func:`units_done`). Nothing happens unless a caller
listens (``with listening(listener): opf.compile(...)``): the command line's progress display
does, to draw the C build's progress and print how long each stage took. The listener is a
context variable, so a compile in another thread does not report to it.

:class:`StageTimes` records the time of each stage exclusive of the stages inside it (the C
compiler runs inside "load kernels"), so its times add up to the whole."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar


class StageListener:
    """Receives a compile's stage reports; this base class ignores them."""

    def begin(self, name: str) -> None:
        """Stage ``name`` began (inside the stage that is running, if any)."""

    def end(self, name: str) -> None:
        """Stage ``name`` ended."""

    def units(self, done: int, total: int) -> None:
        """Of the ``total`` translation units of a C build, ``done`` are compiled (reported
        with 0 when the build starts, then after each unit)."""


_listener: ContextVar[StageListener | None] = ContextVar("opfusion_stage_listener",
                                                         default=None)


@contextlib.contextmanager
def listening(listener: StageListener) -> Iterator[StageListener]:
    """Send the stage reports of the compiles in this block to ``listener``."""
    token = _listener.set(listener)
    try:
        yield listener
    finally:
        _listener.reset(token)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Mark the block as stage ``name`` for the listener (if any)."""
    listener = _listener.get()
    if listener is None:
        yield
        return
    listener.begin(name)
    try:
        yield
    finally:
        listener.end(name)


def units_done(done: int, total: int) -> None:
    """Report the progress of a C build to the listener (if any)."""
    listener = _listener.get()
    if listener is not None:
        listener.units(done, total)


class StageTimes(StageListener):
    """Seconds spent in each stage, exclusive of the stages inside it, in the order the
    stages first began; time outside every stage is not counted."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._open: list[str] = []
        self._since = time.perf_counter()

    def begin(self, name: str) -> None:
        self._charge()
        self._open.append(name)
        self.seconds.setdefault(name, 0.0)

    def end(self, name: str) -> None:
        self._charge()
        if self._open and self._open[-1] == name:
            self._open.pop()

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` measured elsewhere (the interpreter's start-up, say)."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def total(self) -> float:
        """The sum of every stage's seconds."""
        return sum(self.seconds.values())

    def items(self, since: dict[str, float] | None = None,
              min_seconds: float = 0.005) -> list[str]:
        """``["start-up 0.31 s", "import ONNX 0.42 s", ...]``: the stages that took at least
        ``min_seconds`` (since ``since``, an earlier copy of ``seconds``, when given)."""
        before = since or {}
        spent = {name: seconds - before.get(name, 0.0) for name, seconds in self.seconds.items()}
        return [f"{name} {seconds:.2f} s" for name, seconds in spent.items()
                if seconds >= min_seconds]

    def summary(self, since: dict[str, float] | None = None) -> str:
        """The :meth:`items`, comma-separated."""
        return ", ".join(self.items(since))

    def _charge(self) -> None:
        now = time.perf_counter()
        if self._open:
            self.seconds[self._open[-1]] += now - self._since
        self._since = now
