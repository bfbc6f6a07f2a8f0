"""The ``opfusion`` command: demo, compile, run, show, bench and cache.

    opfusion demo                                  built-in models, fused vs unfused
    opfusion compile model.onnx -o model.opf       import, optimize, fuse, generate C, export
    opfusion run model.opf [--input x=x.npy]       run (random inputs when none are given)
    opfusion show model.onnx --explain             the IR at a stage; why edges were not fused
    opfusion bench model.onnx --compare none,ort   a latency table
    opfusion cache info | clear                    the kernel cache: where, how big; empty it

Every error is one line on stderr and a non-zero exit status (1; 2 for a bad command line);
``--debug`` shows the traceback instead (and, when the C compiler failed, its whole output;
without it a summary: the first errors and the source's path). ``-v`` logs each stage
(``-vv`` more) through the standard ``logging`` module. On a terminal, compilation shows its
progress (a bar with ``tqdm``, the ``progress`` extra, when it is installed; else plain
lines). ``compile`` prints the time the user waited for, from the interpreter's start to
the written file, and how long each stage took."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from .errors import CompileError, OpfusionError
from .progress import Progress, compile_with_progress, count_groups, showing_progress
from .stages import listening, stage
from .target import host_num_cores
from .terminal import printable
from .transform.context import DEFAULT_OPT_LEVEL
from .transform.fusion_strategy import fusion_strategies

log = logging.getLogger("opfusion.cli")

STAGES = ("imported", "optimized", "fused")


class CommandError(OpfusionError):
    """A mistake on the command line or in the files it names."""


def _print(*values: Any, file: Any = None, flush: bool = False) -> None:
    """``print``, with every value made :func:`~opfusion.terminal.printable`: what the command
    prints holds names from the model (inputs, outputs, nodes, error messages), and a name
    must not be able to send control sequences to the terminal."""
    print(*(printable(value) for value in values), file=file, flush=flush)


# ---------------------------------------------------------------------------------------------
# models and inputs


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``name=1,3,224,224`` (or ``name=1x3x224x224``) -> ``("name", (1, 3, 224, 224))``."""
    name, sep, dims = text.rpartition("=")
    parts = dims.replace("x", ",").split(",")
    if not sep or not name or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise CommandError(f"bad --shape {text!r}: expected NAME=D1,D2,... with positive "
                           f"integers, e.g. --shape input=1,3,224,224")
    return name, tuple(int(p) for p in parts)


def _existing_file(path: str) -> Path:
    file = Path(path)
    if not file.exists():
        raise CommandError(f"no such file: {path}")
    if not file.is_file():
        raise CommandError(f"{path} is not a file")
    return file


def load_onnx(path: str, shapes: Sequence[str] = (), verbose: int = 0, *,
              allow_symbolic: bool = False, progress: Progress | None = None
              ) -> tuple[Any, dict[str, np.ndarray]]:
    """Import an ONNX file with ``--shape`` overrides (``NAME=D1,D2,...``), drawing on
    ``progress`` (default: a display of its own).

    A model with symbolic input dimensions left open is an error naming the --shape to give,
    unless ``allow_symbolic`` (the command fixes them otherwise): then its
    :class:`~opfusion.ir.symbolic.SymbolicModule` comes back."""
    from .frontend import from_onnx
    from .ir.symbolic import SymbolicModule

    file = _existing_file(path)
    overrides = dict(parse_shape(text) for text in shapes)
    start = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            shown = progress or stack.enter_context(showing_progress(verbose))
            shown.stage(f"importing {path}")
            stack.enter_context(listening(shown))
            with stage("import ONNX"):
                mod, params = from_onnx(str(file), shape=overrides)
    except OpfusionError as err:
        hint = _symbolic_input_hint(file, overrides)
        raise CommandError(f"{err}{hint}") from err
    if isinstance(mod, SymbolicModule) and not allow_symbolic:
        raise CommandError(f"{mod.first_symbolic()}; the command needs static shapes"
                           f"{_symbolic_input_hint(file, overrides)}")
    _refuse_staged(mod)
    log.info("imported %s in %.2f s", path, time.perf_counter() - start)
    return mod, params


def _refuse_staged(mod: Any) -> None:
    """The command line compiles static graphs: a model run in stages is an error saying how
    to run it."""
    from .frontend.onnx.staged import OnnxStagedModel

    if isinstance(mod, OnnxStagedModel):
        raise CommandError(f"the model's shapes depend on the values it computes ({mod.error}); "
                           "the command line compiles static graphs: run it from Python "
                           "(opf.compile(opf.frontend.from_onnx(path)[0]) runs it in stages)")


def _symbolic_input_hint(file: Path, overrides: dict[str, Any]) -> str:
    """When an input has a symbolic dimension and no --shape, the --shape that would do (for
    ``opfusion run``, an --input of any shape does too)."""
    try:
        import onnx

        graph = onnx.load(str(file), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - not an ONNX model at all: the error said so
        return ""
    initializers = {t.name for t in graph.initializer}
    for value in graph.input:
        if value.name in initializers or value.name in overrides:
            continue
        dims = value.type.tensor_type.shape.dim
        if any(not d.HasField("dim_value") for d in dims):
            shown = ",".join(str(d.dim_value) if d.HasField("dim_value") else "1" for d in dims)
            return (f" (on the command line: --shape {value.name}={shown}; opfusion run also "
                    f"takes the shape of --input {value.name}=FILE.npy)")
    return ""


def is_artifact(path: str) -> bool:
    """A compiled ``.opf`` file (a zip archive) rather than an ONNX model."""
    suffix = Path(path).suffix.lower()
    if suffix in (".onnx", ".pb"):
        return False
    return suffix == ".opf" or zipfile.is_zipfile(path)


def load_inputs(specs: Sequence[str], input_names: Sequence[str]
                ) -> dict[str, tuple[np.ndarray, str]]:
    """``--input NAME=FILE.npy`` values and their files (a bare ``FILE.npy`` for a model with
    one input)."""
    feeds = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            if len(input_names) != 1:
                raise CommandError(f"--input {spec!r}: name the input (NAME=FILE.npy); the "
                                   f"model's inputs are {', '.join(input_names)}")
            name, path = input_names[0], spec
        file = _existing_file(path)
        try:
            feeds[name] = (np.load(file, allow_pickle=False), path)
        except (ValueError, OSError) as err:
            raise CommandError(f"--input {spec!r}: {path} is not a .npy array file "
                               f"({err})") from None
    return feeds


def describe(array: np.ndarray) -> str:
    """``float32[1, 10]  min ... max ... mean ...  [first values]``."""
    text = f"{array.dtype}{list(array.shape)}"
    if array.size and array.dtype.kind in "fiub":
        values = array.astype(np.float64)
        text += f"  min {values.min():.4g}  max {values.max():.4g}  mean {values.mean():.4g}"
        head = ", ".join(f"{v:.4g}" for v in values.ravel()[:4])
        text += f"  [{head}{', ...' if array.size > 4 else ''}]"
    return text


def _type_text(ty: Any) -> str:
    return f"{ty.dtype}{list(ty.shape)}"


def _input_types(exe: Any) -> list[tuple[str, Any]]:
    infos = sorted((v for v in exe.values if v.input_index is not None),
                   key=lambda v: v.input_index)
    return [(exe.input_names[v.input_index], v.type) for v in infos]


# ---------------------------------------------------------------------------------------------
# commands


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DEMO_MODELS, run_demo

    names = list(DEMO_MODELS) if args.model == "all" else [args.model]

    def compile_fn(mod: Any, params: Any, fusion: str) -> Any:
        return compile_with_progress(args.verbose, mod, params, fusion=fusion,
                                     label=f"demo ({'fused' if fusion != 'none' else 'unfused'})")

    def write(text: str) -> None:
        _print(text, flush=True)

    results = run_demo(names, rounds=args.rounds, write=write, compile_fn=compile_fn)
    return 0 if results else 1


def cmd_compile(args: argparse.Namespace) -> int:
    if args.target is not None and args.target.device == "cuda":
        return _compile_for_gpu(args)
    output = Path(args.output) if args.output else Path(args.model).with_suffix(".opf")
    with showing_progress(args.verbose) as progress:
        times = progress.times
        if args.startup:
            times.add("start-up", args.startup)
        mod, params = load_onnx(args.model, args.shape, args.verbose, progress=progress)
        exe = compile_with_progress(args.verbose, mod, params, args.opt_level, args.fusion,
                                    verify=args.verify, target=args.target, progress=progress,
                                    records=_tuning_records(args.records))
        progress.stage(f"writing {output}")
        with listening(progress), stage("export"):
            exe.export(output)
    seconds = args.startup + time.perf_counter() - args.started
    from .demo import generated_source

    source, lines = generated_source(exe)
    operators = sum(len(step.group.op_names) for step in exe.steps)
    outputs = [_type_text(exe.values[i].type) for i in exe.outputs]
    _print(f"compiled {args.model} -> {output}")
    _print(f"  inputs     {', '.join(f'{n}: {_type_text(t)}' for n, t in _input_types(exe))}")
    _print(f"  outputs    {', '.join(outputs)}")
    _print(f"  target     {exe.target.describe()}")
    _print(f"  kernels    {exe.num_kernels} ({operators} operators; fusion {args.fusion}, "
          f"opt level {args.opt_level})")
    if exe.reference_steps:
        _print(f"  in Python  {', '.join(exe.reference_steps)} (no native code: NumPy "
               f"reference kernels, run between calls of the native entry)")
    _print(f"  memory     {exe.plan.total_bytes / 2**20:.2f} MB planned for intermediates "
          f"({exe.plan.naive_bytes / 2**20:.2f} MB unplanned)")
    _print(f"  time       {seconds:.2f} s" + ("; every kernel verified against the reference "
                                              "interpreter" if args.verify else ""))
    other = seconds - times.total()
    if other >= 0.005:
        times.add("other", other)
    _print(wrap_items(times.items(), "  stages     "))
    if source:
        _print(f"  C source   {source} ({lines} lines)")
    _print(f"run it with: opfusion run {output}")
    return 0


def _compile_for_gpu(args: argparse.Namespace) -> int:
    """``opfusion compile --target cuda``: the model's CUDA source (``.cu``) and its NVRTC
    build for the target's architecture (``.cubin``), written beside each other; needs no
    GPU."""
    from collections import Counter

    from .compiler.gpu import build_gpu_model

    records = _tuning_records(args.records)  # opfusion tune --target cuda... on a GPU
    output = Path(args.output) if args.output else Path(args.model).with_suffix(".cu")
    with showing_progress(args.verbose) as progress:
        mod, params = load_onnx(args.model, args.shape, args.verbose, progress=progress)
        progress.stage("lowering for the GPU")
        model = build_gpu_model(mod, params, args.target, args.opt_level, args.fusion,
                                records)
        arch = args.target.cuda_arch
        progress.stage(f"NVRTC ({arch})")
        image = model.compile(arch)
    source, binary = output.with_suffix(".cu"), output.with_suffix(".cubin")
    source.write_text(model.source.code)
    binary.write_bytes(image)
    rules = Counter((k.schedule_config or {"rule": "gpu_default"})["rule"]
                    for k in model.kernels if k.prim_func is not None)
    launches = sum(len(g.launches) for g in model.source.groups)
    seconds = args.startup + time.perf_counter() - args.started
    _print(f"compiled {args.model} -> {source}, {binary}")
    _print(f"  target     {args.target} (CUDA C, NVRTC for {arch})")
    _print(f"  kernels    {len(model.kernels)} in {launches} launches; "
           + ", ".join(f"{rule} {count}" for rule, count in sorted(rules.items())))
    if model.reference_steps:
        _print(f"  on host    {', '.join(model.reference_steps)} (NumPy reference kernels)")
    _print(f"  time       {seconds:.2f} s")
    _print("run it on a GPU with opf.compile(mod, target=...) (a GPUExecutor)")
    return 0


def _tuning_records(path: str | None) -> Any:
    """``--records``' file as TuningRecords (None without the option)."""
    if path is None:
        return None
    from .autotune.records import TuningRecords

    records = TuningRecords.load(_existing_file(path))
    if records.skipped:
        _print(f"warning: {records.skipped} lines of {path} are not tuning records; skipped",
               file=sys.stderr)
    return records


def cmd_tune(args: argparse.Namespace) -> int:
    from .autotune import TuneProgress, tune

    if args.trials < 1:
        raise CommandError(f"--trials must be at least 1, not {args.trials}")
    mod, params = load_onnx(args.model, args.shape, args.verbose)
    runner: Any = "local"
    if args.ray is not None:
        from .autotune.ray_runner import RayRunner

        runner = RayRunner(address=args.ray or None)

    def report(status: TuneProgress) -> None:
        entry = status.task
        best = "-" if entry.best_seconds is None else f"{entry.best_seconds * 1e3:.3f} ms"
        speedup = f", {entry.speedup:.2f}x" if entry.speedup is not None else ""
        default = ("" if entry.default_seconds is None
                   else f" (default {entry.default_seconds * 1e3:.3f} ms{speedup})")
        _print(f"[{status.trials:>5}/{status.total_trials}] {status.elapsed:6.0f} s  "
               f"{printable(entry.task.name, keep_newlines=False)} x{entry.task.weight}: best "
               f"{best}{default}; tuned groups {status.estimated_seconds * 1e3:.2f} ms per "
               f"run (untuned {status.untuned_seconds * 1e3:.2f} ms)", flush=True)

    result = tune(mod, params, target=args.target, trials=args.trials, records=args.output,
                  runner=runner, seconds=args.seconds, opt_level=args.opt_level,
                  fusion=args.fusion, callback=report, model_check=not args.no_model_check)
    _print(result.render())
    _print(f"records: {args.output}; compile with: opfusion compile {args.model} "
           f"--records {args.output}")
    return 0


def wrap_items(items: Sequence[str], indent: str, width: int = 100) -> str:
    """``items`` comma-separated after ``indent``, in lines of at most ``width`` characters
    broken between items only (each line after the first indented as far)."""
    lines = [indent]
    for k, item in enumerate(items):
        text = item + ("," if k + 1 < len(items) else "")
        if len(lines[-1]) > len(indent) and len(lines[-1]) + 1 + len(text) > width:
            lines.append(" " * len(indent))
        lines[-1] += ("" if len(lines[-1]) == len(indent) else " ") + text
    return "\n".join(lines)


def _executor_for(args: argparse.Namespace
                  ) -> tuple[Any, dict[str, tuple[np.ndarray, str]] | None]:
    """Load a compiled .opf, or compile an ONNX model with the command's options; with the
    ``--input`` arrays when they were loaded to fix the model's symbolic dimensions."""
    if is_artifact(str(_existing_file(args.model))):
        given = [flag for flag, value in (("--shape", args.shape), ("--fusion", args.fusion),
                                          ("--opt-level", args.opt_level),
                                          ("--target", args.target))
                 if value not in (None, [])]
        if given:
            raise CommandError(f"{given[0]} applies when compiling an ONNX model; "
                               f"{args.model} is already compiled")
        from .compiler.artifact import load

        return load(args.model), None
    from .ir.symbolic import SymbolicModule

    mod, params = load_onnx(args.model, args.shape or (), args.verbose,
                            allow_symbolic=bool(args.input))
    loaded = None
    if isinstance(mod, SymbolicModule):  # the --input arrays' shapes fix its dimensions
        loaded = load_inputs(args.input, mod.input_names)
        mod, params = _specialize(mod, loaded, args.verbose)
    exe = compile_with_progress(args.verbose, mod, params,
                                DEFAULT_OPT_LEVEL if args.opt_level is None else args.opt_level,
                                args.fusion or "tvm", target=args.target)
    return exe, loaded


def _specialize(mod: Any, loaded: dict[str, tuple[np.ndarray, str]], verbose: int
                ) -> tuple[Any, dict[str, np.ndarray]]:
    """The symbolic module ``mod`` imported for the shapes of the ``--input`` arrays."""
    from .compiler.specialize import check_shapes

    given = {name: array.shape for name, (array, _) in loaded.items()}
    symbolic = [tensor.name for tensor in mod.symbolic_inputs()]
    missing = [name for name in symbolic if name not in given]
    if missing:
        raise CommandError(f"input {missing[0]!r} has symbolic dimensions: give it with "
                           f"--input {missing[0]}=FILE.npy (or fix them with --shape)")
    check_shapes(mod, given)
    shapes = {name: given[name] for name in symbolic}
    text = ", ".join(f"{name}: {list(shape)}" for name, shape in shapes.items())
    with showing_progress(verbose) as progress:
        progress.stage(f"importing for the inputs' shapes ({text})")
        specialized = mod.specialize(shapes)
    _refuse_staged(specialized[0])
    return specialized


def cmd_run(args: argparse.Namespace) -> int:
    from .compiler.compile import random_inputs

    exe, loaded = _executor_for(args)
    exe.set_num_threads(args.threads)
    if args.input:
        if loaded is None:
            loaded = load_inputs(args.input, exe.input_names)
        feeds = {name: array for name, (array, _) in loaded.items()}
        sources = {name: path for name, (_, path) in loaded.items()}
    else:
        feeds = dict(zip(exe.input_names, random_inputs(exe, seed=args.seed)))
        sources = {}
    start = time.perf_counter()
    outputs = exe.run(feeds)
    seconds = time.perf_counter() - start
    _print("inputs:" if sources else f"inputs (random, standard normal, seed {args.seed}):")
    for name, array in feeds.items():
        _print(f"  {name}  {array.dtype}{list(array.shape)}"
              + (f"  from {sources[name]}" if name in sources else ""))
    _print(f"outputs ({seconds * 1e3:.2f} ms, first run):")
    for index, (name, array) in enumerate(zip(exe.output_names, outputs)):
        _print(f"  {index}  {printable(name, keep_newlines=False)}  {describe(array)}")
    if args.save:
        keys = npz_keys(exe.output_names)
        np.savez(args.save, **dict(zip(keys, outputs)))
        _print(f"saved the outputs to {args.save} as {', '.join(keys)}")
    if args.profile:
        _print(f"\nprofile (median of {args.repeat} runs per kernel):")
        _print(exe.profile(feeds, repeat=args.repeat))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from .compiler.compile import alter_layout, fuse
    from .transform import InferType, PassContext, explain_fusion, fusion_to_dot, optimize

    mod, params = load_onnx(args.model, args.shape, args.verbose)
    fuse_level = 0 if args.fusion == "none" else args.opt_level
    with PassContext(opt_level=args.opt_level):
        imported = InferType()(mod)
        optimized = optimize(imported, params)
        # What opf.compile fuses: the optimized graph in the host's blocked layouts.
        laid_out = alter_layout(optimized, None)
        fused = fuse(laid_out, args.fusion, args.opt_level)
        stage = args.stage or ("fused" if not (args.dot or args.explain) else None)
        if stage is not None:
            shown = {"imported": imported, "optimized": optimized, "fused": fused}[stage]
            _print(shown.astext(show_meta_data=False))
            from .demo import count_operators

            _print(f"opfusion: {stage}: {count_operators(shown)} operators"
                  + (f" in {count_groups(fused)} fused groups (fusion {args.fusion}, opt "
                     f"level {args.opt_level})" if stage == "fused" else ""), file=sys.stderr)
        if args.explain:
            report = explain_fusion(laid_out, fuse_opt_level=fuse_level)
            _print(report.render())
            if report:
                rules = ", ".join(f"{rule} {n}" for rule, n in report.by_rule().items())
                _print(f"refusals by rule: {rules}")
        if args.dot:
            write_dot(fusion_to_dot(laid_out, fuse_opt_level=fuse_level), args.dot)
        if args.fusion == "cinn" and (args.explain or args.dot):
            _print("(--explain and --dot show FuseOps' groups; with --fusion cinn, FusionMerge "
                  "then merges some of them: see --stage fused)")
    return 0


def write_dot(text: str, path: str) -> None:
    """Write DOT text to ``path``; for .svg/.png/.pdf render it with Graphviz's ``dot`` when
    it is installed, and otherwise write the DOT text beside it (with a note)."""
    target = Path(path)
    fmt = target.suffix.lower().lstrip(".")
    if fmt in ("dot", "gv"):
        target.write_text(text + "\n", encoding="utf-8")
        _print(f"wrote the fused groups (one cluster per group) to {target}")
        return
    if fmt not in ("svg", "png", "pdf"):
        raise CommandError(f"--dot {path}: give a .dot, .gv, .svg, .png or .pdf file")
    program = shutil.which("dot")
    if program is None:
        fallback = target.with_suffix(".dot")
        fallback.write_text(text + "\n", encoding="utf-8")
        _print(f"Graphviz's `dot` program is not installed, so the DOT text went to {fallback} "
              f"instead of {target} (install graphviz, e.g. apt install graphviz, or render the "
              f"file with any Graphviz viewer)", file=sys.stderr)
        return
    result = subprocess.run([program, f"-T{fmt}", "-o", str(target)], input=text, text=True,
                            capture_output=True, check=False)
    if result.returncode != 0:
        raise CommandError(f"Graphviz's dot failed on the fusion graph: "
                           f"{result.stderr.strip() or result.returncode}")
    _print(f"wrote the fused groups (one cluster per group) to {target}")


def cmd_cache(args: argparse.Namespace) -> int:
    from .backend.cpu.toolchain import cache_info, clear_cache

    if args.action == "clear":
        removed = clear_cache()
        print(f"removed {removed} entries from {cache_info().path}")
        return 0
    info = cache_info()
    print(f"path:    {info.path}")
    print(f"entries: {info.entries}")
    print(f"size:    {_bytes(info.total_bytes)} ({info.total_bytes} bytes)")
    print(f"limit:   {_bytes(info.limit_bytes)} (set OPFUSION_CACHE_LIMIT to change it)")
    return 0


def _bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def cmd_bench(args: argparse.Namespace) -> int:
    from .compiler.compile import random_inputs
    from .demo import interleaved_medians, machine_summary, median_ratio, relative_error

    engines = [e.strip() for e in args.compare.split(",") if e.strip()] if args.compare else []
    compare_engines = _compare_engines()
    unknown = [e for e in engines if e not in compare_engines]
    if unknown:
        raise CommandError(f"--compare: unknown engine {unknown[0]!r}; choose from "
                           f"{', '.join(compare_engines)} (comma-separated)")
    if is_artifact(str(_existing_file(args.model))):
        raise CommandError(f"bench takes an ONNX model (it compiles it several ways); "
                           f"{args.model} is a compiled artifact: use opfusion run --profile")
    mod, params = load_onnx(args.model, args.shape, args.verbose)
    compile_seconds: dict[str, str] = {}

    def compile_for(fusion: str) -> Any:
        start = time.perf_counter()
        exe = compile_with_progress(args.verbose, mod, params, args.opt_level, fusion,
                                    label=f"opfusion ({fusion})", target=args.target)
        compile_seconds[f"opfusion ({fusion})"] = f"{time.perf_counter() - start:.2f}s"
        exe.set_num_threads(args.threads)
        return exe

    main_exe = compile_for(args.fusion)
    feeds = dict(zip(main_exe.input_names, random_inputs(main_exe)))
    reference = main_exe.run(feeds)
    runners: dict[str, Callable[[], Any]] = {f"opfusion ({args.fusion})":
                                             lambda: main_exe.run(feeds)}
    kernels = {f"opfusion ({args.fusion})": str(main_exe.num_kernels)}
    errors = {}
    for engine in dict.fromkeys(engines):
        if engine == args.fusion:
            continue
        if engine == "ort":
            session = _ort_session(args.model, args.threads)
            names = [i.name for i in session.get_inputs()]
            ort_feeds = {name: feeds[name] for name in names}
            runners["onnxruntime"] = lambda s=session, f=ort_feeds: s.run(None, f)
            kernels["onnxruntime"] = "-"
            errors["onnxruntime"] = relative_error(runners["onnxruntime"](), reference)
            continue
        exe = compile_for(engine)
        label = f"opfusion ({engine})"
        runners[label] = lambda e=exe: e.run(feeds)
        kernels[label] = str(exe.num_kernels)
        errors[label] = relative_error(exe.run(feeds), reference)
    log.info("timing %s", ", ".join(runners))
    medians = interleaved_medians(runners, rounds=args.rounds)
    base = medians[next(iter(runners))]
    inputs = ", ".join(f"{n}: {_type_text(t)}" for n, t in _input_types(main_exe))
    _print(f"model: {args.model} ({inputs})")
    _print(f"machine: {machine_summary()}")
    width = max(len(name) for name in runners)
    _print(f"{'engine':<{width}}  {'median':>10}  {'time/first':>10}  {'kernels':>7}  "
          f"{'max diff':>8}  {'compile':>7}")
    for name, times in medians.items():
        ratio = median_ratio(times, base)
        diff = f"{errors[name]:.1e}" if name in errors else "-"
        median = statistics.median(times)
        _print(f"{name:<{width}}  {median * 1e3:>8.3f}ms  {ratio:>9.2f}x  {kernels[name]:>7}  "
              f"{diff:>8}  {compile_seconds.get(name, '-'):>7}")
    _print(f"median of {args.rounds} rounds of interleaved runs; time/first: this row's time over "
          f"the first row's;\nmax diff: largest difference from the first row's output, "
          f"relative to its largest value; compile: opf.compile's time (-v: by stage)")
    return 0


def _ort_session(path: str, threads: int = 0) -> Any:
    try:
        import onnxruntime as ort
    except ImportError:
        raise CommandError("--compare ort needs onnxruntime: pip install onnxruntime") from None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or host_num_cores()
    options.log_severity_level = 3
    # Interleaved timing: ONNX Runtime's threads otherwise keep spinning after a run and slow
    # down whichever engine runs next.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - onnxruntime raises its own exception types
        raise CommandError(f"onnxruntime cannot load {path}: {err}") from None


# ---------------------------------------------------------------------------------------------
# the command line


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line."""

    def error(self, message: str) -> NoReturn:
        text = printable(f"{self.prog}: error: {message} (see {self.prog} --help)")
        self.exit(2, text + "\n")


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                        help="log each stage (-vv: every pass)")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the traceback of an error")
    return common


def _compile_options(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    parser.add_argument("--shape", action="append", default=[] if not optional else None,
                        metavar="NAME=D1,D2,...",
                        help="an input's shape (needed for symbolic dimensions); repeatable")
    parser.add_argument("--opt-level", type=int, choices=range(4), metavar="{0,1,2,3}",
                        default=None if optional else DEFAULT_OPT_LEVEL,
                        help=f"optimization level (default {DEFAULT_OPT_LEVEL})")
    strategies = fusion_strategies()
    described = "; ".join(f"{name}: {s.doc}" for name, s in strategies.items())
    parser.add_argument("--fusion", choices=list(strategies),
                        default=None if optional else "tvm",
                        help=f"fusion strategy (default tvm). {described}")
    parser.add_argument("--target", type=_target, default=None, metavar="TARGET",
                        help="the machine to compile for, e.g. 'c' (this CPU, the default), "
                             "'c -mattr=+avx2,+fma' (any AVX2 CPU), 'llvm -mcpu=znver4', "
                             "'cuda -arch=sm_90' (compile writes CUDA C and a cubin)")


def _threads_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=_thread_count, default=0, metavar="N",
                        help="threads the kernels run on (default: every core)")


def _thread_count(text: str) -> int:
    """``--threads``'s value: an int from 0 (every core) to 4096."""
    from .compiler.executor import check_num_threads

    try:
        value = int(text)
        check_num_threads(value)
    except (ValueError, OpfusionError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a thread count (0 to 4096)") from None
    return value


def _target(text: str) -> Any:
    """``--target``'s value as an opf.Target (a bad one is argparse's usage error)."""
    from .target import Target, TargetError

    try:
        return Target(text)
    except TargetError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _compare_engines() -> tuple[str, ...]:
    """What ``bench --compare`` takes: every fusion strategy, and ONNX Runtime."""
    return (*fusion_strategies(), "ort")


# np.savez's own keyword arguments, which an array may not be saved under.
_SAVEZ_KEYWORDS = frozenset({"file", "args", "kwds", "allow_pickle"})


def npz_keys(names: Sequence[str]) -> list[str]:
    """One key per output for ``--save``: its name with anything but letters, digits, ``_``,
    ``-`` and ``.`` replaced by ``_`` (a key is a file name inside the .npz), and
    ``output_<i>`` where that leaves no usable key (empty, a leading dot, too long, a
    keyword of np.savez, or taken by an earlier output)."""
    keys: list[str] = []
    for index, name in enumerate(names):
        key = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
        if (not key or key.startswith(".") or len(key) > 100 or key in _SAVEZ_KEYWORDS
                or key in keys):
            key = f"output_{index}"
            while key in keys:
                key += "_"
        keys.append(key)
    return keys


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    parser = _Parser(prog="opfusion", parents=[common],
                     description="opfusion: a deep-learning compiler built around operator "
                                 "fusion.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"opfusion {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=_Parser)

    demo = commands.add_parser("demo", parents=[common], help="built-in models: fused vs "
                               "unfused latency, checked against the reference interpreter")
    demo.add_argument("--model", choices=("all", "cnn", "transformer"), default="all")
    demo.add_argument("--rounds", type=int, default=5, help="timing rounds (default 5)")
    demo.set_defaults(handler=cmd_demo)

    compile_ = commands.add_parser("compile", parents=[common],
                                   help="compile an ONNX model into a .opf file")
    compile_.add_argument("model", metavar="MODEL.onnx")
    compile_.add_argument("-o", "--output", metavar="OUT.opf",
                          help="where to write the compiled model (default MODEL.opf)")
    _compile_options(compile_)
    compile_.add_argument("--verify", action="store_true",
                          help="check every kernel against the reference interpreter")
    compile_.add_argument("--records", metavar="RECORDS.json",
                          help="tuning records (from `opfusion tune`): each group gets the "
                               "best config measured for it")
    compile_.set_defaults(handler=cmd_compile)

    tune_ = commands.add_parser(
        "tune", parents=[common], help="search the kernels' schedule knobs, keep the records",
        description="Tune the schedule knobs of every fused group of an ONNX model: "
                    "candidates are built, then measured one at a time in a worker process "
                    "(on the GPU for --target cuda...) and checked against the reference "
                    "interpreter; every result is "
                    "appended to the records (a second run with the same file continues). "
                    "Last, the tuned groups are timed in the compiled model beside the "
                    "heuristic's, and a config slower there is not kept. "
                    "Compile with the records: opfusion compile MODEL.onnx --records FILE.")
    tune_.add_argument("model", metavar="MODEL.onnx")
    tune_.add_argument("--trials", type=int, default=1000,
                       help="candidates to measure (default 1000)")
    tune_.add_argument("--seconds", type=float, default=None,
                       help="stop after the round that passes this much wall time")
    tune_.add_argument("-o", "--output", default="tune.json", metavar="RECORDS.json",
                       help="the records file to append to (default tune.json)")
    tune_.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                       help="measure on a Ray cluster (ADDRESS: 'auto', 'ray://host:port'; "
                            "none: a local Ray); needs pip install opfusion[tune]")
    tune_.add_argument("--no-model-check", action="store_true",
                       help="keep the configs that won alone, without timing them in the "
                            "model")
    _compile_options(tune_)
    tune_.set_defaults(handler=cmd_tune)

    run = commands.add_parser(
        "run", parents=[common], help="run a .opf or ONNX model",
        description="Run a compiled .opf file or an ONNX model. WARNING: a .opf file holds "
                    "native code, and running it runs that code (like unpickling a file): "
                    "run only .opf files from a source you trust. Loading checks the file "
                    "against its library's own kernel table, so a damaged or edited file is "
                    "an error, not a crash.")
    run.add_argument("model", metavar="MODEL.opf|MODEL.onnx")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input's value (repeatable); random standard-normal without any")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    run.add_argument("--profile", action="store_true", help="print the per-kernel profile")
    run.add_argument("--repeat", type=int, default=10, help="runs per kernel for --profile")
    run.add_argument("--save", metavar="OUT.npz", help="save the outputs")
    _threads_option(run)
    _compile_options(run, optional=True)
    run.set_defaults(handler=cmd_run)

    show = commands.add_parser("show", parents=[common],
                               help="print the IR at a stage, draw or explain the fusion")
    show.add_argument("model", metavar="MODEL.onnx")
    show.add_argument("--stage", choices=STAGES,
                      help="imported, optimized or fused (default fused, unless only --dot or "
                           "--explain is asked for)")
    show.add_argument("--dot", metavar="OUT.svg|OUT.dot",
                      help="draw the fused groups (SVG, PNG, PDF need Graphviz's dot)")
    show.add_argument("--explain", action="store_true",
                      help="say why each unfused edge was not fused")
    _compile_options(show)
    show.set_defaults(handler=cmd_show)

    bench = commands.add_parser("bench", parents=[common],
                                help="latency of opfusion against other engines")
    bench.add_argument("model", metavar="MODEL.onnx")
    bench.add_argument("--compare", default="none,ort", metavar="ENGINES",
                       help=f"comma-separated: {', '.join(fusion_strategies())} (opfusion's "
                            f"fusion strategies), ort (onnxruntime); default none,ort")
    bench.add_argument("--rounds", type=int, default=5, help="timing rounds (default 5)")
    _threads_option(bench)
    _compile_options(bench)
    bench.set_defaults(handler=cmd_bench)

    cache = commands.add_parser(
        "cache", parents=[common], help="show or empty the kernel cache",
        description="The kernel cache ($OPFUSION_CACHE_DIR/kernels, default "
                    "~/.cache/opfusion/kernels) holds compiled kernel libraries, each checked "
                    "against a recorded SHA-256 before use. It is kept under "
                    "$OPFUSION_CACHE_LIMIT bytes (default 2G), least recently used first.")
    cache.add_argument("action", choices=("info", "clear"),
                       help="info: path, entries, size and limit; clear: remove every entry")
    cache.set_defaults(handler=cmd_cache)
    return parser


class _PrintableFormatter(logging.Formatter):
    """Log records, like everything else the command prints, made printable."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def startup_seconds() -> float | None:
    """How long this process has been running (its start-up, when called first thing), from
    the kernel's record of its start; None where there is no /proc (not Linux)."""
    try:
        with open("/proc/self/stat") as handle:
            # Field 22, counted after the command name (which may hold spaces) in parentheses.
            start_ticks = int(handle.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def _first_line(err: BaseException) -> str:
    # Escaped first, then split at newlines only: a carriage return (or another character
    # str.splitlines breaks at) in a model's name stays visible as \r, inside its line.
    lines = printable(str(err)).strip().split("\n") or [type(err).__name__]
    more = f" ({len(lines) - 1} more lines: rerun with --debug)" if len(lines) > 1 else ""
    return lines[0] + more


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``opfusion`` command with ``argv`` (default ``sys.argv[1:]``); return the exit
    status."""
    args = build_parser().parse_args(argv)
    args.verbose = getattr(args, "verbose", 0) or 0
    args.started = time.perf_counter()
    # Run as a program (not called from Python): the user also waited for the interpreter to
    # start and import opfusion.
    args.startup = (startup_seconds() or 0.0) if argv is None else 0.0
    debug = getattr(args, "debug", False)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_PrintableFormatter("opfusion: %(message)s"))
    logging.basicConfig(handlers=[handler],
                        level=logging.DEBUG if args.verbose > 1 else
                        logging.INFO if args.verbose else logging.WARNING)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        if debug:
            raise
        _print("opfusion: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - every error becomes one line (or a traceback)
        if debug:
            if isinstance(err, CompileError):
                _print(f"opfusion: the C compiler's command:\n{err.command}\nand its whole "
                       f"output:\n{err.compiler_output}", file=sys.stderr)
            raise
        if isinstance(err, CompileError):  # its message is a summary of several lines
            _print(f"opfusion: error: {err}", file=sys.stderr)
        elif isinstance(err, OpfusionError):
            _print(f"opfusion: error: {_first_line(err)}", file=sys.stderr)
        elif isinstance(err, OSError):
            _print(f"opfusion: error: {err.strerror or err}"
                  + (f": {err.filename}" if err.filename else ""), file=sys.stderr)
        else:
            _print(f"opfusion: internal error: {type(err).__name__}: {_first_line(err)} "
                  f"(rerun with --debug for the traceback, and please report it)",
                  file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
