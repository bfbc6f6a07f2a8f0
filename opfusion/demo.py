"""The built-in demo: two models built in code, compiled with and without fusion, checked
against the reference interpreter and timed (what ``opfusion demo`` prints).

The models come from :mod:`opfusion.testing.workloads` at sizes where fusion's effect is
visible on a laptop-class CPU in a few seconds:

* ``cnn`` — MobileNet v2 (residual inverted-bottleneck blocks, batch norm after every
  convolution, ReLU6) on a 56x56 image at width 0.5: activation-heavy, so the unfused
  program spends much of its time writing and re-reading intermediate tensors;
* ``transformer`` — one BERT-style encoder layer (multi-head self-attention, residuals,
  layer norm, a GELU feed-forward) on 16 tokens of width 32. Its time goes mostly to the
  dense layers, softmax and erf, which fusion does not make cheaper; fusion saves the
  kernels of the bias adds, the GELU's arithmetic and the reshape/transpose chains, so its
  gain is smaller (about 1.2-1.3x here) and larger at small sizes, where calls dominate.

Latency is the median of interleaved runs (fused, unfused, fused, ...) in several rounds,
so that a load spike on a shared machine hits both programs alike; the speedup is the median
of the per-round ratios. No network and no files are needed."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import OpfusionError
from .ir.evaluate import evaluate
from .ir.expr import Call
from .ir.module import IRModule
from .ir.op import Op
from .ir.visitor import post_order


@dataclass(frozen=True)
class DemoModel:
    """A built-in model: a workload builder of :mod:`opfusion.testing.workloads` and its
    arguments."""

    name: str
    description: str
    workload: str
    arguments: Mapping[str, Any] = field(default_factory=dict)

    def build(self) -> tuple[IRModule, dict[str, np.ndarray]]:
        """The module and its (seeded, calibrated) weights."""
        from .testing.workloads import WORKLOADS

        return WORKLOADS[self.workload](**self.arguments)


DEMO_MODELS: dict[str, DemoModel] = {
    "cnn": DemoModel(
        "cnn", "MobileNet v2 (residual blocks, batch norm, ReLU6), a 1x3x56x56 image, "
        "width 0.5", "mobilenet_v2",
        {"image_shape": (3, 56, 56), "num_classes": 10, "width_multiplier": 0.5}),
    "transformer": DemoModel(
        "transformer", "a BERT-style encoder layer (attention, layer norm, GELU), "
        "16 tokens x 32 wide, 2 heads", "transformer_encoder",
        {"hidden": 32, "heads": 2, "seq": 16}),
}

#: Relative error (to max|reference|) a compiled model may show against the interpreter.
TOLERANCE = 1e-4


# ---------------------------------------------------------------------------------------------
# timing


def interleaved_medians(functions: Mapping[str, Callable[[], Any]], rounds: int = 5,
                        round_seconds: float = 0.25, warmup: int = 2) -> dict[str, list[float]]:
    """Time each function in ``rounds`` rounds; within a round the functions take turns, run
    by run, as often as fits in about ``round_seconds`` (3 to 200 runs). Returns, per
    function, the median seconds of each round."""
    for _ in range(warmup):
        for function in functions.values():
            function()
    once = 0.0
    for function in functions.values():
        start = time.perf_counter()
        function()
        once += time.perf_counter() - start
    runs = int(min(200, max(3, round_seconds / max(once, 1e-6))))
    medians: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(max(1, rounds)):
        times: dict[str, list[float]] = {name: [] for name in functions}
        for _ in range(runs):
            for name, function in functions.items():
                start = time.perf_counter()
                function()
                times[name].append(time.perf_counter() - start)
        for name, values in times.items():
            medians[name].append(statistics.median(values))
    return medians


def median_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median over rounds of ``numerator / denominator`` (a speedup when the numerator is
    the baseline's time)."""
    return statistics.median(n / d for n, d in zip(numerator, denominator))


def machine_summary() -> str:
    """The CPU, its ISA, its cores and the current load, in one line."""
    from .target import host_cpu_name, host_target

    host = host_target()
    cores = host.num_cores
    model = f"{host_cpu_name()} ({host.isa})"
    text = f"{model}, {cores} core{'s' if cores != 1 else ''}"
    try:
        load = os.getloadavg()[0]
    except OSError:
        return text
    text += f", load {load:.1f}"
    if load > 0.5 * cores:
        text += " (a loaded machine: timings are noisy)"
    return text


# ---------------------------------------------------------------------------------------------
# the demo


def operator_counts(mod: IRModule) -> dict[str, int]:
    """How often each operator is called in ``@main``, inside fused functions too."""
    counts: dict[str, int] = {}
    for node in post_order(mod["main"].body):
        if isinstance(node, Call) and isinstance(node.op, Op):
            counts[node.op.name] = counts.get(node.op.name, 0) + 1
    return counts


def count_operators(mod: IRModule) -> int:
    """Operator calls in ``@main``, counting those inside fused functions."""
    return sum(operator_counts(mod).values())


def relative_error(got: Any, want: Any) -> float:
    """max|got - want| / max|want| over all outputs (infinite on a shape mismatch)."""
    gots = got if isinstance(got, (list, tuple)) else [got]
    wants = want if isinstance(want, (list, tuple)) else [want]
    worst = 0.0
    for g, w in zip(gots, wants):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape:
            return math.inf
        if not w.size:
            continue
        error = float(np.max(np.abs(g - w))) / (float(np.max(np.abs(w))) or 1.0)
        if not error <= worst:  # a NaN anywhere makes the result NaN, which no check passes
            worst = error
    return worst


@dataclass
class DemoResult:
    """What the demo found for one model."""

    model: DemoModel
    ops_built: dict[str, int]
    ops_optimized: dict[str, int]
    fused_kernels: int
    unfused_kernels: int
    compile_seconds: dict[str, float]
    errors: dict[str, float]
    latency: dict[str, list[float]]
    planned_bytes: int
    naive_bytes: int
    source_path: str | None
    source_lines: int

    @property
    def fused_seconds(self) -> float:
        return statistics.median(self.latency["fused"])

    @property
    def unfused_seconds(self) -> float:
        return statistics.median(self.latency["unfused"])

    @property
    def speedup(self) -> float:
        return median_ratio(self.latency["unfused"], self.latency["fused"])


def run_model(model: DemoModel, rounds: int = 5,
              compile_fn: Callable[..., Any] | None = None) -> DemoResult:
    """Build ``model``, compile it fused (TVM's rules) and unfused, check both against the
    reference interpreter and time them. ``compile_fn`` replaces ``opf.compile`` (the command
    line passes one that shows progress)."""
    from .compiler.compile import compile as opf_compile
    from .testing.workloads import workload_input
    from .transform.infer_type import InferType
    from .transform.optimize import optimize

    compile_fn = compile_fn or opf_compile
    mod, params = model.build()
    feeds = workload_input(mod, params)
    ops_built = operator_counts(mod)
    # What opf.compile does first, at the same (the current context's) opt_level.
    ops_optimized = operator_counts(optimize(InferType()(mod), params))
    executors, compile_seconds = {}, {}
    for variant, strategy in (("fused", "tvm"), ("unfused", "none")):
        start = time.perf_counter()
        executors[variant] = compile_fn(mod, params=params, fusion=strategy)
        compile_seconds[variant] = time.perf_counter() - start
    want = evaluate(mod, {**feeds, **params})
    errors = {variant: relative_error(exe.run(feeds), want)
              for variant, exe in executors.items()}
    for variant, error in errors.items():
        if not error <= TOLERANCE:
            raise OpfusionError(f"demo model {model.name!r}: the {variant} program differs from "
                                f"the reference interpreter by {error:.3g} x max|reference| "
                                f"(tolerance {TOLERANCE:g}); this is a bug, please report it")
    fused, unfused = executors["fused"], executors["unfused"]
    latency = interleaved_medians({"fused": lambda: fused.run(feeds),
                                   "unfused": lambda: unfused.run(feeds)}, rounds=rounds)
    source_path, source_lines = generated_source(fused)
    return DemoResult(model, ops_built, ops_optimized, fused.num_kernels, unfused.num_kernels,
                      compile_seconds, errors, latency, fused.plan.total_bytes,
                      fused.plan.naive_bytes, source_path, source_lines)


def generated_source(exe: Any) -> tuple[str | None, int]:
    """Where the C of a compiled model is kept (the kernel cache) and its line count."""
    module = next(iter(exe.modules.values()), None)  # every kernel is in one library
    if module is None:
        return None, 0
    library = module.library
    path = library.source_path if os.path.isfile(library.source_path) else library.path
    return str(path), exe.source().count("\n")


def format_result(result: DemoResult) -> str:
    """The lines ``opfusion demo`` prints for one model."""
    megabytes = 2.0 ** 20
    gone = [name for name in result.ops_built if name not in result.ops_optimized]
    lines = [
        f"{result.model.name}: {result.model.description}",
        f"  operators    {sum(result.ops_built.values())} as built, "
        f"{sum(result.ops_optimized.values())} after optimization"
        + (f" ({', '.join(gone)} folded away)" if gone else ""),
        f"  kernels      {result.fused_kernels} fused groups; {result.unfused_kernels} unfused "
        f"(one per operator)",
        f"  compile      {result.compile_seconds['fused']:.1f} s fused, "
        f"{result.compile_seconds['unfused']:.1f} s unfused",
        f"  checked      both match the reference interpreter (max error "
        f"{max(result.errors.values()):.1e} x max|ref|)",
        f"  latency      {result.fused_seconds * 1e3:.2f} ms fused, "
        f"{result.unfused_seconds * 1e3:.2f} ms unfused: {result.speedup:.2f}x faster with "
        f"fusion",
        f"  memory       {result.planned_bytes / megabytes:.2f} MB for intermediates "
        f"({result.naive_bytes / megabytes:.2f} MB unplanned)",
    ]
    if result.source_path:
        lines.append(f"  generated C  {result.source_path} ({result.source_lines} lines)")
    return "\n".join(lines)


def geometric_mean(values: Iterable[float]) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def run_demo(names: Iterable[str] = tuple(DEMO_MODELS), rounds: int = 5,
             write: Callable[[str], None] = print,
             compile_fn: Callable[..., Any] | None = None) -> list[DemoResult]:
    """Run the demo on the named models, writing its report line by line with ``write``."""
    names = list(names)
    unknown = [name for name in names if name not in DEMO_MODELS]
    if unknown:
        raise OpfusionError(f"no demo model {unknown[0]!r}; choose from "
                            f"{', '.join(DEMO_MODELS)}")
    write("opfusion demo: built-in models compiled with operator fusion (TVM's FuseOps rules) "
          "and without,\nchecked against the reference interpreter and timed (medians of "
          f"{rounds} rounds of interleaved runs).")
    write(f"machine: {machine_summary()}\n")
    results = []
    for name in names:
        result = run_model(DEMO_MODELS[name], rounds=rounds, compile_fn=compile_fn)
        results.append(result)
        write(format_result(result) + "\n")
    speedups = ", ".join(f"{r.model.name} {r.speedup:.2f}x" for r in results)
    summary = f"fused vs unfused: {speedups}"
    if len(results) > 1:
        summary += f" (geometric mean {geometric_mean(r.speedup for r in results):.2f}x)"
    write(summary)
    write("next: opfusion show MODEL.onnx --explain   (why operators were or were not fused)\n"
          "      opfusion compile MODEL.onnx -o MODEL.opf && opfusion run MODEL.opf --profile")
    return results
