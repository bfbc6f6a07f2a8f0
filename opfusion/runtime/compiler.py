"""The C compiler driver and the kernel cache: C source in, path of a shared library out.

A shared library is cached under ``$OPFUSION_CACHE_DIR/kernels/<key>.so`` (default cache
directory ``~/.cache/opfusion``). The key hashes everything that decides the machine code:
the source, the flags, the compiler's identity and version, and the host CPU's features —
``-march=native`` code built on one CPU can die with SIGILL on another that shares the cache.

Writes are atomic: the compiler writes a temporary file in the same directory, which is then
renamed over the final name, so a process that finds ``<key>.so`` always finds a whole file,
even while another process is building the same kernel."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import CompileError, CompilerNotFoundError

#: Flags every kernel is compiled with. ``-ffast-math`` is deliberately absent: it lets the
#: compiler reassociate and drop NaN/Inf handling, which changes results. The two flags that
#: are here change no result: ``-fno-math-errno`` only stops libm calls from setting errno
#: (so ``sqrtf`` can become an instruction), and ``-fno-trapping-math`` only says that no
#: program inspects floating-point exception flags (so ``a > b ? a : b`` in a loop can be
#: if-converted and vectorized).
DEFAULT_FLAGS: tuple[str, ...] = (
    "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-fno-math-errno",
    "-fno-trapping-math",
)

#: Compilers tried, in order, when $CC is not set.
_CANDIDATES = ("cc", "gcc", "clang")

#: Bumped when the layout of the cache or the meaning of a key changes.
_CACHE_FORMAT = "opfusion-kernel-cache-1"


@dataclass(frozen=True)
class CompileStats:
    """How many kernels this process compiled and how many it found in the cache."""

    compiles: int = 0
    cache_hits: int = 0


_stats = {"compiles": 0, "cache_hits": 0}


def compile_stats() -> CompileStats:
    """Return the counts of compiler invocations and cache hits since the process started."""
    return CompileStats(**_stats)


@dataclass(frozen=True)
class CompiledLibrary:
    """A shared library on disk, with how it was obtained."""

    path: Path
    source_path: Path
    key: str
    from_cache: bool
    seconds: float


def find_compiler() -> list[str]:
    """Return the C compiler's command line: ``$CC`` if set, else cc, gcc or clang from PATH.

    Raises CompilerNotFoundError if $CC names a program that does not exist, or if no compiler
    is on PATH."""
    env_cc = os.environ.get("CC", "").strip()
    if env_cc:
        try:
            argv = shlex.split(env_cc)
        except ValueError as err:
            raise CompilerNotFoundError(
                f"CC={env_cc!r} is not a valid command line ({err}); set CC to a C compiler"
            ) from err
        resolved = shutil.which(argv[0]) if argv else None
        if resolved is None:
            raise CompilerNotFoundError(
                f"the C compiler named by CC={env_cc!r} was not found. Set CC to an installed C "
                "compiler (e.g. CC=gcc) or unset it to use cc/gcc/clang from PATH."
            )
        return [resolved, *argv[1:]]
    for name in _CANDIDATES:
        resolved = shutil.which(name)
        if resolved is not None:
            return [resolved]
    raise CompilerNotFoundError(
        "no C compiler found (tried $CC, then cc, gcc and clang on PATH); opfusion needs one to "
        "build kernels. Install gcc (e.g. `apt-get install gcc`) or set CC to a C compiler."
    )


def have_c_compiler() -> bool:
    """True when :func:`find_compiler` finds a C compiler (for skipping tests without one)."""
    try:
        find_compiler()
    except CompilerNotFoundError:
        return False
    return True


@functools.lru_cache(maxsize=16)
def _compiler_version(argv: tuple[str, ...], mtime_ns: int) -> str:
    # mtime_ns is part of the memo key so that an upgraded compiler is noticed.
    try:
        result = subprocess.run([*argv, "--version"], capture_output=True, text=True,
                                timeout=60, check=False)
    except OSError as err:
        raise CompilerNotFoundError(
            f"the C compiler {argv[0]!r} could not be run ({err}); install gcc or set CC"
        ) from err
    return result.stdout + result.stderr


def compiler_version(argv: list[str]) -> str:
    """Return the output of ``<compiler> --version`` (memoized per compiler binary)."""
    try:
        mtime_ns = os.stat(argv[0]).st_mtime_ns
    except OSError:
        mtime_ns = 0
    return _compiler_version(tuple(argv), mtime_ns)


@functools.lru_cache(maxsize=1)
def host_cpu_features() -> str:
    """Return a description of the host CPU's instruction-set features (for the cache key)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return " ".join(sorted(value.split()))
    # No /proc/cpuinfo (macOS, BSD): the best portable description there is.
    return f"{platform.machine()} {platform.processor()}"


def cache_dir() -> Path:
    """Return the kernel cache directory: ``$OPFUSION_CACHE_DIR`` or ``~/.cache/opfusion``."""
    root = os.environ.get("OPFUSION_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "opfusion"
    return base / "kernels"


def cache_key(source: str, argv: list[str], flags: tuple[str, ...]) -> str:
    """Return the content hash that names a kernel's shared library in the cache."""
    digest = hashlib.sha256()
    for part in (_CACHE_FORMAT, source, "\0".join(flags), "\0".join(argv),
                 compiler_version(argv), host_cpu_features()):
        digest.update(part.encode())
        digest.update(b"\0\1\0")
    return digest.hexdigest()[:40]


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        _remove_quietly(tmp)
        raise


def _remove_quietly(path: str | Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def compile_source(source: str, *, flags: tuple[str, ...] = DEFAULT_FLAGS,
                   directory: Path | None = None) -> CompiledLibrary:
    """Compile C ``source`` into a shared library, or find it in the cache; return its path.

    Raises CompilerNotFoundError when there is no compiler and CompileError (with the
    compiler's messages and the path of the source) when compilation fails."""
    argv = find_compiler()
    key = cache_key(source, argv, flags)
    directory = cache_dir() if directory is None else directory
    library = directory / f"{key}.so"
    source_path = directory / f"{key}.c"
    if library.is_file():
        _stats["cache_hits"] += 1
        return CompiledLibrary(library, source_path, key, True, 0.0)

    started = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    # The source is kept next to the library so that a failure (or a crash in the kernel)
    # can be read and recompiled by hand.
    _write_atomically(source_path, source)
    fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".so.tmp", dir=directory)
    os.close(fd)
    command = [*argv, *flags, "-o", tmp, str(source_path)]
    try:
        _stats["compiles"] += 1
        try:
            result = subprocess.run(command, capture_output=True, text=True, check=False)
        except OSError as err:
            raise CompilerNotFoundError(
                f"the C compiler {argv[0]!r} could not be run ({err}); install gcc or set CC"
            ) from err
        if result.returncode != 0:
            output = (result.stderr + result.stdout).strip()
            raise CompileError(
                f"the C compiler failed (exit status {result.returncode}) on {source_path}\n"
                f"command: {shlex.join(command)}\n{output}",
                source_path=str(source_path), compiler_output=output,
            )
        os.replace(tmp, library)
    except BaseException:
        _remove_quietly(tmp)
        raise
    return CompiledLibrary(library, source_path, key, False, time.perf_counter() - started)


def evict(library: CompiledLibrary) -> None:
    """Remove a library from the cache (e.g. one that the dynamic loader rejected)."""
    _remove_quietly(library.path)
