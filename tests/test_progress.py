"""The command line's progress display: plain lines without tqdm, a bar with it, and the C
build's translation units counted as they are compiled."""

import io
import sys

import pytest

from opfusion.backend.cpu import units
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.progress import compile_with_progress, make_progress
from opfusion.testing.workloads import SMALL_WORKLOAD_ARGS, WORKLOADS

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")


class Terminal(io.StringIO):
    """What stderr wrote, pretending to be a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def terminal(monkeypatch, tmp_path):
    """A terminal for stderr (the test puts it in place: pytest's capture sets sys.stderr
    between a fixture and its test); a fresh kernel cache, and every build split in two."""
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(units, "MIN_UNIT_BYTES", 1)
    monkeypatch.setattr(units, "build_jobs", lambda: 2)
    return Terminal()


def compile_mlp():
    mod, params = WORKLOADS["mlp"](**SMALL_WORKLOAD_ARGS.get("mlp", {}))
    return compile_with_progress(0, mod, params)


def test_without_tqdm_progress_is_plain_lines_with_the_units_compiled(terminal, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` raises ImportError
    monkeypatch.setattr(sys, "stderr", terminal)
    exe = compile_mlp()
    lines = terminal.getvalue().splitlines()
    assert lines[0] == "opfusion: optimizing (opt level 3, fusion tvm)"
    assert "opfusion: C compiler: 2 units, compiled at once" in lines
    assert lines.index("opfusion: C compiler: 1/2 units") < lines.index(
        "opfusion: C compiler: 2/2 units")
    assert exe.num_kernels > 1


def test_with_tqdm_progress_is_a_bar_of_units(terminal, monkeypatch):
    pytest.importorskip("tqdm")
    monkeypatch.setattr(sys, "stderr", terminal)
    assert type(make_progress(0)).__name__ == "_TqdmProgress"
    compile_mlp()
    drawn = terminal.getvalue()
    assert "opfusion: C compiler" in drawn and "2/2 units" in drawn


def test_off_a_terminal_progress_is_only_logged(monkeypatch, caplog):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    progress = make_progress(0)
    with caplog.at_level("DEBUG", logger="opfusion.cli"):
        progress.stage("importing model.onnx")
        progress.units(1, 2)
    assert sys.stderr.getvalue() == ""
    assert caplog.messages == ["importing model.onnx",
                               "C compiler: 1 of 2 translation units compiled"]
