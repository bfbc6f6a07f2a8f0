"""Lower one fused group (a primitive function) to one kernel: the FuseTIR step.

Every operator call of the group becomes its TE compute, chained through the group's
dataflow; then one schedule covers them all:

* elementwise, broadcast and injective stages that are not results are inlined into their
  readers — materialising them would cost a round trip through memory and buy nothing;
* the group's anchor (its conv2d, dense, pooling, reduction or softmax) gets the backend's
  schedule rule for its operator (see :mod:`opfusion.backend.schedule_rule`), with a given
  config or the rule's default for the target; the rule also attaches the elementwise
  epilogue to the anchor's tiles;
* without an anchor rule every remaining stage gets the backend's default schedule (on the
  CPU: the outer loops fused and run in parallel, the innermost loop split and vectorized).

The computes and the rule run under ``with backend.target:``, so that both see the same
hardware (the computes read the vector width from the current target).

Operators with no TE compute (sort, topk: truly opaque) cannot be lowered; a group holding one
must be that one call, and the executor runs its NumPy reference."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import te
from ..backend import Backend, get_backend
from ..errors import OpfusionError
from ..ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ..ir.op import Op, OpPatternKind
from ..ir.types import TensorType, TupleType
from ..ir.visitor import post_order
from ..te.lower import lower
from ..tir import mma
from ..tir.nan_free import Fact, constant_fact
from ..tir.stmt import PrimFunc
from ..tir.work import kernel_work
from ..topi import get_compute

K = OpPatternKind


class LoweringUnsupportedError(OpfusionError):
    """A group cannot become a kernel (an operator without a TE compute inside a larger group,
    or a value kind the kernel interface does not take)."""


@dataclass
class LoweredGroup:
    """One fused group ready to run.

    ``prim_func`` takes the group's parameters, then ``constants`` (large constants kept in
    the function), then one buffer per output. ``reference_function`` is set instead for a
    lone operator without a TE compute: the executor evaluates it with the reference
    interpreter. ``op_names`` lists the fused operators (for profiles).
    ``schedule_config`` is the schedule rule's config the kernel was built with
    (:meth:`opfusion.backend.schedule_rule.Config.to_dict`: ``{"rule": ..., "knobs": {...}}``,
    plain JSON), None for the default schedule."""

    name: str
    prim_func: PrimFunc | None
    output_types: list[TensorType]
    constants: list[np.ndarray] = field(default_factory=list)
    reference_function: Function | None = None
    op_names: list[str] = field(default_factory=list)
    function: Function | None = None  # the primitive function (absent after opf.load)
    schedule_config: dict[str, Any] | None = None


def lower_primitive_function(func: Function, name: str, backend: Backend | None = None,
                             config: Any = None,
                             input_facts: dict[int, Fact] | None = None) -> LoweredGroup:
    """Turn the primitive function ``func`` into one kernel named ``name``, scheduled by
    ``backend`` (default: the current target's) with schedule ``config`` (a
    :class:`~opfusion.backend.schedule_rule.Config` of the group's rule, or its ``to_dict()``;
    None: the rule's default for the target). ``input_facts``: what every call passes as the
    inputs (by position) that are float constants (:func:`constant_facts`; the kernel may
    assume it)."""
    output_types = _output_types(func)
    calls = [n for n in post_order(func.body, into_functions=False) if isinstance(n, Call)]
    op_names = [c.op.name if isinstance(c.op, Op) else "call" for c in calls]
    missing = [c for c in calls if not isinstance(c.op, Op) or get_compute(c.op.name) is None]
    if missing:
        only = missing[0]
        if len(calls) == 1 and isinstance(only.op, Op):
            return LoweredGroup(name, None, output_types, reference_function=func,
                                op_names=op_names, function=func)
        what = only.op.name if isinstance(only.op, Op) else type(only.op).__name__
        raise LoweringUnsupportedError(
            f"fused group {name}: {what} has no TE compute and is fused with other operators; "
            f"opaque operators must form groups of their own")
    backend = backend or get_backend()
    with backend.target:
        builder, schedule, anchor = _schedulable(func, name)
        outputs = builder.outputs
        if anchor is not None:
            used = backend.schedule(schedule, anchor[1], outputs[0], anchor[0].op.name, config)
        else:
            used = backend.schedule(schedule, None, None, None, config)
    args = builder.placeholders + builder.constant_placeholders + outputs
    prim = lower(schedule, args, name=name)
    facts = dict(input_facts or {})
    facts.update(constant_facts(builder.constants, len(builder.placeholders),
                                backend.target.allow_tf32))
    prim.attrs["constant_facts"] = facts
    if backend.target.allow_tf32 and not backend.target.tf32_rounds_operands:
        prim.attrs[mma.TRUNCATES_ATTR] = True  # -tf32=fast: see tir.mma.truncates_operands
    return LoweredGroup(name, prim, output_types, builder.constants, op_names=op_names,
                        function=func,
                        schedule_config=used.to_dict() if used is not None else None)


def constant_facts(constants: list[np.ndarray | None], first: int, tf32: bool = False
                   ) -> dict[int, Fact]:
    """The facts (bounds, NaN, zero: :class:`~opfusion.tir.nan_free.Fact`) of the kernel
    parameters (by position; the constants follow the ``first`` inputs) that are float
    constants: what the code generator may assume of them (a quantized epilogue's scales and
    biases); with ``tf32`` (a target whose tensor cores may read them), whether TF32 holds
    their values exactly (a product's weights after RoundTF32Weights)."""
    facts: dict[int, Fact] = {}
    for index, data in enumerate(constants):
        fact = constant_fact(data, tf32) if data is not None else None
        if fact is not None:
            facts[first + index] = fact
    return facts


def unscheduled_work(func: Function, backend: Backend | None = None) -> int:
    """Innermost statement executions (:func:`opfusion.tir.work.kernel_work`) of the kernel
    of primitive function ``func`` with its injective stages inlined and no schedule rule:
    every other stage computed once, whole, at the root. A rule's kernel does about this
    much (its tiles round some extents up); far more means it recomputes a stage at every
    iteration of a loop where it meant to compute a slice of it, as a bounds inference over
    a tile that does not map onto the stage's axes does (tests/compiler/test_kernel_work.py
    holds the light models' kernels, drawn convolutions and small products to it)."""
    backend = backend or get_backend()
    with backend.target:
        builder, schedule, _ = _schedulable(func, "unscheduled")
    args = builder.placeholders + builder.constant_placeholders + builder.outputs
    return kernel_work(lower(schedule, args, name="unscheduled").body)


def schedule_space(func: Function, backend: Backend | None = None) -> Any:
    """``(rule, space, default config)`` of the schedule rule that would arrange the kernel
    of primitive function ``func`` (see :meth:`opfusion.backend.Backend.config_space`), or
    None when no rule with knobs takes it (a lone operator without a TE compute, several
    results, a group without an anchor unless the backend tunes its fallback rule): what a
    tuner may choose for this group."""
    calls = [n for n in post_order(func.body, into_functions=False) if isinstance(n, Call)]
    if any(not isinstance(c.op, Op) or get_compute(c.op.name) is None for c in calls):
        return None
    backend = backend or get_backend()
    with backend.target:
        builder, _, anchor = _schedulable(func, "space")
        if anchor is None:
            if len(builder.outputs) != 1:
                return None
            return backend.fallback_space(builder.outputs[0])
        return backend.config_space(anchor[1], builder.outputs[0], anchor[0].op.name)


def _schedulable(func: Function, name: str
                 ) -> tuple[_TEBuilder, te.Schedule, tuple[Call, te.Tensor] | None]:
    """The TE graph of ``func``, its schedule with the injective stages inlined, and the
    anchor a schedule rule arranges (None: the default schedule)."""
    builder = _TEBuilder(func, name)
    outputs = builder.outputs
    schedule = te.create_schedule([t.op for t in outputs])
    _inline_injective_stages(schedule, builder, outputs)
    anchor = _anchor(builder) or _layout_anchor(builder, outputs)
    return builder, schedule, anchor if len(outputs) == 1 else None


def _output_types(func: Function) -> list[TensorType]:
    ty = func.body.checked_type
    fields = ty.fields if isinstance(ty, TupleType) else [ty]
    for item in fields:
        if not isinstance(item, TensorType):
            raise LoweringUnsupportedError(f"a fused group returns {item!r}; kernels return "
                                           f"tensors (or a flat tuple of tensors)")
    return list(fields)


class _TEBuilder:
    """The TE graph of a primitive function: placeholders for its parameters and its large
    constants, one compute chain per call, and the result tensors."""

    def __init__(self, func: Function, name: str) -> None:
        self.placeholders: list[te.Tensor] = []
        self.constant_placeholders: list[te.Tensor] = []
        self.constants: list[np.ndarray] = []
        self.call_of: dict[Any, tuple[Call, te.Tensor]] = {}  # te op -> (call, its tensor)
        value: dict[Expr, Any] = {}
        for param in func.params:
            value[param] = self._parameter(param, name)
        for node in post_order(func.body, into_functions=False):
            if node in value:
                continue
            value[node] = self._convert(node, value)
        result = value[func.body]
        outputs = list(result) if isinstance(result, (list, tuple)) else [result]
        self.outputs = _distinct_computed(outputs)

    def _parameter(self, param: Var, name: str) -> te.Tensor | list[te.Tensor]:
        """A tensor parameter becomes one placeholder; a tuple of tensors (an unfused tuple
        passed to concatenate) one placeholder per field."""
        ty = param.type_annotation
        fields = ty.fields if isinstance(ty, TupleType) else [ty]
        holders = []
        for field_type in fields:
            if not isinstance(field_type, TensorType):
                raise LoweringUnsupportedError(f"fused group {name}: parameter "
                                               f"%{param.name_hint} is {ty!r}")
            holder = te.placeholder(field_type.shape, field_type.dtype,
                                    name=f"p{len(self.placeholders)}")
            self.placeholders.append(holder)
            holders.append(holder)
        return holders if isinstance(ty, TupleType) else holders[0]

    def _convert(self, node: Expr, value: dict[Expr, Any]) -> Any:
        if isinstance(node, Constant):
            return self._constant(node)
        if isinstance(node, Tuple):
            return [value[f] for f in node.fields]
        if isinstance(node, TupleGetItem):
            return value[node.tuple_value][node.index]
        if isinstance(node, Call) and isinstance(node.op, Op):
            inputs = [value[a] for a in node.args]
            out = get_compute(node.op.name)(inputs, node.attrs, node.checked_type)
            for tensor in (out if isinstance(out, (list, tuple)) else [out]):
                self.call_of[tensor.op] = (node, tensor)
            return list(out) if isinstance(out, tuple) else out
        raise LoweringUnsupportedError(f"a fused group holds {node!r}, which has no kernel form")

    def _constant(self, node: Constant) -> te.Tensor:
        data = node.data
        if data.ndim == 0:  # small enough to live in the code
            scalar = data.item()
            return te.compute((), lambda: te.const(scalar, str(data.dtype)), name="scalar")
        holder = te.placeholder(data.shape, str(data.dtype),
                                name=f"c{len(self.constant_placeholders)}")
        self.constant_placeholders.append(holder)
        self.constants.append(data)
        return holder


def _distinct_computed(outputs: list[te.Tensor]) -> list[te.Tensor]:
    """Kernel outputs must be distinct computed tensors: a parameter returned as is, or a
    tensor returned twice, gets a copy stage."""
    seen: list[Any] = []
    result = []
    for tensor in outputs:
        if isinstance(tensor.op, te.PlaceholderOp) or any(tensor.op is op for op in seen):
            source = tensor
            tensor = te.compute(source.shape, lambda *i, src=source: src[i], name="copy")
        seen.append(tensor.op)
        result.append(tensor)
    return result


def _inline_injective_stages(s: te.Schedule, builder: _TEBuilder,
                             outputs: list[te.Tensor]) -> None:
    output_ops = [t.op for t in outputs]
    for stage in list(s.stages):
        op = stage.op
        if not isinstance(op, te.ComputeOp) or any(op is o for o in output_ops):
            continue
        if op.reduce_axis:
            continue
        entry = builder.call_of.get(op)
        if entry is None:
            if not op.axis:  # an inline scalar constant
                stage.compute_inline()
            continue
        call = entry[0]
        if call.op.pattern <= K.kInjective:
            stage.compute_inline()


#: Injective operators that move data between layouts: a group whose result one of them
#: computes is scheduled by its rule (the loops ordered for the layouts), not the default.
LAYOUT_ANCHORS = ("layout_transform", "channel_shuffle")


def _layout_anchor(builder: _TEBuilder, outputs: list[te.Tensor]
                   ) -> tuple[Call, te.Tensor] | None:
    """The layout-moving call that computes the group's single output, if one does."""
    if len(outputs) != 1:
        return None
    for call, tensor in builder.call_of.values():
        if call.op.name in LAYOUT_ANCHORS and tensor.op is outputs[0].op:
            return call, tensor
    return None


def _anchor(builder: _TEBuilder) -> tuple[Call, te.Tensor] | None:
    """The call whose schedule shapes the kernel: the most complex pattern, last in order."""
    best: tuple[Call, te.Tensor] | None = None
    for call, tensor in builder.call_of.values():
        if call.op.pattern < K.kCommReduce:
            continue
        if best is None or call.op.pattern >= best[0].op.pattern:
            best = (call, tensor)
    return best
