"""The C compiler driver and the kernel cache: C source in, path of a shared library out.

A large source is compiled as several translation units at once, one per core of the machine
that builds it (see :mod:`.units`): each unit is compiled to an object file and the objects
are linked. A small source is compiled whole, in one process. Compiler messages name lines of
the whole source file kept beside the library, and a failure raises a :class:`CompileError`
whose message is a summary (the first errors, their count, the source's path); the
compiler's whole output is its ``compiler_output``.

A shared library is cached under ``$OPFUSION_CACHE_DIR/kernels/<key>.so`` (default cache
directory ``~/.cache/opfusion``). The key hashes everything that decides the machine code:
the source, the flags, the compiler's identity and version, and the host CPU's features —
``code tuned for one CPU is not reused on another that shares the cache.

Writes are atomic: the compiler writes a temporary file in the same directory, which is then
renamed over the final name, so a process that finds ``<key>.so`` always finds a whole file,
even while another process is building the same kernel.

Nothing in the cache is trusted for being there. Beside each library, ``<key>.sha256`` holds
the SHA-256 of the library as it was written (the digest is written first, then the library
renamed into place); a library whose digest file is missing or does not match — truncated,
damaged, replaced — is evicted and built again, never loaded. After loading, the library's
kernel table must list the kernels the caller expects (see :mod:`opfusion.backend.cpu.module`),
else it too is evicted and rebuilt.

The cache is bounded: when it grows beyond :func:`cache_limit` bytes (default
:data:`DEFAULT_CACHE_LIMIT`, 2 GiB; set ``OPFUSION_CACHE_LIMIT`` to a byte count such as
``500M`` or ``4G``), the least recently used entries (by access time, which a cache hit
renews) are removed. Temporary files left by a compile that was killed are removed once they
are :data:`STALE_TMP_SECONDS` old (a live compile's temporary file is younger).
``opfusion cache info`` and ``opfusion cache clear`` show and empty it."""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from ...errors import BuildError, CompileError, CompilerNotFoundError
from ...stages import stage, units_done
from ...target import Target, as_target
from ...target.host import host_cpuinfo_flags
from . import units

#: Flags every kernel is compiled with, whatever the target; the target adds its ISA flags
#: (:func:`target_flags`). ``-ffast-math`` is deliberately absent: it lets the compiler
#: reassociate and drop NaN/Inf handling, which changes results. ``-fno-math-errno`` changes
#: no result: it only stops libm calls from setting errno (so ``sqrtf`` can become an
#: instruction). ``-fno-trapping-math`` is absent too, although it would change no result
#: either: with it, GCC 12.2 (Debian 12's compiler) if-converts ``(float)(a[i] > 0 && !(b[i] >
#: 0))`` in nested loops whose inner one is short (2 x 5 x 6, 4 x 4 x 4) into vector code that
#: gets some elements wrong; without it, that loop is not if-converted. Of the light and
#: transformer models' kernels only softmax, the input's layout transform, attention and
#: GELU epilogues compile differently without it, and no model measured slower. There is no
#: ``-march=native``: the code may use only the features the target names, so that what an
#: artifact needs is what its target says. ``-fwrapv`` (signed overflow wraps, as NumPy's
#: arithmetic does) is absent too: it made ResNet-50 1.12x and the BERT layer 1.08x slower
#: (AVX-512 Xeon, 2026-11-30, `benchmarks/ab_checkouts.py`), since index arithmetic may then
#: wrap as well. Integer values that overflow wrap instead because the emitter computes
#: sums, differences and products of values read from memory in unsigned types
#: (``c_family._wrapping``) and the loop-IR simplifier decides nothing on such values as if
#: they were exact integers (fuzzing, seed 63008).
BASE_FLAGS: tuple[str, ...] = (
    "-O3", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-fno-math-errno",
)


def target_flags(target: Target | None = None) -> tuple[str, ...]:
    """The compiler flags of a kernel library for ``target`` (None: the current target):
    :data:`BASE_FLAGS` and the target's ISA flags (``-march=x86-64 -mavx2 -mfma ...``)."""
    resolved = as_target(target)
    return (*BASE_FLAGS, *resolved.compiler_flags())


#: Compilers tried, in order, when $CC is not set.
_CANDIDATES = ("cc", "gcc", "clang")

#: Bumped when the layout of the cache or the meaning of a key changes.
_CACHE_FORMAT = "opfusion-kernel-cache-1"

#: Default size limit of the kernel cache in bytes (``OPFUSION_CACHE_LIMIT`` overrides it).
DEFAULT_CACHE_LIMIT = 2 << 30

#: Age in seconds after which a ``*.tmp`` file in the cache is a leftover of a killed compile.
STALE_TMP_SECONDS = 3600

_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}

#: How many compiler error lines a CompileError's message quotes.
QUOTED_ERRORS = 3


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


def _binary_mtime_ns(argv: list[str]) -> int:
    """The compiler binary's modification time, part of the memos' keys so that an upgraded
    compiler is asked again (0 where it cannot be read)."""
    try:
        return os.stat(argv[0]).st_mtime_ns
    except OSError:
        return 0


def compiler_version(argv: list[str]) -> str:
    """Return the output of ``<compiler> --version`` (memoized per compiler binary)."""
    return _compiler_version(tuple(argv), _binary_mtime_ns(argv))


@functools.lru_cache(maxsize=16)
def _rejected_flags(argv: tuple[str, ...], mtime_ns: int, flags: tuple[str, ...]
                    ) -> tuple[str, ...]:
    def accepted(tried: tuple[str, ...]) -> bool:
        try:
            result = subprocess.run([*argv, *tried, "-x", "c", "-E", "-o", os.devnull, "-"],
                                    input="", capture_output=True, text=True, timeout=60,
                                    check=False)
        except (OSError, subprocess.TimeoutExpired):
            return True  # (a compiler that cannot run fails on its kernels, with its words)
        return result.returncode == 0

    if accepted(flags):
        return ()
    return tuple(flag for flag in flags[1:] if not accepted((flags[0], flag)))


def rejected_feature_flags(argv: list[str], flags: tuple[str, ...]) -> tuple[str, ...]:
    """The ISA flags among ``flags`` (``-march=...`` first, then ``-m<feature>`` ones) that the
    C compiler ``argv`` does not know: one preprocessing run with all of them, then one per
    flag only when that fails (memoized per compiler binary). An older GCC than the CPU
    (GCC 10 and ``-mavxvnni`` on an Alder Lake) would otherwise fail on every kernel."""
    return _rejected_flags(tuple(argv), _binary_mtime_ns(argv), tuple(flags))


def host_cpu_features() -> str:
    """Every flag the host CPU reports, for the cache key: a library tuned for this CPU
    (``-mtune=native``) is not reused by a different one sharing the cache."""
    return " ".join(host_cpuinfo_flags()) or f"{platform.machine()} {platform.processor()}"


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


def cache_limit() -> int:
    """The kernel cache's size limit in bytes: ``$OPFUSION_CACHE_LIMIT`` (a byte count, with an
    optional K, M, G or T suffix) or :data:`DEFAULT_CACHE_LIMIT`."""
    text = os.environ.get("OPFUSION_CACHE_LIMIT", "").strip().upper().removesuffix("B")
    if not text:
        return DEFAULT_CACHE_LIMIT
    number, suffix = (text[:-1], text[-1]) if text[-1] in _SIZE_SUFFIXES else (text, "")
    try:
        value = float(number) * _SIZE_SUFFIXES[suffix]
    except ValueError:
        raise BuildError(f"OPFUSION_CACHE_LIMIT={os.environ['OPFUSION_CACHE_LIMIT']!r} is not "
                         f"a size; set it to a byte count such as 500M or 4G") from None
    return max(0, int(value))


def digest_path(library: Path) -> Path:
    """Where the SHA-256 of ``library`` is recorded (``<key>.sha256``)."""
    return library.with_suffix(".sha256")


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's contents, in hex."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def has_recorded_digest(library: Path, expected: str | None = None) -> bool:
    """True when ``library`` exists and its contents have the digest recorded beside it (and
    that digest is ``expected``, when given)."""
    try:
        recorded = digest_path(library).read_text().strip()
        return (len(recorded) == 64 and (expected is None or recorded == expected)
                and file_sha256(library) == recorded)
    except (OSError, UnicodeDecodeError):
        return False


def store_library(library: Path, data: bytes) -> None:
    """Write ``data`` as ``library`` with its digest, both atomically (digest first, so that a
    library that can be found always has its digest)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{library.name}.", suffix=".tmp", dir=library.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        _publish(Path(tmp), library)
    except BaseException:
        _remove_quietly(tmp)
        raise
    tidy_cache(keep=library)


def _publish(tmp: Path, library: Path) -> None:
    _write_atomically(digest_path(library), file_sha256(tmp) + "\n")
    os.replace(tmp, library)


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


def compile_source(source: str, *, flags: tuple[str, ...] | None = None,
                   directory: Path | None = None, jobs: int | None = None) -> CompiledLibrary:
    """Compile C ``source`` into a shared library, or find it in the cache; return its path.
    ``flags`` default to :func:`target_flags` of the current target; ``jobs`` (default
    :func:`.units.build_jobs`) is how many compiler processes may run at once, on as many
    translation units (:func:`.units.translation_units`). The library does the same whatever
    ``jobs`` is, so it is not part of the cache key (the source, which holds every unit, is).

    Raises CompilerNotFoundError when there is no compiler and CompileError (a summary of the
    compiler's messages and the path of the source; the whole output in
    ``compiler_output``) when compilation fails."""
    argv = find_compiler()
    flags = target_flags() if flags is None else tuple(flags)
    key = cache_key(source, argv, flags)
    directory = cache_dir() if directory is None else directory
    library = directory / f"{key}.so"
    source_path = directory / f"{key}.c"
    if has_recorded_digest(library):
        _stats["cache_hits"] += 1
        touch(library)
        return CompiledLibrary(library, source_path, key, True, 0.0)
    if library.exists():
        # Truncated, damaged, replaced, or from before digests: loading it could crash.
        evict_path(library)

    started = time.perf_counter()
    directory.mkdir(parents=True, exist_ok=True)
    # The source is kept next to the library so that a failure (or a crash in the kernel)
    # can be read and recompiled by hand; the compiler's messages name its lines.
    _write_atomically(source_path, source)
    fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".so.tmp", dir=directory)
    os.close(fd)
    parts = units.translation_units(source, units.build_jobs() if jobs is None else jobs,
                                    source_path)
    try:
        _stats["compiles"] += 1
        with stage("C compiler"):
            if len(parts) == 1:
                command = [*argv, *flags, "-o", tmp, str(source_path)]
                result = _run_compiler(command)
                if result.returncode != 0:
                    raise compile_error(result.returncode, _output(result), source_path,
                                        command)
            else:
                _compile_and_link(parts, argv, flags, Path(tmp), source_path)
        _publish(Path(tmp), library)
    except BaseException:
        _remove_quietly(tmp)
        raise
    tidy_cache(directory, keep=library)
    return CompiledLibrary(library, source_path, key, False, time.perf_counter() - started)


def _compile_and_link(parts: list[tuple[str, str]], argv: list[str], flags: tuple[str, ...],
                      output: Path, source_path: Path) -> None:
    """Compile each unit to an object file, all at once, then link them into ``output``.
    When units fail, the error sums up the messages of all of them."""
    compile_flags = [flag for flag in flags if flag != "-shared"]
    total = len(parts)
    units_done(0, total)
    with tempfile.TemporaryDirectory(prefix="opfusion-build-") as build, \
            ThreadPoolExecutor(max_workers=total) as pool:
        objects = [str(Path(build) / f"unit{index}.o") for index in range(total)]
        commands = [[*argv, *compile_flags, "-c", "-x", "c", "-", "-o", obj] for obj in objects]
        futures = [pool.submit(_run_compiler, command, text)
                   for command, (_, text) in zip(commands, parts)]
        pending, done = set(futures), 0
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            done += len(finished)
            units_done(done, total)
        results = [future.result() for future in futures]
        failed = [index for index, result in enumerate(results) if result.returncode != 0]
        if failed:
            where = (f"{len(failed)} of {total} units" if len(failed) > 2 else "; ".join(
                f"unit {index + 1} of {total}: {parts[index][0]}" for index in failed))
            raise compile_error(results[failed[0]].returncode,
                                "\n".join(_output(results[index]) for index in failed),
                                source_path, commands[failed[0]], where)
        link = [*argv, *flags, "-o", str(output), *objects]
        result = _run_compiler(link)
        if result.returncode != 0:
            raise compile_error(result.returncode, _output(result), source_path, link,
                                "linking the units")


def build_shared_library(source: Path, library: Path, flags: Sequence[str],
                         libraries: Sequence[str] = ()) -> None:
    """Compile ``source`` into ``library`` once, outside the cache (an exported model's): in
    the source's directory, so that its relative paths (an ``.incbin``) resolve there, with
    ``flags`` and then ``libraries`` (``-lm``). Errors as :func:`compile_source`'s."""
    command = [*find_compiler(), *flags, "-o", str(library), source.name, *libraries]
    result = _run_compiler(command, cwd=source.parent)
    if result.returncode != 0:
        raise compile_error(result.returncode, _output(result), source, command)


def _run_compiler(command: list[str], stdin: str | None = None, cwd: Path | None = None
                  ) -> subprocess.CompletedProcess[str]:
    """Run one compiler command (reading ``stdin`` when given), capturing its output."""
    try:
        return subprocess.run(command, input=stdin, capture_output=True, text=True,
                              check=False, cwd=cwd)
    except OSError as err:
        raise CompilerNotFoundError(
            f"the C compiler {command[0]!r} could not be run ({err}); install gcc or set CC"
        ) from err


def _output(result: subprocess.CompletedProcess[str]) -> str:
    return (result.stderr + result.stdout).strip()


def compile_error(status: int, output: str, source_path: Path, command: Sequence[str],
                  where: str = "") -> CompileError:
    """A :class:`CompileError` whose message sums up ``output``: the source's path (and which
    part of it, ``where``, was being compiled), how many errors, the first
    :data:`QUOTED_ERRORS` of them, and where the rest is. The whole output and the command
    are the exception's ``compiler_output`` and ``command``."""
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.search(line)]
    quoted = (errors or lines)[:QUOTED_ERRORS]
    counted = (f"{len(errors)} error{'s' if len(errors) != 1 else ''}" if errors
               else f"{len(lines)} lines of output")
    part = f" ({where})" if where else ""
    message = [f"the C compiler failed (exit status {status}) on {source_path}{part}: "
               f"{counted}"]
    message += [f"  {line}" for line in quoted]
    if len(lines) > len(quoted):
        message.append(f"  ... ({len(lines) - len(quoted)} more lines; rerun with --debug, "
                       f"or read the exception's compiler_output, for the whole output)")
    return CompileError("\n".join(message), source_path=str(source_path),
                        compiler_output=output, command=shlex.join(command))


# gcc's and clang's "file:line:col: error: ..." and "fatal error:", and the linker's errors.
_ERROR_LINE = re.compile(r"(^|: )(fatal )?error: |undefined reference to ")


def evict(library: CompiledLibrary) -> None:
    """Remove a library and its digest from the cache (e.g. one that the dynamic loader or
    the kernel-table check rejected)."""
    evict_path(library.path)


def evict_path(library: Path) -> None:
    """Remove the library at ``library`` and its digest (the C source stays, for reading)."""
    _remove_quietly(library)
    _remove_quietly(digest_path(library))


def touch(path: Path) -> None:
    """Renew a cache entry for the least-recently-used eviction: its access time becomes now
    (set explicitly, as mounts with noatime or relatime would not; the modification time stays,
    which says when it was built). A read-only cache is fine."""
    try:
        os.utime(path, ns=(time.time_ns(), path.stat().st_mtime_ns))
    except OSError:
        pass


@dataclass(frozen=True)
class CacheInfo:
    """What the kernel cache holds: its directory, number of entries (a library with its
    digest and source, or a source alone), their total size and the size limit."""

    path: Path
    entries: int
    total_bytes: int
    limit_bytes: int


#: The files one cache entry may have, by suffix.
_ENTRY_SUFFIXES = (".so", ".c", ".sha256", ".cubin", ".ptx")


def _entries(directory: Path) -> dict[Path, list[tuple[Path, os.stat_result]]]:
    """Files of the cache grouped by entry (the path without suffix); temporaries excluded."""
    groups: dict[Path, list[tuple[Path, os.stat_result]]] = {}
    for folder in (directory, directory / "artifacts", directory / "cuda"):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            path = folder / name
            if name.endswith(".tmp") or path.suffix not in _ENTRY_SUFFIXES:
                continue
            try:
                stat = path.stat()
            except OSError:
                continue
            groups.setdefault(path.with_suffix(""), []).append((path, stat))
    return groups


def cache_info(directory: Path | None = None) -> CacheInfo:
    """Describe the kernel cache (``opfusion cache info``)."""
    directory = cache_dir() if directory is None else directory
    groups = _entries(directory)
    total = sum(stat.st_size for files in groups.values() for _, stat in files)
    return CacheInfo(directory, len(groups), total, cache_limit())


def clear_cache(directory: Path | None = None) -> int:
    """Remove every entry of the kernel cache and stale temporaries; return how many entries
    were removed (``opfusion cache clear``). A compile running meanwhile is unaffected: its
    temporary file is kept and it publishes its library afterwards."""
    directory = cache_dir() if directory is None else directory
    groups = _entries(directory)
    for files in groups.values():
        for path, _ in files:
            _remove_quietly(path)
    remove_stale_temporaries(directory)
    with _ledger_lock:
        _ledger.pop(directory, None)  # the next write walks it again
    return len(groups)


def remove_stale_temporaries(directory: Path | None = None,
                             max_age: float = STALE_TMP_SECONDS) -> int:
    """Remove ``*.tmp`` files older than ``max_age`` seconds (left by a killed compile);
    return how many were removed."""
    directory = cache_dir() if directory is None else directory
    cutoff = time.time() - max_age
    removed = 0
    for folder in (directory, directory / "artifacts", directory / "cuda"):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = folder / name
            try:
                if name.endswith(".tmp") and path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
            except OSError:
                pass
    return removed


def enforce_cache_limit(directory: Path | None = None, limit: int | None = None,
                        keep: Path | None = None) -> int:
    """Remove least recently used entries (oldest access time first) until the cache
    is within ``limit`` bytes (default :func:`cache_limit`); the entry of ``keep`` stays.
    Return how many entries were removed."""
    directory = cache_dir() if directory is None else directory
    limit = cache_limit() if limit is None else limit
    groups = _entries(directory)
    total = sum(stat.st_size for files in groups.values() for _, stat in files)
    removed = 0
    if total > limit:
        kept = keep.with_suffix("") if keep is not None else None
        order = sorted((max(stat.st_atime for _, stat in files), str(stem), stem)
                       for stem, files in groups.items() if stem != kept)
        for _, _, stem in order:
            if total <= limit:
                break
            for path, stat in groups[stem]:
                _remove_quietly(path)
                total -= stat.st_size
            removed += 1
    with _ledger_lock:
        _ledger[directory] = total
    return removed


#: Per cache directory: its size in bytes as this process last knew it (after its last walk,
#: plus what it wrote since). See :func:`tidy_cache`.
_ledger: dict[Path, int] = {}
_ledger_lock = threading.Lock()

def _entry_bytes(keep: Path | None) -> int:
    """Bytes of the cache entry ``keep`` belongs to (0 for None)."""
    if keep is None:
        return 0
    total = 0
    for suffix in _ENTRY_SUFFIXES:
        try:
            total += keep.with_suffix(suffix).stat().st_size
        except OSError:
            pass
    return total


def tidy_cache(directory: Path | None = None, keep: Path | None = None) -> None:
    """After a write (of ``keep``'s entry): remove stale temporaries and keep the cache
    within its limit. The directory is walked (every file stat-ed) the first time a process
    writes to it, and after that only when what it has written since could take the cache
    past its limit: a cache of 27,000 files (525 MB) took 0.5 s to walk, and a walk after
    every compile made the test suite more than twice as slow. Other processes' writes are
    seen at the next walk, so a cache several processes fill at once may pass its limit by
    what they wrote meanwhile (a soft limit, like ccache's)."""
    directory = cache_dir() if directory is None else directory
    limit = cache_limit()
    written = _entry_bytes(keep)
    with _ledger_lock:
        known = _ledger.get(directory)
        if known is not None:
            known += written
            _ledger[directory] = known
            if known <= limit:
                return
    remove_stale_temporaries(directory)
    enforce_cache_limit(directory, limit, keep=keep)
