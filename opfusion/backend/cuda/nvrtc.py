"""NVRTC: CUDA C to PTX or a cubin, in process, with no GPU and no CUDA toolkit installed.

NVRTC comes from pip (``nvidia-cuda-nvrtc-cu12``) and is called through NVIDIA's
``cuda-python`` bindings (``cuda-bindings``), both in the ``opfusion[cuda]`` extra. Compiling
needs neither a GPU nor its driver: the tests compile every kernel of the light models this
way on machines without one. ``arch`` is ``sm_XY`` (a cubin: machine code for that GPU) or
``compute_XY`` (PTX, which the driver compiles for any newer GPU)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from ...errors import BuildError, CompileError

_ARCH = re.compile(r"^(sm|compute)_[0-9]{2,3}[a-z]?$")

#: Options every compile gets: C++17 (hexadecimal float literals), and no fast math (the
#: kernels keep CUDA's IEEE float32 division, square root and math functions).
BASE_OPTIONS = ("--std=c++17",)


def nvrtc_available() -> str | None:
    """None when NVRTC can be used, else why not (to show in a skip or an error)."""
    try:
        _bindings()
    except BuildError as err:
        return str(err)
    return None


def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor) version."""
    nvrtc = _bindings()
    err, major, minor = nvrtc.nvrtcVersion()
    _check(nvrtc, err, "nvrtcVersion")
    return int(major), int(minor)


def compile_cuda(source: str, arch: str, name: str = "opfusion.cu") -> bytes:
    """``source`` compiled for ``arch`` (``sm_90``: a cubin; ``compute_90``: PTX text, as
    bytes). A rejected source raises :class:`CompileError` with NVRTC's log."""
    if not _ARCH.match(arch):
        raise BuildError(f"CUDA architecture {arch!r} is not sm_XY or compute_XY (e.g. sm_90)")
    nvrtc = _bindings()
    err, program = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
        options = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in BASE_OPTIONS)]
        (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            log = _log(nvrtc, program)
            first = [line for line in log.splitlines() if "error" in line][:5]
            raise CompileError(
                f"NVRTC rejected the CUDA source of {name} for {arch}: "
                f"{log.count(' error')} error(s); first: {'; '.join(first) or log[:500]}",
                compiler_output=log, command=" ".join(o.decode() for o in options))
        if arch.startswith("sm_"):
            err, size = nvrtc.nvrtcGetCUBINSize(program)
            _check(nvrtc, err, "nvrtcGetCUBINSize")
            out = b" " * size
            (err,) = nvrtc.nvrtcGetCUBIN(program, out)
            _check(nvrtc, err, "nvrtcGetCUBIN")
            return out
        err, size = nvrtc.nvrtcGetPTXSize(program)
        _check(nvrtc, err, "nvrtcGetPTXSize")
        out = b" " * size
        (err,) = nvrtc.nvrtcGetPTX(program, out)
        _check(nvrtc, err, "nvrtcGetPTX")
        return out.rstrip(b"\0")
    finally:
        nvrtc.nvrtcDestroyProgram(program)


#: Bump when what the cache stores for a key changes.
_CACHE_FORMAT = "opfusion-cuda-1"


def compile_cuda_cached(source: str, arch: str) -> bytes:
    """:func:`compile_cuda`, through the kernel cache: ``<kernel cache>/cuda/<key>.cubin``
    (``.ptx``), the key hashing the source, the architecture, the options and NVRTC's
    version, each file with its SHA-256 beside it. An entry whose digest is missing or
    wrong is compiled again, never loaded."""
    from ..cpu.toolchain import cache_dir, has_recorded_digest, store_library, touch

    major, minor = nvrtc_version()
    digest = hashlib.sha256()
    for part in (_CACHE_FORMAT, source, arch, " ".join(BASE_OPTIONS), f"{major}.{minor}"):
        digest.update(part.encode())
        digest.update(b"\0\1\0")
    suffix = ".cubin" if arch.startswith("sm_") else ".ptx"
    path = cache_dir() / "cuda" / (digest.hexdigest()[:40] + suffix)
    if has_recorded_digest(path):
        touch(path)
        return path.read_bytes()
    image = compile_cuda(source, arch)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        store_library(path, image)
    except OSError:
        pass  # an unwritable cache costs the next process a compile, nothing else
    return image


def _bindings() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:
            from cuda import nvrtc  # cuda-python before the bindings package split
        except ImportError:
            raise BuildError("compiling for CUDA needs NVRTC and cuda-python: pip install "
                             "'opfusion[cuda]' (nvidia-cuda-nvrtc-cu12 and cuda-bindings)"
                             ) from None
    try:
        err, _, _ = nvrtc.nvrtcVersion()
    except Exception as exc:  # the bindings load libnvrtc on first use
        raise BuildError(f"NVRTC could not be loaded ({exc}); pip install "
                         "nvidia-cuda-nvrtc-cu12 (the bindings' major version must match)"
                         ) from None
    _check(nvrtc, err, "nvrtcVersion")
    return nvrtc


def _log(nvrtc: Any, program: Any) -> str:
    err, size = nvrtc.nvrtcGetProgramLogSize(program)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return ""
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(program, log)
    return log.rstrip(b"\0").decode(errors="replace")


def _check(nvrtc: Any, err: Any, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise BuildError(f"{what} failed: {err}")


__all__ = ["compile_cuda", "compile_cuda_cached", "nvrtc_available", "nvrtc_version"]
