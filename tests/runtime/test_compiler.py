"""The compiler driver and kernel cache: finding cc, compile errors, cache hits, atomic writes."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opfusion.backend.cpu import toolchain as compiler
from opfusion.backend.cpu.toolchain import (
    BASE_FLAGS,
    cache_dir,
    cache_key,
    compile_source,
    compile_stats,
    find_compiler,
    have_c_compiler,
)
from opfusion.errors import CompileError, CompilerNotFoundError

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

SOURCE = "int opf_test_answer(void) { return 42; }\n"


def unique_source(tag: str) -> str:
    # Each test compiles its own source so that the session-wide cache cannot hide a compile.
    return f"/* {tag} */\n{SOURCE}"


def test_cc_naming_a_missing_program_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/bin/cc")
    with pytest.raises(CompilerNotFoundError, match="CC='/nonexistent/bin/cc'.*not found"):
        find_compiler()
    with pytest.raises(CompilerNotFoundError, match="install|Set CC"):
        compile_source(unique_source("missing"))


def test_no_compiler_on_path_says_install_gcc_or_set_cc(monkeypatch, tmp_path):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(CompilerNotFoundError, match="Install gcc.*set CC"):
        find_compiler()


def test_cc_may_carry_arguments(monkeypatch):
    monkeypatch.setenv("CC", f"{find_compiler()[0]} -Wall")
    argv = find_compiler()
    assert argv[1:] == ["-Wall"]
    assert compile_source(unique_source("cc-args")).path.is_file()


def test_second_build_is_a_cache_hit_without_compiling(kernel_cache):
    source = unique_source("cache-hit")
    before = compile_stats()
    first = compile_source(source)
    mtime = first.path.stat().st_mtime_ns
    second = compile_source(source)
    after = compile_stats()
    assert not first.from_cache and second.from_cache
    assert after.compiles - before.compiles == 1
    assert after.cache_hits - before.cache_hits == 1
    assert first.path == second.path and second.path.stat().st_mtime_ns == mtime
    assert first.path.parent == kernel_cache


def test_cache_hit_does_not_run_the_compiler(monkeypatch):
    source = unique_source("no-subprocess")
    compile_source(source)

    def forbidden(*args, **kwargs):
        raise AssertionError(f"the compiler ran on a cache hit: {args}")

    monkeypatch.setattr(compiler.subprocess, "run", forbidden)
    assert compile_source(source).from_cache


def test_cache_key_covers_source_flags_compiler_and_cpu(monkeypatch):
    argv = find_compiler()
    key = cache_key(SOURCE, argv, BASE_FLAGS)
    assert key == cache_key(SOURCE, argv, BASE_FLAGS)
    assert key != cache_key(SOURCE + " ", argv, BASE_FLAGS)
    assert key != cache_key(SOURCE, argv, (*BASE_FLAGS, "-g"))
    assert key != cache_key(SOURCE, [*argv, "-m64"], BASE_FLAGS)
    monkeypatch.setattr(compiler, "host_cpu_features", lambda: "a different cpu")
    assert key != cache_key(SOURCE, argv, BASE_FLAGS)
    monkeypatch.setattr(compiler, "compiler_version", lambda argv: "cc 99.0")
    assert key != cache_key(SOURCE, argv, BASE_FLAGS)


def test_host_cpu_features_name_the_instruction_sets():
    features = compiler.host_cpu_features()
    assert features and features == compiler.host_cpu_features()
    if Path("/proc/cpuinfo").exists() and sys.platform.startswith("linux"):
        assert " " in features


def test_default_cache_dir_is_under_home(monkeypatch, tmp_path):
    monkeypatch.delenv("OPFUSION_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "opfusion" / "kernels"


def test_compile_error_shows_compiler_message_and_source_path():
    source = "int broken(void) { return undeclared_name; }\n"
    with pytest.raises(CompileError) as info:
        compile_source(source)
    err = info.value
    assert "undeclared_name" in str(err) and err.source_path in str(err)
    assert Path(err.source_path).read_text() == source
    assert not Path(err.source_path).with_suffix(".so").exists()


def test_writes_go_through_a_temporary_file_in_the_same_directory(monkeypatch):
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        replaced.append((Path(src), Path(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(compiler.os, "replace", spy)
    library = compile_source(unique_source("atomic"))
    so_moves = [(s, d) for s, d in replaced if d == library.path]
    assert len(so_moves) == 1
    tmp, final = so_moves[0]
    assert tmp.parent == final.parent and tmp != final
    assert not tmp.exists()
    leftovers = [p for p in library.path.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


def test_failed_compile_leaves_no_temporary_files(kernel_cache):
    with pytest.raises(CompileError):
        compile_source("this is not C\n")
    assert [p for p in kernel_cache.iterdir() if p.name.endswith(".tmp")] == []


def test_concurrent_builds_of_one_kernel_all_succeed(tmp_path):
    # Several processes compile the same source into one fresh cache at the same time; each
    # must end with a loadable library and none may see a partial file.
    script = textwrap.dedent(f"""
        import ctypes, sys
        from opfusion.backend.cpu.toolchain import compile_source
        lib = compile_source({SOURCE!r} + "/* concurrent */\\n")
        assert ctypes.CDLL(str(lib.path)).opf_test_answer() == 42
        print(lib.path)
    """)
    env = {**os.environ, "OPFUSION_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    assert len({r[0].strip() for r in results}) == 1
    assert [p.name for p in (tmp_path / "kernels").iterdir() if p.name.endswith(".tmp")] == []


def test_corrupt_cached_library_is_rebuilt(kernel_cache):
    import numpy as np

    from opfusion.codegen import codegen_c
    from opfusion.driver import build
    from opfusion.tir import expr as E
    from opfusion.tir import stmt as S

    A = E.Buffer("A", (4,), "float32")
    i = E.Var("i")
    func = S.PrimFunc("corrupt_me", [A], S.For(i, 0, 4, S.ForKind.SERIAL,
                                                S.BufferStore(A, 7.0, [i])))
    # A damaged cache entry (never loaded by this process) is replaced, not trusted.
    library = compile_source(codegen_c(func).code)
    junk = library.path.with_name("junk.tmp")
    junk.write_bytes(b"not a shared library")
    os.replace(junk, library.path)
    before = compile_stats().compiles
    module = build(func)
    assert compile_stats().compiles == before + 1
    a = np.zeros(4, "float32")
    module(a)
    np.testing.assert_array_equal(a, 7.0)
