"""ONNX RNN, GRU and LSTM, unrolled over time: imported graphs agree with onnx.reference for
what it implements (directions, layouts, biases, initial states, peepholes,
linear_before_reset) and with a NumPy reference of the ONNX definition for the rest
(sequence_lens, clip, input_forget, other activations), itself checked against
onnx.reference and, where installed, ONNX Runtime; compiled models agree too."""

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import OpfusionError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.frontend.onnx.converters.recurrent import MAX_STEPS  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402
from opfusion.testing.sequence_models import lstm_model  # noqa: E402

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
INPUT_NAMES = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
SEQ, BATCH, FEATURES, HIDDEN = 4, 3, 5, 4

# -- a NumPy reference of the ONNX definitions ------------------------------------------------


def _softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


# name -> (default alpha, default beta, function); None: the function takes no such value
ACTIVATIONS = {
    "relu": (None, None, lambda x, a, b: np.maximum(x, 0)),
    "tanh": (None, None, lambda x, a, b: np.tanh(x)),
    "sigmoid": (None, None, lambda x, a, b: 1 / (1 + np.exp(-x))),
    "affine": (1.0, 0.0, lambda x, a, b: a * x + b),
    "leakyrelu": (0.01, None, lambda x, a, b: np.where(x >= 0, x, a * x)),
    "thresholdedrelu": (1.0, None, lambda x, a, b: np.where(x > a, x, 0)),
    "scaledtanh": (1.0, 1.0, lambda x, a, b: a * np.tanh(b * x)),
    "hardsigmoid": (0.2, 0.5, lambda x, a, b: np.clip(a * x + b, 0, 1)),
    "elu": (1.0, None, lambda x, a, b: np.where(x > 0, x, a * (np.exp(np.minimum(x, 0)) - 1))),
    "softsign": (None, None, lambda x, a, b: x / (1 + np.abs(x))),
    "softplus": (None, None, lambda x, a, b: _softplus(x)),
}
DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"],
                       "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


def _bound_activations(op_type, directions, attrs):
    names = attrs.get("activations") or DEFAULT_ACTIVATIONS[op_type] * directions
    alphas, betas = list(attrs.get("activation_alpha", [])), list(attrs.get("activation_beta", []))
    bound = []
    for name in names:
        alpha, beta, fn = ACTIVATIONS[name.lower()]
        alpha = alphas.pop(0) if alpha is not None and alphas else alpha
        beta = betas.pop(0) if beta is not None and betas else beta
        bound.append(lambda x, fn=fn, a=alpha, b=beta: fn(x, a, b))
    count = len(DEFAULT_ACTIVATIONS[op_type])
    return [bound[d * count:(d + 1) * count] for d in range(directions)]


def _cell(op_type, acts, x, h, c, w, r, wb, rb, p, attrs):
    """One step of one direction in float64: the new (h, c)."""
    clip = attrs.get("clip")
    cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
    hidden = h.shape[1]
    if op_type == "RNN":
        return acts[0](cl(x @ w.T + h @ r.T + wb + rb)), c
    if op_type == "GRU":
        f, g = acts
        xw, split = x @ w.T + wb, np.split
        xz, xr, xh = split(xw, 3, axis=1)
        rz, rr, rh = split(r, 3)
        bz, br, bh = split(rb, 3)
        z = f(cl(xz + h @ rz.T + bz))
        reset = f(cl(xr + h @ rr.T + br))
        if attrs.get("linear_before_reset"):
            cand = g(cl(xh + reset * (h @ rh.T + bh)))
        else:
            cand = g(cl(xh + (reset * h) @ rh.T + bh))
        return (1 - z) * cand + z * h, c
    f, g, act_h = acts
    gi, go, gf, gc = np.split(x @ w.T + h @ r.T + wb + rb, 4, axis=1)
    pi, po, pf = np.split(p, 3) if p is not None else (np.zeros(hidden),) * 3
    i = f(cl(gi + pi * c))
    forget = 1 - i if attrs.get("input_forget") else f(cl(gf + pf * c))
    c_new = forget * c + i * g(cl(gc))
    o = f(cl(go + po * c_new))
    return o * act_h(c_new), c_new


def numpy_layer(op_type, feeds, attrs):
    """Y, Y_h (and Y_c) of an ONNX recurrent layer from its definition, in float64 then
    cast to X's dtype: masks by sequence_lens (kept state, zero Y; zero final states for
    length 0, as ONNX Runtime), reverse and bidirectional directions, layout 1."""
    x = feeds["X"].astype(np.float64)
    layout = attrs.get("layout", 0)
    states0 = {k: feeds[k].astype(np.float64) for k in ("initial_h", "initial_c") if k in feeds}
    if layout:
        x = x.transpose(1, 0, 2)
        states0 = {k: v.transpose(1, 0, 2) for k, v in states0.items()}
    steps, batch, _ = x.shape
    w, r = feeds["W"].astype(np.float64), feeds["R"].astype(np.float64)
    directions, hidden = w.shape[0], r.shape[2]
    gates = GATES[op_type] * hidden
    bias = feeds.get("B", np.zeros((directions, 2 * gates))).astype(np.float64)
    lens = feeds.get("sequence_lens", np.full(batch, steps))
    acts = _bound_activations(op_type, directions, attrs)
    y = np.zeros((steps, directions, batch, hidden))
    finals = np.zeros((2, directions, batch, hidden))
    for d in range(directions):
        h = states0.get("initial_h", np.zeros((directions, batch, hidden)))[d]
        c = states0.get("initial_c", np.zeros((directions, batch, hidden)))[d]
        p = feeds["P"][d].astype(np.float64) if "P" in feeds else None
        reverse = d == 1 or attrs.get("direction") == "reverse"
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            h_new, c_new = _cell(op_type, acts[d], x[t], h, c, w[d], r[d], bias[d, :gates],
                                 bias[d, gates:], p, attrs)
            valid = (t < lens)[:, None]
            h, c = np.where(valid, h_new, h), np.where(valid, c_new, c)
            y[t, d] = np.where(valid, h, 0)
        started = (lens > 0)[:, None]  # length 0: final states 0, as ONNX Runtime
        finals[:, d] = np.where(started, h, 0), np.where(started, c, 0)
    outs = [y, finals[0], finals[1]][:3 if op_type == "LSTM" else 2]
    if layout:
        outs = [outs[0].transpose(2, 0, 1, 3)] + [s.transpose(1, 0, 2) for s in outs[1:]]
    return [o.astype(feeds["X"].dtype) for o in outs]


# -- building and checking one-node models ---------------------------------------------------


def make_case(op_type, *, seq=SEQ, batch=BATCH, direction="forward", layout=0, bias=True,
              initial=False, peepholes=False, lens=None, dtype=np.float32, seed=0):
    """Random inputs of one layer: name -> array, in ONNX's input order."""
    rng = np.random.default_rng(seed)
    directions = 2 if direction == "bidirectional" else 1
    gates = GATES[op_type] * HIDDEN

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(dtype)

    feeds = {"X": normal(*((seq, batch) if layout == 0 else (batch, seq)), FEATURES),
             "W": normal(directions, gates, FEATURES, scale=0.5),
             "R": normal(directions, gates, HIDDEN, scale=0.5)}
    if bias:
        feeds["B"] = normal(directions, 2 * gates, scale=0.5)
    if lens is not None:
        feeds["sequence_lens"] = np.array(lens, np.int32)
    state = (directions, batch, HIDDEN) if layout == 0 else (batch, directions, HIDDEN)
    if initial:
        feeds["initial_h"] = normal(*state)
        if op_type == "LSTM":
            feeds["initial_c"] = normal(*state)
    if peepholes:
        feeds["P"] = normal(directions, 3 * HIDDEN, scale=0.5)
    return feeds


def make_model(op_type, feeds, attrs, graph_inputs=("X",), outputs=None, opset=22):
    """One node; ``graph_inputs`` are graph inputs, the other feeds initializers."""
    outputs = list(outputs or (["Y", "Y_h", "Y_c"] if op_type == "LSTM" else ["Y", "Y_h"]))
    names = [name if name in feeds else "" for name in INPUT_NAMES[:8 if op_type == "LSTM"
                                                                   else 6]]
    while not names[-1]:
        names.pop()
    node = helper.make_node(op_type, names, outputs, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype),
                                       feeds[n].shape) for n in graph_inputs],
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds["X"].dtype),
                                       None) for n in outputs if n],
        [numpy_helper.from_array(v, n) for n, v in feeds.items() if n not in graph_inputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _full_attrs(op_type, attrs):
    return {"hidden_size": HIDDEN, **attrs}


def check(op_type, feeds, graph_inputs=("X",), oracle="onnx", compiled=False, rtol=1e-5,
          **attrs):
    """Import, evaluate (and compile) one layer; compare with the NumPy reference and with
    ``oracle``: "onnx" (onnx.reference), "ort" (ONNX Runtime, if installed) or None."""
    attrs = _full_attrs(op_type, attrs)
    model = make_model(op_type, feeds, attrs, graph_inputs)
    want = numpy_layer(op_type, feeds, attrs)
    if oracle == "onnx":
        assert_close(tuple(ReferenceEvaluator(model).run(None, feeds)), tuple(want), rtol)
    elif oracle == "ort":
        assert_close(tuple(_onnxruntime(model, feeds)), tuple(want), rtol)
    inputs = {n: feeds[n] for n in graph_inputs}
    mod, params = from_onnx(model)
    assert_close(opf.ir.evaluate(mod, inputs), tuple(want), rtol)
    if compiled:
        exe = opf.compile(mod, params=params)
        assert_close(tuple(exe.run(inputs)), tuple(want), rtol)
    return mod


def _onnxruntime(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [value.name for value in session.get_inputs()]
    return session.run(None, {n: feeds[n] for n in names})


# -- what onnx.reference implements ----------------------------------------------------------

@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_directions_and_layouts(op_type, direction, layout):
    feeds = make_case(op_type, direction=direction, layout=layout, initial=True)
    check(op_type, feeds, direction=direction, layout=layout)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_no_bias_no_initial_state(op_type):
    check(op_type, make_case(op_type, bias=False, direction="bidirectional"),
          direction="bidirectional")


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_weights_and_states_as_graph_inputs(op_type):
    feeds = make_case(op_type, initial=True, peepholes=op_type == "LSTM", seed=3)
    check(op_type, feeds, graph_inputs=tuple(feeds))


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_lstm_peepholes(direction):
    feeds = make_case("LSTM", direction=direction, initial=True, peepholes=True, seed=4)
    check("LSTM", feeds, direction=direction)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_gru_linear_before_reset(direction):
    for bias in (True, False):
        feeds = make_case("GRU", direction=direction, initial=True, bias=bias, seed=5)
        check("GRU", feeds, direction=direction, linear_before_reset=1)


def test_double_precision():
    feeds = make_case("LSTM", direction="bidirectional", initial=True, dtype=np.float64)
    check("LSTM", feeds, direction="bidirectional", rtol=1e-12)


@pytest.mark.parametrize("outputs", [["Y"], ["", "Y_h"], ["", "", "Y_c"], ["Y", "", "Y_c"]])
def test_any_subset_of_outputs(outputs):
    feeds = make_case("LSTM", initial=True)
    attrs = _full_attrs("LSTM", {})
    model = make_model("LSTM", feeds, attrs, outputs=outputs)
    want = [w for name, w in zip(outputs, numpy_layer("LSTM", feeds, attrs)) if name]
    mod, _ = from_onnx(model)
    got = opf.ir.evaluate(mod, {"X": feeds["X"]})
    assert_close(got if isinstance(got, tuple) else (got,), tuple(want))


# -- what onnx.reference ignores: sequence_lens, clip, input_forget, activations -----------

@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_constant_sequence_lens(op_type, direction):
    feeds = make_case(op_type, direction=direction, initial=True, lens=[4, 2, 0])
    check(op_type, feeds, oracle="ort", direction=direction)


@pytest.mark.parametrize("op_type", ["GRU", "LSTM"])
def test_sequence_lens_computed_at_run_time(op_type):
    feeds = make_case(op_type, direction="bidirectional", initial=True, lens=[3, 4, 1])
    graph_inputs = ("X", "sequence_lens")
    mod = check(op_type, feeds, graph_inputs=graph_inputs, oracle="ort",
                direction="bidirectional")
    exe = opf.compile(mod)
    attrs = _full_attrs(op_type, {"direction": "bidirectional"})
    for lens in ([3, 4, 1], [1, 1, 1], [4, 4, 4], [2, 0, 3]):
        feeds["sequence_lens"] = np.array(lens, np.int32)
        inputs = {n: feeds[n] for n in graph_inputs}
        want = tuple(numpy_layer(op_type, feeds, attrs))
        assert_close(opf.ir.evaluate(mod, inputs), want)
        assert_close(tuple(exe.run(inputs)), want)


def test_full_constant_sequence_lens_need_no_masks():
    feeds = make_case("LSTM", lens=[SEQ] * BATCH)
    mod = check("LSTM", feeds)
    ops = {node.op.name for node in opf.ir.post_order(mod["main"].body)
           if isinstance(node, opf.ir.Call) and hasattr(node.op, "name")}
    assert "where" not in ops and "greater" not in ops


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_clip(op_type):
    feeds = make_case(op_type, direction="bidirectional", initial=True,
                      peepholes=op_type == "LSTM")
    check(op_type, feeds, oracle="ort", direction="bidirectional", clip=0.4)


def test_lstm_input_forget_with_peepholes_clip_and_lengths():
    feeds = make_case("LSTM", direction="bidirectional", initial=True, peepholes=True,
                      lens=[1, 4, 3])
    check("LSTM", feeds, oracle="ort", direction="bidirectional", input_forget=1, clip=0.3)


@pytest.mark.parametrize("op_type, attrs", [
    ("RNN", {"activations": ["Affine", "LeakyRelu"], "activation_alpha": [0.5, 0.2],
             "activation_beta": [0.1]}),
    ("RNN", {"activations": ["ScaledTanh", "HardSigmoid"], "activation_alpha": [0.5, 0.3],
             "activation_beta": [0.7, 0.4]}),
    ("RNN", {"activations": ["ThresholdedRelu", "Elu"], "activation_alpha": [0.3, 0.4]}),
    ("RNN", {"activations": ["Softsign", "Softplus"]}),
    ("RNN", {"activations": ["Relu", "Sigmoid"]}),
    ("GRU", {"activations": ["HardSigmoid", "Softsign", "Sigmoid", "Elu"],
             "activation_alpha": [0.3, 0.5], "activation_beta": [0.4]}),
    ("LSTM", {"activations": ["HardSigmoid", "Affine", "ScaledTanh",
                              "Sigmoid", "Tanh", "Relu"],
              "activation_alpha": [0.3, 0.5, 0.7], "activation_beta": [0.4, 0.1, 0.9]}),
])
def test_activations(op_type, attrs):
    feeds = make_case(op_type, direction="bidirectional", initial=True)
    check(op_type, feeds, oracle="ort", direction="bidirectional", **attrs)


# -- compiled ---------------------------------------------------------------------------------

def test_compiled_lstm_and_gru():
    feeds = make_case("LSTM", seq=6, direction="bidirectional", initial=True, peepholes=True)
    check("LSTM", feeds, compiled=True, direction="bidirectional")
    feeds = make_case("GRU", seq=6, direction="reverse", initial=True)
    check("GRU", feeds, compiled=True, direction="reverse")
    feeds = make_case("GRU", seq=5, direction="bidirectional", layout=1)
    check("GRU", feeds, compiled=True, direction="bidirectional", layout=1,
          linear_before_reset=1)
    feeds = make_case("RNN", seq=5, lens=[5, 3, 2])
    check("RNN", feeds, oracle=None, compiled=True, clip=0.5)


def test_compiled_cells_are_one_kernel_each_step():
    # Every step's cell is the same kernel (the step is a kernel argument, not code), so a
    # longer sequence adds calls, not kernels to generate.
    def distinct_kernels(seq):
        feeds = make_case("LSTM", seq=seq, lens=[seq, 2, 1])
        attrs = _full_attrs("LSTM", {})
        mod, params = from_onnx(make_model("LSTM", feeds, attrs, ("X", "sequence_lens")))
        exe = opf.compile(mod, params=params)
        assert_close(tuple(exe.run({n: feeds[n] for n in ("X", "sequence_lens")})),
                     tuple(numpy_layer("LSTM", feeds, attrs)))
        return len(exe.model_layout().step_kernels), len(set(exe.model_layout().step_kernels))
    (short_steps, short_kernels), (long_steps, long_kernels) = map(distinct_kernels, (3, 12))
    assert long_steps > short_steps and long_kernels == short_kernels


def test_long_sequence_compiles():
    # 2 x 520 step outputs: Y is joined in chunks (one kernel of 1040 arguments could not
    # be called).
    feeds = make_case("RNN", seq=520, batch=1, direction="bidirectional", lens=[500])
    check("RNN", feeds, graph_inputs=("X", "sequence_lens"), oracle=None, compiled=True,
          direction="bidirectional")


def test_lstm_classifier_matches_onnxruntime():
    model = lstm_model()
    feeds = {"x": np.random.default_rng(0).standard_normal((16, 2, 8), dtype=np.float32)}
    want = _onnxruntime(model, feeds)
    mod, params = from_onnx(model)
    got = opf.compile(mod, params=params).run(feeds)
    assert_close(got[0], want[0], rtol=1e-5)


# -- errors ------------------------------------------------------------------------------------

def _import_error(op_type, feeds, **attrs):
    with pytest.raises(OpfusionError) as info:
        from_onnx(make_model(op_type, feeds, _full_attrs(op_type, attrs)))
    return str(info.value)


def test_too_long_a_sequence_is_refused_with_advice():
    feeds = make_case("RNN", seq=MAX_STEPS + 1, batch=1)
    message = _import_error("RNN", feeds)
    assert str(MAX_STEPS + 1) in message and "chunks" in message


def test_invalid_attributes_and_inputs_are_named():
    feeds = make_case("GRU")
    assert "direction" in _import_error("GRU", feeds, direction="sideways")
    assert "hidden_size" in _import_error("GRU", feeds, hidden_size=HIDDEN + 1)
    assert "activation" in _import_error("GRU", feeds, activations=["Sigmoid", "Cosine"])
    assert "activations" in _import_error("GRU", feeds, activations=["Sigmoid"])
    assert "clip" in _import_error("GRU", feeds, clip=-1.0)
    assert "sequence_lens" in _import_error("GRU", make_case("GRU", lens=[5, 1, 1]))
    wrong = dict(feeds, W=feeds["W"][:, :-1])
    assert "W" in _import_error("GRU", wrong)
