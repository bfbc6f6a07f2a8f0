"""``opf.Target``: the machine code is generated for, parsed from a string as in TVM.

    opf.Target("c")                          # the host CPU, its features detected
    opf.Target("llvm -mcpu=znver4")          # a CPU by name
    opf.Target("c -mattr=+avx2,+fma")        # a generic x86-64 CPU plus these features
    opf.Target("c -mcpu=native -mattr=-avx512f")  # the host without AVX-512
    opf.Target("c -num-cores=4 -l2-cache=2M")
    with opf.Target("c -mattr=+avx2,+fma"):  # the current target of opf.compile / opf.build
        exe = opf.compile(mod, params=params)

``"c"`` and ``"llvm"`` both name the CPU backend (opfusion generates C for it either way; TVM
scripts say "llvm"). A target holds the kind, the architecture, the ISA features (closed under
implication: ``+avx512f`` brings AVX2 and FMA), the vector width per dtype, the vector register
count, the core count and the data-cache sizes, and the compiler flags they imply.
``str(target)`` parses back to an equal target. Everything that depends on the hardware reads
the target; nothing else assumes it."""

from __future__ import annotations

import functools
import re
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BuildError
from . import isa
from .host import (
    compilable_host_features,
    format_size,
    host_arch,
    host_cache_bytes,
    host_features,
    host_num_cores,
    parse_size,
)


class TargetError(BuildError):
    """A target string or object opfusion cannot use: an unknown kind, option, CPU or
    feature, a bad value, or a target whose code this machine cannot run."""


@dataclass(frozen=True)
class TargetKind:
    """A kind of target (``c``, ``llvm``, ``cuda``): its options (name -> parser of the
    value) and the device family it compiles for."""

    name: str
    device: str
    options: tuple[str, ...]
    doc: str


_KINDS: dict[str, TargetKind] = {}


#: Kernel work below which a parallel loop runs on the calling thread (see
#: :attr:`Target.min_parallel_work`).
PARALLEL_GRAIN = 1 << 15


def register_target_kind(kind: TargetKind) -> TargetKind:
    """Make ``kind`` parseable by :class:`Target` (a new backend registers its kind)."""
    if kind.name in _KINDS:
        raise TargetError(f"target kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


_CPU_OPTIONS = ("mcpu", "mattr", "num-cores", "l1-cache", "l2-cache", "l3-cache")
register_target_kind(TargetKind("c", "cpu", _CPU_OPTIONS, "C for the CPU (host by default)"))
register_target_kind(TargetKind("llvm", "cpu", _CPU_OPTIONS, "the CPU backend, TVM's spelling"))
#: The architecture a CUDA target without ``-arch`` compiles for: Ampere, whose code runs on
#: Hopper too.
DEFAULT_CUDA_ARCH = "sm_80"

#: Multiprocessors of the largest GPU of each architecture (A100, A10/RTX 30, L4/RTX 40,
#: H100 and H200 SXM): what a schedule must give work to, unless ``-sms=N`` says otherwise.
CUDA_MULTIPROCESSORS = {"sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_90": 132}

register_target_kind(TargetKind("cuda", "cuda", ("arch", "num-cores", "sms", "tf32"),
                                "CUDA C for an NVIDIA GPU (-arch=sm_90 -sms=132 -tf32=1|fast)"))

#: Shared memory one block may opt in to, per architecture (CUDA C++ Programming Guide,
#: "Technical Specifications per Compute Capability": 96 KB on 7.0, 64 KB on 7.5, 163 KB on
#: 8.0 and 8.7, 99 KB on 8.6 and 8.9, 227 KB on 9.0).
CUDA_SHARED_MEMORY_PER_BLOCK = {"sm_70": 96 * 1024, "sm_75": 64 * 1024, "sm_80": 163 * 1024,
                                "sm_86": 99 * 1024, "sm_87": 163 * 1024, "sm_89": 99 * 1024,
                                "sm_90": 227 * 1024}

#: The first architecture with TF32 tensor cores (Ampere).
TF32_ARCH = 80

#: ``-tf32=`` values: off, operands rounded to nearest, operands truncated by the tensor cores.
TF32_MODES = ("0", "1", "fast")


def target_kinds() -> list[str]:
    """Names of the target kinds :class:`Target` parses."""
    return list(_KINDS)


class Target:
    """The machine code is generated for; see the module docstring for the string syntax.

    ``Target(s)`` parses ``s``; ``Target(target)`` returns an equal target. Options:
    ``-mcpu=NAME`` (a known CPU or ``native``), ``-mattr=+f,-g`` (features added to or removed
    from the CPU's; without ``-mcpu``, ``-mattr`` starts from the architecture's baseline and a
    bare kind is the host), ``-num-cores=N`` and ``-l1-cache=``/``-l2-cache=``/``-l3-cache=``
    (bytes, K/M suffixes) overriding what the OS reports."""

    def __init__(self, spec: str | Target) -> None:
        if isinstance(spec, Target):
            spec = str(spec)
        if not isinstance(spec, str):
            raise TargetError(f"a target is a string such as 'c' or 'llvm -mcpu=znver4', not "
                              f"{type(spec).__name__}")
        words = spec.split()
        if not words:
            raise TargetError("an empty target string; use 'c' for the host CPU")
        kind = _KINDS.get(words[0])
        if kind is None:
            raise TargetError(f"unknown target kind {words[0]!r} in {spec!r}; known kinds: "
                              f"{', '.join(_KINDS)}")
        self.kind = kind
        self.options = _parse_options(kind, words[1:], spec)
        self.arch, self.features = self._resolve_features(spec)
        self._caches = self._resolve_caches(spec)
        self.num_cores = self._resolve_cores(spec)

    # -- parsing -----------------------------------------------------------------------------

    def _resolve_features(self, spec: str) -> tuple[str, frozenset[str]]:
        if self.kind.device != "cpu":
            return self.kind.name, frozenset()
        mcpu = self.options.get("mcpu")
        mattr = self.options.get("mattr")
        if mcpu in (None, "native") and (mattr is None or mcpu == "native"):
            arch, features = host_arch(), compilable_host_features()
        elif mcpu is None:  # -mattr alone: the baseline of the architecture it names
            arch = _arch_of_features(_split_mattr(mattr or ""))
            features = isa.closure(arch, ())
        elif mcpu == "native":
            arch, features = host_arch(), isa.closure(host_arch(), ())
        elif mcpu in isa.KNOWN_CPUS:
            arch, names = isa.KNOWN_CPUS[mcpu]
            features = isa.closure(arch, names)
        else:
            raise TargetError(f"unknown CPU -mcpu={mcpu!r} in {spec!r}; known: native, "
                              f"{', '.join(isa.KNOWN_CPUS)}")
        for item in _split_mattr(mattr or ""):
            sign, name = item[0], item[1:]
            if name not in isa.known_features(arch):
                raise TargetError(f"unknown {arch} feature {name!r} in -mattr of {spec!r}; "
                                  f"known: {', '.join(isa.known_features(arch))}")
            features = (isa.closure(arch, (*features, name)) if sign == "+"
                        else isa.without(arch, features, name))
        return arch, features

    def _resolve_caches(self, spec: str) -> dict[int, int]:
        caches = dict(host_cache_bytes())
        for level in (1, 2, 3):
            text = self.options.get(f"l{level}-cache")
            if text is not None:
                caches[level] = _positive(text, f"l{level}-cache", spec, parse_size)
        return caches

    def _resolve_cores(self, spec: str) -> int:
        text = self.options.get("num-cores")
        if text is None:
            return host_num_cores()
        return _positive(text, "num-cores", spec, int)

    # -- what code generation reads -------------------------------------------------------

    @property
    def device(self) -> str:
        """The device family: ``cpu`` or ``cuda``."""
        return self.kind.device

    @property
    def mcpu(self) -> str | None:
        return self.options.get("mcpu")

    def has(self, feature: str) -> bool:
        """Whether the target has ISA feature ``feature`` (``"avx512f"``, ``"fma"``)."""
        return feature in self.features

    @property
    def vector_bits(self) -> int:
        """Width of the widest vector register, in bits (512 with AVX-512, 256 with AVX; 32 on
        a GPU, whose threads each compute one float32 at a time)."""
        if self.device != "cpu":
            return 32
        return isa.vector_bits(self.arch, self.features)

    # -- GPU facts (CUDA targets) ---------------------------------------------------------------

    @property
    def cuda_arch(self) -> str:
        """The GPU architecture code is compiled for: ``-arch=sm_XY``, else ``sm_80``."""
        if self.device != "cuda":
            raise TargetError(f"target {self} is not a CUDA target")
        arch = self.options.get("arch", DEFAULT_CUDA_ARCH)
        if not re.fullmatch(r"sm_[0-9]{2,3}[a-z]?", arch):
            raise TargetError(f"target {self}: -arch={arch} is not a GPU architecture such "
                              "as sm_80 or sm_90")
        return arch

    @property
    def multiprocessors(self) -> int:
        """The GPU's streaming multiprocessors (``-sms=N``; else the largest GPU of the
        architecture's): a launch of fewer blocks leaves some idle."""
        text = self.options.get("sms")
        if text is not None:
            return _positive(text, "sms", str(self), int)
        arch = self.cuda_arch
        family = arch.rstrip(string.ascii_lowercase)  # sm_90a: an sm_90
        return CUDA_MULTIPROCESSORS.get(family, CUDA_MULTIPROCESSORS[DEFAULT_CUDA_ARCH])

    @property
    def allow_tf32(self) -> bool:
        """Whether float32 products may run on tensor cores in TF32 (``-tf32=1`` or
        ``-tf32=fast``; off by default): their operands reduced to 10 bits of mantissa, as
        PyTorch's ``allow_tf32`` and cuDNN's default convolutions do. Results then differ
        from float32 ones by about 1e-3 of their size. Needs sm_80 or newer. ``1`` rounds
        each operand to nearest (:attr:`tf32_rounds_operands`), ``fast`` gives the tensor
        cores the float32 values, of which they read the top 19 bits (a truncation, what
        cuBLAS and cuDNN do under PyTorch's ``allow_tf32``)."""
        if self.device != "cuda":
            return False
        text = self.options.get("tf32", "0")
        if text not in TF32_MODES:
            raise TargetError(f"target {self}: -tf32={text} is not one of "
                              f"{', '.join(TF32_MODES)}")
        if text != "0" and int(re.sub(r"[^0-9]", "", self.cuda_arch)) < TF32_ARCH:
            raise TargetError(f"target {self}: TF32 tensor cores need sm_80 or newer, not "
                              f"{self.cuda_arch}")
        return text != "0"

    @property
    def tf32_rounds_operands(self) -> bool:
        """Whether TF32 products round their operands to nearest (``-tf32=1``: ``cvt.rna``,
        half a TF32 ulp at most, at a compare, an add and a mask a value where the value is
        not rounded already) rather than give the tensor cores float32 values to truncate
        (``-tf32=fast``: up to one ulp, no instructions)."""
        return self.allow_tf32 and self.options.get("tf32") == "1"

    @property
    def max_threads_per_block(self) -> int:
        """Threads one GPU block may have (1024 on every architecture since sm_20)."""
        return 1024

    @property
    def max_shared_memory_per_block(self) -> int:
        """Bytes of statically allocated shared memory one block may use (48 KiB)."""
        return 48 * 1024

    @property
    def max_dynamic_shared_memory_per_block(self) -> int:
        """Bytes of shared memory one block may use when its kernel opts in to more than
        the static 48 KiB (dynamic shared memory): the architecture's, or 48 KiB for one
        not listed (:data:`CUDA_SHARED_MEMORY_PER_BLOCK`)."""
        family = self.cuda_arch.rstrip(string.ascii_lowercase)  # sm_90a: an sm_90
        return CUDA_SHARED_MEMORY_PER_BLOCK.get(family, self.max_shared_memory_per_block)

    @property
    def warp_size(self) -> int:
        """Threads that execute in lockstep on an NVIDIA GPU."""
        return 32

    @property
    def vector_bytes(self) -> int:
        return self.vector_bits // 8

    @property
    def vector_registers(self) -> int:
        """Vector registers code can name (32 with AVX-512, 16 with AVX2)."""
        return isa.vector_registers(self.arch, self.features)

    def vector_lanes(self, dtype: str = "float32") -> int:
        """Elements of ``dtype`` in one vector register (16 float32 with AVX-512)."""
        return max(1, self.vector_bytes // np.dtype(dtype).itemsize)

    @property
    def matrix_tiles(self) -> int:
        """Tile registers of the target's matrix unit for products of bytes: AMX's 8 (each
        up to :attr:`matrix_tile_rows` rows of :attr:`matrix_tile_bytes` bytes), 0 without
        one."""
        return 8 if self.has("amx-int8") else 0

    @property
    def matrix_tile_rows(self) -> int:
        """Rows of one matrix tile (AMX: 16): the outputs one tile of sums holds in a
        column, and the most a product of tiles multiplies at once."""
        return 16

    @property
    def matrix_tile_bytes(self) -> int:
        """Bytes of one matrix tile's row (AMX: 64): 16 int32 sums, or the 64 bytes of one
        output's contraction that a product of tiles takes."""
        return 64

    @property
    def cache_line_bytes(self) -> int:
        """Bytes of one cache line, the unit a prefetch fetches: 64 on x86-64 and on the Arm
        cores this target models."""
        return 64

    def cache_bytes(self, level: int) -> int:
        """Data-cache size of ``level`` (1, 2 or 3) per core, in bytes."""
        if level not in self._caches:
            raise TargetError(f"cache level {level} is not 1, 2 or 3")
        return self._caches[level]

    @property
    def min_parallel_work(self) -> int:
        """The least work (innermost statement executions, :func:`opfusion.tir.work.
        kernel_work`) of a kernel worth spreading over threads. Below it, waking the other
        threads for the kernel's parallel loop (a futex wake and a reschedule, several
        microseconds) costs more than they save, and the kernel runs on the calling thread;
        with one core, every kernel does. Measured with ``benchmarks/parallel_grain.py``."""
        return PARALLEL_GRAIN if self.num_cores > 1 else 1 << 62

    @property
    def isa(self) -> str:
        """Short name of the vector ISA for reports: avx512, avx2, avx, sse2, neon."""
        return isa.isa_name(self.arch, self.features)

    @property
    def is_host(self) -> bool:
        """True when the target is exactly the host CPU (``c``, ``llvm``, ``-mcpu=native``
        with no ``-mattr``): its code may be tuned for this machine."""
        return (self.device == "cpu" and self.options.get("mcpu") in (None, "native")
                and "mattr" not in self.options)

    def compiler_flags(self) -> tuple[str, ...]:
        """Flags that make the C compiler generate code for exactly this target's features."""
        if self.device != "cpu":
            raise TargetError(f"target {self} is not compiled by the C compiler")
        flags = isa.compiler_feature_flags(self.arch, self.features)
        if self.arch == "x86_64":
            if self.is_host:
                flags += ("-mtune=native",)
            if self.vector_bits == 512:  # the compiler's own vectorization uses zmm too
                flags += ("-mprefer-vector-width=512",)
        return flags

    def explicit(self) -> Target:
        """The same code target with every feature spelled out (``c -mcpu=generic
        -mattr=+sse4.2,+avx,...``): it means the same on any machine, which ``"c"`` (the host)
        does not. Core count and cache sizes are the host's again (they tune, never decide
        whether code runs)."""
        if self.device != "cpu":
            return Target(str(self))
        base = isa.GENERIC_CPU.get(self.arch)
        if base is None:
            raise TargetError(f"target {self}: no generic CPU is known for {self.arch}")
        baseline = isa.closure(self.arch, ())
        extra = [f"+{f}" for f in isa.known_features(self.arch)
                 if f in self.features and f not in baseline]
        attrs = f" -mattr={','.join(extra)}" if extra else ""
        return Target(f"{self.kind.name} -mcpu={base}{attrs}")

    def missing_on_host(self) -> list[str]:
        """The target's features this machine lacks (empty when its code can run here)."""
        if self.device != "cpu":
            return []
        if self.arch != host_arch():
            return [f"arch:{self.arch}"]
        return sorted(self.features - host_features())

    # -- identity -----------------------------------------------------------------------------

    def __str__(self) -> str:
        parts = [self.kind.name]
        for name in self.kind.options:
            if name in self.options:
                parts.append(f"-{name}={self.options[name]}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"Target({str(self)!r})"

    def _identity(self) -> tuple[Any, ...]:
        return (str(self), self.arch, tuple(sorted(self.features)), self.num_cores,
                tuple(sorted(self._caches.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Target) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def describe(self) -> str:
        """One line for reports: the string, ISA, vector width and cores."""
        return (f"{self} ({self.arch}, {self.isa}, {self.vector_bits}-bit vectors, "
                f"{self.vector_registers} vector registers, {self.num_cores} cores, "
                f"L2 {format_size(self.cache_bytes(2))})")

    # -- the current target ------------------------------------------------------------------

    def __enter__(self) -> Target:
        _stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stack().pop()

    @staticmethod
    def current(allow_none: bool = False) -> Target | None:
        """The innermost ``with target:`` of this thread; else the host target (None with
        ``allow_none``)."""
        stack = _stack()
        if stack:
            return stack[-1]
        return None if allow_none else host_target()


_local = threading.local()


def _stack() -> list[Target]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


@functools.lru_cache(maxsize=1)
def host_target() -> Target:
    """``Target("c")``: the host CPU (made once per process)."""
    return Target("c")


def as_target(target: str | Target | None) -> Target:
    """``target`` as a :class:`Target`; None means the current one."""
    if target is None:
        current = Target.current()
        assert current is not None
        return current
    if isinstance(target, Target):
        return target
    kind = getattr(target, "kind", None)  # a TVM-style object carrying a string kind
    if not isinstance(target, str) and isinstance(kind, str):
        target = kind
    return Target(target)  # type: ignore[arg-type]


def _parse_options(kind: TargetKind, words: list[str], spec: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for word in words:
        name, eq, value = word.lstrip("-").partition("=")
        if not word.startswith("-") or not eq or not value:
            raise TargetError(f"target option {word!r} in {spec!r} is not of the form "
                              f"-name=value (e.g. -mcpu=znver4)")
        if name not in kind.options:
            raise TargetError(f"unknown option -{name} for target kind {kind.name!r} in "
                              f"{spec!r}; known: {', '.join('-' + o for o in kind.options)}")
        if name in options:
            raise TargetError(f"option -{name} is given twice in {spec!r}")
        options[name] = value
    if "mattr" in options:
        options["mattr"] = ",".join(_split_mattr(options["mattr"], spec))
    return options


def _arch_of_features(items: list[str]) -> str:
    """The architecture whose features ``-mattr`` names: the host's when it knows them all,
    else the one that does (``c -mattr=+avx2`` means x86-64 on an Arm host too)."""
    names = [item[1:] for item in items]
    for arch in (host_arch(), *isa.IMPLIES):
        if all(name in isa.known_features(arch) for name in names):
            return arch
    return host_arch()


def _split_mattr(text: str, spec: str = "") -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    for item in items:
        if item[0] not in "+-" or len(item) < 2:
            raise TargetError(f"-mattr item {item!r} in {spec!r} needs a + or - sign "
                              f"(e.g. -mattr=+avx2,+fma)")
    return items


def _positive(text: str, name: str, spec: str, parse: Callable[[str], int]) -> int:
    try:
        value = parse(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise TargetError(f"-{name}={text} in {spec!r} must be a positive number")
    return value
