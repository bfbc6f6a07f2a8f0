"""The ONNX project's backend test suite (``onnx.backend.test.BackendTest``), run against
:mod:`opfusion.frontend.onnx.backend`.

Kinds: the generated node tests (from the cache of ``onnx_node_data.py``; the wheel ships no
per-node data) and the shipped ``simple``, ``pytorch-converted`` and ``pytorch-operator``
models. The runner's ``real`` kind is left out: its only local cases are the nine light
models, whose constant weights give the same output for any input, so comparing with their
shipped outputs proves nothing. ``test_light_models.py`` imports them and compares numbers on
random-weight copies (``opfusion.testing.light_model``) instead. Tests outside the project's
scope are skipped with their reason and known failures are xfail (not strict); both lists live
in ``onnx_backend_scope.py``.

The suite runs twice, once per engine of the backend: compiled (the default: every test model
becomes C kernels; the classes keep onnx's names, ``OnnxBackendNodeModelTest``, ...) and the
reference interpreter (the same classes prefixed ``Reference``), each held to its own list of
known failures. The reference run costs half a minute and tells a frontend regression from a
compiler one. ``benchmarks/onnx_backend_report.py [--engine reference]`` counts the same tests
and groups the failures."""

from unittest import mock

import numpy as np
import pytest

pytest.importorskip("onnx")
import onnx.backend.test.runner as onnx_runner  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402
from onnx.backend.test import BackendTest  # noqa: E402
from onnx.backend.test.loader import DATA_DIR  # noqa: E402
from onnx_backend_scope import KNOWN_FAILURES, out_of_scope_reason  # noqa: E402
from onnx_node_data import load_node_tests  # noqa: E402

from opfusion import OpfusionError  # noqa: E402
from opfusion.frontend.onnx import backend as onnx_backend  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402


def backend_for(engine: str) -> type[onnx_backend.OpfusionBackend]:
    """The backend with ``engine`` as its engine (onnx's runner passes no options)."""

    class EngineBackend(onnx_backend.OpfusionBackend):
        @classmethod
        def prepare(cls, model, device="CPU", **kwargs):
            return super().prepare(model, device, engine=engine, **kwargs)

    EngineBackend.__name__ = EngineBackend.__qualname__ = f"OpfusionBackend_{engine}"
    return EngineBackend


class OpfusionBackendTest(BackendTest):
    """onnx's runner with its node tests read from the generated cache and no ``real`` models
    (the light models prove nothing numerically; any other would need a download)."""

    def __init__(self, backend, parent_module=None):
        load_shipped = onnx_runner.load_model_tests

        def load_model_tests(data_dir=DATA_DIR, kind=None):
            if kind == "node":
                return load_node_tests()
            if kind == "real":
                return []
            return load_shipped(data_dir, kind)

        with mock.patch.object(onnx_runner, "load_model_tests", load_model_tests):
            super().__init__(backend, parent_module)


def engine_test_cases(engine: str, prefix: str) -> dict[str, type]:
    """onnx's test classes for ``engine``, named ``prefix`` + onnx's name; what is out of scope
    is skipped (with its reason) and the engine's known failures are xfail."""
    known = KNOWN_FAILURES[engine]
    test_cases = {}
    for class_name, case_class in OpfusionBackendTest(backend_for(engine),
                                                      __name__).test_cases.items():
        case_class.__name__ = case_class.__qualname__ = prefix + class_name
        for name in [attr for attr in vars(case_class) if attr.startswith("test_")]:
            func = getattr(case_class, name)
            reason = out_of_scope_reason(name)
            base = name.removesuffix("_cpu")
            if reason:
                func = pytest.mark.skip(reason=f"out of scope: {reason}")(func)
            elif base in known:
                func = pytest.mark.xfail(reason=known[base], strict=False)(func)
            setattr(case_class, name, func)
        test_cases[prefix + class_name] = case_class
    return test_cases


globals().update(engine_test_cases("compiled", ""))
globals().update(engine_test_cases("reference", "Reference"))


# -- the backend API itself ------------------------------------------------------------------


def make_model(nodes, inputs, outputs=("y",), opset=17):
    outs = [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None) for name in outputs]
    graph = helper.make_graph(nodes, "g", inputs, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def add_model():
    return make_model([helper.make_node("Add", ["a", "b"], ["y"]),
                       helper.make_node("Neg", ["y"], ["z"])],
                      [tensor("a", [2, 3]), tensor("b", [3])], outputs=("y", "z"))


A = np.arange(6, dtype=np.float32).reshape(2, 3)
B = np.array([1.0, -2.0, 0.5], np.float32)


def test_run_takes_a_list_or_a_dict_and_returns_outputs_in_graph_order():
    rep = onnx_backend.prepare(add_model())
    for inputs in ([A, B], {"b": B, "a": A}):
        y, z = rep.run(inputs)
        assert_close(y, A + B)
        assert_close(z, -(A + B))
    assert_close(rep.run([A, B])["z"], -(A + B))


def test_run_model_prepares_and_runs():
    outputs = onnx_backend.run_model(add_model(), [A, B])
    assert len(outputs) == 2
    assert_close(outputs[0], A + B)


def test_run_node_runs_one_node():
    node = helper.make_node("Add", ["a", "b"], ["y"])
    (y,) = onnx_backend.run_node(node, [A, B])
    assert_close(y, A + B)


def test_symbolic_dimensions_take_the_shapes_passed_to_run():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["n", 3])])
    rep = onnx_backend.prepare(model)  # nothing to import yet: "n" is open
    for rows in (2, 5):
        x = np.linspace(-1, 1, rows * 3, dtype=np.float32).reshape(rows, 3)
        assert_close(rep.run([x])[0], np.maximum(x, 0))


def test_imports_by_shape_are_kept_in_a_bounded_cache():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["n", 3])])
    rep = onnx_backend.prepare(model, max_specializations=2)
    for rows in (1, 2, 1, 4):  # 2 is now the least recently used of {1, 2}
        x = np.linspace(-1, 1, rows * 3, dtype=np.float32).reshape(rows, 3)
        assert_close(rep.run([x])[0], np.maximum(x, 0))
    assert [key[0][1] for key in rep._runners.keys()] == [(1, 3), (4, 3)]
    assert len(rep._runners) == 2


def test_shape_option_closes_symbolic_dimensions_at_prepare():
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["n", 3])])
    rep = onnx_backend.prepare(model, shape={"x": (4, 3)})
    with pytest.raises(OpfusionError, match="expects shape \\(4, 3\\)"):
        rep.run([np.zeros((2, 3), np.float32)])


def reshape_model():
    return make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                      [tensor("x", [2, 6]), tensor("shape", [2], TensorProto.INT64)])


def test_values_that_decide_shapes_are_frozen_to_the_values_passed():
    rep = onnx_backend.prepare(reshape_model())
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for shape in ((3, 4), (4, 3)):
        assert_close(rep.run([x, np.array(shape, np.int64)])[0], x.reshape(shape))
    assert rep.frozen_inputs == ["shape"]


def test_without_specialization_a_shape_input_is_an_error():
    with pytest.raises(OpfusionError, match="must be a constant known at import time"):
        onnx_backend.prepare(reshape_model(), specialize=False)


def test_the_engine_is_one_entry_in_a_table(monkeypatch):
    calls = []

    def counting_engine(mod, params):
        run = onnx_backend.ENGINES["reference"](mod, params)
        return lambda inputs: calls.append(len(inputs)) or run(inputs)

    monkeypatch.setitem(onnx_backend.ENGINES, "counting", counting_engine)
    y, _ = onnx_backend.prepare(add_model(), engine="counting").run([A, B])
    assert_close(y, A + B)
    assert calls == [2]


def test_the_default_engine_compiles_and_the_reference_stays_selectable():
    compiled = onnx_backend.prepare(add_model())
    reference = onnx_backend.prepare(add_model(), engine="reference")
    assert (compiled.engine, reference.engine) == ("compiled", "reference")
    for got, want in zip(compiled.run([A, B]), reference.run([A, B])):
        assert_close(got, want)


def test_every_engine_converts_inputs_of_the_same_kind():
    for engine in ("compiled", "reference"):
        y, _ = onnx_backend.prepare(add_model(), engine=engine).run([A.astype(np.float64), B])
        assert y.dtype == np.float32
        assert_close(y, A + B)


def test_a_model_that_does_not_compile_is_an_error_not_a_fallback(monkeypatch):
    calls = []

    def failing_compile(mod, params=None):
        calls.append(mod)
        raise OpfusionError("nn.foo has no kernel")

    monkeypatch.setattr(onnx_backend, "compile_model", failing_compile)
    with pytest.raises(OpfusionError, match="compiled engine cannot build.*nn.foo has no "
                                            "kernel(.|\n)*engine='reference'") as info:
        onnx_backend.prepare(add_model())
    assert str(info.value.__cause__) == "nn.foo has no kernel"
    # Nor is it retried with more inputs frozen: specialization answers import errors only.
    with pytest.raises(OpfusionError, match="compiled engine cannot build"):
        onnx_backend.prepare(reshape_model()).run([np.zeros((2, 6), np.float32),
                                                   np.array([3, 4], np.int64)])
    assert len(calls) == 2


def test_an_internal_error_surfaces_as_an_opfusion_error(monkeypatch):
    def broken_engine(mod, params):
        raise ValueError("boom")

    monkeypatch.setitem(onnx_backend.ENGINES, "broken", broken_engine)
    with pytest.raises(OpfusionError, match="internal error.*ValueError: boom") as info:
        onnx_backend.prepare(add_model(), engine="broken")
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("call, message", [
    (lambda: onnx_backend.prepare(add_model(), engine="tvm"), "unknown engine 'tvm'"),
    (lambda: onnx_backend.prepare(add_model(), "CUDA"), "CPU only, not 'CUDA'"),
    (lambda: onnx_backend.prepare(add_model(), rtol=1e-3), "no option 'rtol'"),
    (lambda: onnx_backend.prepare(b"garbage"), "not a valid ONNX model"),
    (lambda: onnx_backend.run_model(add_model(), [A]), "takes 2 input\\(s\\) \\(a, b\\), got 1"),
    (lambda: onnx_backend.run_model(add_model(), {"a": A}), "'b' missing"),
    (lambda: onnx_backend.run_model(add_model(), [B, A]), "input %a expects shape"),
])
def test_mistakes_are_opfusion_errors(call, message):
    with pytest.raises(OpfusionError, match=message):
        call()


def test_supports_the_cpu_only():
    assert onnx_backend.supports_device("CPU")
    assert not onnx_backend.supports_device("CUDA")
