"""What a model's GPU kernels execute, read from their machine code, with no GPU.

    pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm   # NVIDIA's wheels on PyPI
    python benchmarks/gpu_sass.py [resnet50] [--batch 32] [--arch sm_90] [--target "cuda -tf32=1"]
                                  [--set KNOB=VALUE ...]

The model is built for the GPU target (``build_gpu_model``: the default schedule configs),
compiled by NVRTC to a cubin for ``--arch``, and disassembled by ``cuobjdump -sass``. For
each kernel with tensor-core instructions (``HMMA``) it prints, for its innermost loop that
holds them and for the outermost (the contraction step: the copies into shared memory and
the barriers as well), how many instructions the loop body has per ``HMMA``, and of them the
shared-memory loads (``LDS``) and stores (``STS``), global loads (``LDG``), async copies
(``LDGSTS``), barriers (``BAR``)
and float compares (``FSETP``: the TF32 rounding's test for a finite value). Also the
registers, spills and shared memory ptxas reports (NVRTC's ``--ptxas-options=-v``).

``--set KNOB=VALUE`` (repeatable; e.g. ``--set async_stages=2 --set double_buffer=False``)
counts the kernels with those knobs in place of the tensor-core rules' defaults, where a
group's space admits them (the rest keep the default): what a knob does to the machine code,
before a GPU times it.

A loop's body is counted once, as the code stands (instructions between a backward branch
and its target), not as it runs: inner loops that are not unrolled are counted once, and
no latency, occupancy or memory traffic is modelled. On an H100 each ``HMMA.1688.F32.TF32``
keeps a multiprocessor quarter's tensor core busy for about 4 cycles, in which that quarter
issues at most 4 instructions, so a loop of more than about 4 instructions per ``HMMA`` is
bound by issue rather than by the tensor cores. A change to a GPU schedule, to lowering or to
the CUDA emitter can be compared before and after this way on a machine with no GPU; its
time needs one (``benchmarks/gpu.py``)."""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from opfusion import testing
from opfusion.backend.cuda import nvrtc
from opfusion.compiler.gpu import build_gpu_model

#: Instruction kinds reported per loop.
KINDS = ("LDS", "STS", "LDG", "LDGSTS", "BAR", "FSETP")


def cuobjdump() -> str | None:
    """The path of ``cuobjdump``: on PATH, or from the ``nvidia-cuda-cuobjdump`` wheel."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia  # the namespace package NVIDIA's wheels install into
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for candidate in sorted(Path(root).glob("*/bin/cuobjdump")):
            return str(candidate)
    return None


def compile_with_report(source: str, arch: str) -> tuple[bytes, str]:
    """The cubin of ``source`` for ``arch`` and ptxas's per-kernel report."""
    bindings = nvrtc._bindings()
    err, program = bindings.nvrtcCreateProgram(source.encode(), b"model.cu", 0, [], [])
    nvrtc._check(bindings, err, "nvrtcCreateProgram")
    try:
        options = [f"--gpu-architecture={arch}".encode(),
                   *(o.encode() for o in nvrtc.BASE_OPTIONS), b"--ptxas-options=-v"]
        (err,) = bindings.nvrtcCompileProgram(program, len(options), options)
        log = nvrtc._log(bindings, program)
        nvrtc._check(bindings, err, f"nvrtcCompileProgram: {log[:500]}")
        err, size = bindings.nvrtcGetCUBINSize(program)
        nvrtc._check(bindings, err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        (err,) = bindings.nvrtcGetCUBIN(program, cubin)
        nvrtc._check(bindings, err, "nvrtcGetCUBIN")
        return cubin, log
    finally:
        bindings.nvrtcDestroyProgram(program)


def ptxas_usage(log: str) -> dict[str, str]:
    """Kernel name -> ptxas's registers / spills / shared memory line."""
    usage: dict[str, str] = {}
    kernel = None
    for line in log.splitlines():
        entry = re.search(r"Compiling entry function '(\w+)'", line)
        if entry:
            kernel = entry.group(1)
        elif kernel and "Used" in line:
            usage[kernel] = line.split("Used", 1)[1].strip()
        elif kernel and "spill" in line and " 0 bytes spill stores" not in line:
            usage[kernel + " spills"] = line.split(":", 2)[-1].strip()
    return usage


def kernels_sass(sass: str) -> dict[str, list[tuple[int, str]]]:
    """Kernel name -> its instructions as (address, text), in order."""
    kernels: dict[str, list[tuple[int, str]]] = {}
    for part in re.split(r"\n\s*Function : ", sass)[1:]:
        name = part.split("\n", 1)[0].strip()
        kernels[name] = [(int(m.group(1), 16), m.group(2).strip())
                         for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", part)]
    return kernels


def opcode(text: str) -> str:
    """``@!P0 LDS.U.128 R4, [R2]`` -> ``LDS``."""
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


def hmma_loops(code: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """The loops (target, branch address) whose bodies hold an HMMA, innermost first."""
    loops = []
    for address, text in code:
        branch = re.search(r"BRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address:
            loops.append((int(branch.group(1), 16), address))
    holding = [(a, b) for a, b in loops
               if any(a <= x <= b and opcode(t) == "HMMA" for x, t in code)]
    return sorted(holding, key=lambda loop: loop[1] - loop[0])


def loop_line(code: list[tuple[int, str]], loop: tuple[int, int]) -> str:
    body = [opcode(t) for x, t in code if loop[0] <= x <= loop[1]]
    counts = collections.Counter(body)
    hmma = counts["HMMA"]
    kinds = " ".join(f"{k} {counts[k]}" for k in KINDS)
    return f"{len(body):5d} instr, {hmma:3d} HMMA, {len(body) / hmma:5.1f} per HMMA | {kinds}"


@contextlib.contextmanager
def overridden_defaults(knobs: dict[str, object]):
    """The tensor-core rules' heuristic configs with ``knobs`` set, where the group's space
    admits the result (else the heuristic's own), while the context lasts."""
    from opfusion.backend.cuda.schedules import conv2d_mma, mma
    from opfusion.backend.schedule_rule import ScheduleError

    rules = (conv2d_mma.GPUConv2dMmaRule, mma.GPUMmaRule)
    saved = [rule.default_config for rule in rules]

    def wrapped(heuristic):
        def default_config(self, anchor, output, target):
            config = heuristic(self, anchor, output, target)
            try:
                return self.space(anchor, output, target).config(**{**dict(config), **knobs})
            except ScheduleError:
                return config
        return default_config

    try:
        for rule, heuristic in zip(rules, saved):
            rule.default_config = wrapped(heuristic)
        yield
    finally:
        for rule, heuristic in zip(rules, saved):
            rule.default_config = heuristic


def knob_value(text: str) -> tuple[str, object]:
    """``name=value`` as (name, value): an int, True/False, or the text."""
    name, _, value = text.partition("=")
    if value in ("True", "False"):
        return name, value == "True"
    try:
        return name, int(value)
    except ValueError:
        return name, value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="resnet50",
                        help="a workload of opfusion.testing.WORKLOADS")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--target", default="cuda -tf32=1")
    parser.add_argument("--set", action="append", default=[], type=knob_value,
                        metavar="KNOB=VALUE", help="a knob of the tensor-core rules' configs "
                        "in place of the default, where the space admits it")
    args = parser.parse_args()
    missing = nvrtc.nvrtc_available()
    tool = cuobjdump()
    if missing is not None or tool is None:
        print(f"needs NVRTC ({missing or 'found'}) and cuobjdump with nvdisasm beside it "
              f"({tool or 'pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm'})")
        return 1
    mod, params = testing.WORKLOADS[args.model](batch_size=args.batch)
    with overridden_defaults(dict(args.set)):
        model = build_gpu_model(mod, params, f"{args.target} -arch={args.arch}")
    cubin, log = compile_with_report(model.source.code, args.arch)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.cubin"
        path.write_bytes(cubin)
        # cuobjdump runs nvdisasm, which the wheels install beside it
        env = {**os.environ, "PATH": f"{Path(tool).parent}{os.pathsep}{os.environ['PATH']}"}
        sass = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True,
                              check=True, env=env).stdout
    usage = ptxas_usage(log)
    configs = {k.name: (k.schedule_config or {}) for k in model.kernels}
    print(f"# {args.model} batch {args.batch}, target {args.target!r}, {args.arch}: "
          f"{len(model.kernels)} kernels")
    totals: collections.Counter[str] = collections.Counter()
    for name, code in kernels_sass(sass).items():
        loops = hmma_loops(code)
        if not loops:
            continue
        group = re.sub(r"_\d+$", "", name) if name not in configs else name
        config = configs.get(name) or configs.get(group) or {}
        print(f"{name}  {config.get('rule')} {config.get('knobs')}")
        print(f"    ptxas: {usage.get(name, '?')}"
              + (f"; SPILLS {usage[name + ' spills']}" if name + " spills" in usage else ""))
        print(f"    innermost: {loop_line(code, loops[0])}")
        if loops[-1] != loops[0]:
            print(f"    outermost: {loop_line(code, loops[-1])}")
        body = [opcode(t) for x, t in code if loops[-1][0] <= x <= loops[-1][1]]
        totals.update(instructions=len(body), HMMA=body.count("HMMA"))
    if totals["HMMA"]:
        print(f"# all tensor-core kernels' outermost loops: {totals['instructions']} "
              f"instructions, {totals['HMMA']} HMMA, "
              f"{totals['instructions'] / totals['HMMA']:.1f} per HMMA")
    return 0


if __name__ == "__main__":
    sys.exit(main())
