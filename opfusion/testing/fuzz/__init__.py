"""Fuzzing the ONNX pipeline: seeded mutations of small valid models, each one imported,
compiled, run and checked against the reference interpreter in an isolated worker process.

The contract under test: for any bytes handed to ``from_onnx``, every stage either succeeds or
raises an :class:`~opfusion.errors.OpfusionError`. Anything else is a bug: another exception
type, a crash of the process (a signal), a hang, or a compiled model whose outputs differ from
the reference interpreter's ("wrong answer").

A case is fully determined by ``(seed, number)``: :func:`make_case` picks a seed model from
:data:`SEED_MODELS` and one to three mutations from :data:`MUTATIONS` with a
``random.Random`` seeded by both, so any outcome replays with :func:`run_case` in-process
(``python benchmarks/fuzz_models.py --case N --seed S`` shows its traceback). Cases numbered
below ``len(SEED_MODELS)`` are the unmutated seeds: the baseline must pass.

:func:`run_cases` runs cases in worker processes (``spawn``), one case at a time per worker: a
worker that dies is recorded as a crash with its signal and restarted, one that passes the
per-case timeout is killed and recorded as a hang. Workers run with one OpenMP thread and a
cap on their address space, so a model that declares a huge tensor fails inside the worker
instead of exhausting the machine."""

from __future__ import annotations

import contextlib
import faulthandler
import math
import multiprocessing
import os
import random
import resource
import signal
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait as wait_connections
from pathlib import Path
from typing import Any

import numpy as np

from ...ir.symbolic import SymbolicModule
from .mutations import _WEIGHTS, MUTATIONS, _mutate_bytes
from .seeds import SEED_MODELS

__all__ = [
    "MUTATIONS", "SEED_MODELS", "FuzzCase", "Outcome", "is_acceptable", "make_case",
    "run_case", "run_cases", "summarize",
]


# The outcome categories. Only the first two are acceptable.
OK = "ok"
OPFUSION_ERROR = "opfusion-error"
EXCEPTION = "exception"
WRONG_ANSWER = "wrong-answer"
CRASH = "crash"
HANG = "hang"
HARNESS = "harness-error"  # the fuzzer itself failed: a bug here, not in opfusion

# The finite values agree but NaN/Inf do not: the optimizer's algebra (batch norm folded into
# a scale and shift, x/c into x*(1/c)) legitimately propagates Inf and NaN differently from the
# model as written, so this is recorded as a kind of success, not a wrong answer.
NONFINITE = "non-finite values differ"

# A graph input with more elements than this is not fed (the run stage is skipped).
MAX_INPUT_ELEMENTS = 1 << 22
# Relative tolerance (to the largest magnitude of the reference output) of the comparison.
RTOL = 1e-3

# ---------------------------------------------------------------------------------------------
# cases


@dataclass(frozen=True)
class FuzzCase:
    """One fuzz case: the model's bytes and how they were made."""

    number: int
    seed: int
    model_name: str
    mutations: tuple[str, ...]
    data: bytes
    from_file: bool  # import from a file on disk (so external data is read) rather than bytes
    wide_ints: bool = False  # integer inputs drawn from [-16, 16): indices out of range
    fusion: str = "tvm"  # opf.compile's fusion strategy
    opt_level: int = 3


def make_case(number: int, seed: int = 0) -> FuzzCase:
    """Build case ``number`` of the run seeded ``seed``: deterministic in both.

    Cases below ``len(SEED_MODELS)`` are the seed models themselves; the others are a seed
    model with one mutation (most cases), two or three, and occasionally byte-level damage
    of the serialized model, out-of-range integer feeds, or another fusion strategy and
    opt_level for the compile."""
    names = list(SEED_MODELS)
    if number < len(names):
        model = SEED_MODELS[names[number]]()
        return FuzzCase(number, seed, names[number], (), model.SerializeToString(), False)
    rng = random.Random(seed * 1_000_003 + number)
    name = rng.choice(names)
    model = SEED_MODELS[name]()
    mutation_names = list(MUTATIONS)
    weights = [_WEIGHTS.get(m, 1) for m in mutation_names]
    count = rng.choices((1, 2, 3), weights=(6, 3, 1))[0]
    done: list[str] = []
    attempts = 0
    while len(done) < count and attempts < 50:
        attempts += 1
        mutation = rng.choices(mutation_names, weights=weights)[0]
        description = MUTATIONS[mutation](model, rng)
        if description is not None:
            done.append(f"{mutation}: {description}")
    data = model.SerializeToString()
    if rng.random() < 0.04:
        data, description = _mutate_bytes(data, rng)
        done.append(f"bytes: {description}")
    wide_ints = rng.random() < 0.1
    if wide_ints:
        done.append("feeds: integer inputs in [-16, 16)")
    fusion = rng.choices(("tvm", "cinn", "none"), weights=(6, 3, 1))[0]
    opt_level = rng.choices((3, 2, 1, 0), weights=(6, 2, 1, 1))[0]
    if (fusion, opt_level) != ("tvm", 3):
        done.append(f"compile: fusion={fusion}, opt_level={opt_level}")
    from_file = any(item.startswith("external_data") for item in done)
    return FuzzCase(number, seed, name, tuple(done), data, from_file, wide_ints, fusion,
                    opt_level)


@dataclass
class Outcome:
    """What one case did. ``category`` is one of ok, opfusion-error, exception,
    wrong-answer, crash, hang, harness-error; ``kind`` refines it (the exception class, the
    signal); ``stage`` is the pipeline stage it reached (import, compile, run, reference,
    compare); ``where`` is the innermost opfusion frame of the traceback."""

    case: int
    seed: int
    model_name: str
    mutations: tuple[str, ...]
    category: str
    kind: str = ""
    stage: str = ""
    message: str = ""
    where: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The category and kind: the unit the summary counts."""
        return f"{self.category}: {self.kind}" if self.kind else self.category


def is_acceptable(outcome: Outcome) -> bool:
    """True for success and for an :class:`~opfusion.errors.OpfusionError`."""
    return outcome.category in (OK, OPFUSION_ERROR)


def _innermost_opfusion_frame(tb: Any) -> str:
    frames = traceback.extract_tb(tb)
    for frame in reversed(frames):
        path = frame.filename.replace(os.sep, "/")
        if "/opfusion/" in path and "/opfusion/testing/fuzz/" not in path:
            short = path[path.rindex("/opfusion/") + 1:]
            return f"{short}:{frame.lineno} in {frame.name}"
    if frames:
        frame = frames[-1]
        return f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}"
    return ""


# The part of opf.compile a failure is in, by the package of its innermost frame.
_COMPILE_PARTS = (("opfusion/transform/fuse", "fuse"), ("opfusion/transform/fusion", "fuse"),
                  ("opfusion/transform/", "optimize"), ("opfusion/compiler/lower_group", "lower"),
                  ("opfusion/te/", "lower"), ("opfusion/tir/", "lower"),
                  ("opfusion/topi/", "lower"), ("opfusion/backend/cpu/schedules", "lower"),
                  ("opfusion/backend/cpu/toolchain", "build"),
                  ("opfusion/backend/cpu/module", "build"), ("opfusion/backend/", "codegen"),
                  ("opfusion/codegen/", "codegen"), ("opfusion/runtime/", "build"),
                  ("opfusion/compiler/", "build"))


def _substage(stage: str, where: str) -> str:
    if stage != "compile":
        return stage
    for prefix, part in _COMPILE_PARTS:
        if where.startswith(prefix):
            return f"compile/{part}"
    return stage


def _compare(got: Sequence[Any], want: Any, from_floats: frozenset[int] = frozenset()) -> str:
    """'' when the compiled outputs match the reference, :data:`NONFINITE` when only their
    NaN/Inf differ, else what differs. Integer outputs match exactly, but for those in
    ``from_floats`` (a Cast of a float value): a float computation may order its roundings
    otherwise than the reference (a product of 24 values, one ulp apart), so their values
    may differ by one (a truncation's boundary) or by the floats' tolerance."""
    wants = list(want) if isinstance(want, tuple) else [want]
    if len(got) != len(wants):
        return f"{len(got)} outputs, the reference gives {len(wants)}"
    for index, (g, w) in enumerate(zip(got, wants)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape or g.dtype != w.dtype:
            return (f"output {index}: {g.dtype}{list(g.shape)}, the reference gives "
                    f"{w.dtype}{list(w.shape)}")
        if w.dtype.kind != "f":
            if not np.array_equal(g, w):
                bad = g != w
                if index in from_floats and w.dtype.kind in "iu":
                    wide = np.abs(w.astype(np.float64))
                    allowed = max(1.0, RTOL * float(wide.max()))
                    bad &= np.abs(g.astype(np.float64) - w.astype(np.float64)) > allowed
                if bad.any():
                    return (f"output {index}: {int(np.sum(bad))} of {w.size} {w.dtype} "
                            "elements differ")
            continue
        finite = np.isfinite(w)
        both = finite & np.isfinite(g)
        if both.any():
            scale = float(np.max(np.abs(w[both].astype(np.float64)))) or 1.0
            error = float(np.max(np.abs(g[both].astype(np.float64) - w[both]))) / scale
            if error > RTOL:
                return f"output {index}: max error {error:.3g} x max|reference|"
        if not np.array_equal(np.isfinite(g), finite) or not np.array_equal(
                g[~finite], w[~finite], equal_nan=True):
            return NONFINITE
    return ""


def _float_cast_outputs(data: bytes) -> frozenset[int]:
    """The positions of a model's outputs that a Cast makes of a float value (by ONNX's own
    shape inference); none where the model does not parse or infer."""
    try:
        import onnx

        model = onnx.shape_inference.infer_shapes(onnx.load_model_from_string(data))
    except Exception:  # noqa: BLE001 - a damaged model: compared exactly
        return frozenset()
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*graph.input, *graph.value_info, *graph.output]}
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
              onnx.TensorProto.BFLOAT16}
    made = {out: node for node in graph.node for out in node.output}
    found = set()
    for index, value in enumerate(graph.output):
        node = made.get(value.name)
        if node is not None and node.op_type == "Cast" and types.get(node.input[0]) in floats:
            found.add(index)
    return frozenset(found)


def _example_shapes(mod: SymbolicModule) -> dict[str, tuple[int, ...]] | None:
    """Shapes for a symbolic module's inputs: each symbolic dimension 1 (the size that
    broadcasts); None when an input's rank is unknown."""
    shapes = {}
    for tensor in mod.symbolic_inputs():
        if tensor.dims is None:
            return None
        shapes[tensor.name] = tuple(d if isinstance(d, int) else 1 for d in tensor.dims)
    return shapes


def _inputs_for(mod: Any, wide_ints: bool = False) -> dict[str, np.ndarray] | None:
    """Standard-normal floats, integers in [0, 4) (in [-16, 16) with ``wide_ints``) and
    random bools for ``@main``'s parameters (a staged model's inputs); None when they would
    be too large to feed."""
    from ...frontend.onnx.staged import OnnxStagedModel

    if isinstance(mod, OnnxStagedModel):
        declared = [(name, mod.input_shapes[name], mod.input_dtypes[name])
                    for name in mod.input_names]
    else:
        declared = [(param.name_hint, param.checked_type.shape, param.checked_type.dtype)
                    for param in mod["main"].params]
    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    for name, dims, dtype_name in declared:
        shape = tuple(int(d) for d in dims)
        if any(d < 0 for d in shape) or math.prod(shape) > MAX_INPUT_ELEMENTS:
            return None
        dtype = np.dtype(dtype_name)
        if dtype.kind == "f":
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            feeds[name] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            low, high = (-16, 16) if wide_ints else (0, 4)
            feeds[name] = rng.integers(low, high, shape).astype(dtype)
        else:
            return None
    return feeds


def _reference(mod: Any, feeds: dict[str, np.ndarray], params: dict[str, np.ndarray]) -> Any:
    """The reference interpreter's outputs (a staged model's stages evaluated by it)."""
    from ...compiler.staged import CompileSettings
    from ...frontend.onnx.staged import OnnxStagedModel
    from ...ir.evaluate import evaluate
    from ...target import host_target

    if isinstance(mod, OnnxStagedModel):
        outputs = mod.compile(CompileSettings(host_target(), reference=True)).run(feeds)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
    return evaluate(mod, {**feeds, **params})


def _import(case: FuzzCase) -> tuple[Any, dict[str, np.ndarray]]:
    from ...frontend import from_onnx

    if not case.from_file:
        return from_onnx(case.data)
    with tempfile.TemporaryDirectory(prefix="opf-fuzz-") as folder:
        path = Path(folder) / "model.onnx"
        path.write_bytes(case.data)
        weights = np.arange(16, dtype=np.float32).tobytes()
        (Path(folder) / "weights.bin").write_bytes(weights)
        return from_onnx(path)


def run_case(case: FuzzCase, *, compile_model: bool = True, reraise: bool = False) -> Outcome:
    """Run one case in this process: import, compile, run, reference, compare.

    Returns the outcome; with ``reraise=True`` an exception propagates instead (to read its
    traceback). ``compile_model=False`` stops after import (type-checked by the import)."""
    from ... import compile as opf_compile
    from ...errors import OpfusionError

    outcome = Outcome(case.number, case.seed, case.model_name, case.mutations, OK)
    start = time.perf_counter()
    stage = "import"
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            mod, params = _import(case)
            if compile_model:
                stage = "compile"
                exe = opf_compile(mod, params=params, opt_level=case.opt_level,
                                  fusion=case.fusion)
                if isinstance(mod, SymbolicModule):
                    # A symbolic input dim: its executor compiles a specialization (here, to
                    # keep the compile stage's failures in it), the reference runs its import.
                    shapes = _example_shapes(mod)
                    if shapes is not None:
                        exe.specialize(shapes)
                        mod, params = mod.specialize(shapes)
                stage = "inputs"
                feeds = None if isinstance(mod, SymbolicModule) else _inputs_for(
                    mod, case.wide_ints)
                if feeds is None:
                    outcome.notes.append("inputs too large or unsupported: not run")
                else:
                    stage = "run"
                    got = exe.run(feeds)
                    stage = "reference"
                    want = _reference(mod, feeds, params)
                    stage = "compare"
                    difference = _compare(got, want, _float_cast_outputs(case.data))
                    if difference == NONFINITE:
                        outcome.kind = NONFINITE
                    elif difference:
                        outcome.category = WRONG_ANSWER
                        outcome.message = difference
            outcome.stage = stage
    except OpfusionError as err:
        if reraise:
            raise
        outcome.category, outcome.kind = OPFUSION_ERROR, type(err).__name__
        outcome.where = _innermost_opfusion_frame(err.__traceback__)
        outcome.stage, outcome.message = _substage(stage, outcome.where), str(err)
    except Exception as err:  # noqa: BLE001 - the point: any other type is a finding
        if reraise:
            raise
        outcome.category, outcome.kind = EXCEPTION, type(err).__name__
        outcome.where = _innermost_opfusion_frame(err.__traceback__)
        outcome.stage, outcome.message = _substage(stage, outcome.where), str(err)
    outcome.message = outcome.message[:2000]
    outcome.seconds = time.perf_counter() - start
    return outcome


# ---------------------------------------------------------------------------------------------
# isolation: worker processes


@dataclass
class _Config:
    seed: int
    compile_every: int
    memory_limit: int
    cache_dir: str | None
    faults: dict[int, str] = field(default_factory=dict)


def _inject_fault(fault: str) -> None:
    """Fail the way a broken kernel would (to test the harness itself)."""
    if fault == "segfault":
        import ctypes

        ctypes.string_at(0)
    elif fault == "abort":
        os.abort()
    elif fault == "hang":
        time.sleep(3600)
    raise ValueError(f"unknown fault {fault!r}")


def _limit_worker(config: _Config) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    if config.cache_dir:
        os.environ["OPFUSION_CACHE_DIR"] = config.cache_dir
    if config.memory_limit > 0:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (config.memory_limit, config.memory_limit))
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _worker_main(conn: Any, config: _Config, log_path: str) -> None:
    """A worker: runs the case numbers it receives and sends back each outcome as a dict.
    Its stdout and stderr go to ``log_path`` (emptied before each case), where faulthandler
    writes the Python stack of a crash."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    faulthandler.enable()
    _limit_worker(config)
    from ... import compile as _  # noqa: F401  (import the pipeline before saying ready)

    conn.send("ready")
    while True:
        number = conn.recv()
        if number is None:
            return
        os.ftruncate(2, 0)
        os.lseek(2, 0, os.SEEK_SET)
        if number in config.faults:
            _inject_fault(config.faults[number])
        try:
            case = make_case(number, config.seed)
        except Exception as err:  # noqa: BLE001 - a bug of the fuzzer, reported as such
            outcome = Outcome(number, config.seed, "?", (), HARNESS, type(err).__name__,
                              "make_case", f"{err}\n{traceback.format_exc()}")
        else:
            compile_model = config.compile_every > 0 and number % config.compile_every == 0
            outcome = run_case(case, compile_model=compile_model)
        conn.send(asdict(outcome))


class _Worker:
    def __init__(self, context: Any, config: _Config, log_path: str) -> None:
        self.conn, child = context.Pipe()
        self.log_path = log_path
        self.process = context.Process(target=_worker_main, args=(child, config, log_path),
                                       daemon=True)
        self.process.start()
        child.close()
        self.ready = False
        self.number: int | None = None
        self.deadline = time.monotonic() + 120.0  # the start, imports included

    def send(self, number: int, timeout: float) -> None:
        self.number = number
        self.deadline = time.monotonic() + timeout
        self.conn.send(number)

    def kill(self) -> int | None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()
        return self.process.exitcode

    def crash_log(self) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""
        lines = [line for line in text.splitlines() if line.strip()]
        return "\n".join(lines[-12:])


def _lost_outcome(number: int, config: _Config, category: str, kind: str, message: str,
                  seconds: float) -> Outcome:
    try:
        case = make_case(number, config.seed)
        name, mutations = case.model_name, case.mutations
    except Exception:  # noqa: BLE001 - the worker reports harness errors itself
        name, mutations = "?", ()
    return Outcome(number, config.seed, name, mutations, category, kind, "", message[:2000],
                   seconds=seconds)


def run_cases(numbers: Iterable[int], seed: int = 0, *, jobs: int = 1,
              timeout: float = 20.0, compile_every: int = 1,
              memory_limit: int = 4 << 30, cache_dir: str | None = None,
              progress: Callable[[Outcome], None] | None = None,
              faults: dict[int, str] | None = None) -> list[Outcome]:
    """Run cases in ``jobs`` isolated worker processes; outcomes in case order.

    A case that has not answered after ``timeout`` seconds is a hang (its worker is killed
    and replaced); a worker that dies is a crash of its case (by signal, with the tail of
    faulthandler's stack). ``compile_every=k`` compiles and runs only cases whose number is
    a multiple of k (the others are imported only); 0 imports only. ``memory_limit`` caps
    each worker's address space (bytes; 0: no cap); ``cache_dir`` sets its
    OPFUSION_CACHE_DIR (None: inherited). ``progress`` is called with each outcome.
    ``faults`` maps case numbers to "segfault", "abort" or "hang": the worker fails that way
    instead of running the case (to test this harness)."""
    config = _Config(seed, compile_every, memory_limit, cache_dir, dict(faults or {}))
    context = multiprocessing.get_context("spawn")
    pending = list(numbers)
    pending.reverse()
    results: dict[int, Outcome] = {}
    with tempfile.TemporaryDirectory(prefix="opf-fuzz-logs-") as logs:
        serial = 0

        def start() -> _Worker:
            nonlocal serial
            serial += 1
            return _Worker(context, config, str(Path(logs) / f"worker{serial}.log"))

        workers = [start() for _ in range(max(1, min(jobs, len(pending))))]

        def finish(outcome: Outcome) -> None:
            results[outcome.case] = outcome
            if progress is not None:
                progress(outcome)

        try:
            while pending or any(w.number is not None for w in workers):
                for worker in workers:
                    if worker.ready and worker.number is None and pending:
                        worker.send(pending.pop(), timeout)
                now = time.monotonic()
                wait_for = max(0.0, min(w.deadline for w in workers) - now)
                ready = wait_connections([w.conn for w in workers], timeout=wait_for)
                for index, worker in enumerate(workers):
                    number = worker.number
                    if worker.conn in ready:
                        try:
                            message = worker.conn.recv()
                        except (EOFError, OSError):
                            message = None
                        if message == "ready":
                            worker.ready = True
                            worker.deadline = math.inf
                            continue
                        if message is not None:
                            finish(Outcome(**{**message, "mutations": tuple(
                                message["mutations"])}))
                            worker.number = None
                            worker.deadline = math.inf
                            continue
                        code = worker.kill()
                        log = worker.crash_log()
                        if number is None:  # died at start or between cases
                            raise RuntimeError(f"a fuzz worker died outside a case "
                                               f"(exit code {code}):\n{log}")
                        elapsed = timeout - (worker.deadline - time.monotonic())
                        kind = (signal.Signals(-code).name if code is not None and code < 0
                                else f"exit {code}")
                        finish(_lost_outcome(number, config, CRASH, kind, log, elapsed))
                        workers[index] = start()
                    elif time.monotonic() >= worker.deadline:
                        worker.kill()
                        if number is None:
                            raise RuntimeError("a fuzz worker did not start within 120 s")
                        finish(_lost_outcome(number, config, HANG, f"> {timeout:g} s",
                                             worker.crash_log(), timeout))
                        workers[index] = start()
        finally:
            for worker in workers:
                if worker.process.is_alive():
                    with contextlib.suppress(OSError, BrokenPipeError):
                        worker.conn.send(None)
                    worker.process.join(2)
                worker.kill()
    return [results[number] for number in sorted(results)]


# ---------------------------------------------------------------------------------------------
# reporting


def summarize(outcomes: Sequence[Outcome], examples: int = 3) -> str:
    """A table of counts by category and kind, then, for every category that is not
    acceptable, its first ``examples`` cases with their mutations, stage and message."""
    counts = Counter(outcome.key for outcome in outcomes)
    order = sorted(counts, key=lambda key: (not key.startswith(OK),
                                            not key.startswith(OPFUSION_ERROR), -counts[key]))
    lines = [f"{len(outcomes)} cases"]
    lines += [f"  {counts[key]:6d}  {key}" for key in order]
    bad = [outcome for outcome in outcomes if not is_acceptable(outcome)]
    if bad:
        sites = Counter((o.key, o.stage, o.where) for o in bad)
        lines.append(f"{len(bad)} unacceptable outcomes (not ok, not an OpfusionError) at "
                     f"{len(sites)} sites (category, stage, innermost opfusion frame):")
        lines += [f"  {count:6d}  {key} | {stage or '?'} | {where or '?'}"
                  for (key, stage, where), count in sites.most_common()]
        lines.append("first examples:")
    shown: Counter[str] = Counter()
    for outcome in bad:
        if shown[outcome.key] >= examples:
            continue
        shown[outcome.key] += 1
        message = outcome.message.strip().replace("\n", "\n      ")
        if len(message) > 600:
            message = message[:600] + " ..."
        lines.append(f"- [{outcome.key}] case {outcome.case} (seed {outcome.seed}), model "
                     f"{outcome.model_name}, stage {outcome.stage or '?'}"
                     + (f", at {outcome.where}" if outcome.where else ""))
        for mutation in outcome.mutations:
            lines.append(f"    mutation {mutation!r}")
        lines.append(f"    message: {message}")
        lines.append(f"    replay: python benchmarks/fuzz_models.py --case {outcome.case} "
                     f"--seed {outcome.seed}")
    return "\n".join(lines)
