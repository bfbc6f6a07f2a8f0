"""Check an operator's TE compute against its NumPy reference, one call at a time.

    check_compute(opf.op.nn.conv2d, x, w, strides=2, padding=1)

builds the call over variables shaped like the arrays, turns it into TE with the registered
compute, lowers it with a plain schedule, runs it (the loop-IR interpreter by default, or the
C compiler with ``compiled=True``) and compares with the reference interpreter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import te
from ..errors import OpfusionError
from ..ir.evaluate import evaluate
from ..ir.expr import Call, Expr, Function, Tuple, Var
from ..ir.module import IRModule
from ..ir.types import TensorType, TupleType
from ..te.lower import lower
from ..tir.stmt import PrimFunc
from .registry import get_compute


def call_over_arrays(builder: Callable[..., Expr], arrays: tuple[Any, ...],
                     attrs: dict[str, Any]) -> tuple[Call, list[Var], list[np.ndarray]]:
    """``builder(*vars, **attrs)`` over one variable per array (a list of arrays becomes a
    tuple argument), with the variables and the arrays in parameter order."""
    params: list[Var] = []
    values: list[np.ndarray] = []
    args: list[Any] = []
    for index, item in enumerate(arrays):
        if isinstance(item, list):
            group = []
            for sub, array in enumerate(item):
                array = np.asarray(array)
                params.append(Var(f"x{index}_{sub}", TensorType(array.shape, array.dtype)))
                values.append(array)
                group.append(params[-1])
            args.append(group)
        else:
            array = np.asarray(item)
            params.append(Var(f"x{index}", TensorType(array.shape, array.dtype)))
            values.append(array)
            args.append(params[-1])
    call = builder(*args, **attrs)
    if not isinstance(call, Call):
        raise OpfusionError(f"{builder!r} did not build a single call")
    call.checked_type  # noqa: B018 - infer types now
    return call, params, values


def lower_call(call: Call, params: list[Var], name: str = "kernel") -> tuple[PrimFunc, list[Any]]:
    """The PrimFunc computing ``call`` (parameters: one buffer per variable, then the
    outputs) with a plain schedule, and the output TE tensors."""
    compute = get_compute(call.op.name)
    if compute is None:
        raise OpfusionError(f"{call.op.name} has no TE compute registered")
    holders = {p: te.placeholder(p.type_annotation.shape, p.type_annotation.dtype,
                                 name=p.name_hint) for p in params}
    inputs = [[holders[f] for f in arg.fields] if isinstance(arg, Tuple) else holders[arg]
              for arg in call.args]
    out = compute(inputs, call.attrs, call.checked_type)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    s = te.create_schedule([o.op for o in outs])
    return lower(s, [holders[p] for p in params] + outs, name=name), outs


#: The target whose lowering :func:`check_compute` checks too: every op check also runs the
#: op as one fused group through the GPU's compute and schedule rules, in the interpreter
#: (blocks, threads, barriers and data races checked).
GPU_TARGET = "cuda"


def check_compute(builder: Callable[..., Expr], *arrays: Any, rtol: float = 1e-5,
                  compiled: bool = False, **attrs: Any) -> None:
    """Assert that the TE compute of ``builder``'s op matches the NumPy reference, with a
    plain schedule (in the interpreter, or ``compiled`` by the C compiler) and as a fused
    group scheduled for a GPU (:data:`GPU_TARGET`; in the interpreter, not with
    ``compiled``, whose point is the C compiler's own semantics)."""
    from ..testing import assert_close

    call, params, values = call_over_arrays(builder, arrays, attrs)
    want = evaluate(IRModule.from_expr(Function(params, call)), values)
    if not compiled:
        gpu = _run_as_group(call, params, values, GPU_TARGET)
        assert_close(gpu if isinstance(call.checked_type, TupleType) else gpu[0], want, rtol)
    func, outs = lower_call(call, params)
    results = [np.empty(tuple(int(d) for d in o.shape), dtype=o.dtype) for o in outs]
    if compiled:
        from ..driver import build

        build(func)(*values, *results)
    else:
        from ..tir.interp import run

        run(func, *values, *results)
    got = tuple(results) if isinstance(call.checked_type, TupleType) else results[0]
    assert_close(got, want, rtol)


def _run_as_group(call: Call, params: list[Var], values: list[np.ndarray], target: str
                  ) -> tuple[np.ndarray, ...]:
    """``call`` as one fused group lowered for ``target`` by its backend's rules, run by the
    interpreter."""
    from ..backend import get_backend
    from ..compiler.lower_group import lower_primitive_function
    from ..ir.types import TensorType
    from ..tir.interp import run
    from ..transform.infer_type import InferType

    func = InferType()(IRModule.from_expr(Function(params, call)))["main"]
    group = lower_primitive_function(func, "group", get_backend(target))
    if group.prim_func is None:
        raise OpfusionError(f"{call.op.name} has no TE compute to lower")
    types = group.output_types
    results = [np.empty(tuple(int(d) for d in t.shape), dtype=t.dtype) for t in types
               if isinstance(t, TensorType)]
    run(group.prim_func, *values, *[np.array(c) for c in group.constants], *results)
    return tuple(results)
