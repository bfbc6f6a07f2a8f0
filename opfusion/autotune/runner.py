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
from .worker import HEADER, MeasureRequest, write_message

logger = logging.getLogger("opfusion.autotune")


class Runner(ABC):
    """Measures built candidates of one task (see :mod:`opfusion.autotune.measure`)."""

    name = "runner"

    @abstractmethod
    def run(self, data: TaskData, candidates: Sequence[Candidate], options: MeasureOptions,
            reference: Candidate | None = None) -> list[MeasureResult]:
        """One result per candidate, in order; candidates that failed to build are failed
        results without being run. With a ``reference`` (a candidate measured before), each
        result's ``reference`` is its time measured alongside them, for comparing
        measurements taken at different times."""

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
    if not message.startswith(("crashed:", "timeout:", "build:")):
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
        self.loaded: set[int] = set()

    def start(self) -> None:
        env = dict(os.environ)
        package_root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH"))
                                            if p)
        self.proc = subprocess.Popen([sys.executable, "-m", "opfusion.autotune.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env)
        self._forget()

    def ask(self, data: TaskData, message: tuple[Any, ...], timeout: float
            ) -> tuple[Any, ...]:
        """Send ``message`` about task ``data`` (starting the worker and giving it the task
        first when needed): the answer, ``("error", "crashed: ...")`` when the worker died or
        ``("error", "timeout: ...")`` when it was killed for taking longer than ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        if self.task != data.key:
            answer = self._ask(("task", data), timeout)
            if answer[0] != "ok":
                return answer
            self._forget()
            self.task = data.key
        answer = self._ask(message, timeout)
        if message[0] == "load" and answer[0] == "ok":
            self.loaded.add(message[1])
        return answer

    def _ask(self, message: tuple[Any, ...], timeout: float) -> tuple[Any, ...]:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            write_message(self.proc.stdin, message)
            return self._answer(time.monotonic() + timeout, timeout)
        except (BrokenPipeError, EOFError):
            return ("error", f"crashed: {self._exit_reason()}")

    def _answer(self, deadline: float, timeout: float) -> tuple[Any, ...]:
        header = self._read(HEADER.size, deadline)
        if header is None:
            self.kill()
            return ("error", f"timeout: no result within {timeout:g} s (killed)")
        data = self._read(HEADER.unpack(header)[0], deadline)
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
        self._forget()
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
        self._forget()

    def _forget(self) -> None:
        """A new (or no) worker process holds no task and no loaded candidate."""
        self.task = None
        self.loaded = set()

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
        self._forget()


class LocalRunner(Runner):
    """Measures on this machine in a worker process that a crashing or hanging candidate
    cannot take the tuner down with: each candidate is loaded and checked on its own, then
    the ones that passed are timed together, interleaved (:func:`.worker.time_interleaved`),
    with the ``reference`` candidate when one is given, so their times compare even on a
    machine whose speed drifts."""

    name = "local"

    def __init__(self) -> None:
        self._worker = WorkerProcess()

    def run(self, data: TaskData, candidates: Sequence[Candidate], options: MeasureOptions,
            reference: Candidate | None = None) -> list[MeasureResult]:
        everyone = [*candidates, *([reference] if reference is not None else [])]
        answers: dict[int, tuple[Any, ...]] = {}
        for key, candidate in enumerate(everyone):
            if candidate.error is not None:
                answers[key] = ("error", candidate.error)
            else:
                answers[key] = self._worker.ask(
                    data, ("load", key, request_for(candidate, options)), options.timeout)
        passed = [key for key, answer in answers.items() if answer[0] == "ok"]
        times = self._time(data, everyone, passed, options)
        for key in passed:
            answers[key] = times[key]
        results = [result_of(c, answers[k]) for k, c in enumerate(everyone)]
        if reference is not None:
            measured = results.pop()
            for result in results:
                result.reference = measured.seconds
        return results

    def _time(self, data: TaskData, everyone: Sequence[Candidate], keys: list[int],
              options: MeasureOptions) -> dict[int, tuple[Any, ...]]:
        """The answers of timing ``keys`` interleaved; when that fails (a candidate that
        crashes or hangs only sometimes), each is timed on its own, so the failure is
        its own."""
        if not keys:
            return {}
        self._reload(data, everyone, keys, options)
        answer = self._worker.ask(data, ("time", keys, options),
                                  options.timeout * len(keys))
        if answer[0] == "ok":
            return {key: ("ok", *timed) for key, timed in zip(keys, answer[1])}
        if len(keys) == 1:
            return {keys[0]: answer}
        result = {}
        for key in keys:
            self._reload(data, everyone, [key], options)
            one = self._worker.ask(data, ("time", [key], options), options.timeout)
            result[key] = ("ok", *one[1][0]) if one[0] == "ok" else one
        return result

    def _reload(self, data: TaskData, everyone: Sequence[Candidate], keys: list[int],
                options: MeasureOptions) -> None:
        """Load ``keys`` again when the worker was restarted since (a crash loses them)."""
        if self._worker.proc is not None and self._worker.task == data.key and \
                self._worker.loaded >= set(keys):
            return
        for key in keys:
            self._worker.ask(data, ("load", key, request_for(everyone[key], options)),
                             options.timeout)

    def close(self) -> None:
        self._worker.close()
