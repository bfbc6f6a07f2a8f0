"""Latency of whole models: opfusion against fusion="none", ONNX Runtime and OpenVINO.

    python benchmarks/models.py [names...] [--vision] [--transformer] [--repeat 30] [--no-ort]
                                [--no-openvino]
    python benchmarks/models.py [names...] --target "c -mattr=+avx2,+fma" --target c
    python benchmarks/models.py [names...] --isa avx2

For each model (by default the nine light models: the random-weight copies of
opfusion.testing.light_model; ``--vision`` adds the four torchvision classifiers of
opfusion.testing.vision_model, resnet18, mobilenet_v3_large, efficientnet_b0 and
shufflenet_v2_x1_0, which may also be named one by one; ``--transformer`` the transformer
blocks of opfusion.testing.transformer_model, bert_layer and gpt_block, input (1, 128, 768);
a name ending in .onnx is that file, e.g. the ViT-B/16 of ``benchmarks/export_vit_b16.py``;
batch 1, standard-normal input) it
times, in one process and interleaved: opfusion (``opf.compile``'s defaults), opfusion with
``fusion="none"``, ONNX Runtime (CPU provider) and OpenVINO (CPU;
when importable: it is an optional peer, ``pip install openvino``, never a dependency of
opfusion), every engine on the host's cores. OpenVINO gets ``INFERENCE_PRECISION_HINT=f32``
(it computes in bf16 by default on CPUs that have it), ``PERFORMANCE_HINT=LATENCY`` and as
many threads as the others; the header says whether every operation of its compiled models
really runs in f32. ``--no-ort`` and ``--no-openvino`` leave a peer out.

The engines are timed in alternating batches (``overhead.interleaved``), each batch a quarter
of a second or one call, whichever is longer, after a 50 ms pause in which the previous
engine's threads stop spinning; the median of the batches' means per engine.
Batches rather than one call of each in turn because ONNX Runtime's threads spin for a while
after its runs (OpenVINO's and opfusion's briefly) and, on a machine of two cores, slow
whichever engine runs next: a batch that long leaves them only its first sliver. Models slow
enough for one call per batch (vgg19) are the per-call alternation; there the spin is a
sliver of that call. Alternating at all keeps a drifting machine (other jobs, clock changes)
from favouring one engine.

Each row gives the engines' median latencies; ``fused/unf`` (unfused time over fused),
``ort/opf`` and ``ov/opf`` (the peer's time over opfusion's: above 1, opfusion is faster);
``max diff``, the largest difference of any engine's outputs from opfusion's relative to the
largest magnitude of opfusion's (a misconfigured peer shows here, and is named below the
table when above 1e-3); the kernel count; the cold compile time (empty kernel cache) and the
cached one; the executor's planned memory against the sum of all intermediate tensors. It
ends with

    geomean ort/opfusion <x> openvino/opfusion <y> fused/unfused <z>

after a line saying how opfusion's OpenMP threads wait (``opfusion.runtime.openmp``: Intel's
runtime when installed, else libgomp's short spin; ``OPFUSION_OPENMP=gnu`` forces libgomp).

each the geometric mean over the models of the peer's time over opfusion's (unfused's over
fused's for the last).

With ``--isa avx2`` (or ``sse4.2``) opfusion compiles for that ISA (``c -mattr=+avx2,+fma``)
and OpenVINO is held to it by oneDNN's ``ONEDNN_MAX_CPU_ISA``, so that an AVX-512 host
compares the two engines' code for AVX2 CPUs (what Zen 3 runs). The cap holds OpenVINO's
convolutions, not all of it: the operations it runs wider anyway (products it gives MLAS,
which picks its kernels from the CPU's features, and some reductions) are named below the
table, and a model with many (the transformer blocks) is not a fair comparison. ONNX Runtime
is left out: its MLAS has no such cap.

With ``--target`` (given once per target), the fused model is compiled for each target and
the latencies are printed side by side, timed interleaved with ONNX Runtime in one run, with
each target's speedup over the first (e.g. the host's AVX-512 code against AVX2 code on the
same machine); the header names the CPU and each target's ISA."""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
from overhead import interleaved

import opfusion as opf
from opfusion.frontend import from_onnx
from opfusion.runtime.openmp import wait_policy
from opfusion.target import Target, host_cpu_name
from opfusion.testing.light import LIGHT_MODEL_NAMES, light_model
from opfusion.testing.transformer import TRANSFORMER_MODEL_NAMES, transformer_model
from opfusion.testing.vision import VISION_MODEL_NAMES, vision_model

BATCH_SECONDS = 0.25
#: A pause before each batch, in which the previous engine's threads stop spinning: ONNX
#: Runtime's slowed the next engine's whole batch by up to 10% on the models bound by memory
#: (alexnet, zfnet512), so whichever engine followed it was handicapped.
SETTLE_SECONDS = 0.05
NAME_WIDTH = 18  # shufflenet_v2_x1_0
#: ``--isa``: the opfusion target and oneDNN's ``ONEDNN_MAX_CPU_ISA`` value for each ISA.
ISA_CAPS = {"avx2": ("c -mattr=+avx2,+fma", "AVX2"),
            "avx2_vnni": ("c -mattr=+avx2,+fma,+avxvnni", "AVX2_VNNI"),
            "sse4.2": ("c -mattr=+sse4.2", "SSE41")}
MAX_DIFF = 1e-3  # relative to max|output|; f32 engines agree to about 1e-5


@dataclass
class Engine:
    """One way to run a model: ``run`` is what is timed, ``outputs`` runs it once and returns
    its outputs as arrays in graph-output order (for the comparison with opfusion's)."""

    name: str
    run: Callable[[], Any]
    outputs: Callable[[], list[np.ndarray]]


def opfusion_engine(name: str, exe: Any, feeds: dict[str, np.ndarray]) -> Engine:
    run = partial(exe.run, feeds)
    return Engine(name, run, run)


def ort_engine(path: str, x: np.ndarray) -> Engine | None:
    """ONNX Runtime on the CPU provider with one intra-op thread per core; None when it is
    not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = Target.current().num_cores
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    run = partial(session.run, None, {session.get_inputs()[0].name: x})
    return Engine("ort", run, run)


def openvino_engine(path: str, x: np.ndarray) -> tuple[Engine, bool, list[str]] | None:
    """OpenVINO on the CPU in f32, tuned for latency, with one thread per core, whether
    every operation of the compiled model runs in f32 (not bf16 or f16), and the kernels it
    runs above ``ONEDNN_MAX_CPU_ISA`` when that is set (:func:`openvino_above_cap`); None
    when it is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": Target.current().num_cores})
    request = compiled.create_infer_request()
    run = partial(request.infer, {0: x})

    def outputs() -> list[np.ndarray]:
        result = run()
        return [np.asarray(result[port]) for port in compiled.outputs]

    return Engine("openvino", run, outputs), openvino_runs_f32(compiled), openvino_above_cap(
        compiled)


#: Kernel names (OpenVINO's ``primitiveType``) that a cap of the ISA at AVX2 or below does
#: not hold: oneDNN's AVX-512 and AMX code, and MLAS's products, which choose by the CPU.
ABOVE_AVX2 = ("avx512", "amx", "mlas")


def openvino_above_cap(compiled: Any) -> list[str]:
    """With ``ONEDNN_MAX_CPU_ISA`` set to AVX2 or below, the operations of the compiled model
    that run wider code anyway (``"FullyConnected gemm_mlas_f32 x4"``): OpenVINO sends some
    products to MLAS and some reductions to its own AVX-512 kernels whatever the cap."""
    caps = [cap for _, cap in ISA_CAPS.values()]
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() not in caps:
        return []
    counts: dict[str, int] = {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        kind = info["primitiveType"].astype(str) if "primitiveType" in info else ""
        if any(word in kind for word in ABOVE_AVX2):
            key = f"{info['layerType'].astype(str)} {kind}"
            counts[key] = counts.get(key, 0) + 1
    return [f"{key} x{count}" for key, count in counts.items()]


def openvino_runs_f32(compiled: Any) -> bool:
    """Whether the precision hint reads f32 and no operation of the executable graph computes
    in a narrower float type."""
    if str(compiled.get_property("INFERENCE_PRECISION_HINT")) not in ("<Type: 'float32'>",
                                                                      "f32", "float32"):
        return False
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "runtimePrecision" in info and info["runtimePrecision"].astype(str) in (
                "bf16", "f16"):
            return False
    return True


def max_relative_diff(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Largest |got - want| over all outputs, relative to the largest |want|."""
    scale = max(float(np.max(np.abs(w))) for w in want) or 1.0
    return max(float(np.max(np.abs(np.asarray(g, np.float64) - w))) for g, w in zip(got, want)
               ) / scale


def compile_times(mod: opf.IRModule, params: dict[str, np.ndarray],
                  target: str | None = None) -> tuple[Any, float, float]:
    """Compile (for ``target``; None: the host) with an empty kernel cache, then again with
    it warm."""
    saved = os.environ.get("OPFUSION_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cache:
        os.environ["OPFUSION_CACHE_DIR"] = cache
        try:
            start = time.perf_counter()
            opf.compile(mod, params=params, target=target)
            cold = time.perf_counter() - start
            start = time.perf_counter()
            exe = opf.compile(mod, params=params, target=target)
            cached = time.perf_counter() - start
        finally:
            if saved is None:
                os.environ.pop("OPFUSION_CACHE_DIR", None)
            else:
                os.environ["OPFUSION_CACHE_DIR"] = saved
    return exe, cold, cached


def timed(engines: list[Engine], repeat: int, warmup: int = 2) -> list[float]:
    """Median seconds per call of each engine, interleaved in batches (see the module's
    docstring)."""
    for engine in engines:
        for _ in range(warmup):
            engine.run()
    return interleaved([e.run for e in engines], repeat, batch=1, batch_seconds=BATCH_SECONDS,
                       settle_seconds=SETTLE_SECONDS)


def model_path(name: str) -> str:
    """The ONNX file of a light, vision or transformer model (generated and cached on first
    use), or ``name`` itself when it is the path of an .onnx file."""
    if name.endswith(".onnx"):
        return name
    if name in VISION_MODEL_NAMES:
        return str(vision_model(name))
    if name in TRANSFORMER_MODEL_NAMES:
        return str(transformer_model(name))
    return str(light_model(name))


def row_label(name: str) -> str:
    """A model's name in the table (an .onnx file's name without its folder and suffix)."""
    return os.path.basename(name).removesuffix(".onnx") if name.endswith(".onnx") else name


def model_names(names: list[str], vision: bool, transformer: bool = False) -> list[str]:
    """The models to run: those named (light models when none are and no set is asked
    for), then the vision models if ``vision``, the transformer blocks if ``transformer``."""
    chosen = list(names) or ([] if vision or transformer else list(LIGHT_MODEL_NAMES))
    every = LIGHT_MODEL_NAMES + VISION_MODEL_NAMES + TRANSFORMER_MODEL_NAMES
    unknown = [name for name in chosen if name.removeprefix("light_") not in every
               and not (name.endswith(".onnx") and os.path.isfile(name))]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; the names are "
                         f"{', '.join(every)}")
    chosen += [name for name in VISION_MODEL_NAMES if vision and name not in chosen]
    return chosen + [name for name in TRANSFORMER_MODEL_NAMES
                     if transformer and name not in chosen]


def model_input(exe: Any) -> tuple[str, np.ndarray]:
    (input_name,) = exe.input_names
    shape = next(v.type.shape for v in exe.values if v.input_index == 0)
    return input_name, np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def print_header() -> None:
    versions = []
    for module in ("onnxruntime", "openvino"):
        try:
            versions.append(f"{module} {__import__(module).__version__.split('-')[0]}")
        except ImportError:
            versions.append(f"no {module}")
    host = Target("c")
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, cpu: {host_cpu_name()}, ISA {host.isa}, "
          f"{host.num_cores} cores; {', '.join(versions)}; load {os.getloadavg()[0]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*",
                        help="light or vision models (default: the nine light models)")
    parser.add_argument("--vision", action="store_true",
                        help="run the four torchvision models too (alone if no names)")
    parser.add_argument("--transformer", action="store_true",
                        help="run the transformer blocks too (alone if no names)")
    parser.add_argument("--repeat", type=int, default=30,
                        help="calls per engine at least (5 batches at least)")
    parser.add_argument("--no-ort", action="store_true")
    parser.add_argument("--no-openvino", action="store_true")
    parser.add_argument("--target", action="append", default=[],
                        help="compare these targets (give it once per target)")
    parser.add_argument("--isa", choices=sorted(ISA_CAPS),
                        help="opfusion and OpenVINO both held to this ISA; no ONNX Runtime")
    args = parser.parse_args()
    names = model_names(args.names, args.vision, args.transformer)
    target = None
    if args.isa:
        target, os.environ["ONEDNN_MAX_CPU_ISA"] = ISA_CAPS[args.isa]
    print_header()
    if args.target:
        compare_targets(names, args.target, args.repeat, not args.no_ort)
    else:
        if target is not None:
            print(f"# opfusion for {opf.Target(target).describe()}; OpenVINO with "
                  f"ONEDNN_MAX_CPU_ISA={os.environ['ONEDNN_MAX_CPU_ISA']}; no ONNX Runtime")
        compare_engines(names, args.repeat, not args.no_ort and target is None,
                        not args.no_openvino, target)
    print(f"# load after: {os.getloadavg()[0]:.2f}")


def compare_engines(names: list[str], repeat: int, with_ort: bool, with_openvino: bool,
                    target: str | None = None) -> None:
    """The table of the module's docstring; opfusion compiled for ``target`` (None: the
    host)."""
    import onnx

    print(f"{'model':<{NAME_WIDTH}} {'fused':>9} {'unfused':>9} {'ort':>9} {'openvino':>9} "
          f"{'fused/unf':>9} {'ort/opf':>8} {'ov/opf':>8} {'max diff':>9} {'kernels':>8} "
          f"{'cold':>7} {'cached':>7} {'plan MB':>8} {'all MB':>7}")
    ratios: dict[str, list[float]] = {"ort": [], "openvino": [], "unfused": []}
    notes: list[str] = []
    openvino_f32: list[bool] = []
    for name in names:
        path = model_path(name)
        mod, params = from_onnx(onnx.load(path))
        fused, cold, cached = compile_times(mod, params, target)
        input_name, x = model_input(fused)
        unfused = opf.compile(mod, params=params, fusion="none", target=target)
        engines = [opfusion_engine("fused", fused, {input_name: x}),
                   opfusion_engine("unfused", unfused, {input_name: x})]
        ort = ort_engine(path, x) if with_ort else None
        engines += [ort] if ort is not None else []
        openvino = openvino_engine(path, x) if with_openvino else None
        if openvino is not None:
            engines.append(openvino[0])
            openvino_f32.append(openvino[1])
            if openvino[2]:
                notes.append(f"# {name}: openvino runs above the ISA cap: "
                             f"{', '.join(openvino[2])}")
        want = [np.asarray(a, np.float64) for a in engines[0].outputs()]
        diffs = {e.name: max_relative_diff(e.outputs(), want) for e in engines[1:]}
        notes += [f"# {name}: {engine} differs from opfusion by {diff:.1e} of max|output|"
                  for engine, diff in diffs.items() if diff > MAX_DIFF]
        seconds = dict(zip([e.name for e in engines], timed(engines, repeat)))
        t_fused = seconds["fused"]
        cells = [seconds.get(e, math.nan) for e in ("unfused", "ort", "openvino")]
        for engine, value in zip(("unfused", "ort", "openvino"), cells):
            if not math.isnan(value):
                ratios[engine].append(value / t_fused)
        print(f"{row_label(name):<{NAME_WIDTH}} {t_fused * 1e3:>7.2f}ms "
              + " ".join(f"{t * 1e3:>7.2f}ms" for t in cells) + " "
              + " ".join(f"{t / t_fused:>{w}.2f}x" for t, w in zip(cells, (8, 7, 7)))
              + f" {max(diffs.values()):>9.1e} {fused.num_kernels:>8} {cold:>6.1f}s "
              f"{cached:>6.2f}s {fused.plan.total_bytes / 2**20:>8.1f} "
              f"{fused.plan.naive_bytes / 2**20:>7.1f}")
    for note in notes:
        print(note)
    if openvino_f32:
        print(f"# openvino in f32 on every model (hint and every operation's runtime "
              f"precision): {'yes' if all(openvino_f32) else 'NO'}")
    print(f"# opfusion's OpenMP threads: {wait_policy()}")
    print(f"geomean ort/opfusion {geomean(ratios['ort']):.3f} "
          f"openvino/opfusion {geomean(ratios['openvino']):.3f} "
          f"fused/unfused {geomean(ratios['unfused']):.3f}")


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def compare_targets(names: list[str], specs: list[str], repeat: int, with_ort: bool) -> None:
    """Fused latency of each model for each target, interleaved, side by side."""
    import onnx

    targets = [opf.Target(spec) for spec in specs]
    for index, target in enumerate(targets):
        print(f"# t{index}: {target.describe()}")
    heads = "".join(f"{'t' + str(i):>10}" for i in range(len(targets)))
    ratios = "".join(f"{'t0/t' + str(i):>8}" for i in range(1, len(targets)))
    print(f"{'model':<{NAME_WIDTH}}{heads}{ratios}{'ort':>10}{'ort/t-1':>9}{'cold':>7}")
    speedups: list[list[float]] = [[] for _ in targets]
    for name in names:
        path = model_path(name)
        mod, params = from_onnx(onnx.load(path))
        compiled = [compile_times(mod, params, str(t)) for t in targets]
        input_name, x = model_input(compiled[0][0])
        engines = [opfusion_engine(f"t{i}", exe, {input_name: x})
                   for i, (exe, _, _) in enumerate(compiled)]
        ort = ort_engine(path, x) if with_ort else None
        times = timed(engines + ([ort] if ort is not None else []), repeat)
        t_ort = times.pop() if ort is not None else math.nan
        for i, t in enumerate(times):
            speedups[i].append(times[0] / t)
        cells = "".join(f"{t * 1e3:>8.2f}ms" for t in times)
        cells += "".join(f"{times[0] / t:>7.2f}x" for t in times[1:])
        label = row_label(name)
        print(f"{label:<{NAME_WIDTH}}{cells}{t_ort * 1e3:>8.2f}ms{t_ort / times[-1]:>8.2f}x"
              f"{compiled[-1][1]:>6.1f}s")
    summary = " ".join(f"t0/t{i} {geomean(s):.3f}" for i, s in enumerate(speedups) if i)
    print(f"geomean {summary}")


if __name__ == "__main__":
    main()
