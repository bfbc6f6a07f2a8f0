"""Runners: where candidates are measured. :class:`LocalRunner` uses a worker process on
this machine; :class:`~opfusion.autotune.ray_runner.RayRunner` spreads tasks over a Ray
cluster. Both answer :meth:`Runner.run` with one :class:`MeasureResult` per candidate, in
order, and measure one candidate at a time per machine."""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from .measure import Candidate, MeasureOptions, MeasureResult, TaskData, compile_candidates
from .worker import _LENGTH, MeasureRequest, write_message

logger = logging.getLogger("opfusion.autotune")


class Runner(ABC):
    """Measures built candidates of one task (see :mod:`opfusion.autotune.measure`)."""

    name = "runner"

    @abstractmethod
    def run(self, data: TaskData, candidates: Sequence[Candidate],
            options: MeasureOptions) -> list[MeasureResult]:
        """One result per candidate, in order; candidates that failed to build are failed
        results without being run."""

    def build(self, candidates: Sequence[Candidate], workers: int | None = None) -> None:
        """Compile the candidates' libraries where they will be measured (here: on
        ``workers`` threads); a failure sets the candidate's ``error``."""
        compile_candidates(candidates, workers)

    def close(self) -> None:  # noqa: B027 - a runner without processes has none to release
        """Release the runner's processes (it may be used again: they restart)."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def result_of(candidate: Candidate, answer: tuple[Any, ...]) -> MeasureResult:
    """The result of a worker's answer to one candidate: its time, or a failure named by its
    kind (``crashed:``, ``timeout:``, ``wrong:`` for other numbers, ``failed:``)."""
    if answer[0] == "ok":
        return MeasureResult(candidate.config, seconds=answer[1], repeats=list(answer[2]))
    message = str(answer[1])
    if not message.startswith(("crashed:", "timeout:")):
        kind = "wrong" if message.startswith("ValueError") else "failed"
        message = f"{kind}: {message}"
    logger.debug("candidate %s: %s", dict(candidate.config), message)
    return MeasureResult(candidate.config, error=message)


def request_for(candidate: Candidate, options: MeasureOptions) -> MeasureRequest:
    return MeasureRequest(candidate.source, candidate.entry_name, candidate.params,
                          candidate.flags, options)


class WorkerProcess:
    """One ``python -m opfusion.autotune.worker`` and the task it holds; restarted after a
    candidate kills it or hangs."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.task: str | None = None

    def start(self) -> None:
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH"))
                                            if p)
        self.proc = subprocess.Popen([sys.executable, "-m", "opfusion.autotune.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env)
        self.task = None

    def measure(self, data: TaskData, request: MeasureRequest) -> tuple[Any, ...]:
        """``("ok", seconds, repeats)`` or ``("error", message)`` for one candidate."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        if self.task != data.key:
            answer = self._ask(("task", data), request.options.timeout)
            if answer[0] != "ok":
                return answer
            self.task = data.key
        return self._ask(("measure", request), request.options.timeout)

    def _ask(self, message: tuple[Any, ...], timeout: float) -> tuple[Any, ...]:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            write_message(self.proc.stdin, message)
            return self._answer(time.monotonic() + timeout, timeout)
        except (BrokenPipeError, EOFError):
            return ("error", f"crashed: {self._exit_reason()}")

    def _answer(self, deadline: float, timeout: float) -> tuple[Any, ...]:
        header = self._read(_LENGTH.size, deadline)
        if header is None:
            self.kill()
            return ("error", f"timeout: no result within {timeout:g} s (killed)")
        data = self._read(_LENGTH.unpack(header)[0], deadline)
        if data is None:
            self.kill()
            return ("error", f"timeout: no result within {timeout:g} s (killed)")
        return pickle.loads(data)  # our own worker's answer over a private pipe

    def _read(self, count: int, deadline: float) -> bytes | None:
        """``count`` bytes of the worker's answers, or None at the deadline; EOFError when
        the worker exits."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        chunks: list[bytes] = []
        have = 0
        while have < count:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, count - have)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            have += len(chunk)
        return b"".join(chunks)

    def _exit_reason(self) -> str:
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            return "the worker stopped answering"
        self.proc = None
        if code < 0:
            try:
                return f"the worker died of {signal.Signals(-code).name}"
            except ValueError:
                return f"the worker died of signal {-code}"
        return f"the worker exited with status {code}"

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
        self.task = None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                write_message(self.proc.stdin, ("stop",))
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        self.task = None


class LocalRunner(Runner):
    """Measures on this machine, one candidate at a time, in a worker process that a crashing
    or hanging candidate cannot take the tuner down with."""

    name = "local"

    def __init__(self) -> None:
        self._worker = WorkerProcess()

    def run(self, data: TaskData, candidates: Sequence[Candidate],
            options: MeasureOptions) -> list[MeasureResult]:
        return [self.run_one(data, c, options) for c in candidates]

    def run_one(self, data: TaskData, candidate: Candidate,
                options: MeasureOptions) -> MeasureResult:
        if candidate.error is not None:
            return MeasureResult(candidate.config, error=candidate.error)
        return result_of(candidate, self._worker.measure(data, request_for(candidate, options)))

    def close(self) -> None:
        self._worker.close()
