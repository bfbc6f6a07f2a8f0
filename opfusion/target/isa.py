"""Instruction-set facts: the ISA features opfusion tracks, what each implies, the CPUs it
knows by name, how ``/proc/cpuinfo`` spells them and which compiler flag enables each.

Feature names follow LLVM's ``-mattr`` spelling (``avx2``, ``fma``, ``avx512f``, ``sse4.2``),
which is also GCC's ``-m<feature>`` spelling. Only features that can change generated code are
tracked: ``hypervisor`` or ``constant_tsc`` never decide whether a library loads."""

from __future__ import annotations

#: Architecture names as ``platform.machine()`` may spell them -> the family opfusion uses.
_ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "x64": "x86_64", "aarch64": "aarch64",
                 "arm64": "aarch64"}

#: x86 features, each with the features it implies (transitively closed by :func:`closure`).
X86_IMPLIES: dict[str, tuple[str, ...]] = {
    "sse": (), "sse2": ("sse",), "sse3": ("sse2",), "ssse3": ("sse3",), "sse4.1": ("ssse3",),
    "sse4.2": ("sse4.1",), "popcnt": (), "avx": ("sse4.2",), "avx2": ("avx",),
    "fma": ("avx",), "f16c": ("avx",), "bmi": (), "bmi2": (), "lzcnt": (), "movbe": (),
    "avx512f": ("avx2", "fma", "f16c"), "avx512cd": ("avx512f",), "avx512dq": ("avx512f",),
    "avx512bw": ("avx512f",), "avx512vl": ("avx512f",), "avx512vnni": ("avx512bw",),
    "avx512bf16": ("avx512bw",), "avx512ifma": ("avx512f",), "avx512vbmi": ("avx512bw",),
    # AVX-VNNI: VNNI's byte products on VEX-encoded 32-byte vectors, for CPUs without AVX-512
    # (Intel's client cores since Alder Lake) as well as with it
    "avxvnni": ("avx2",),
    # AMX: eight tile registers of up to 16 rows x 64 bytes and a matrix unit whose
    # ``tdpbusd`` multiplies a 16 x 64 tile of unsigned bytes by a 64 x 16 one of signed bytes
    # into 16 x 16 int32 sums (Sapphire Rapids and later Xeons). Linux hands the tiles' state
    # to a process only when asked (see :func:`opfusion.target.host.os_grants_amx`).
    "amx-tile": (), "amx-int8": ("amx-tile",),
}

#: Arm (AArch64) features: Advanced SIMD is part of the base architecture.
ARM_IMPLIES: dict[str, tuple[str, ...]] = {
    "neon": (), "fp16": ("neon",), "dotprod": ("neon",), "sve": ("neon",), "bf16": ("neon",),
}

IMPLIES = {"x86_64": X86_IMPLIES, "aarch64": ARM_IMPLIES}

#: Features every CPU of the architecture has (the compiler's default target assumes them).
BASELINE = {"x86_64": ("sse2",), "aarch64": ("neon",)}

#: ``/proc/cpuinfo`` spellings that differ from the feature name.
_CPUINFO_NAMES = {
    "pni": "sse3", "sse4_1": "sse4.1", "sse4_2": "sse4.2", "abm": "lzcnt",
    "avx512_vnni": "avx512vnni", "avx512_bf16": "avx512bf16", "avx512_vbmi": "avx512vbmi",
    "avx512vbmi": "avx512vbmi", "avx_vnni": "avxvnni", "asimd": "neon", "asimddp": "dotprod",
    "asimdhp": "fp16", "bmi1": "bmi", "amx_tile": "amx-tile", "amx_int8": "amx-int8",
}

_V2 = ("sse3", "ssse3", "sse4.1", "sse4.2", "popcnt")
_V3 = (*_V2, "avx", "avx2", "bmi", "bmi2", "f16c", "fma", "lzcnt", "movbe")
_V4 = (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")

#: CPUs known by name (``-mcpu=``), with their architecture and features.
KNOWN_CPUS: dict[str, tuple[str, tuple[str, ...]]] = {
    "generic": ("x86_64", ()), "x86-64": ("x86_64", ()), "x86-64-v2": ("x86_64", _V2),
    "x86-64-v3": ("x86_64", _V3), "x86-64-v4": ("x86_64", _V4),
    "haswell": ("x86_64", _V3), "broadwell": ("x86_64", _V3), "skylake": ("x86_64", _V3),
    "skylake-avx512": ("x86_64", _V4), "cascadelake": ("x86_64", (*_V4, "avx512vnni")),
    "icelake-server": ("x86_64", (*_V4, "avx512vnni", "avx512ifma", "avx512vbmi")),
    "sapphirerapids": ("x86_64", (*_V4, "avx512vnni", "avx512ifma", "avx512vbmi",
                                  "avx512bf16", "avxvnni", "amx-int8")),
    "alderlake": ("x86_64", (*_V3, "avxvnni")), "raptorlake": ("x86_64", (*_V3, "avxvnni")),
    "meteorlake": ("x86_64", (*_V3, "avxvnni")),
    "znver1": ("x86_64", _V3), "znver2": ("x86_64", _V3), "znver3": ("x86_64", _V3),
    "znver4": ("x86_64", (*_V4, "avx512vnni", "avx512ifma", "avx512vbmi", "avx512bf16")),
    "znver5": ("x86_64", (*_V4, "avx512vnni", "avx512ifma", "avx512vbmi", "avx512bf16",
                          "avxvnni")),
    "armv8-a": ("aarch64", ()), "neoverse-n1": ("aarch64", ("fp16", "dotprod")),
    "neoverse-v1": ("aarch64", ("fp16", "dotprod", "sve", "bf16")),
    "apple-m1": ("aarch64", ("fp16", "dotprod")),
}


#: The CPU name that means "the architecture's baseline, nothing more".
GENERIC_CPU = {"x86_64": "generic", "aarch64": "armv8-a"}


def normalize_arch(machine: str) -> str:
    """``platform.machine()``'s spelling -> ``x86_64`` or ``aarch64`` (others as given)."""
    return _ARCH_ALIASES.get(machine.lower(), machine.lower())


def known_features(arch: str) -> tuple[str, ...]:
    """The feature names opfusion tracks on ``arch`` (empty for an unknown architecture)."""
    return tuple(IMPLIES.get(arch, {}))


def closure(arch: str, features: tuple[str, ...] | list[str] | frozenset[str]) -> frozenset[str]:
    """``features`` with everything they imply and the architecture's baseline."""
    implies = IMPLIES.get(arch, {})
    result: set[str] = set()
    stack = [*BASELINE.get(arch, ()), *features]
    while stack:
        feature = stack.pop()
        if feature not in result:
            result.add(feature)
            stack.extend(implies.get(feature, ()))
    return frozenset(result)


def without(arch: str, features: frozenset[str], removed: str) -> frozenset[str]:
    """``features`` less ``removed`` and every feature that implies it (``-avx2`` also drops
    ``avx512f``: a CPU cannot have AVX-512 without AVX2)."""
    implies = IMPLIES.get(arch, {})
    kept = set(features)
    changed = True
    kept.discard(removed)
    while changed:  # drop features whose implications are no longer all present
        changed = False
        for feature in sorted(kept):
            if any(needed not in kept for needed in implies.get(feature, ())):
                kept.discard(feature)
                changed = True
    return frozenset(kept)


def features_from_cpuinfo(arch: str, flags: tuple[str, ...]) -> frozenset[str]:
    """The tracked features among ``/proc/cpuinfo`` flags (closed under implication only for
    what the CPU itself reports: a flag absent stays absent)."""
    tracked = set(known_features(arch))
    found = {_CPUINFO_NAMES.get(flag, flag) for flag in flags}
    return frozenset(found & tracked) | frozenset(BASELINE.get(arch, ()))


def compiler_feature_flags(arch: str, features: frozenset[str]) -> tuple[str, ...]:
    """GCC/Clang flags enabling exactly ``features`` on top of the architecture's baseline,
    ``-march=x86-64 -mavx2 -mfma ...``: never ``-march=native``, so the code uses no feature
    the target does not name (and an artifact needs only those)."""
    if arch == "x86_64":
        skip = ("sse", *BASELINE[arch])
        return ("-march=x86-64", *(f"-m{feature}" for feature in known_features(arch)
                                   if feature in features and feature not in skip))
    if arch == "aarch64":
        extras = "".join(f"+{f}" for f in ("fp16", "dotprod", "sve", "bf16") if f in features)
        return (f"-march=armv8.2-a{extras}" if extras else "-march=armv8-a",)
    return ()


def vector_bits(arch: str, features: frozenset[str]) -> int:
    """The width of the widest vector registers the features give."""
    if arch == "x86_64":
        if "avx512f" in features:
            return 512
        if "avx" in features:
            return 256
        return 128
    return 128


def vector_registers(arch: str, features: frozenset[str]) -> int:
    """How many vector registers code for the features can name."""
    if arch == "x86_64":
        return 32 if "avx512f" in features else 16
    return 32


def isa_name(arch: str, features: frozenset[str]) -> str:
    """A short name of the vector ISA for reports: ``avx512``, ``avx2``, ``avx``, ``sse2``,
    ``neon``."""
    if arch == "x86_64":
        for feature, name in (("avx512f", "avx512"), ("avx2", "avx2"), ("avx", "avx")):
            if feature in features:
                return name
        return "sse2"
    if arch == "aarch64":
        return "sve" if "sve" in features else "neon"
    return arch
