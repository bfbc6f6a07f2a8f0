"""``exe.export_library(dir)``: a shared library, a C header and an example program that run
the model without Python. The example is built with the system C compiler by the command the
export gives, fed raw little-endian input files, and its raw outputs must equal ``exe.run``'s
bit for bit (and the reference interpreter's, within tolerance) on a CNN, a transformer
layer and an MLP."""

import subprocess

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.export import c_string
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.export_library import ExportError
from opfusion.ir.evaluate import evaluate
from opfusion.testing import SMALL_WORKLOAD_ARGS, WORKLOADS, assert_close, workload_input

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")


def _run_example(exported, inputs, outputs):
    """Build the example (once per directory) and run it on ``inputs`` (arrays, in input
    order); return its outputs as arrays shaped like ``outputs``."""
    folder = exported.directory
    if not (folder / "example").exists():
        built = subprocess.run(exported.build_command, shell=True, cwd=folder,
                               capture_output=True, text=True, timeout=120)
        assert built.returncode == 0, built.stderr
    names = []
    for i, array in enumerate(inputs):
        np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tofile(
            folder / f"input_{i}.bin")
        names.append(f"input_{i}.bin")
    names += [f"output_{j}.bin" for j in range(len(outputs))]
    ran = subprocess.run(["./example", *names], cwd=folder, capture_output=True, text=True,
                         timeout=120, env={"OMP_NUM_THREADS": "2"})
    assert ran.returncode == 0, ran.stderr
    return [np.fromfile(folder / f"output_{j}.bin", dtype=np.dtype(want.dtype).newbyteorder(
        "<")).reshape(want.shape) for j, want in enumerate(outputs)]


@pytest.mark.parametrize("name", ["resnet18", "transformer_encoder", "mlp"])
def test_the_exported_example_reproduces_exe_run_bit_for_bit(name, tmp_path):
    mod, params = WORKLOADS[name](**SMALL_WORKLOAD_ARGS[name])
    exe = opf.compile(mod, params=params)
    feeds = workload_input(mod, params)
    inputs = [feeds[n] for n in exe.input_names]
    want = exe.run(None, feeds)
    exported = exe.export_library(tmp_path / name, name=name)
    got = _run_example(exported, inputs, want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.array_equal(g, w)  # the same kernels, the same flags: the same bits
    reference = evaluate(mod["main"], [{**feeds, **params}[p.name_hint]
                                       for p in mod["main"].params])
    assert_close(got[0], reference, rtol=1e-4)


def test_the_library_exports_only_its_api(tmp_path):
    mod, params = WORKLOADS["mlp"](**SMALL_WORKLOAD_ARGS["mlp"])
    exported = opf.compile(mod, params=params).export_library(tmp_path, name="net")
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(exported.library)],
                             capture_output=True, text=True)
    if symbols.returncode != 0:
        pytest.skip("nm is not installed")
    names = sorted(line.split()[-1] for line in symbols.stdout.splitlines() if line.strip())
    assert names == ["net_inputs", "net_outputs", "net_run", "net_set_num_threads"]
    header = exported.header.read_text()
    assert "int32_t net_run(const void* const* inputs, void* const* outputs, void* " \
           "workspace);" in header
    assert "#define NET_WORKSPACE_BYTES" in header


def test_outputs_that_are_inputs_or_repeated_are_copied(tmp_path):
    """An output that no kernel writes in place (an input, a value returned twice) is the
    entry's copy, in the library as in exe.run."""
    x = opf.var("x", (2, 3))
    y = opf.op.exp(x)
    exe = opf.compile(opf.Function([x], opf.Tuple([y, x, y])))
    value = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    want = exe.run([value])
    assert np.array_equal(want[1], value) and np.array_equal(want[0], want[2])
    assert not np.shares_memory(want[0], want[2])
    got = _run_example(exe.export_library(tmp_path), [value], want)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_a_model_with_python_kernels_is_refused_naming_them(tmp_path):
    x = opf.var("x", (5,))
    exe = opf.compile(opf.Function([x], opf.op.exp(x)))
    exe.steps[0].function = None  # as a kernel without native code (sort, say) runs
    with pytest.raises(ExportError, match=r"run in Python .*fused_exp_0 \(exp\)"):
        exe.export_library(tmp_path)


@pytest.mark.parametrize("name", ["", "1model", "a-b", "opf_model", "x" * 64, 'a"b'])
def test_a_name_that_is_no_c_identifier_is_refused(name, tmp_path):
    x = opf.var("x", (5,))
    exe = opf.compile(opf.Function([x], opf.op.exp(x)))
    with pytest.raises(ExportError, match="must be a C identifier"):
        exe.export_library(tmp_path, name=name)


def test_model_names_reach_the_source_only_as_escaped_literals():
    assert c_string('in"put*/\\') == '"in\\042put\\052/\\134"'
    assert c_string("é") == '"\\303\\251"'
