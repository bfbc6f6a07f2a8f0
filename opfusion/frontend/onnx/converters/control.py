"""Converters of ONNX's control flow: If, Loop and Scan.

opfusion compiles static graphs, so control flow is resolved at import, where the shapes
are known:

* **If** with a condition known at import (a constant, or folded from shapes) is the chosen
  branch's body, inlined. A condition computed at run time gives both branches, inlined, and
  a ``where`` per output when their outputs have the same types (every value stays in the
  compiled graph; both branches run). Branches whose outputs differ in shape need the
  condition at import: :class:`~opfusion.errors.DataDependentError`, which the staged
  executor answers by specializing on the condition's value.
* **Loop** and **Scan** are unrolled: the body is converted once per iteration with the
  iteration's values bound to its inputs, so each iteration's operators fold and fuse like any
  others and the compiled model's native entry calls the iterations' kernels in order (no
  Python per iteration), when the Loop's trip count and the condition after each iteration
  are known at import (constants, or values that fold: ``cond_out = Identity(cond_in)``) and
  the unrolled body stays under ``MAX_UNROLLED_NODES``. Otherwise (a long loop; an exit that
  depends on data) the import stops with a :class:`~opfusion.errors.DataDependentError` and
  the staged executor runs the Loop as a loop: its body compiled once as a model, called per
  iteration. Scan's length is its inputs' static size; a Scan too long to unroll is refused.

Scan outputs are stacked along their axis with ``expand_dims`` and ``concatenate``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .... import op
from ....errors import DataDependentError
from ....ir.expr import Call, Constant, Expr, Tuple, TupleGetItem
from ....ir.op import OpPatternKind
from ..registry import OnnxNode, converter
from ._common import checked_axis, tensor_type
from .tensor import as_ints, required_const

MAX_UNROLLED_NODES = 2_000
"""The most body nodes one Loop or Scan is unrolled to (trip count x body nodes). A longer
Loop runs as a loop: its body compiled once, called per iteration by the staged executor
(:mod:`opfusion.frontend.onnx.staged`); a longer Scan is refused."""


# ---------------------------------------------------------------------------------------------
# If
# ---------------------------------------------------------------------------------------------
@converter("If")
def if_(node: OnnxNode) -> list[Expr]:
    cond = node.input(0)
    if isinstance(cond, Constant):
        value = cond.data
        if value.size != 1:
            raise node.error(f"the condition must hold one value, got shape {value.shape}")
        branch = "then_branch" if bool(value.reshape(-1)[0]) else "else_branch"
        return node.run_graph(branch, [])
    then = node.run_graph("then_branch", [])
    other = node.run_graph("else_branch", [])
    if len(then) != len(other):
        raise node.error(f"then_branch gives {len(then)} outputs and else_branch "
                         f"{len(other)}; both must give the node's outputs")
    same = all(tensor_type(a) == tensor_type(b) for a, b in zip(then, other))
    if not same:
        # Which shape the outputs have depends on the condition: known only at run time.
        required_const(node, 0, "cond; the branches' outputs differ in type or shape")
    if not _cheap_and_safe([*then, *other]):
        # Computing both would cost too much, or the branch not taken could raise (an index
        # valid only when its branch is taken): run only the taken one, in stages.
        required_const(node, 0, "cond; a branch is large or may raise on the other's data")
    if tensor_type(cond).size != 1:
        raise node.error(f"the condition must hold one value, got shape "
                         f"{tensor_type(cond).shape}")
    flag = op.reshape(cond, newshape=[])
    if tensor_type(flag).dtype != "bool":
        flag = op.cast(flag, dtype="bool")
    return [op.where(flag, a, b) for a, b in zip(then, other)]


SELECT_BRANCH_NODES = 256
"""A run-time If computes both branches and selects (``where``) only when the operators that
lead to its outputs number at most this many (counted back into the enclosing graph too)."""


def _cheap_and_safe(outputs: list[Expr]) -> bool:
    """Whether the operators ``outputs`` are computed by are few and none can fail at run
    time (checked indices, or opaque operators that raise), looking back at most
    ``SELECT_BRANCH_NODES`` operators (a worklist)."""
    seen: set[int] = set()
    pending = list(outputs)
    while pending:
        expr = pending.pop()
        if id(expr) in seen or not isinstance(expr, (Call, Tuple, TupleGetItem)):
            continue
        seen.add(id(expr))
        if len(seen) > SELECT_BRANCH_NODES:
            return False
        if isinstance(expr, Call):
            if expr.op.pattern == OpPatternKind.kOpaque or expr.attrs.get("mode") == "checked":
                return False
            pending.extend(expr.args)
        elif isinstance(expr, Tuple):
            pending.extend(expr.fields)
        else:
            pending.append(expr.tuple_value)
    return True


# ---------------------------------------------------------------------------------------------
# Loop
# ---------------------------------------------------------------------------------------------
@converter("Loop")
def loop(node: OnnxNode) -> list[Expr]:
    trip = _optional_scalar(node, 0, "M, the trip count")
    first = _optional_scalar(node, 1, "cond, the initial condition")
    if trip is None and first is None:
        raise node.error("neither a trip count M nor a condition is given: the loop would "
                         "never end")
    trip_count = None if trip is None else max(int(trip), 0)
    running = True if first is None else bool(first)
    states: list[Expr] = [node.input(i) for i in range(2, len(node.inputs))]
    body = node.attrs.get("body")
    body_nodes = len(body.node) if body is not None and hasattr(body, "node") else 0
    if trip_count is not None and trip_count * max(body_nodes, 1) > MAX_UNROLLED_NODES:
        _run_as_loop(node, f"{trip_count} iterations of a body of {body_nodes} nodes are "
                           f"more than the {MAX_UNROLLED_NODES} nodes opfusion unrolls")
    count = 0
    scans: list[list[Expr]] = []
    while running and (trip_count is None or count < trip_count):
        if (count + 1) * max(body_nodes, 1) > MAX_UNROLLED_NODES:
            _run_as_loop(node, f"it ran past the {MAX_UNROLLED_NODES} body nodes opfusion "
                               "unrolls")
        outputs = node.run_graph("body", [_int64(count), _bool(True), *states],
                                 f"iteration {count}")
        if len(outputs) < 1 + len(states):
            raise node.error(f"the body gives {len(outputs)} outputs; it must give the "
                             f"condition and the {len(states)} loop-carried values first")
        running = _condition_after(node, outputs[0], count)
        states = outputs[1:1 + len(states)]
        scans.append(outputs[1 + len(states):])
        count += 1
    if not scans:
        outputs = node.run_graph("body", [_int64(0), _bool(True), *states],
                                 "types of its outputs")
        empty = [_empty_stack(value) for value in outputs[1 + len(states):]]
        return [*states, *empty]
    per_output = [list(values) for values in zip(*scans)]
    return [*states, *(_stack(values, 0) for values in per_output)]


def _optional_scalar(node: OnnxNode, index: int, what: str) -> np.generic | None:
    expr = node.optional_input(index)
    if expr is None:
        return None
    value = required_const(node, index, what)
    if value.size != 1:
        raise node.error(f"input {index} ({what}) must hold one value, got shape {value.shape}")
    return value.reshape(-1)[0]


def _run_as_loop(node: OnnxNode, why: str) -> None:
    """Refuse to unroll: the staged executor runs the node as a loop of its compiled body."""
    raise DataDependentError(
        f"{node.op_type} (node {node.name!r}, opset {node.opset}): {why}; it runs as a loop of "
        "its compiled body (opf.compile of the model runs it in stages; from_onnx(..., "
        "data_dependent='raise') refuses it)", node=node.name)


def _condition_after(node: OnnxNode, cond: Expr, count: int) -> bool:
    if not isinstance(cond, Constant):
        _run_as_loop(node, f"the body computes its condition from run-time values (iteration "
                           f"{count}), so how many times it runs depends on the data")
    if cond.data.size != 1:
        raise node.error(f"the body's condition must hold one value, got shape "
                         f"{cond.data.shape}")
    return bool(cond.data.reshape(-1)[0])


MAX_UNROLLED_SCAN_NODES = 200_000
"""The most body nodes one Scan is unrolled to (there is no loop to run it as instead)."""


def _check_unroll(node: OnnxNode, iterations: int, body_nodes: int) -> None:
    if iterations * max(body_nodes, 1) > MAX_UNROLLED_SCAN_NODES:
        raise node.error(f"{iterations} iterations of a body of {body_nodes} nodes exceed "
                         f"the {MAX_UNROLLED_SCAN_NODES} nodes opfusion unrolls a Scan to; "
                         "shorten the sequence or split the model")


# ---------------------------------------------------------------------------------------------
# Scan
# ---------------------------------------------------------------------------------------------
@converter("Scan", since=8)
def scan_8(node: OnnxNode) -> list[Expr]:
    """Opset 8: every state and scan input has a leading batch axis (the scan axis is 1),
    and an optional sequence_lens that must cover the whole sequence."""
    lengths = node.optional_input(0)
    values = [node.input(i) for i in range(1, len(node.inputs))]
    num_scan = int(node.attr("num_scan_inputs", 0))
    num_states = len(values) - num_scan
    if num_scan < 1 or num_states < 0:
        raise node.error(f"num_scan_inputs={num_scan} does not fit the node's "
                         f"{len(values)} inputs")
    batch = tensor_type(values[0]).shape[0] if values[0] is not None else 0
    length = tensor_type(values[num_states]).shape[1]
    if lengths is not None:
        given = required_const(node, 0, "sequence_lens")
        if np.any(given.reshape(-1) != length):
            raise node.error(f"sequence_lens {given.tolist()} shorter than the sequence "
                             f"({length}) are not supported")
    directions = as_ints(node.attr("directions", [0] * num_scan))
    per_batch: list[list[Expr]] = []
    for b in range(batch):
        picked = [op.take(value, _int64(b), axis=0) for value in values]
        per_batch.append(_scan(node, picked[:num_states], picked[num_states:],
                               [0] * num_scan, directions, [0] * 0, [0] * 0))
    return [_stack(list(outs), 0) for outs in zip(*per_batch)]


@converter("Scan", since=9)
def scan_9(node: OnnxNode) -> list[Expr]:
    num_scan = int(node.attr("num_scan_inputs", 0))
    values = [node.input(i) for i in range(len(node.inputs))]
    num_states = len(values) - num_scan
    if num_scan < 1 or num_states < 0:
        raise node.error(f"num_scan_inputs={num_scan} does not fit the node's "
                         f"{len(values)} inputs")
    scanned = values[num_states:]
    in_axes = [checked_axis(node, a, tensor_type(v).ndim) for a, v in
               zip(as_ints(node.attr("scan_input_axes", [0] * num_scan)), scanned)]
    in_dirs = as_ints(node.attr("scan_input_directions", [0] * num_scan))
    out_axes = as_ints(node.attr("scan_output_axes", []))
    out_dirs = as_ints(node.attr("scan_output_directions", []))
    return _scan(node, values[:num_states], scanned, in_axes, in_dirs, out_axes, out_dirs)


def _scan(node: OnnxNode, states: list[Expr], scanned: list[Expr], in_axes: Sequence[int],
          in_dirs: Sequence[int], out_axes: Sequence[int], out_dirs: Sequence[int]
          ) -> list[Expr]:
    if len(in_axes) != len(scanned) or len(in_dirs) != len(scanned):
        raise node.error("scan_input_axes and scan_input_directions must give one entry per "
                         "scan input")
    lengths = {tensor_type(v).shape[axis] for v, axis in zip(scanned, in_axes)}
    if len(lengths) != 1:
        raise node.error(f"the scan inputs have different lengths {sorted(lengths)} along "
                         "their scan axes")
    (length,) = lengths
    body = node.attrs.get("body")
    _check_unroll(node, length, len(body.node) if hasattr(body, "node") else 0)
    outputs_per_step: list[list[Expr]] = []
    for t in range(length):
        slices = [op.take(v, _int64(length - 1 - t if d else t), axis=axis)
                  for v, axis, d in zip(scanned, in_axes, in_dirs)]
        outputs = node.run_graph("body", [*states, *slices], f"iteration {t}")
        if len(outputs) < len(states):
            raise node.error(f"the body gives {len(outputs)} outputs; it must give the "
                             f"{len(states)} state values first")
        states = outputs[:len(states)]
        outputs_per_step.append(outputs[len(states):])
    if length == 0:
        raise node.error("the scan inputs are empty (length 0); the scan outputs' shapes "
                         "are unknown")
    results = []
    for j, values in enumerate(zip(*outputs_per_step)):
        ordered = list(values)
        if j < len(out_dirs) and out_dirs[j]:
            ordered.reverse()
        ndim = tensor_type(ordered[0]).ndim + 1
        axis = checked_axis(node, out_axes[j], ndim) if j < len(out_axes) else 0
        results.append(_stack(ordered, axis))
    return [*states, *results]


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _stack(values: list[Expr], axis: int) -> Expr:
    """``values`` (one type) stacked along a new ``axis``."""
    return op.concatenate([op.expand_dims(v, axis=axis) for v in values], axis=axis)


def _empty_stack(value: Expr) -> Expr:
    ty = tensor_type(value)
    return Constant(np.zeros((0, *ty.shape), dtype=ty.dtype))


def _int64(value: int) -> Constant:
    return Constant(np.array(value, dtype=np.int64))


def _bool(value: bool) -> Constant:
    return Constant(np.array(value, dtype=np.bool_))
