"""Converters of ONNX's recurrent layers RNN, GRU and LSTM, unrolled over time into graph IR.

The sequence length is static at import, so each layer becomes a chain of cells built from
existing operators:

* the input term ``X @ W^T`` (plus the biases that do not depend on the state) of every
  timestep is computed up front, one product per gate over all steps (the compiler's
  MergeParallelProducts makes them one product when the weights are constants);
* each step adds ``H_{t-1} @ R^T`` (one ``nn.dense`` per cell, two for a GRU with
  ``linear_before_reset=0``) and applies the gate activations with elementwise operators, so
  FuseOps puts each cell's elementwise tail in a kernel after its product and the compiled
  model calls the cell kernels in order, with no Python per step. A step reads its input
  term with ``take`` at a constant index, an argument of the kernel, so every step's cell is
  the same kernel, generated and compiled once;
* ``sequence_lens`` (a constant or a value computed at run time) becomes per-step ``where``
  masks: at steps at or past a batch entry's length the state is kept and ``Y`` is 0, as in
  ONNX Runtime (a reverse direction then starts at each entry's own last step; an entry of
  length 0 ends with zero states). A constant outside 0..T is an error; a value computed at
  run time acts as if clamped to 0..T;
* ``direction="reverse"`` runs t = T-1..0, ``"bidirectional"`` stacks both directions on
  the num_directions axis; ``layout=1`` is handled by transposing in and out.

Unrolling makes graphs that grow with the sequence length: more than :data:`MAX_STEPS` steps
are refused with an error that says what to do."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .... import op
from ....ir.expr import Constant, Expr
from ....ir.types import is_float
from ..registry import OnnxNode, converter
from ._common import filled, shape_of, tensor_type
from .activation import _negative_part, _softplus

MAX_STEPS = 4096
"""The longest sequence a recurrent layer is unrolled over (steps per direction)."""

# ---------------------------------------------------------------------------------------------
# activation functions, by lower-cased name: (default alpha/beta, function of x, alpha, beta).
# ``None`` marks a parameter the function does not take (and so does not consume from the
# activation_alpha/activation_beta lists).


@dataclass(frozen=True)
class _Activation:
    alpha: float | None
    beta: float | None
    fn: Callable[[Expr, float, float], Expr]


def _thresholded_relu(x: Expr, alpha: float) -> Expr:
    return op.where(op.greater(x, _scalar(alpha, x)), x, _scalar(0, x))


def _elu(x: Expr, alpha: float) -> Expr:
    return op.where(op.greater(x, _scalar(0, x)), x, _negative_part(x, alpha))


_ACTIVATIONS: dict[str, _Activation] = {
    "relu": _Activation(None, None, lambda x, a, b: op.nn.relu(x)),
    "tanh": _Activation(None, None, lambda x, a, b: op.tanh(x)),
    "sigmoid": _Activation(None, None, lambda x, a, b: op.sigmoid(x)),
    "affine": _Activation(1.0, 0.0, lambda x, a, b: x * a + b),
    "leakyrelu": _Activation(0.01, None, lambda x, a, b: op.nn.leaky_relu(x, alpha=a)),
    "thresholdedrelu": _Activation(1.0, None, lambda x, a, b: _thresholded_relu(x, a)),
    "scaledtanh": _Activation(1.0, 1.0, lambda x, a, b: op.tanh(x * b) * a),
    "hardsigmoid": _Activation(0.2, 0.5,
                               lambda x, a, b: op.clip(x * a + b, a_min=0.0, a_max=1.0)),
    "elu": _Activation(1.0, None, lambda x, a, b: _elu(x, a)),
    "softsign": _Activation(None, None, lambda x, a, b: x / (op.abs(x) + 1.0)),
    "softplus": _Activation(None, None, lambda x, a, b: _softplus(x)),
}

Act = Callable[[Expr], Expr]


def _scalar(value: float, like: Expr) -> Constant:
    return Constant(np.asarray(value, dtype=tensor_type(like).dtype))


def _bind(name: str, alpha: float, beta: float) -> Act:
    fn = _ACTIVATIONS[name].fn
    return lambda x: fn(x, alpha, beta)


def _activations(node: OnnxNode, defaults: Sequence[str], directions: int) -> list[list[Act]]:
    """The activation functions of each direction, with their alpha/beta bound. The
    activation_alpha/_beta lists are consumed in the order of the functions, each value by
    the next function that takes that parameter (as ONNX Runtime reads them); a function
    with no value left takes its ONNX default."""
    per_direction = len(defaults)
    names = node.attr("activations", None)
    if not names:
        names = list(defaults) * directions
    if len(names) != per_direction * directions:
        raise node.error(f"attribute activations={names} has {len(names)} entries; give "
                         f"{per_direction} per direction ({per_direction * directions} for "
                         f"{directions} direction(s))")
    alphas = list(node.attr("activation_alpha", None) or [])
    betas = list(node.attr("activation_beta", None) or [])
    bound: list[Act] = []
    for name in names:
        spec = _ACTIVATIONS.get(str(name).lower())
        if spec is None:
            raise node.error(f"activation {name!r} is not one ONNX defines for recurrent "
                             f"layers; use one of {sorted(_ACTIVATIONS)}")
        alpha = alphas.pop(0) if spec.alpha is not None and alphas else spec.alpha
        beta = betas.pop(0) if spec.beta is not None and betas else spec.beta
        bound.append(_bind(str(name).lower(), float(alpha or 0.0), float(beta or 0.0)))
    return [bound[d * per_direction:(d + 1) * per_direction] for d in range(directions)]


# ---------------------------------------------------------------------------------------------
# small tensor helpers


def _pick(x: Expr, index: int, axis: int = 0) -> Expr:
    """``x[index]`` along ``axis``, that axis dropped."""
    return op.squeeze(op.strided_slice(x, begin=[index], end=[index + 1], axes=[axis]),
                      axis=[axis])


def _cols(x: Expr, gate: int, hidden: int) -> Expr:
    """Gate ``gate`` of a (..., gates * hidden) tensor: its columns gate*hidden..+hidden."""
    axis = len(shape_of(x)) - 1
    return op.strided_slice(x, begin=[gate * hidden], end=[(gate + 1) * hidden], axes=[axis])


def _rows(x: Expr, begin: int, end: int) -> Expr:
    return op.strided_slice(x, begin=[begin], end=[end], axes=[0])


def _stack(values: Sequence[Expr], shape: tuple[int, ...]) -> Expr:
    """(B, H) values, in row-major order of the leading axes of ``shape``, as one tensor of
    ``shape``: a concatenation along the rows and a reshape (a kernel of thousands of
    arguments is called through its thunk)."""
    return op.reshape(_rows_of(list(values)), newshape=list(shape))


def _rows_of(values: Sequence[Expr]) -> Expr:
    return values[0] if len(values) == 1 else op.concatenate(list(values), axis=0)


# ---------------------------------------------------------------------------------------------
# the layer: inputs checked, per-direction loop, outputs assembled


@dataclass(frozen=True)
class _Kind:
    gates: int
    activations: tuple[str, ...]
    states: int  # 1 (h) or 2 (h and c)


_KINDS = {
    "RNN": _Kind(1, ("Tanh",), 1),
    "GRU": _Kind(3, ("Sigmoid", "Tanh"), 1),
    "LSTM": _Kind(4, ("Sigmoid", "Tanh", "Tanh"), 2),
}


@dataclass
class _Direction:
    """What one direction's cells read: per-direction slices of the node's inputs."""

    w: Expr                # (gates*H, I)
    r: Expr                # (gates*H, H)
    r_zr: Expr | None      # GRU: R's z and r rows (2*H, H), R's h rows (H, H)
    r_h: Expr | None
    wb: Expr | None        # (gates*H,) input bias
    rb: Expr | None        # (gates*H,) recurrence bias
    p: Expr | None         # (3*H,) LSTM peepholes i, o, f
    h0: Expr               # (B, H)
    c0: Expr | None        # (B, H), LSTM
    acts: list[Act]


@dataclass(frozen=True)
class _Layer:
    kind: str
    hidden: int
    clip: float | None
    input_forget: bool
    linear_before_reset: bool


def _expect_shape(node: OnnxNode, value: Expr, name: str, want: tuple[int, ...]) -> None:
    if shape_of(value) != want:
        raise node.error(f"input {name} has shape {shape_of(value)}; expected {want}")


def _convert(node: OnnxNode) -> list[Expr]:
    kind = _KINDS[node.op_type]
    x, w, r = node.input(0), node.input(1), node.input(2)
    dtype = tensor_type(x).dtype
    if not is_float(dtype):
        raise node.error(f"input X must be floating point, got {dtype}")
    if len(shape_of(x)) != 3 or len(shape_of(w)) != 3 or len(shape_of(r)) != 3:
        raise node.error(f"inputs X {shape_of(x)}, W {shape_of(w)} and R {shape_of(r)} must "
                         "be 3-D")
    layout = node.attr("layout", 0)
    if layout not in (0, 1):
        raise node.error(f"attribute layout={layout} must be 0 or 1")
    if layout == 1:
        x = op.transpose(x, axes=[1, 0, 2])  # (T, B, I) from here on
    steps, batch, features = shape_of(x)
    directions, hidden = _directions(node), shape_of(r)[2]
    if node.attr("hidden_size", None) not in (None, hidden):
        raise node.error(f"attribute hidden_size={node.attr('hidden_size')} disagrees with R "
                         f"{shape_of(r)} (hidden size {hidden})")
    gates = kind.gates * hidden
    _expect_shape(node, w, "W", (directions, gates, features))
    _expect_shape(node, r, "R", (directions, gates, hidden))
    if steps > MAX_STEPS:
        raise node.error(f"the sequence has {steps} steps; opfusion unrolls recurrent layers "
                         f"over time and refuses more than {MAX_STEPS} steps: split the "
                         "sequence into chunks (passing the final states on as initial_h/"
                         "initial_c) or export the model for shorter sequences")
    clip = node.attr("clip", None)
    if clip is not None and not clip > 0:
        raise node.error(f"attribute clip={clip} must be positive")
    layer = _Layer(node.op_type, hidden, clip, bool(node.attr("input_forget", 0)),
                   bool(node.attr("linear_before_reset", 0)))
    state_shape = (directions, batch, hidden)
    seq_lens = _sequence_lens(node, steps, batch)
    per_dir = _per_direction(node, kind, layer, directions, state_shape, layout, dtype)

    ys, finals = [], []
    for d, spec in enumerate(per_dir):
        reverse = d == 1 or node.attr("direction", "forward") == "reverse"
        y, states = _run_direction(layer, spec, x, seq_lens, reverse)
        ys.append(y)
        finals.append(states)
    # Y: (T, D, B, H); Y_h, Y_c: (D, B, H); layout 1 puts the batch first.
    y_out = (_stack([ys[d][t] for t in range(steps) for d in range(directions)],
                    (steps, directions, batch, hidden)) if steps
             else filled((0, directions, batch, hidden), 0, dtype, what="Y"))
    outputs = [y_out] + [_stack([states[i] for states in finals], (directions, batch, hidden))
                         for i in range(kind.states)]
    if layout == 1:
        outputs = [op.transpose(outputs[0], axes=[2, 0, 1, 3])] + [
            op.transpose(state, axes=[1, 0, 2]) for state in outputs[1:]]
    return outputs[:max(node.num_outputs, 1)]


def _directions(node: OnnxNode) -> int:
    direction = node.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise node.error(f"attribute direction={direction!r} must be 'forward', 'reverse' or "
                         "'bidirectional'")
    return 2 if direction == "bidirectional" else 1


def _sequence_lens(node: OnnxNode, steps: int, batch: int) -> Expr | None:
    """sequence_lens as a (B, 1) column for the step masks, or None when every entry runs
    all ``steps`` (absent, or a constant of full lengths). A constant out of 0..T is an
    error; a value computed at run time acts clamped to 0..T (the masks only compare)."""
    lens = node.optional_input(4)
    if lens is None:
        return None
    if not np.issubdtype(np.dtype(tensor_type(lens).dtype), np.integer):
        raise node.error(f"input sequence_lens must be integers, got {tensor_type(lens).dtype}")
    _expect_shape(node, lens, "sequence_lens", (batch,))
    if isinstance(lens, Constant):
        values = np.asarray(lens.data).reshape(-1)
        bad = [int(v) for v in values if not 0 <= v <= steps]
        if bad:
            raise node.error(f"sequence_lens {values.tolist()} has lengths {bad} outside 0.."
                             f"{steps} (the sequence length of X)")
        if (values == steps).all():
            return None
    return op.reshape(lens, newshape=[batch, 1])


def _optional(node: OnnxNode, index: int, name: str, shape: tuple[int, ...]) -> Expr | None:
    value = node.optional_input(index)
    if value is not None:
        _expect_shape(node, value, name, shape)
    return value


def _initial(node: OnnxNode, index: int, name: str, state_shape: tuple[int, int, int],
             layout: int, dtype: str) -> Expr:
    """initial_h / initial_c as (D, B, H); zeros when absent."""
    directions, batch, hidden = state_shape
    value = node.optional_input(index)
    if value is None:
        return filled(state_shape, 0, dtype, what=name)
    if layout == 1:
        _expect_shape(node, value, name, (batch, directions, hidden))
        return op.transpose(value, axes=[1, 0, 2])
    _expect_shape(node, value, name, state_shape)
    return value


def _per_direction(node: OnnxNode, kind: _Kind, layer: _Layer, directions: int,
                   state_shape: tuple[int, int, int], layout: int,
                   dtype: str) -> list[_Direction]:
    gates = kind.gates * layer.hidden
    w, r = node.input(1), node.input(2)
    b = _optional(node, 3, "B", (directions, 2 * gates))
    h0 = _initial(node, 5, "initial_h", state_shape, layout, dtype)
    c0 = p = None
    if layer.kind == "LSTM":
        c0 = _initial(node, 6, "initial_c", state_shape, layout, dtype)
        p = _optional(node, 7, "P", (directions, 3 * layer.hidden))
    acts = _activations(node, kind.activations, directions)
    specs = []
    for d in range(directions):
        b_d = _pick(b, d) if b is not None else None
        r_d = _pick(r, d)
        split = layer.kind == "GRU" and not layer.linear_before_reset
        specs.append(_Direction(
            w=_pick(w, d), r=r_d,
            r_zr=_rows(r_d, 0, 2 * layer.hidden) if split else None,
            r_h=_rows(r_d, 2 * layer.hidden, 3 * layer.hidden) if split else None,
            wb=op.strided_slice(b_d, begin=[0], end=[gates]) if b_d is not None else None,
            rb=op.strided_slice(b_d, begin=[gates], end=[2 * gates]) if b_d is not None else None,
            p=_pick(p, d) if p is not None else None,
            h0=_pick(h0, d), c0=_pick(c0, d) if c0 is not None else None, acts=acts[d]))
    return specs


def _input_bias(layer: _Layer, spec: _Direction) -> Expr | None:
    """The bias added to the input projection: Wb plus the part of Rb that is not gated by
    the state (all of it, except a GRU's hidden-gate Rb under linear_before_reset)."""
    if spec.wb is None or spec.rb is None:
        return None
    if layer.kind == "GRU" and layer.linear_before_reset:
        hidden = layer.hidden
        zr = op.strided_slice(spec.rb, begin=[0], end=[2 * hidden])
        return spec.wb + op.concatenate([zr, filled((hidden,), 0, tensor_type(zr).dtype)],
                                        axis=0)
    return spec.wb + spec.rb


def _project(layer: _Layer, spec: _Direction, x: Expr) -> list[Expr]:
    """Every step's input term at once, one (T, B, H) tensor per gate: X @ W_gate^T plus
    the gate's part of :func:`_input_bias`. Separate tensors (rather than one product
    sliced) let each step read a gate with an operator of its own, which fuses into the
    kernel that uses it."""
    hidden = layer.hidden
    bias = _input_bias(layer, spec)
    projected = []
    for gate in range(shape_of(spec.w)[0] // hidden):
        value = op.nn.dense(x, _rows(spec.w, gate * hidden, (gate + 1) * hidden))
        projected.append(value if bias is None else value + _cols(bias, gate, hidden))
    return projected


def _run_direction(layer: _Layer, spec: _Direction, x: Expr, seq_lens: Expr | None,
                   reverse: bool) -> tuple[list[Expr], list[Expr]]:
    """One direction over the sequence: Y's (B, H) slices in time order and the final
    states (h, and c for an LSTM)."""
    steps = shape_of(x)[0]
    projected = _project(layer, spec, x)
    cell = _CELLS[layer.kind]
    states = [spec.h0] + ([spec.c0] if spec.c0 is not None else [])
    ys: list[Expr | None] = [None] * steps
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        new = cell(layer, spec, _StepInput(projected, t), states)
        if seq_lens is None:
            states, ys[t] = new, new[0]
            continue
        # Past its length a batch entry keeps its state and writes zeros. t is a 1-element
        # tensor, an argument of the kernel (see _StepInput). Y reads the kept state, not
        # the new one, so that the new state's only consumer is its mask, which fuses into
        # the cell's kernel.
        valid = op.greater(seq_lens, Constant(np.array([t], dtype=tensor_type(seq_lens).dtype)))
        states = [op.where(valid, n, s) for n, s in zip(new, states)]
        ys[t] = op.where(valid, states[0], _scalar(0, states[0]))
    if seq_lens is not None:
        # An entry of length 0 has no final state: 0 (as ONNX Runtime), not the initial one.
        started = op.greater(seq_lens, Constant(np.zeros(1, tensor_type(seq_lens).dtype)))
        states = [op.where(started, s, _scalar(0, s)) for s in states]
    return ys, states  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# cells: (layer, direction, this step's projected input, states) -> new states.
#
# The cells slice gates out of a product's result and add the step's input term after
# slicing: a product's only consumers are then slices, which FuseOps puts, with the gate
# arithmetic and the slices of the projected input, in one kernel after the product.


class _StepInput:
    """Step ``t`` of the projected input (see :func:`_project`), read one gate at a time.

    The step is picked with ``take`` at a 1-element constant index rather than a slice at t:
    the index is then an argument of the cell's kernel, not a number in its code, so every
    step's cell is the same kernel, generated and compiled once."""

    def __init__(self, projected: list[Expr], t: int) -> None:
        self.projected = projected
        self.index = Constant(np.array([t], dtype=np.int64))

    def gate(self, index: int) -> Expr:
        """Gate ``index`` of step t: (B, H)."""
        picked = op.take(self.projected[index], self.index, axis=0, mode="clip")
        return op.squeeze(picked, axis=[0])


def _clipped(layer: _Layer, x: Expr) -> Expr:
    return x if layer.clip is None else op.clip(x, a_min=-layer.clip, a_max=layer.clip)


def _rnn_cell(layer: _Layer, spec: _Direction, xt: _StepInput,
              states: list[Expr]) -> list[Expr]:
    (f,) = spec.acts
    return [f(_clipped(layer, xt.gate(0) + op.nn.dense(states[0], spec.r)))]


def _gru_cell(layer: _Layer, spec: _Direction, xt: _StepInput,
              states: list[Expr]) -> list[Expr]:
    f, g = spec.acts
    (h,) = states
    hidden = layer.hidden
    if layer.linear_before_reset:
        # One product for all three gates; Rb_h stays inside the reset gate's product (the
        # input bias holds Rb_z and Rb_r).
        rec = op.nn.dense(h, spec.r)
    else:
        assert spec.r_h is not None
        rec = op.nn.dense(h, spec.r_zr)
    z = f(_clipped(layer, xt.gate(0) + _cols(rec, 0, hidden)))
    reset = f(_clipped(layer, xt.gate(1) + _cols(rec, 1, hidden)))
    if layer.linear_before_reset:
        rec_h = _cols(rec, 2, hidden)
        if spec.rb is not None:
            rec_h = rec_h + _cols(spec.rb, 2, hidden)
        pre_h = xt.gate(2) + reset * rec_h
    else:
        pre_h = xt.gate(2) + op.nn.dense(reset * h, spec.r_h)
    candidate = g(_clipped(layer, pre_h))
    return [(1.0 - z) * candidate + z * h]


def _lstm_cell(layer: _Layer, spec: _Direction, xt: _StepInput,
               states: list[Expr]) -> list[Expr]:
    f, g, act_h = spec.acts
    h, c = states
    hidden = layer.hidden
    rec = op.nn.dense(h, spec.r)  # gates i, o, f, c
    peep = ([_cols(spec.p, k, hidden) for k in range(3)] if spec.p is not None
            else [None, None, None])

    def gate(index: int, peephole: Expr | None, state: Expr) -> Expr:
        value = xt.gate(index) + _cols(rec, index, hidden)
        if peephole is not None:
            value = value + peephole * state
        return f(_clipped(layer, value))

    i = gate(0, peep[0], c)
    forget = 1.0 - i if layer.input_forget else gate(2, peep[2], c)
    c_new = forget * c + i * g(_clipped(layer, xt.gate(3) + _cols(rec, 3, hidden)))
    o = gate(1, peep[1], c_new)
    return [o * act_h(c_new), c_new]


_CELLS = {"RNN": _rnn_cell, "GRU": _gru_cell, "LSTM": _lstm_cell}


@converter("RNN")
def rnn(node: OnnxNode) -> list[Expr]:
    return _convert(node)


@converter("GRU")
def gru(node: OnnxNode) -> list[Expr]:
    return _convert(node)


@converter("LSTM")
def lstm(node: OnnxNode) -> list[Expr]:
    return _convert(node)
