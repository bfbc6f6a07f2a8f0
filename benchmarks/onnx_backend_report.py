"""Run the ONNX backend test suite's in-scope tests through opfusion's backend and count.

    python benchmarks/onnx_backend_report.py [--kinds node,light,...] [-k REGEX]
                                             [--engine compiled|reference|onnxruntime]
                                             [--no-specialize] [--jobs N]
                                             [--write-known-failures]

Not pytest: each test case is prepared and run with :mod:`opfusion.frontend.onnx.backend`
directly, and compared with the expected outputs exactly as onnx's runner does
(``assert_allclose`` with the case's rtol/atol) — except the ``light`` kind, which runs
random-weight copies of the light models on a standard-normal input against onnxruntime
(needs the test extra), relative to the output's largest magnitude. Prints, per kind, the
tests in scope, passed and failed, then the failures grouped by cause: unsupported ops (with
the number of tests each blocks), errors (by exception class) and numeric mismatches. The bar
of issue 3 is the ``node`` line: the generated node tests, tensor-only inference subset
(``tests/frontend/onnx_backend_scope.py`` says what is out of scope and why).

``--engine`` picks the backend's engine (``compiled``, the default, or ``reference``), or
``onnxruntime``: the same cases, inputs and comparison run by ONNX Runtime's CPU provider
instead of opfusion, the peer's count on the same scope (needs the test extra).
``--write-known-failures`` rewrites that engine's KNOWN_FAILURES block of the scope file from
this run (entries of tests this run did not cover are kept). A run of another engine than the
reference also lists its failures that the reference engine passes (by the reference block of
KNOWN_FAILURES): those are bugs of that engine, not gaps of the frontend."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "frontend"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx.backend.test.loader import load_model_tests  # noqa: E402
from onnx.backend.test.runner import Runner  # noqa: E402
from onnx_backend_scope import KNOWN_FAILURES, out_of_scope_reason  # noqa: E402
from onnx_node_data import load_node_tests  # noqa: E402

from opfusion.errors import OpfusionError  # noqa: E402
from opfusion.frontend import UnsupportedOnnxError  # noqa: E402
from opfusion.frontend.onnx import backend as onnx_backend  # noqa: E402
from opfusion.testing import assert_close, light_model  # noqa: E402

SCOPE_FILE = ROOT / "tests" / "frontend" / "onnx_backend_scope.py"
KINDS = ["node", "light", "simple", "pytorch-converted", "pytorch-operator"]
TIMEOUT_S = 120
# The light kind runs random-weight copies (their shipped outputs are the same for any
# input); outputs may differ from onnxruntime's by this fraction of their largest magnitude.
LIGHT_RTOL = 1e-3


def collect(kinds: list[str], pattern: str | None) -> list[tuple[str, str, str, float, float]]:
    """(kind, name, model_dir, rtol, atol) of every in-scope case of ``kinds``."""
    cases = []
    for kind in kinds:
        if kind == "node":
            found = load_node_tests()
        elif kind == "light":
            found = load_model_tests(kind="real")  # the nine light models: shipped, no download
            if not _have_onnxruntime():
                print("light: skipped (its reference outputs come from onnxruntime: "
                      "pip install onnxruntime)\n")
                continue
        else:
            found = load_model_tests(kind=kind)
        for case in sorted(found, key=lambda case: case.name):
            if out_of_scope_reason(f"{case.name}_cpu") or pattern and not re.search(pattern,
                                                                                    case.name):
                continue
            where = case.model_dir or case.url
            if kind == "light":
                light_model(_light_name(where))  # generated once, here, not in the workers
            cases.append((kind, case.name, where, case.rtol, case.atol))
    return cases


def run_case(kind: str, name: str, where: str, rtol: float, atol: float,
             engine: str, specialize: bool) -> dict:
    """Prepare and run one case; returns its outcome as plain data (it crosses processes)."""
    start = time.perf_counter()
    outcome = {"kind": kind, "name": name}
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(TIMEOUT_S)
    try:
        model, data_sets = _load_case(kind, where)
        rep = (_OnnxRuntimeRep(model) if engine == "onnxruntime" else
               onnx_backend.prepare(model, engine=engine, specialize=specialize))
        for inputs, expected in data_sets:
            outputs = list(rep.run(inputs))
            if kind == "light":
                for got, want in zip(outputs, expected):
                    assert_close(got, want, rtol=LIGHT_RTOL)
            else:
                Runner.assert_similar_outputs(expected, outputs, rtol=rtol, atol=atol)
        outcome.update(status="passed", specialized=bool(rep.frozen_inputs))
    except UnsupportedOnnxError as err:
        outcome.update(status="unsupported", ops=_unsupported_ops(err, model))
    except AssertionError as err:
        outcome.update(status="mismatch", message=_mismatch_summary(err))
    except OpfusionError as err:
        cause = err.__cause__
        if isinstance(cause, OpfusionError):  # an engine's failure: the cause says what
            outcome.update(status="error", cls=f"{engine}: {type(cause).__name__}",
                           message=_first_line(cause))
        else:
            cls = type(err).__name__ + (f" <- {type(cause).__name__}" if cause else "")
            outcome.update(status="error", cls=cls, message=_first_line(err))
    except _Timeout:
        outcome.update(status="error", cls="Timeout", message=f"over {TIMEOUT_S} s")
    except Exception as err:  # noqa: BLE001 - a non-opfusion exception breaks the contract
        if engine == "onnxruntime":  # ONNX Runtime's own errors are its failures
            outcome.update(status="error", cls=f"onnxruntime: {type(err).__name__}",
                           message=_first_line(err))
            outcome["seconds"] = time.perf_counter() - start
            return outcome
        outcome.update(status="error", cls=f"non-opfusion {type(err).__name__}",
                       message=_first_line(err))
    finally:
        signal.alarm(0)
    outcome["seconds"] = time.perf_counter() - start
    return outcome


class _OnnxRuntimeRep:
    """A case run by ONNX Runtime (``--engine onnxruntime``), answering as a backend rep."""

    frozen_inputs = None

    def __init__(self, model) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.log_severity_level = 4
        self.session = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                                    providers=["CPUExecutionProvider"])
        self.names = [value.name for value in self.session.get_inputs()]

    def run(self, inputs):
        return self.session.run(None, dict(zip(self.names, inputs)))


class _Timeout(Exception):
    pass


def _timeout(signum, frame):
    raise _Timeout()


def _load_case(kind: str, where: str):
    if kind == "light":
        return _load_light(where)
    model = onnx.load(os.path.join(where, "model.onnx"))
    data_sets = []
    for data_dir in sorted(Path(where).glob("test_data_set_*")):
        inputs = [_read_tensor(data_dir / f"input_{i}.pb")
                  for i in range(len(list(data_dir.glob("input_*.pb"))))]
        outputs = [_read_tensor(data_dir / f"output_{i}.pb")
                   for i in range(len(list(data_dir.glob("output_*.pb"))))]
        data_sets.append((inputs, outputs))
    return model, data_sets


def _light_name(url: str) -> str:
    return Path(url).stem.removeprefix("light_")


def _have_onnxruntime() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def _load_light(url: str):
    """A light model's random-weight copy (``opfusion.testing.light_model``), a
    standard-normal input and onnxruntime's output for it. The shipped model and output would
    prove nothing: its constant weights give the same output for any input."""
    import onnxruntime

    path = light_model(_light_name(url))
    model = onnx.load(path)
    initializers = {tensor.name for tensor in model.graph.initializer}
    rng = np.random.default_rng(0)
    feeds = {value.name: rng.standard_normal([d.dim_value for d in
                                              value.type.tensor_type.shape.dim],
                                             dtype=np.float32)
             for value in model.graph.input if value.name not in initializers}
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(str(path), options,
                                           providers=["CPUExecutionProvider"])
    return model, [(list(feeds.values()), session.run(None, feeds))]


def _read_tensor(path: Path) -> np.ndarray:
    tensor = onnx.TensorProto()
    tensor.ParseFromString(path.read_bytes())
    return onnx.numpy_helper.to_array(tensor)


def _unsupported_ops(err: UnsupportedOnnxError, model) -> list[str]:
    """The op types the error lists (one per line: "  Op (node 'n', domain d, opset k)")."""
    missing = []
    for op_type, domain in re.findall(r"^\s+(\S+) \(node .*?, domain (\S+?),", str(err), re.M):
        label = op_type if domain == "ai.onnx" else f"{domain}.{op_type}"
        if label not in missing:
            missing.append(label)
    return missing or [f"? ({_first_line(err)})"]


def _mismatch_summary(err: AssertionError) -> str:
    """numpy's assert_allclose message in one line: tolerances, share of elements off, and the
    largest differences (its first lines alone only say that something differs)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    wanted = ("Not equal to tolerance", "Mismatched elements", "Max absolute difference",
              "Max relative difference")
    picked = [line for line in lines if line.startswith(wanted)]
    if len(picked) < 2:
        return _first_line(err)
    text = "; ".join(picked)
    for long, short in (("Not equal to tolerance ", ""), ("Mismatched elements: ", "off "),
                        ("Max absolute difference among violations: ", "max abs "),
                        ("Max relative difference among violations: ", "max rel ")):
        text = text.replace(long, short)
    return text[:300]


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[:3])[:300] if lines else type(err).__name__


def cause_of(outcome: dict) -> str:
    """A short cause for KNOWN_FAILURES."""
    if outcome["status"] == "unsupported":
        return "unsupported op: " + ", ".join(outcome["ops"])
    if outcome["status"] == "mismatch":
        return "numeric mismatch: " + outcome["message"]
    return f"{outcome['cls']}: {outcome['message']}"


# ---------------------------------------------------------------------------------------------
# printing


def report(outcomes: list[dict], kinds: list[str]) -> None:
    print(f"{'kind':<18} {'in scope':>8} {'passed':>7} {'failed':>7} {'pass %':>7}"
          f" {'specialized':>12}")
    for kind in kinds:
        mine = [o for o in outcomes if o["kind"] == kind]
        passed = [o for o in mine if o["status"] == "passed"]
        special = sum(o["specialized"] for o in passed)
        share = 100.0 * len(passed) / len(mine) if mine else 0.0
        print(f"{kind:<18} {len(mine):>8} {len(passed):>7} {len(mine) - len(passed):>7} "
              f"{share:>6.1f}% {special:>12}")
    print("('specialized': passed only after the backend froze shape-deciding inputs to their "
          "values)")
    failures = [o for o in outcomes if o["status"] != "passed"]
    if not failures:
        return

    unsupported = [o for o in failures if o["status"] == "unsupported"]
    if unsupported:
        blocked = Counter(op for o in unsupported for op in o["ops"])
        print(f"\n== unsupported ops: {len(unsupported)} tests ==")
        for op, count in blocked.most_common():
            print(f"  {op:<28} {count:>4} tests")

    errors = [o for o in failures if o["status"] == "error"]
    if errors:
        by_class: dict[str, list[dict]] = defaultdict(list)
        for o in errors:
            by_class[o["cls"]].append(o)
        print(f"\n== errors: {len(errors)} tests ==")
        for cls, group in sorted(by_class.items(), key=lambda item: -len(item[1])):
            print(f"  {cls} ({len(group)})")
            for o in group:
                print(f"    {o['name']}: {o['message'][:160]}")

    mismatches = [o for o in failures if o["status"] == "mismatch"]
    if mismatches:
        print(f"\n== numeric mismatch: {len(mismatches)} tests ==")
        for o in mismatches:
            print(f"    {o['name']}: {o['message'][:160]}")


def report_regressions(outcomes: list[dict], engine: str) -> None:
    """The failures of ``engine`` on tests that the reference engine passes."""
    reference_failures = KNOWN_FAILURES["reference"]
    worse = [o for o in outcomes if o["status"] != "passed" and o["name"] not in
             reference_failures]
    print(f"\n== failing with the {engine} engine, passing with the reference engine: "
          f"{len(worse)} tests ==")
    for o in worse:
        print(f"    {o['name']}: {cause_of(o)[:160]}")


def write_known_failures(outcomes: list[dict], engine: str) -> int:
    covered = {o["name"] for o in outcomes}
    entries = {name: cause for name, cause in KNOWN_FAILURES[engine].items()
               if name not in covered}
    entries.update({o["name"]: cause_of(o) for o in outcomes if o["status"] != "passed"})
    lines = []
    for name in sorted(entries):
        key = json.dumps(name)
        one_line = f"    {key}: "
        if len(one_line) + 10 <= 100:
            room = 100 - len(one_line) - 3
            lines.append(f"{one_line}{json.dumps(_clip(entries[name], room))},")
        else:
            lines.append(f"    {key}:")
            lines.append(f"        {json.dumps(_clip(entries[name], 100 - 8 - 3))},")
    text = SCOPE_FILE.read_text()
    begin = text.index(f"# BEGIN KNOWN_FAILURES {engine} ")
    body_start = text.index("{\n", begin) + 2
    end = text.index(f"}}\n# END KNOWN_FAILURES {engine}\n", begin)
    SCOPE_FILE.write_text(text[:body_start] + "".join(line + "\n" for line in lines)
                          + text[end:])
    return len(entries)


def _clip(text: str, width: int) -> str:
    """``text`` cut so that its JSON form fits ``width`` characters."""
    text = text.replace("\n", " ")
    while len(json.dumps(text)) - 2 > width:
        text = text[:width - 3 - (len(json.dumps(text)) - 2 - len(text))] + "..."
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated, of {', '.join(KINDS)} (default: all)")
    parser.add_argument("-k", dest="pattern", help="only tests whose name matches this regex")
    parser.add_argument("--engine", choices=[*sorted(onnx_backend.ENGINES), "onnxruntime"],
                        default=onnx_backend.DEFAULT_ENGINE,
                        help=f"the backend's engine (default {onnx_backend.DEFAULT_ENGINE})")
    parser.add_argument("--no-specialize", action="store_true",
                        help="do not let the backend freeze shape-deciding inputs")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--write-known-failures", action="store_true")
    args = parser.parse_args()
    kinds = [kind for kind in args.kinds.split(",") if kind]
    unknown = [kind for kind in kinds if kind not in KINDS]
    if unknown:
        parser.error(f"unknown kind(s) {', '.join(unknown)}; the kinds are {', '.join(KINDS)}")

    cases = collect(kinds, args.pattern)
    names = Counter(name for _, name, *_ in cases)
    assert all(count == 1 for count in names.values()), "test names must be unique"
    start = time.perf_counter()
    specialize = not args.no_specialize
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_case, *case, args.engine, specialize) for case in cases]
        outcomes = [future.result() for future in futures]
    elapsed = time.perf_counter() - start
    print(f"onnx {onnx.__version__}; {len(cases)} in-scope tests run in {elapsed:.0f} s "
          f"on {args.jobs} process(es); engine {args.engine}; value specialization "
          f"{'on' if specialize else 'off'}\n")
    report(outcomes, kinds)
    if args.engine not in ("reference", "onnxruntime"):
        report_regressions(outcomes, args.engine)
    slowest = sorted(outcomes, key=lambda o: -o["seconds"])[:5]
    print("\nslowest: " + ", ".join(f"{o['name']} {o['seconds']:.1f} s" for o in slowest))
    if args.write_known_failures:
        count = write_known_failures(outcomes, args.engine)
        print(f"\nwrote {count} KNOWN_FAILURES[{args.engine!r}] entries to "
              f"{SCOPE_FILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
