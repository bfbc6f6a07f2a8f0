"""How the kernels' OpenMP threads wait between kernels (libgomp's wait policy).

Each kernel's parallel loop is an OpenMP parallel region. Between two regions the worker
threads wait: spinning costs nothing to resume but holds a core; sleeping frees the core but
costs a futex wake and a reschedule to resume — on the 2-core virtual machines of CI, tens of
microseconds per kernel. Measured with ``benchmarks/wait_policy.py`` (AVX-512 Zen 4, 2 cores,
batch 1, quiet): a 3-layer MLP runs in 14 us spinning 1,000 iterations and 101 us sleeping,
SqueezeNet in 6.6 ms and 9.0 ms, ShuffleNet in 6.7 ms and 11.1 ms, ResNet-50 in 52.5 ms and
56.9 ms; spinning longer (10,000 or 100,000 iterations, libgomp's default of about 300,000, or
forever) gains nothing more. But a thread that spins long takes its core from any other
process and from the thread that still works when the machine is busy: with one core kept
busy by a neighbour, ResNet-50 took 105 ms sleeping, 111 ms spinning 1,000 iterations, 159 ms
spinning 10,000 and 213 ms with the default spin (SqueezeNet 12.6, 15.6, 21.6 and 21.7 ms).

The policy is therefore a short spin, then sleep: :data:`SPIN_COUNT` iterations (long enough
to bridge the gap between two kernels of a run and between back-to-back runs, short enough
that a busy machine loses little). libgomp reads its settings once, when it
loads, for the whole process: no OpenMP runtime can wait differently per executor. opfusion
sets ``GOMP_SPINCOUNT`` just before it loads its first kernel library — not at import, and
never when the user has set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` (``OMP_WAIT_POLICY=
passive`` always sleeps, ``active`` always spins) or when libgomp is loaded already (by
another library; its settings stand, and :func:`wait_policy` says so).

Intel's OpenMP runtime (libiomp5, from ``pip install intel-openmp``, the ``intel-openmp``
extra) runs the kernels instead whenever it is installed (``OPFUSION_OPENMP`` unset or
``auto``): it is loaded before the first kernel library, globally, so that the kernels'
GOMP_* calls resolve to it, and its threads wait ``KMP_BLOCKTIME`` (1 ms unless the user set
it) spinning with yields, so that a quiet machine pays no wake-ups between kernels and a busy
one gets its cores back. On the Xeon of ``docs/benchmarks.md`` (a VM, where a sleeping
thread's wake-up costs tens of microseconds), with one core kept busy by another process,
ShuffleNet ran 6.3 ms (libgomp, 1,000 spins: 6.1; 20,000 spins: 19.7) and quiet 2.58 ms (2.71
and 2.50); the nine light models ran 1.09x faster in geomean (ONNX Runtime's and OpenVINO's
times unchanged by it). ``auto`` keeps libgomp when Intel's runtime is not installed, when
the user set ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` (a libgomp setting), and when libgomp
is loaded already (by torch, say: the kernels would call it). ``OPFUSION_OPENMP=gnu`` always
takes libgomp; ``intel`` (or the path of a libiomp5.so) insists on Intel's, and is refused
when it is missing, or not used, with a warning, when libgomp was loaded first. A path
given as the value is loaded as it is, and its code runs in this process (as ``LD_PRELOAD``'s
would): name only a library you trust."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings
from pathlib import Path

from ..errors import OpfusionError

#: Iterations a waiting OpenMP thread spins before it sleeps (libgomp's GOMP_SPINCOUNT).
SPIN_COUNT = 1000

_lock = threading.Lock()
_decided: str | None = None


def _libgomp_loaded() -> bool:
    """Whether libgomp is mapped into this process already (Linux; False where unknown)."""
    try:
        with open("/proc/self/maps") as maps:
            return any("libgomp" in line for line in maps)
    except OSError:
        return False


#: The environment variable that picks the OpenMP runtime (see the module docstring).
RUNTIME_ENV = "OPFUSION_OPENMP"
#: Milliseconds Intel's runtime spins (yielding) before its threads sleep, unless the user
#: set ``KMP_BLOCKTIME``: long enough to bridge the kernels of a run, short against the
#: 50 ms between two engines' batches in ``benchmarks/models.py`` (its default, 200 ms,
#: kept the cores busy into ONNX Runtime's batches).
INTEL_BLOCKTIME_MS = "1"


def intel_library(value: str) -> Path | None:
    """The libiomp5.so that ``OPFUSION_OPENMP=value`` names: the path itself, or for
    ``intel`` the one the intel-openmp package installs (``<prefix>/lib``); None if none."""
    if value != "intel":
        return Path(value) if Path(value).is_file() else None
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        candidate = Path(prefix) / "lib" / "libiomp5.so"
        if candidate.is_file():
            return candidate
    return None


def _load_intel(library: Path) -> str:
    """Load Intel's OpenMP runtime globally (see the module docstring); what was decided."""
    os.environ.setdefault("KMP_BLOCKTIME", INTEL_BLOCKTIME_MS)
    ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    return (f"Intel's OpenMP runtime {library}: spin with yields for "
            f"KMP_BLOCKTIME={os.environ['KMP_BLOCKTIME']} ms, then sleep")


def _insist_on_intel(value: str) -> str:
    """``OPFUSION_OPENMP=intel`` or a path: Intel's runtime, refused when missing, not used
    (with a warning) when libgomp is loaded already; what was decided."""
    library = intel_library(value)
    if library is None:
        raise OpfusionError(
            f"{RUNTIME_ENV}={value!r}: no libiomp5.so found. The value is 'auto' (the "
            f"default: Intel's runtime when installed, else libgomp), 'gnu' (libgomp), 'intel' "
            f"(the libiomp5.so of `pip install intel-openmp`, the opfusion[intel-openmp] "
            f"extra) or the path of a libiomp5.so")
    if _libgomp_loaded():
        warnings.warn(f"{RUNTIME_ENV}={value!r} is not used: libgomp was loaded before "
                      "opfusion's first kernel library (by another library), and the kernels "
                      "would call it; compile with opfusion before importing that library",
                      RuntimeWarning, stacklevel=3)
        return f"libgomp (loaded before opfusion's kernels; {RUNTIME_ENV} not used)"
    return _load_intel(library)


#: libgomp's own settings: when the user set one, ``auto`` keeps libgomp and the setting.
_LIBGOMP_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def _configure_libgomp() -> str:
    """libgomp's short spin, unless the user or another library settled it; what was
    decided."""
    user = {key: os.environ[key] for key in _LIBGOMP_SETTINGS if key in os.environ}
    if user:
        return "set by the user: " + ", ".join(f"{k}={v}" for k, v in user.items())
    if _libgomp_loaded():
        return "libgomp was loaded before opfusion's kernels: its own settings"
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return f"spin {SPIN_COUNT} iterations, then sleep (GOMP_SPINCOUNT)"


def _automatic() -> str:
    """``auto``: Intel's runtime when installed and nothing speaks for libgomp (see the
    module docstring), else libgomp's short spin; what was decided."""
    library = intel_library("intel")
    if (library is not None and not _libgomp_loaded()
            and not any(key in os.environ for key in _LIBGOMP_SETTINGS)):
        return _load_intel(library)
    return _configure_libgomp()


def configure_wait_policy() -> str:
    """Pick the kernels' OpenMP runtime and settle how its threads wait, before the first
    kernel library loads (see the module docstring, and ``OPFUSION_OPENMP``); returns what
    was decided, as :func:`wait_policy` does. Idempotent."""
    global _decided
    with _lock:
        if _decided is None:
            runtime = os.environ.get(RUNTIME_ENV, "auto") or "auto"
            if runtime == "auto":
                _decided = _automatic()
            elif runtime == "gnu":
                _decided = _configure_libgomp()
            else:
                _decided = _insist_on_intel(runtime)
        return _decided


def wait_policy() -> str:
    """How this process's OpenMP threads wait, in words ("not decided yet" before the first
    kernel library is loaded)."""
    return _decided or "not decided yet (no kernel library loaded)"
