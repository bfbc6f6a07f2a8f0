"""The kernel cache verifies what it loads: a library whose recorded SHA-256 is missing or
does not match (truncated, damaged, replaced) is rebuilt before it is ever loaded, and one
whose kernel table does not list the expected kernels is evicted and rebuilt. Stale
temporaries are removed, the cache stays within its size limit, and ``opfusion cache``
shows and empties it.

Loading happens in a fresh process: a process that has loaded a library keeps using the
mapping it has, so only a new process shows what a damaged file does."""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from opfusion.backend.cpu.toolchain import (
    cache_info,
    clear_cache,
    compile_source,
    digest_path,
    enforce_cache_limit,
    file_sha256,
    has_recorded_digest,
    have_c_compiler,
    remove_stale_temporaries,
)

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

# Builds a kernel filling a (rows, 4) buffer with 7 and prints the compile count, the
# library's path and whether the numbers are right.
_BUILD = textwrap.dedent("""
    import sys
    import numpy as np
    import opfusion as opf
    from opfusion.backend.cpu.toolchain import compile_stats
    from opfusion.tir import expr as E
    from opfusion.tir import stmt as S

    rows = int(sys.argv[1])
    A = E.Buffer("A", (rows, 4), "float32")
    i = E.Var("i")
    body = S.For(i, 0, rows * 4, S.ForKind.SERIAL, S.BufferStore(A, 7.0, [i // 4, i % 4]))
    kernel = opf.build(S.PrimFunc("cache_fill", [A], body))
    a = np.zeros((rows, 4), "float32")
    kernel(a)
    print(compile_stats().compiles, kernel.library.path, bool((a == 7).all()))
""")


def _build(cache, rows=64):
    env = {**os.environ, "OPFUSION_CACHE_DIR": str(cache)}
    result = subprocess.run([sys.executable, "-c", _BUILD, str(rows)], env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    compiles, path, right = result.stdout.split()
    return int(compiles), Path(path), right == "True"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))
    return tmp_path


def _truncate(path, other):
    data = open(path, "rb").read()
    with open(path, "wb") as handle:
        handle.write(data[:len(data) // 2])


def _flip(path, other):
    data = bytearray(open(path, "rb").read())
    for position in range(len(data) // 4, len(data), 97):
        data[position] ^= 0xFF
    with open(path, "wb") as handle:
        handle.write(data)


def _replace(path, other):
    os.replace(other, path)


def _replace_with_digest(path, other):
    # As if the key had missed something: a valid library with its own digest, built for
    # other shapes. Only the kernel table can tell.
    os.replace(other, path)
    digest_path(path).write_text(file_sha256(path) + "\n")


def _drop_digest(path, other):
    os.unlink(digest_path(path))


@pytest.fixture(scope="module")
def other_library(tmp_path_factory):
    """A valid library with the same kernel name, built for 2 rows instead of 64."""
    return _build(tmp_path_factory.mktemp("other"), rows=2)[1]


@pytest.mark.parametrize("damage", [_truncate, _flip, _replace, _replace_with_digest,
                                    _drop_digest])
def test_a_damaged_or_foreign_cached_library_is_rebuilt(cache, other_library, tmp_path,
                                                        damage):
    compiles, path, right = _build(cache)
    assert compiles == 1 and right
    other = tmp_path / "other.so"
    other.write_bytes(other_library.read_bytes())
    damage(path, other)
    compiles, again, right = _build(cache)
    assert again == path
    assert compiles == 1 and right  # rebuilt once, right numbers, no crash
    assert has_recorded_digest(path)  # and recorded, for the next process to hit


def test_stale_temporaries_go_and_live_ones_stay(cache):
    directory = cache / "kernels"
    directory.mkdir()
    stale, live = directory / ".abc.so.tmp", directory / ".def.so.tmp"
    stale.write_bytes(b"left by a killed compile")
    live.write_bytes(b"a compile still running")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    compile_source("int stale_check(void) { return 1; }\n")
    assert not stale.exists() and live.exists()
    assert remove_stale_temporaries(directory, max_age=0) == 1


def test_the_cache_stays_within_its_limit_least_recently_used_first(cache, monkeypatch):
    libraries = [compile_source(f"int limit_{n}(void) {{ return {n}; }}\n") for n in range(4)]
    for age, library in enumerate(reversed(libraries)):  # libraries[0] used longest ago
        stamp = time.time() - 100 * (age + 1)
        os.utime(library.path, (stamp, stamp))
    entry = sum(p.stat().st_size for p in libraries[0].path.parent.glob(
        libraries[0].key + ".*"))
    monkeypatch.setenv("OPFUSION_CACHE_LIMIT", str(int(entry * 2.5)))
    assert enforce_cache_limit() == 2
    assert [lib.path.exists() for lib in libraries] == [False, False, True, True]
    assert cache_info().total_bytes <= int(entry * 2.5)
    # Writing a new entry keeps the limit too (and keeps the new entry).
    newest = compile_source("int limit_new(void) { return 9; }\n")
    assert newest.path.exists() and cache_info().total_bytes <= int(entry * 2.5)


def test_a_process_walks_the_cache_again_only_when_its_writes_could_pass_the_limit(
        cache, monkeypatch):
    from opfusion.backend.cpu import toolchain

    walks = []
    entries = toolchain._entries
    monkeypatch.setattr(toolchain, "_entries", lambda d: walks.append(d) or entries(d))
    first = compile_source("int walk_0(void) { return 0; }\n")
    assert len(walks) == 1  # the first write walks it
    compile_source("int walk_1(void) { return 1; }\n")
    assert len(walks) == 1  # far below the limit: no walk
    # A limit the next entry passes: that write walks the cache and evicts the oldest.
    total = cache_info().total_bytes
    os.utime(first.path, (time.time() - 100, time.time() - 100))
    monkeypatch.setenv("OPFUSION_CACHE_LIMIT", str(total + 100))
    walks.clear()
    newest = compile_source("int walk_2(void) { return 2; }\n")
    assert walks and newest.path.exists() and not first.path.exists()
    assert cache_info().total_bytes <= total + 100


def test_cache_info_and_clear_from_the_command_line(cache):
    compile_source("int cli_cache(void) { return 3; }\n")
    env = {**os.environ, "OPFUSION_CACHE_DIR": str(cache), "OPFUSION_CACHE_LIMIT": "3M"}

    def opfusion(*args):
        result = subprocess.run([sys.executable, "-m", "opfusion", *args], env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    info = opfusion("cache", "info")
    assert str(cache / "kernels") in info and "entries: 1" in info
    assert "limit:   3.0 MiB" in info
    assert "removed 1 entries" in opfusion("cache", "clear")
    assert "entries: 0" in opfusion("cache", "info")
    assert clear_cache() == 0
