"""FoldConstant and BindParams: compute ahead of time everything that does not depend on the
model's inputs.

``BindParams(params)`` turns named parameters of ``@main`` (weights) into constants;
``FoldConstant()`` then evaluates, with the operators' NumPy references, every call whose
operands are all constants, bottom-up, so a whole constant-only subgraph (a weight transform,
a shape computation, a folded batch-norm scale) collapses into one constant. This is the
"precompute and prune" step of NNVM's build."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..errors import OpfusionError
from ..ir.evaluate import _conform
from ..ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.op import Op
from ..ir.types import TensorType, TupleType, Type
from ..ir.visitor import ExprMutator
from ..opdefs._common import shape_size
from .context import PassContext, register_pass_config
from .pass_infra import Pass, module_pass, pass_factory, register_pass

MAX_FOLD_ELEMENTS = "FoldConstant.max_elements"

register_pass_config(
    MAX_FOLD_ELEMENTS, int, 1 << 26,
    "Calls whose result would hold more elements than this are left unfolded, so a broadcast "
    "of a scalar to a huge shape does not become a huge constant. The ONNX importer holds "
    "no larger constant of its own making either (ConstantOfShape, Range): it keeps them as "
    "operators, which compile to kernels under the compile.* limits.")


class ConstantFolder(ExprMutator):
    """Replace every operator call whose operands are all constants (or tuples of constants)
    by its value, and every projection of a literal tuple by the field. Reusable outside the
    pass (the ONNX importer folds while it converts); its memo makes each node's check
    happen once."""

    def __init__(self, max_elements: int | None = None) -> None:
        super().__init__()
        if max_elements is None:
            max_elements = PassContext.current().get_config(MAX_FOLD_ELEMENTS)
        self.max_elements = max_elements

    def visit_call(self, call: Call) -> Expr:
        new = super().visit_call(call)
        if not isinstance(new, Call) or not isinstance(new.op, Op):
            return new
        if not all(isinstance(arg, Constant) or _constant_tuple(arg) for arg in new.args):
            return new
        if _result_size(new.checked_type) > self.max_elements:
            return new
        args = [arg.data if isinstance(arg, Constant) else tuple(f.data for f in arg.fields)
                for arg in new.args]
        try:
            out = _conform(new.op.reference(*args, **new.attrs), new.checked_type, new)
        except MemoryError:
            # Folding only saves work: a call whose reference needs more memory than the
            # machine gives (large temporaries behind a small result) stays a call, which
            # compiles to a kernel under the compile.* limits.
            return new
        if isinstance(out, tuple):
            return Tuple([Constant(item) for item in out])
        return Constant(out)

    def visit_tuple_getitem(self, item: TupleGetItem) -> Expr:
        new = super().visit_tuple_getitem(item)
        value = new.tuple_value
        if isinstance(value, Tuple):
            return value.fields[new.index]
        return new


def _result_size(ty: Type) -> int:
    if isinstance(ty, TupleType):
        return sum(_result_size(field) for field in ty.fields)
    assert isinstance(ty, TensorType)
    return shape_size(ty.shape)


def _constant_tuple(expr: Expr) -> bool:
    return isinstance(expr, Tuple) and all(isinstance(f, Constant) for f in expr.fields)


@pass_factory
def FoldConstant() -> Pass:  # noqa: N802 - TVM's pass name
    """Evaluate every constant-only subgraph of every function into a constant."""
    return _fold_constant_pass


@module_pass(opt_level=2, name="FoldConstant")
def _fold_constant_pass(mod: IRModule, ctx: PassContext) -> IRModule:
    new = IRModule()
    folder = ConstantFolder(ctx.get_config(MAX_FOLD_ELEMENTS))
    for name, func in mod.functions.items():
        new[mod.get_global_var(name)] = folder.visit(func)
    return new


def fold_constant(expr: Expr) -> Expr:
    """Fold the constant-only subgraphs of one expression (or function)."""
    return ConstantFolder().visit(expr)


@pass_factory
def BindParams(params: Mapping[str, Any], func_name: str = "main") -> Pass:  # noqa: N802
    """A pass that replaces the parameters of ``@func_name`` named in ``params`` by constants
    holding those arrays (weights become foldable). Names that are not parameters, and
    arrays whose shape or dtype differ from the parameter's type, are errors."""
    arrays = {name: np.asarray(value) for name, value in params.items()}

    @module_pass(opt_level=0, name="BindParams")
    def bind(mod: IRModule, ctx: PassContext) -> IRModule:
        func = mod[func_name]
        return mod.with_function(mod.get_global_var(func_name), bind_params(func, arrays))

    return bind


def bind_params(func: Function, params: Mapping[str, Any]) -> Function:
    """``func`` with the parameters named in ``params`` replaced by constants."""
    by_name: dict[str, Var] = {}
    for param in func.params:
        if param.name_hint in by_name and param.name_hint in params:
            raise OpfusionError(f"two parameters are named %{param.name_hint}; bind them "
                                f"by position instead of by name")
        by_name[param.name_hint] = param
    unknown = [name for name in params if name not in by_name]
    if unknown:
        known = ", ".join(p.name_hint for p in func.params)
        what = "is not a parameter" if len(unknown) == 1 else "are not parameters"
        raise OpfusionError(f"params name {', '.join(map(repr, unknown))}, which {what} of "
                            f"the function (its parameters: {known})")
    binding: dict[Expr, Expr] = {}
    for name, value in params.items():
        param = by_name[name]
        array = np.asarray(value)
        want = param.type_annotation
        if isinstance(want, TensorType):
            if tuple(array.shape) != tuple(want.shape):
                raise OpfusionError(f"param {name!r} has shape {array.shape} but %{name} is "
                                    f"declared {want!r}")
            if array.dtype != np.dtype(want.dtype):
                raise OpfusionError(f"param {name!r} has dtype {array.dtype} but %{name} is "
                                    f"declared {want!r}; cast the array first")
        binding[param] = Constant(array)
    body = _Substitute(binding).visit(func.body)
    params_left = [p for p in func.params if p not in binding]
    return Function(params_left, body, func.ret_type, func.attrs)


class _Substitute(ExprMutator):
    def __init__(self, binding: Mapping[Expr, Expr]) -> None:
        super().__init__()
        self.memo.update(binding)


register_pass("FoldConstant", FoldConstant)
