"""The reference interpreter: runs any module with the operators' NumPy references.

It is the oracle every pass, fusion decision and generated kernel is compared against, so it
is deliberately plain: each operator's reference computes, the result is cast to the dtype
type inference promised, and its shape is checked against the inferred one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import EvaluationError
from .expr import Call, Constant, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var
from .infer import infer_type
from .module import IRModule
from .op import Op
from .symbolic import StagedModel, SymbolicModule
from .types import TensorType, TupleType, Type, cast_array
from .visitor import children, post_order

Value = Any  # np.ndarray, a tuple of values, or a Function (a function value)


def evaluate(
    mod_or_func: IRModule | Function,
    inputs: Mapping[str, Any] | Sequence[Any] | None = None,
) -> Any:
    """Run ``@main`` of a module (or a function) on NumPy inputs.

    ``inputs`` is a dict by parameter name or a list in parameter order. Returns one array,
    or a tuple of arrays when the function returns a tuple, in the dtypes type inference
    gives."""
    if isinstance(mod_or_func, IRModule):
        mod: IRModule | None = mod_or_func
        func = mod_or_func["main"]
    elif isinstance(mod_or_func, Function):
        mod, func = None, mod_or_func
    elif isinstance(mod_or_func, SymbolicModule):
        raise mod_or_func.static_error("the reference interpreter (evaluate)")
    elif isinstance(mod_or_func, StagedModel):
        raise mod_or_func.staged_error("the reference interpreter (evaluate)")
    else:
        raise EvaluationError(f"evaluate takes an IRModule or a Function, got "
                              f"{type(mod_or_func).__name__}")
    infer_type(func, mod)
    args = _bind_inputs(func, inputs)
    return _Interpreter(mod).run(func, args)


def _bind_inputs(func: Function, inputs: Mapping[str, Any] | Sequence[Any] | None) -> list[Value]:
    params = func.params
    if inputs is None:
        inputs = {}
    if isinstance(inputs, Mapping):
        names = [p.name_hint for p in params]
        unknown = [key for key in inputs if key not in names]
        if unknown:
            raise EvaluationError(f"no parameter named {unknown[0]!r}; the function takes "
                                  f"{', '.join(names) or 'nothing'}")
        missing = [name for name in names if name not in inputs]
        if missing:
            raise EvaluationError(f"input {missing[0]!r} is missing; the function takes "
                                  f"{', '.join(names)}")
        values = [inputs[name] for name in names]
    else:
        values = list(inputs)
        if len(values) != len(params):
            raise EvaluationError(f"the function takes {len(params)} input(s), got {len(values)}")
    return [_check_input(param, value) for param, value in zip(params, values)]


def _check_input(param: Var, value: Any) -> Value:
    ty = param.type_annotation
    if not isinstance(ty, TensorType):
        return value
    array = np.asarray(value)
    if array.shape != ty.shape:
        raise EvaluationError(f"input %{param.name_hint} expects shape {ty.shape}, got "
                              f"{array.shape}")
    if array.dtype != ty.dtype:
        if not np.can_cast(array.dtype, ty.dtype, casting="same_kind"):
            raise EvaluationError(f"input %{param.name_hint} expects {ty.dtype}, got "
                                  f"{array.dtype}; convert it with .astype({ty.dtype!r})")
        array = array.astype(ty.dtype)
    return array


class _Interpreter:
    def __init__(self, mod: IRModule | None) -> None:
        self.mod = mod

    def run(self, func: Function, args: Sequence[Value]) -> Value:
        """Evaluate ``func``'s body with its parameters bound to ``args``.

        Values are dropped once their last user has run, so peak memory follows the live
        tensors, not the whole graph. Nested functions are values here; calling one runs
        this method again (depth = function nesting, never graph size)."""
        env: dict[Expr, Value] = dict(zip(func.params, args))
        order = post_order(func.body, into_functions=False)
        remaining = _use_counts(order)
        body = func.body
        for node in order:
            if node in env:
                continue
            env[node] = self._eval_node(node, env)
            for child in children(node, into_functions=False):
                remaining[child] -= 1
                if remaining[child] == 0 and child is not body and not isinstance(child, Var):
                    del env[child]
        return env[body]

    def _eval_node(self, node: Expr, env: dict[Expr, Value]) -> Value:
        if isinstance(node, Call):
            args = [env[arg] for arg in node.args]
            op = node.op
            if isinstance(op, Op):
                try:
                    out = op.reference(*args, **node.attrs)
                    return _conform(out, node._checked_type, node)
                except (MemoryError, ValueError) as err:
                    _raise_if_too_large(node, err)
                    raise
            if isinstance(op, GlobalVar):
                assert self.mod is not None
                return self.run(self.mod[op.name_hint], args)
            return self.run(op, args)  # a nested (primitive) function: a value, not a node
        if isinstance(node, Constant):
            return node.data
        if isinstance(node, Tuple):
            return tuple(env[field] for field in node.fields)
        if isinstance(node, TupleGetItem):
            return env[node.tuple_value][node.index]
        if isinstance(node, Function):
            return node
        if isinstance(node, GlobalVar):
            assert self.mod is not None
            return self.mod[node.name_hint]
        assert isinstance(node, Var)
        raise EvaluationError(f"%{node.name_hint} is used but not bound by any function")


def _raise_if_too_large(node: Call, err: Exception) -> None:
    """An EvaluationError naming ``node``'s operator for a reference that ran out of memory
    (MemoryError), or whose result NumPy cannot even describe (ValueError for a byte count
    past its int64 range); other ValueErrors are left to the caller to re-raise."""
    ty = node._checked_type
    nbytes = _type_bytes(ty) if ty is not None else 0
    if not isinstance(err, MemoryError) and nbytes < np.iinfo(np.intp).max:
        return
    where = f" (node {node.span!r})" if node.span else ""
    raise EvaluationError(
        f"the reference of {node.op_name}{where} could not allocate its result of type "
        f"{ty!r} ({nbytes} bytes) or its temporaries: {type(err).__name__}: {err}; the "
        f"reference interpreter needs the whole tensors in memory: use smaller shapes"
    ) from err


def _type_bytes(ty: Type) -> int:
    """The bytes of a value of ``ty`` (summed over a tuple's fields), an exact Python int."""
    if isinstance(ty, TupleType):
        return sum(_type_bytes(field) for field in ty.fields)
    if not isinstance(ty, TensorType):
        return 0
    count = 1
    for dim in ty.shape:
        count *= int(dim)
    return count * np.dtype(ty.dtype).itemsize


def _use_counts(order: list[Expr]) -> dict[Expr, int]:
    counts: dict[Expr, int] = dict.fromkeys(order, 0)
    for node in order:
        for child in children(node, into_functions=False):
            counts[child] += 1
    return counts


def _conform(out: Any, ty: Type | None, node: Call) -> Value:
    """Cast a reference result to the inferred dtype; a shape mismatch is a declaration bug."""
    if isinstance(ty, TupleType):
        assert len(out) == len(ty.fields), (
            f"{node.op_name}: the reference gave {len(out)} outputs but inference promised "
            f"{len(ty.fields)}")
        return tuple(_conform(item, field, node) for item, field in zip(out, ty.fields))
    assert isinstance(ty, TensorType)
    array = np.asarray(out)
    if array.dtype != ty.dtype:
        array = cast_array(array, ty.dtype)  # float -> int by opfusion's rule, as kernels do
    assert array.shape == ty.shape, (
        f"{node.op_name}: the reference gave shape {array.shape} but inference promised "
        f"{ty.shape}")
    return array
