"""What the host machine is: its architecture, ISA features, usable cores and cache sizes.

Read from the operating system (``/proc/cpuinfo``, ``/sys/devices/system/cpu``,
``os.sched_getaffinity``) once per process. A value the OS does not give falls back to a
typical one (:data:`DEFAULT_CACHE_BYTES`); a target string can override each of them."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

from .isa import compiler_feature_flags, features_from_cpuinfo, normalize_arch, without

#: Data-cache sizes assumed where the OS does not report them (level -> bytes).
DEFAULT_CACHE_BYTES = {1: 32 * 1024, 2: 512 * 1024, 3: 8 * 1024 * 1024}

_CACHE_ROOT = Path("/sys/devices/system/cpu/cpu0/cache")


@functools.lru_cache(maxsize=1)
def host_arch() -> str:
    """The host's architecture family: ``x86_64``, ``aarch64`` or what the platform says."""
    return normalize_arch(platform.machine())


@functools.lru_cache(maxsize=1)
def host_cpuinfo_flags() -> tuple[str, ...]:
    """Every flag of the first CPU in ``/proc/cpuinfo`` (``flags`` on x86, ``Features`` on
    Arm), sorted; empty where there is no such file (macOS, BSD)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return tuple(sorted(value.split()))
    return ()


@functools.lru_cache(maxsize=1)
def host_features() -> frozenset[str]:
    """The host's ISA features that opfusion knows (see :mod:`opfusion.target.isa`); AMX's
    only where the OS lets this process use its tiles (:func:`os_grants_amx`)."""
    features = features_from_cpuinfo(host_arch(), host_cpuinfo_flags())
    if "amx-tile" in features and not os_grants_amx():
        features = without(host_arch(), features, "amx-tile")
    return features


#: Linux's ``arch_prctl`` request for an extended state component, and AMX's tile data
#: component (``asm/prctl.h``, ``XFEATURE_XTILEDATA``).
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
_SYS_ARCH_PRCTL = 158  # x86-64


@functools.lru_cache(maxsize=1)
def os_grants_amx() -> bool:
    """Whether this process may use AMX's tiles. Linux (5.16 and later) enables their 8 KiB
    of register state per process, on request; a tile instruction without it faults. The
    request is made here, once, for the whole process (every thread, every kernel library it
    loads): a CPU with AMX on an older kernel, or a VM that hides the state, gets no AMX
    code."""
    if host_arch() != "x86_64" or platform.system() != "Linux":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def compilable_host_features() -> frozenset[str]:
    """:func:`host_features` less those the C compiler cannot generate code for (with
    whatever needs them): the host target's features. A CPU newer than its compiler (GCC 10
    does not know ``-mavxvnni``) gets code for what both know, not a compiler error on every
    kernel. Unchanged where no compiler is found (building reports that)."""
    return _compilable(os.environ.get("CC", ""), host_arch(), host_features())


@functools.lru_cache(maxsize=8)
def _compilable(cc: str, arch: str, features: frozenset[str]) -> frozenset[str]:
    # (cc: the memo's key, so that a different $CC is asked again)
    from ..backend.cpu.toolchain import find_compiler, rejected_feature_flags
    from ..errors import CompilerNotFoundError

    if arch != "x86_64":
        return features
    try:
        argv = find_compiler()
    except CompilerNotFoundError:
        return features
    for flag in rejected_feature_flags(argv, compiler_feature_flags(arch, features)):
        if flag.startswith("-m") and flag[2:] in features:
            features = without(arch, features, flag[2:])
    return features


@functools.lru_cache(maxsize=1)
def host_cpu_name() -> str:
    """The CPU's model name as the OS reports it (for reports; never used to decide code)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.processor() or platform.machine()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "CPU part"):
            return value.strip()
    return platform.processor() or platform.machine()


def host_num_cores() -> int:
    """Cores this process may run on (its CPU affinity, which a container or ``taskset``
    narrows), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@functools.lru_cache(maxsize=1)
def host_cache_bytes() -> dict[int, int]:
    """Data-cache size per level (1, 2, 3) of the first core, from sysfs; a level the OS does
    not report gets :data:`DEFAULT_CACHE_BYTES`."""
    sizes = dict(DEFAULT_CACHE_BYTES)
    try:
        entries = sorted(_CACHE_ROOT.glob("index*"))
    except OSError:
        return sizes
    for entry in entries:
        try:
            level = int((entry / "level").read_text().strip())
            kind = (entry / "type").read_text().strip()
            size = parse_size((entry / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and level in sizes and size > 0:
            sizes[level] = size
    return sizes


_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``"32K"`` -> 32768; a plain byte count, or one with a K, M or G suffix (``B`` ignored).
    Raises ValueError for anything else."""
    body = text.strip().upper().removesuffix("B")
    suffix = body[-1:] if body[-1:] in ("K", "M", "G") else ""
    number = body[: len(body) - len(suffix)]
    if not number.isdigit():
        raise ValueError(f"{text!r} is not a size (a byte count such as 32768, 32K or 1M)")
    return int(number) * _SUFFIXES[suffix]


def format_size(size: int) -> str:
    """The shortest exact spelling :func:`parse_size` reads back: 32768 -> ``"32K"``."""
    for suffix in ("G", "M", "K"):
        unit = _SUFFIXES[suffix]
        if size >= unit and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)
