"""A model's C compiled as several translation units at once: the same numbers as one unit,
a cache key that covers every unit, damaged split libraries rebuilt, compiler errors summed
up with the path of the whole source, and the stages of a compile reported."""

from pathlib import Path

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu import units as unit_split
from opfusion.backend.cpu.toolchain import (
    QUOTED_ERRORS,
    cache_key,
    compile_source,
    find_compiler,
    has_recorded_digest,
    have_c_compiler,
)
from opfusion.backend.cpu.units import SECTION_MARKER, split_sections, translation_units
from opfusion.errors import CompileError
from opfusion.stages import StageListener, StageTimes, listening
from opfusion.testing import assert_close
from opfusion.testing.workloads import SMALL_WORKLOAD_ARGS, WORKLOADS, workload_input

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")


def sectioned_source(tag: str, bodies: dict[str, str]) -> str:
    """A source laid out as the emitter lays one out: a prelude, a section per function, a
    table section."""
    out = [f"/* {tag} */\n#include <stdint.h>\n"]
    for name, body in bodies.items():
        out.append(f"{SECTION_MARKER}kernel {name}\nint32_t {name}(void) {{ {body} }}\n")
    out.append(f"{SECTION_MARKER}table\nint32_t opf_table_{tag}(void) {{ return 0; }}\n")
    return "".join(out)


class Units(StageListener):
    """Records the C build's progress reports."""

    def __init__(self) -> None:
        self.reports: list[tuple[int, int]] = []

    def units(self, done: int, total: int) -> None:
        self.reports.append((done, total))


@pytest.fixture
def split_small_sources(monkeypatch):
    """Split any source with sections into up to three units, however small."""
    monkeypatch.setattr(unit_split, "MIN_UNIT_BYTES", 1)
    monkeypatch.setattr(unit_split, "build_jobs", lambda: 3)


def test_a_split_build_gives_the_reference_numbers_and_those_of_one_unit(
        split_small_sources, monkeypatch):
    mod, params = WORKLOADS["transformer_encoder"](**SMALL_WORKLOAD_ARGS["transformer_encoder"])
    inputs = workload_input(mod, params, seed=1)
    with listening(Units()) as units:
        split = opf.compile(mod, params=params)
    assert units.reports[0] == (0, 3) and units.reports[-1] == (3, 3)
    monkeypatch.setattr(unit_split, "build_jobs", lambda: 1)
    with listening(Units()) as units:
        whole = opf.compile(mod, params=params)
    assert units.reports == []  # one unit: no progress to report
    got = split(**inputs)
    assert_close(got, opf.ir.evaluate(mod, {**inputs, **params}), rtol=1e-4)
    np.testing.assert_array_equal(got, whole(**inputs))
    assert split.source() == whole.source()  # the same file, however it was compiled


def test_sections_are_shared_among_units_by_size_each_after_the_prelude(split_small_sources):
    bodies = {f"k{i}": "return 0;" + " " * (100 * i) for i in range(7)}
    source = sectioned_source("balance", bodies)
    prelude, sections = split_sections(source)
    units = translation_units(source, jobs=3, source_path=Path("/cache/key.c"))
    assert len(units) == 3
    seen = []
    loads = []
    order = [s.name for s in sections]
    for _, text in units:
        assert text.startswith('#line 1 "/cache/key.c"\n' + prelude)
        names = [line[len(SECTION_MARKER):] for line in text.splitlines()
                 if line.startswith(SECTION_MARKER)]
        assert names == sorted(names, key=order.index)  # in the source's order
        seen += names
        loads.append(sum(len(s.text) for s in sections if s.name in names))
    assert sorted(seen) == sorted(order)  # each section exactly once
    assert max(loads) - min(loads) <= max(len(s.text) for s in sections)


def test_a_small_source_one_kernel_or_one_job_is_compiled_whole():
    source = sectioned_source("small", {"a": "return 1;", "b": "return 2;"})
    assert translation_units(source, jobs=8) == [("", source)]
    large = sectioned_source("large", {"a": "return 1;" + " " * 20000, "b": "return 2;"})
    assert len(translation_units(large, jobs=8)) == 2  # no more units than kernels
    assert translation_units(large, jobs=1) == [("", large)]
    one_kernel = sectioned_source("one", {"a": "return 1;" + " " * 20000})
    assert translation_units(one_kernel, jobs=8) == [("", one_kernel)]
    assert translation_units("int f(void) { return 0; }\n", jobs=8)[0][0] == ""


def test_the_cache_key_changes_when_any_unit_or_flag_changes():
    bodies = {"a": "return 1;", "b": "return 2;"}
    argv = find_compiler()
    base = sectioned_source("key", bodies)
    variants = [base, base.replace("#include <stdint.h>", "#include <stdint.h>\n"),
                sectioned_source("key", {"a": "return 3;", "b": "return 2;"}),
                sectioned_source("key", {"a": "return 1;", "b": "return 4;"}),
                base.replace("return 0; }", "return 5; }")]
    keys = {cache_key(source, argv, ("-O3",)) for source in variants}
    keys.add(cache_key(base, argv, ("-O2",)))
    assert len(keys) == len(variants) + 1


def test_a_damaged_split_library_is_rebuilt(split_small_sources, tmp_path):
    source = sectioned_source("damaged", {f"k{i}": f"return {i};" for i in range(4)})
    first = compile_source(source, directory=tmp_path)
    assert not first.from_cache and has_recorded_digest(first.path)
    first.path.write_bytes(first.path.read_bytes()[:100])  # truncated
    second = compile_source(source, directory=tmp_path)
    assert not second.from_cache and second.path == first.path
    assert has_recorded_digest(second.path)
    assert compile_source(source, directory=tmp_path).from_cache


@pytest.mark.parametrize("jobs", [1, 3])
def test_a_compile_error_sums_up_the_errors_with_the_whole_sources_path(
        split_small_sources, tmp_path, jobs):
    bodies = {"good": "return 1;", "bad": "return nope + also_nope;", "worse": "return x;"}
    source = sectioned_source(f"errors{jobs}", bodies)
    with pytest.raises(CompileError) as info:
        compile_source(source, directory=tmp_path, jobs=jobs)
    err = info.value
    message = str(err)
    bad_line = source.splitlines().index("int32_t bad(void) { return nope + also_nope; }") + 1
    assert message.startswith("the C compiler failed") and err.source_path in message
    assert "3 errors" in message
    assert f"{err.source_path}:{bad_line}:" in message  # lines of the whole source
    assert Path(err.source_path).read_text() == source
    assert "also_nope" in err.compiler_output and len(message) < len(err.compiler_output) + 400
    assert message.count("error:") == QUOTED_ERRORS
    assert err.command.startswith(find_compiler()[0])
    if jobs > 1:
        assert "unit " in message and "kernels" in message


def test_a_compile_reports_its_stages():
    mod, params = WORKLOADS["mlp"](**SMALL_WORKLOAD_ARGS.get("mlp", {}))
    with listening(StageTimes()) as times:
        opf.compile(mod, params=params)
    names = list(times.seconds)
    # The memory plan comes before the C: the model's native entry is generated from it.
    assert names[:5] == ["optimize and fuse", "lower", "plan memory", "generate C",
                         "load kernels"]
    assert all(s >= 0 for s in times.seconds.values())
    assert times.total() == pytest.approx(sum(times.seconds.values()))
