"""Progress of long commands: a spinner (rich) or a bar (tqdm) on a terminal when either is
installed, plain lines on a terminal without them, log records always.

Neither rich nor tqdm is a dependency: each is imported only when a display is made. Stages
are logged at INFO and steps (passes) at DEBUG through the ``opfusion.cli`` logger, so
``opfusion -v`` shows the stages and ``-vv`` every pass wherever stderr goes."""

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
from .terminal import printable
from .transform import PassContext, PassInstrument
from .transform.context import DEFAULT_OPT_LEVEL

log = logging.getLogger("opfusion.cli")




class Progress:
    """What a long command is doing. This base class only logs (stages at INFO, steps at
    DEBUG); the subclasses also draw on a terminal (:func:`make_progress` picks one)."""

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

    def _draw(self, text: str, stage: bool) -> None:
        pass

    def close(self) -> None:
        """The work is done: remove what was drawn (safe to call more than once)."""


class _PlainProgress(Progress):
    def _draw(self, text: str, stage: bool) -> None:
        if stage:
            print(f"opfusion: {text}", file=sys.stderr, flush=True)


class _RichProgress(Progress):
    def __init__(self, rich_console: Any) -> None:
        from rich.markup import escape

        self._escape = escape  # rich reads "[red]" in a status as markup; a path may hold it
        self._status: Any = rich_console.Console(stderr=True).status("opfusion")
        self._status.start()

    def _draw(self, text: str, stage: bool) -> None:
        if self._status is not None:
            self._status.update(f"opfusion: {self._escape(text)}")

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


class _TqdmProgress(Progress):
    def __init__(self, tqdm: Any) -> None:
        self._bar: Any = tqdm(total=None, file=sys.stderr, leave=False,
                              bar_format="{desc} [{elapsed}]")

    def _draw(self, text: str, stage: bool) -> None:
        if self._bar is not None:
            self._bar.set_description_str(f"opfusion: {text}")

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
    """A spinner (rich) or a bar (tqdm) when stderr is a terminal and either is installed;
    plain lines on a terminal without them (unless ``verbose``: the log says the same); only
    log records otherwise."""
    if not sys.stderr.isatty():
        return Progress()
    try:
        import rich.console

        return _RichProgress(rich.console)
    except ImportError:
        pass
    try:
        from tqdm import tqdm

        return _TqdmProgress(tqdm)
    except ImportError:
        pass
    return Progress() if verbose else _PlainProgress()


def compile_with_progress(verbose: int, mod: Any, params: Any = None,
                          opt_level: int = DEFAULT_OPT_LEVEL, fusion: str = "tvm",
                          verify: bool = False, label: str = "", target: Any = None) -> Any:
    """``opf.compile`` (for ``target``; None: the host) showing each pass and stage (see
    :func:`make_progress`)."""
    prefix = f"{label}: " if label else ""

    class _Report(PassInstrument):
        # The pass instruments of opf.compile's PassContext are the only window into it.
        def run_before_pass(self, mod: Any, info: Any) -> None:
            progress.update(f"{prefix}{info.name}")

        def run_after_pass(self, mod: Any, info: Any, seconds: float) -> None:
            if info.name in ("FuseOps", "FusionMerge"):
                text = f"{prefix}{info.name} made {count_groups(mod)} groups"
                if fusion != "cinn" or info.name == "FusionMerge":
                    text += "; generating C and compiling the kernels"
                progress.stage(text)

    start = time.perf_counter()
    with showing_progress(verbose) as progress, \
            PassContext(opt_level=opt_level, instruments=[_Report()]):
        progress.stage(f"{prefix}optimizing (opt level {opt_level}, fusion {fusion})")
        exe = opf_compile(mod, target=target, params=params, opt_level=opt_level,
                          fusion=fusion, verify=verify)
    log.info("%scompiled %d kernels in %.2f s", prefix, exe.num_kernels,
             time.perf_counter() - start)
    return exe


def count_groups(mod: Any) -> int:
    """Calls of primitive functions (fused groups) in ``@main``."""
    return sum(1 for node in post_order(mod["main"].body, into_functions=False)
               if isinstance(node, Call) and isinstance(node.op, Function))
