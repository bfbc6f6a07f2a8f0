"""Any batch size: an ONNX model with a symbolic batch dimension imports as a symbolic module,
``opf.compile`` makes it a SpecializingExecutor that compiles each new input shape on first
use (bounded, least recently used evicted), and a new process finds the kernels of a shape
compiled before in the disk cache. Every output is compared with the reference interpreter
on the module imported for the same shape (and with ONNX Runtime when it is installed)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.executor import InputError
from opfusion.compiler.signature import NodeArg
from opfusion.compiler.specialize import SpecializationCache, SpecializingExecutor
from opfusion.ir.symbolic import SymbolicModule, SymbolicShapeError
from opfusion.testing import assert_close, run_in_threads

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

BATCHES = (1, 3, 8)


def mlp_model():
    """x [N, 16] -> matmul, add, relu -> matmul -> softmax -> y [N, 4]."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1"),
               numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1"),
               numpy_helper.from_array(rng.standard_normal((32, 4)).astype(np.float32) / 4,
                                       "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def conv_model():
    """x [batch, 3, 8, 8] -> conv, relu -> global pool -> flatten -> gemm -> y [batch, 5]."""
    rng = np.random.default_rng(1)
    weights = [
        numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float32) / 4, "w"),
        numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((5, 6)).astype(np.float32), "fc"),
    ]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)]
    graph = helper.make_graph(
        nodes, "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def pair_model():
    """a [N, 4], b [N, ?] (one dimension named, one unnamed) -> y = a * 2 + b[:, :4]."""
    nodes = [helper.make_node("Constant", [], ["two"],
                              value=numpy_helper.from_array(np.array(2, np.float32))),
             helper.make_node("Mul", ["a", "two"], ["a2"]),
             helper.make_node("Slice", ["b", "start", "end", "axis"], ["b4"]),
             helper.make_node("Add", ["a2", "b4"], ["y"])]
    consts = [numpy_helper.from_array(np.array([value], np.int64), name)
              for name, value in (("start", 0), ("end", 4), ("axis", 1))]
    graph = helper.make_graph(
        nodes, "pair", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["N", 4]),
                        helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


MODELS = {"mlp": (mlp_model, (16,)), "convnet": (conv_model, (3, 8, 8))}


def batch(n, rest, seed=0):
    return np.random.default_rng(seed + n).standard_normal((n, *rest)).astype(np.float32)


def reference(module, feeds):
    """The interpreter's outputs on ``module`` imported for the shapes of ``feeds``."""
    mod, params = module.specialize({name: array.shape for name, array in feeds.items()})
    want = opf.ir.evaluate(mod, {**feeds, **params})
    return list(want) if isinstance(want, tuple) else [want]


@pytest.fixture(scope="module")
def mlp():
    module, params = opf.frontend.from_onnx(mlp_model())
    return module, opf.compile(module, params=params)


# -- import ----------------------------------------------------------------------------------


def test_a_symbolic_batch_dim_imports_as_a_symbolic_module():
    module, params = opf.frontend.from_onnx(mlp_model())
    assert isinstance(module, SymbolicModule) and params == {}
    assert [(t.name, t.dims, t.dtype) for t in module.inputs] == [("x", ("N", 16), "float32")]
    assert [(t.name, t.dims) for t in module.outputs] == [("y", ("N", 4))]
    assert "x: float32[N, 16]" in repr(module)


def test_shape_still_pins_one_shape():
    mod, _ = opf.frontend.from_onnx(mlp_model(), shape={"x": (2, 16)})
    assert isinstance(mod, opf.IRModule)
    assert mod["main"].params[0].type_annotation.shape == (2, 16)


def test_what_needs_a_graph_refuses_a_symbolic_module_saying_what_to_do():
    module, _ = opf.frontend.from_onnx(mlp_model())
    message = "graph input 'x' has a symbolic dimension 'N' at axis 0.*shape=.*opf.compile"
    with pytest.raises(SymbolicShapeError, match=message):
        opf.transform.InferType()(module)
    with pytest.raises(SymbolicShapeError, match=message):
        opf.ir.evaluate(module, {"x": batch(1, (16,))})
    with pytest.raises(SymbolicShapeError, match=message):
        module["main"]


def test_an_unsupported_operator_is_reported_at_import_not_at_the_first_run():
    model = mlp_model()
    model.graph.node[2].op_type = "NoSuchOp"
    with pytest.raises(opf.frontend.UnsupportedOnnxError, match="NoSuchOp"):
        opf.frontend.from_onnx(model)


# -- running any batch -----------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_batches_1_3_and_8_match_the_reference(name):
    build, rest = MODELS[name]
    module, params = opf.frontend.from_onnx(build())
    exe = opf.compile(module, params=params)
    assert isinstance(exe, SpecializingExecutor)
    for n in BATCHES:
        feeds = {"x": batch(n, rest)}
        (got,) = exe.run(None, feeds)
        assert got.shape[0] == n
        assert_close(got, reference(module, feeds)[0])
    assert exe.specializations == [{"x": (n, *rest)} for n in BATCHES]
    assert exe.compiled == len(BATCHES)


@pytest.mark.parametrize("name", MODELS)
def test_batches_1_3_and_8_match_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    build, rest = MODELS[name]
    model = build()
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    module, params = opf.frontend.from_onnx(model)
    exe = opf.compile(module, params=params)
    for n in BATCHES:
        feeds = {"x": batch(n, rest, seed=10)}
        assert_close(exe.run(None, feeds)[0], session.run(None, feeds)[0], rtol=1e-4)


def test_a_shape_seen_before_is_not_compiled_again(mlp):
    _, exe = mlp
    first = exe(batch(2, (16,)))
    compiled = exe.compiled
    again = exe(batch(2, (16,)))
    assert exe.compiled == compiled
    np.testing.assert_array_equal(first, again)


def test_the_onnx_runtime_forms_show_symbolic_dims_by_name(mlp):
    _, exe = mlp
    assert exe.get_inputs() == [NodeArg("x", ["N", 16], "tensor(float)", np.dtype("float32"))]
    assert exe.get_outputs() == [NodeArg("y", ["N", 4], "tensor(float)", np.dtype("float32"))]
    x = batch(5, (16,))
    (by_name,) = exe.run(["y"], {"x": x})
    assert_close(exe.run({"x": x})[0], by_name)
    assert_close(exe(x=x), by_name)


def test_an_unknown_output_name_fails_before_compiling():
    module, params = opf.frontend.from_onnx(mlp_model())
    exe = opf.compile(module, params=params)
    with pytest.raises(opf.OpfusionError, match="unknown output 'z'"):
        exe.run(["z"], {"x": batch(1, (16,))})
    assert exe.compiled == 0


def test_the_least_recently_used_specialization_is_evicted():
    module, params = opf.frontend.from_onnx(mlp_model())
    exe = opf.compile(module, params=params, max_specializations=2)
    for n in (1, 3, 1, 8):  # 3 is now the least recently used of {1, 3}
        exe.run({"x": batch(n, (16,))})
    assert exe.specializations == [{"x": (1, 16)}, {"x": (8, 16)}]
    assert exe.compiled == 3
    feeds = {"x": batch(3, (16,))}
    assert_close(exe.run(feeds)[0], reference(module, feeds)[0])  # compiled again
    assert exe.compiled == 4
    assert exe.specializations == [{"x": (8, 16)}, {"x": (3, 16)}]


def test_settings_of_the_compile_call_hold_for_every_specialization():
    module, params = opf.frontend.from_onnx(mlp_model())
    with opf.transform.PassContext(opt_level=0):
        exe = opf.compile(module, params=params, fusion="none")
    static, static_params = module.specialize({"x": (2, 16)})
    unfused = opf.compile(static, params=static_params, fusion="none")
    assert exe.specialize({"x": (2, 16)}).num_kernels == unfused.num_kernels == 5
    assert exe.opt_level == 0 and exe.fusion == "none"


def test_max_specializations_must_be_positive_and_only_for_symbolic_models():
    module, params = opf.frontend.from_onnx(mlp_model())
    with pytest.raises(opf.OpfusionError, match="at least 1"):
        opf.compile(module, params=params, max_specializations=0)
    static, _ = module.specialize({"x": (1, 16)})
    with pytest.raises(opf.OpfusionError, match="symbolic input dimensions"):
        opf.compile(static, max_specializations=2)


def test_params_kept_apart_with_freeze_params_false():
    module, params = opf.frontend.from_onnx(mlp_model(), freeze_params=False)
    assert isinstance(module, SymbolicModule) and sorted(params) == ["b1", "w1", "w2"]
    exe = opf.compile(module, params={**params, "b1": np.zeros(32, np.float32)})
    x = batch(3, (16,))
    mod, _ = module.specialize({"x": x.shape})
    want = opf.ir.evaluate(mod, {"x": x, **params, "b1": np.zeros(32, np.float32)})
    assert_close(exe(x), want)


def test_an_input_of_unknown_rank_takes_any_rank():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    module, _ = opf.frontend.from_onnx(model)
    assert module.inputs[0].dims is None
    exe = opf.compile(module)
    assert exe.get_inputs()[0].shape is None
    for shape in ((4,), (2, 3), (1, 2, 3)):
        x = np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape)
        assert_close(exe(x), np.maximum(x, 0))


# -- exporting -------------------------------------------------------------------------------


def test_export_is_refused_but_a_specialization_exports(mlp, tmp_path):
    _, exe = mlp
    with pytest.raises(opf.OpfusionError, match=r"exe.specialize\(\{'x': \(1, 16\)\}\)"):
        exe.export(tmp_path / "m.opf")
    exe.specialize({"x": (4, 16)}).export(tmp_path / "m4.opf")
    loaded = opf.load(tmp_path / "m4.opf")
    x = batch(4, (16,))
    assert_close(loaded(x), exe(x))


# -- wrong inputs ----------------------------------------------------------------------------


@pytest.mark.parametrize("feeds, message", [
    ({"a": np.zeros((2, 4), np.float32), "b": np.zeros((3, 4), np.float32)},
     "input 'b' has 3 at axis 0, the dimension 'N', which input 'a' gives as 2"),
    ({"a": np.zeros((2, 5), np.float32), "b": np.zeros((2, 4), np.float32)},
     r"input 'a' must have shape \(N, 4\), got \(2, 5\): axis 1 is 4"),
    ({"a": np.zeros((2, 4, 1), np.float32), "b": np.zeros((2, 4), np.float32)},
     r"input 'a' must have 2 dimensions \(N, 4\), got shape \(2, 4, 1\)"),
    ({"a": np.zeros((2, 4), np.float64), "b": np.zeros((2, 4), np.float32)},
     "input 'a' must be float32, got float64"),
    ({"a": np.zeros((2, 4), np.float32)}, "input 'b' is missing"),
    ({"a": np.zeros((2, 4), np.float32), "b": np.zeros((2, 4), np.float32),
      "c": np.zeros(1, np.float32)}, "unknown input 'c'"),
])
def test_wrong_inputs_are_input_errors_naming_the_input_before_any_compile(feeds, message):
    module, _ = opf.frontend.from_onnx(pair_model())
    exe = opf.compile(module)
    with pytest.raises(InputError, match=message):
        exe.run(feeds)
    assert exe.compiled == 0


def test_a_named_dimension_is_shared_and_an_unnamed_one_is_free():
    module, _ = opf.frontend.from_onnx(pair_model())
    exe = opf.compile(module)
    assert [arg.shape for arg in exe.get_inputs()] == [["N", 4], ["N", None]]
    for rows, width in ((2, 4), (2, 7), (5, 6)):
        a, b = batch(rows, (4,)), batch(rows, (width,), seed=1)
        assert_close(exe(a, b), a * 2 + b[:, :4])


# -- threads ---------------------------------------------------------------------------------


def test_threads_running_two_new_shapes_compile_each_once():
    module, params = opf.frontend.from_onnx(mlp_model())
    exe = opf.compile(module, params=params)
    inputs = {n: batch(n, (16,), seed=5) for n in (2, 6)}
    wants = {n: reference(module, {"x": x})[0] for n, x in inputs.items()}

    def work(index):
        for round_ in range(5):
            n = (2, 6)[(index + round_) % 2]
            assert_close(exe(inputs[n]), wants[n])

    run_in_threads(8, work)
    assert exe.compiled == 2
    assert sorted(key["x"] for key in exe.specializations) == [(2, 16), (6, 16)]


def test_the_cache_builds_a_missing_value_once_for_concurrent_callers():
    cache = SpecializationCache(capacity=4)
    built = []

    def build():
        built.append(1)
        return len(built)

    values = []
    run_in_threads(8, lambda index: values.append(cache.get("key", build)))
    assert values == [1] * 8 and cache.builds == 1


def test_a_failed_build_leaves_nothing_and_is_tried_again():
    cache = SpecializationCache(capacity=2)

    def fail():
        raise opf.OpfusionError("no")

    with pytest.raises(opf.OpfusionError, match="no"):
        cache.get("key", fail)
    assert "key" not in cache and cache.builds == 0
    assert cache.get("key", lambda: 7) == 7 and cache.keys() == ["key"]


# -- a new process ---------------------------------------------------------------------------


def test_a_restart_finds_the_kernels_of_a_shape_in_the_disk_cache(tmp_path):
    # Two processes in turn on one fresh cache: the first compiles batch 8 (and the runtime's
    # helper library), the second, a restart, compiles nothing and gets the same numbers.
    onnx.save(mlp_model(), tmp_path / "mlp.onnx")
    x = batch(8, (16,))
    np.save(tmp_path / "x.npy", x)
    script = textwrap.dedent(f"""
        import json, sys, numpy as np, opfusion as opf
        from opfusion.backend.cpu.toolchain import compile_stats
        module, params = opf.frontend.from_onnx({str(tmp_path / "mlp.onnx")!r})
        exe = opf.compile(module, params=params)
        np.save(sys.argv[1], exe(np.load({str(tmp_path / "x.npy")!r})))
        stats = compile_stats()
        print(json.dumps({{"compiles": stats.compiles, "cache_hits": stats.cache_hits}}))
    """)
    env = {**os.environ, "OPFUSION_CACHE_DIR": str(tmp_path / "cache")}
    stats = []
    for run in ("cold", "restart"):
        result = subprocess.run([sys.executable, "-c", script, str(tmp_path / f"{run}.npy")],
                                capture_output=True, text=True, env=env, timeout=300,
                                check=False)
        assert result.returncode == 0, result.stderr
        stats.append(json.loads(result.stdout.strip().splitlines()[-1]))
    cold, restart = stats
    assert cold["compiles"] >= 1, cold
    assert restart["compiles"] == 0 and restart["cache_hits"] == cold["compiles"], stats
    want = reference(opf.frontend.from_onnx(mlp_model())[0], {"x": x})[0]
    assert_close(np.load(tmp_path / "cold.npy"), want)
    np.testing.assert_array_equal(np.load(tmp_path / "restart.npy"),
                                  np.load(tmp_path / "cold.npy"))
