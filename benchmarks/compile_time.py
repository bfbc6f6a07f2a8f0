"""Compile time of whole models: ``opfusion compile`` cold and cached, and the C compiler alone.

    python benchmarks/compile_time.py [MODEL...] [--repeat 3] [--before OLD_DIR] [--jobs N]

MODEL is a light model's name (default resnet50) or the path of an ONNX file, e.g. a
ViT-B/16 export made by ``benchmarks/export_vit_b16.py`` (which needs torch). For each model:

- ``opfusion compile`` run as a program, the way a user runs it, its wall time measured from
  outside (so it includes the interpreter's start-up): cold (an empty kernel cache) and
  cached (the cache the cold run filled); medians of ``--repeat`` runs, with the time and the
  stages the command printed for its last run;
- with ``--before OLD_DIR`` (a source tree, e.g. ``git worktree add /tmp/old main``), the
  same for that checkout, run in turn with this one so that a drifting machine slows both;
- the C compiler alone on the model's generated source: whole, in one process (as every
  source was compiled before it was split), against split into translation units for
  ``--jobs`` processes (default: this machine's cores), interleaved, and their ratio.

With ``--crossover``, instead: the C compiler, whole against split in ``--jobs`` units
however small they are, on the sources of models of growing size (the workloads of
:mod:`opfusion.testing.workloads`), to see from what size splitting pays
(:data:`~opfusion.backend.cpu.units.MIN_UNIT_BYTES`).

The load average is printed before and after each model, and with the C compiler's figures
the most cores other processes kept busy during a measurement (from /proc/stat): quote
figures only from a quiet machine (on two cores, a split build gains nothing when another
process holds one)."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def cpu_seconds() -> tuple[float, float]:
    """CPU seconds used so far by the whole machine (/proc/stat; 0 where there is none) and
    by this process and the children it has waited for."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(v) for v in handle.readline().split()[1:]]
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        busy = 0.0
    own = os.times()
    return busy, own.user + own.system + own.children_user + own.children_system


class Others:
    """How many cores other processes kept busy during a measurement: the noise in it (a
    split build gains nothing when no core is free)."""

    def __enter__(self) -> Others:
        self._start = time.perf_counter(), *cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        wall, busy, own = time.perf_counter(), *cpu_seconds()
        self.cores = max(0.0, (busy - self._start[1]) - (own - self._start[2])) / max(
            wall - self._start[0], 1e-9)


def model_path(name: str) -> str:
    if name.endswith(".onnx") or os.sep in name:
        return name
    from opfusion.testing.light import light_model

    return str(light_model(name))


def run_compile(tree: Path, model: str, cache: Path, output: Path) -> tuple[float, str]:
    """Wall seconds of ``opfusion compile`` from ``tree`` with kernel cache ``cache``, and
    what it printed about its time."""
    env = dict(os.environ, PYTHONPATH=str(tree), OPFUSION_CACHE_DIR=str(cache))
    start = time.perf_counter()
    # Run from the output's folder: `python -m` looks in the working directory first, where
    # another checkout's opfusion may be.
    result = subprocess.run([sys.executable, "-m", "opfusion", "compile", model, "-o",
                             str(output)], env=env, cwd=output.parent, capture_output=True,
                            text=True, check=False)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"opfusion compile failed ({tree}):\n{result.stderr}")
    printed = re.search(r"^  time +(.*?)$\n((?:^  stages.*$\n)?(?:^ {13}\S.*$\n)*)",
                        result.stdout, re.MULTILINE)
    text = "" if printed is None else " ".join(
        printed.group(0).replace("time", "", 1).replace("stages", "", 1).split())
    return wall, text


def command_times(trees: dict[str, Path], model: str, repeat: int) -> None:
    """Cold and cached ``opfusion compile`` of ``model`` for each tree, the trees in turn."""
    cold: dict[str, list[float]] = {name: [] for name in trees}
    cached: dict[str, list[float]] = {name: [] for name in trees}
    printed: dict[str, tuple[str, str]] = {}
    noise = 0.0
    with tempfile.TemporaryDirectory(prefix="opfusion-compile-time-") as work:
        for round_ in range(repeat):
            for name, tree in trees.items():
                cache = Path(work) / f"{name}-{round_}"
                output = Path(work) / f"{name}.opf"
                with Others() as others:
                    cold_seconds, cold_text = run_compile(tree, model, cache, output)
                    cached_seconds, cached_text = run_compile(tree, model, cache, output)
                noise = max(noise, others.cores)
                cold[name].append(cold_seconds)
                cached[name].append(cached_seconds)
                printed[name] = (cold_text, cached_text)
    print(f"  (other processes used up to {noise:.2f} cores during these runs)")
    for name in trees:
        print(f"  opfusion compile ({name}): cold {statistics.median(cold[name]):.2f} s, "
              f"cached {statistics.median(cached[name]):.2f} s (wall, median of {repeat})")
        for label, text in zip(("cold", "cached"), printed[name]):
            if text:
                print(f"    printed ({label}): {text}")
    if len(trees) == 2:
        new, old = trees
        for label, times in (("cold", cold), ("cached", cached)):
            ratio = statistics.median(times[old]) / statistics.median(times[new])
            print(f"  {label}: {old}/{new} {ratio:.2f}x")


def generated_source(mod: object, params: object) -> str:
    import opfusion as opf

    with tempfile.TemporaryDirectory(prefix="opfusion-compile-time-") as work:
        os.environ["OPFUSION_CACHE_DIR"] = work
        return opf.compile(mod, params=params).source()


def whole_and_split(source: str, repeat: int, jobs: int
                    ) -> tuple[float, float, int, float]:
    """Median seconds of the C compiler on ``source`` whole and split for ``jobs``
    (interleaved, an empty cache each time), the number of units of the split, and the
    largest number of cores that other processes kept busy during a measurement."""
    from opfusion.backend.cpu import toolchain, units

    count = len(units.translation_units(source, jobs))
    times: dict[int, list[float]] = {1: [], jobs: []}
    noise = 0.0
    with tempfile.TemporaryDirectory(prefix="opfusion-compile-time-") as work:
        for round_ in range(repeat):
            for processes in times:
                with Others() as others:
                    start = time.perf_counter()
                    toolchain.compile_source(
                        source, directory=Path(work) / f"{processes}-{round_}", jobs=processes)
                    times[processes].append(time.perf_counter() - start)
                noise = max(noise, others.cores)
    return statistics.median(times[1]), statistics.median(times[jobs]), count, noise


def c_compiler_times(model: str, repeat: int, jobs: int) -> None:
    """The C compiler on the model's source: whole against split, interleaved."""
    from opfusion.backend.cpu.units import split_sections
    from opfusion.frontend import from_onnx

    source = generated_source(*from_onnx(model))
    whole, split, count, noise = whole_and_split(source, repeat, jobs)
    sections = len(split_sections(source)[1])
    print(f"  C compiler: whole {whole:.2f} s, split into {count} units for {jobs} jobs "
          f"{split:.2f} s: {whole / split:.2f}x ({len(source) // 1024} KiB of C, "
          f"{sections} sections; other processes used up to {noise:.2f} cores meanwhile)")


def crossover(repeat: int, jobs: int) -> None:
    """Whole against split (however small the units) on sources of growing size."""
    from opfusion.backend.cpu import units
    from opfusion.testing.workloads import SMALL_WORKLOAD_ARGS, WORKLOADS

    units.MIN_UNIT_BYTES = 1
    print(f"{'workload':<28} {'KiB':>5} {'units':>5} {'whole':>7} {'split':>7} "
          f"{'whole/split':>11} {'others':>6}")
    cases = [(name, SMALL_WORKLOAD_ARGS.get(name, {})) for name in
             ("mlp", "transformer_encoder", "squeezenet", "mobilenet_v2", "resnet18")]
    cases.append(("resnet18", {}))
    for name, kwargs in cases:
        source = generated_source(*WORKLOADS[name](**kwargs))
        whole, split, count, noise = whole_and_split(source, repeat, jobs)
        label = name + (" (small)" if kwargs else "")
        print(f"{label:<28} {len(source) / 1024:>5.0f} {count:>5} {whole:>6.2f}s "
              f"{split:>6.2f}s {whole / split:>10.2f}x {noise:>6.2f}")
    print("others: the most cores that other processes kept busy during a measurement")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["resnet50"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", type=Path, help="a source tree of the opfusion to compare")
    parser.add_argument("--jobs", type=int, default=None,
                        help="compiler processes of the split build (default: the cores)")
    parser.add_argument("--crossover", action="store_true",
                        help="whole against split on workloads of growing size")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    from opfusion.backend.cpu.toolchain import compiler_version, find_compiler
    from opfusion.backend.cpu.units import build_jobs

    jobs = args.jobs or build_jobs()
    version = compiler_version(find_compiler()).splitlines()[0]
    print(f"# {build_jobs()} cores for the build; {version}")
    if args.crossover:
        crossover(args.repeat, jobs)
        return
    trees = {"this": HERE}
    if args.before is not None:
        trees["before"] = args.before.resolve()
    for name in args.models:
        model = model_path(name)
        print(f"{name} (load {load()})")
        command_times(trees, model, args.repeat)
        c_compiler_times(model, args.repeat, jobs)
        print(f"  (load {load()})")


if __name__ == "__main__":
    main()
