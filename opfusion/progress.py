"""Progress of long commands: a bar (tqdm) on a terminal when tqdm is installed, plain lines
on a terminal without it, log records always; and how long each stage took.

tqdm is optional (``pip install opfusion[progress]``): it is imported only when a display is
made. Stages are logged at INFO and steps (passes, compiled C units) at DEBUG through the
``opfusion.cli`` logger, so ``opfusion -v`` shows the stages and ``-vv`` every pass wherever
stderr goes. A :class:`Progress` is also the compile's stage listener
(:mod:`opfusion.stages`): it draws how many translation units the C compiler has done, and
its ``times`` record the seconds of every stage."""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

from .compiler.compile import compile as opf_compile
from .ir.expr import Call, Function
from .ir.visitor import post_order
from .stages import StageListener, StageTimes, listening
from .terminal import printable
from .transform import PassContext, PassInstrument
from .transform.context import DEFAULT_OPT_LEVEL

log = logging.getLogger("opfusion.cli")


class Progress(StageListener):
    """What a long command is doing. This base class only logs (stages at INFO, steps at
    DEBUG) and times the stages (``times``); the subclasses also draw on a terminal
    (:func:`make_progress` picks one)."""

    def __init__(self) -> None:
        self.times = StageTimes()

    def update(self, text: str) -> None:
        """A new step began (a pass, say)."""
        text = printable(text, keep_newlines=False)
        log.debug(text)
        self._draw(text, stage=False)

    def stage(self, text: str) -> None:
        """A new stage of the pipeline began (the text may hold a model's path or names: it is
        made printable, on one line, before any display draws it)."""
        text = printable(text, keep_newlines=False)
        log.info(text)
        self._draw(text, stage=True)

    # -- the compile's stage reports (opfusion.stages) --------------------------------------

    def begin(self, name: str) -> None:
        self.times.begin(name)
        self.update(name)

    def end(self, name: str) -> None:
        self.times.end(name)

    def units(self, done: int, total: int) -> None:
        log.debug("C compiler: %d of %d translation units compiled", done, total)
        self._draw_units(done, total)

    # -- drawing ----------------------------------------------------------------------------

    def _draw(self, text: str, stage: bool) -> None:
        pass

    def _draw_units(self, done: int, total: int) -> None:
        pass

    def close(self) -> None:
        """The work is done: remove what was drawn (safe to call more than once)."""


class _PlainProgress(Progress):
    def _draw(self, text: str, stage: bool) -> None:
        if stage:
            print(f"opfusion: {text}", file=sys.stderr, flush=True)

    def _draw_units(self, done: int, total: int) -> None:
        # A line per quarter at most: a build on many cores has as many units.
        if done == 0 or done * 4 // total != (done - 1) * 4 // total:
            print(f"opfusion: C compiler: {done}/{total} units" if done else
                  f"opfusion: C compiler: {total} units, compiled at once",
                  file=sys.stderr, flush=True)


class _TqdmProgress(Progress):
    """One line: the current stage and its elapsed time; a bar of units during a C build."""

    _PLAIN = "{desc} [{elapsed}]"
    _BAR = "{desc} {bar} {n_fmt}/{total_fmt} units [{elapsed}]"

    def __init__(self, tqdm: Any) -> None:
        super().__init__()
        # Drawn at every change (mininterval 0): a change is a stage, a pass or a unit.
        self._bar: Any = tqdm(total=None, file=sys.stderr, leave=False, mininterval=0,
                              bar_format=self._PLAIN)

    def _draw(self, text: str, stage: bool) -> None:
        if self._bar is not None:
            self._bar.set_description_str(f"opfusion: {text}")

    def _draw_units(self, done: int, total: int) -> None:
        if self._bar is None:
            return
        if done == 0:
            self._bar.bar_format = self._BAR
            self._bar.reset(total=total)
            self._bar.set_description_str("opfusion: C compiler")
        else:
            self._bar.update(done - self._bar.n)
        if done == total:
            self._bar.bar_format = self._PLAIN
            self._bar.reset(total=None)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


@contextlib.contextmanager
def showing_progress(verbose: int) -> Iterator[Progress]:
    """A :func:`make_progress` display, removed when the block ends."""
    progress = make_progress(verbose)
    try:
        yield progress
    finally:
        progress.close()


def make_progress(verbose: int) -> Progress:
    """A bar (tqdm) when stderr is a terminal and tqdm is installed; plain lines on a
    terminal without it (unless ``verbose``: the log says the same); only log records
    otherwise."""
    if not sys.stderr.isatty():
        return Progress()
    try:
        from tqdm import tqdm
    except ImportError:
        return Progress() if verbose else _PlainProgress()
    return _TqdmProgress(tqdm)


def compile_with_progress(verbose: int, mod: Any, params: Any = None,
                          opt_level: int = DEFAULT_OPT_LEVEL, fusion: str = "tvm",
                          verify: bool = False, label: str = "", target: Any = None,
                          progress: Progress | None = None, records: Any = None) -> Any:
    """``opf.compile`` (for ``target``; None: the host) showing each pass and stage and the C
    build's progress (see :func:`make_progress`). With ``progress`` (a display the caller
    made, with :func:`showing_progress`, for a command that does more than compile), the
    compile draws on it and adds its stage times to ``progress.times``. ``records``: tuning
    records to take the groups' schedule configs from (see ``opf.compile``)."""
    prefix = f"{label}: " if label else ""

    class _Report(PassInstrument):
        # The pass instruments of opf.compile's PassContext are the only window into it.
        def run_before_pass(self, mod: Any, info: Any) -> None:
            shown.update(f"{prefix}{info.name}")

        def run_after_pass(self, mod: Any, info: Any, seconds: float) -> None:
            if info.name in ("FuseOps", "FusionMerge"):
                text = f"{prefix}{info.name} made {count_groups(mod)} groups"
                if fusion != "cinn" or info.name == "FusionMerge":
                    text += "; generating C and compiling the kernels"
                shown.stage(text)

    start = time.perf_counter()
    before = dict(progress.times.seconds) if progress is not None else None
    with contextlib.ExitStack() as stack:
        shown = progress or stack.enter_context(showing_progress(verbose))
        stack.enter_context(listening(shown))
        stack.enter_context(PassContext(opt_level=opt_level, instruments=[_Report()]))
        shown.stage(f"{prefix}optimizing (opt level {opt_level}, fusion {fusion})")
        exe = opf_compile(mod, target=target, params=params, opt_level=opt_level,
                          fusion=fusion, verify=verify, records=records)
    log.info("%scompiled %d kernels in %.2f s (%s)", prefix, exe.num_kernels,
             time.perf_counter() - start, shown.times.summary(before))
    return exe


def count_groups(mod: Any) -> int:
    """Calls of primitive functions (fused groups) in ``@main``."""
    return sum(1 for node in post_order(mod["main"].body, into_functions=False)
               if isinstance(node, Call) and isinstance(node.op, Function))
