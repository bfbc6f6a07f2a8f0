"""Names from a model reach the terminal escaped: an input, output or node name holding an
ANSI escape sequence, a carriage return, a C1 control or a bidirectional override is printed
as \\x1b, \\r, \\x9b, \\u202e by every command and on every error path."""

import logging

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from opfusion.backend.cpu.toolchain import have_c_compiler  # noqa: E402
from opfusion.cli import main  # noqa: E402
from opfusion.progress import Progress  # noqa: E402
from opfusion.terminal import printable  # noqa: E402

EVIL = "\x1b[31m\r\x9b2J\u202e\x07"
RAW = ["\x1b", "\r", "\x9b", "\u202e", "\x07"]


def assert_no_raw_controls(*texts):
    for text in texts:
        for char in RAW:
            assert char not in text, (char, text)


def evil_model(tmp_path, dims=(2, 3), missing_input=False):
    x = helper.make_tensor_value_info(f"x{EVIL}", TensorProto.FLOAT, list(dims))
    y = helper.make_tensor_value_info(f"y{EVIL}", TensorProto.FLOAT, None)
    inputs = [f"x{EVIL}"] + ([f"q{EVIL}"] if missing_input else [])
    node = helper.make_node("Relu" if not missing_input else "Add", inputs, [f"y{EVIL}"],
                            name=f"node{EVIL}")
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "evil.onnx"
    onnx.save(model, path)
    return path


def run_cli(capsys, *args):
    status = main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    assert_no_raw_controls(out, err)
    return status, out, err


def test_printable_escapes_controls_and_keeps_lines():
    assert printable(f"a{EVIL}b\n\tc") == "a\\x1b[31m\\r\\x9b2J\\u202e\\x07b\n\tc"
    assert printable("x\ny\t", keep_newlines=False) == "x\\ny\\t"
    assert printable("résumé ∑ 名前") == "résumé ∑ 名前"
    assert printable(3) == "3"


def test_show_escapes_names(tmp_path, capsys):
    status, out, err = run_cli(capsys, "show", evil_model(tmp_path), "--stage", "imported")
    assert status == 0
    assert "x\\x1b[31m" in out or "x\\u001b[31m" in out


@pytest.mark.skipif(not have_c_compiler(), reason="needs a C compiler")
def test_run_escapes_input_names(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path / "cache"))
    status, out, err = run_cli(capsys, "run", evil_model(tmp_path), "--fusion", "none")
    assert status == 0
    assert f"x{printable(EVIL)}" in out


@pytest.mark.skipif(not have_c_compiler(), reason="needs a C compiler")
def test_run_escapes_output_names_and_saves_them_under_safe_keys(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path / "cache"))
    status, out, err = run_cli(capsys, "run", evil_model(tmp_path), "--fusion", "none",
                               "--save", tmp_path / "out.npz")
    assert status == 0
    assert f"  0  y{printable(EVIL)}  float32[2, 3]" in out
    with np.load(tmp_path / "out.npz") as saved:
        assert saved.files == ["y__31m__2J__"]
        assert (saved["y__31m__2J__"] >= 0).all()  # the relu's output


def test_errors_escape_names(tmp_path, capsys):
    # A node input naming nothing: the error message holds the node's and the input's names.
    status, out, err = run_cli(capsys, "show", evil_model(tmp_path, missing_input=True))
    assert status == 1 and err.startswith("opfusion: error:") and len(err.splitlines()) == 1
    # A symbolic dimension: the hint names the input, unquoted, in a --shape flag.
    status, out, err = run_cli(capsys, "show", evil_model(tmp_path, dims=("N", 3)))
    assert status == 1 and f"--shape x{printable(EVIL)}=1,3" in err


@pytest.mark.skipif(not have_c_compiler(), reason="needs a C compiler")
def test_input_listing_in_errors_is_escaped(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path / "cache"))
    model = evil_model(tmp_path)
    loaded = onnx.load(model)
    loaded.graph.input.append(helper.make_tensor_value_info(f"z{EVIL}", TensorProto.FLOAT, [1]))
    onnx.save(loaded, model)
    np.save(tmp_path / "a.npy", np.ones((2, 3), np.float32))
    status, out, err = run_cli(capsys, "run", model, "--fusion", "none", "--input",
                               tmp_path / "a.npy")
    assert status == 1 and f"the model's inputs are x{printable(EVIL)}, z" in err


def test_progress_and_log_records_are_escaped(caplog):
    with caplog.at_level(logging.INFO, logger="opfusion.cli"):
        Progress().stage(f"importing model{EVIL}.onnx")
    assert caplog.messages == [f"importing model{printable(EVIL)}.onnx"]
    assert_no_raw_controls(*caplog.messages)
