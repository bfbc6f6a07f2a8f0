"""Builder functions (``opf.op.add``, ``opf.op.nn.conv2d``) generated from the declarations.

Each builder takes the op's inputs positionally and its attributes as keywords, checks them
through the declaration, and returns a :class:`~opfusion.ir.Call`. Nothing here is written per
operator: a new declaration in :mod:`opfusion.opdefs` gets its builder for free."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ..errors import OpfusionError
from ..ir.expr import Call, Expr, Tuple, _scalar_like
from ..ir.op import Op, get_op, list_ops


def make_builder(op: Op) -> Callable[..., Call]:
    """The builder function of one operator, with a real signature and docstring."""

    def builder(*args: Any, span: str | None = None, **attrs: Any) -> Call:
        if op.tuple_input:
            if len(args) != 1:
                raise OpfusionError(f"{op.name}: takes one list of tensors, got {len(args)} "
                                    "arguments")
            fields = args[0]
            inputs = [fields if isinstance(fields, Expr) else Tuple(list(fields))]
        else:
            if len(args) != len(op.inputs):
                raise OpfusionError(f"{op.name}: takes {len(op.inputs)} input(s) "
                                    f"({', '.join(op.inputs)}), got {len(args)}")
            inputs = _constants_for_scalars(op, list(args))
        return Call(op, inputs, attrs, span)

    params = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_ONLY) for name in
              (("data",) if op.tuple_input else op.inputs)]
    for key, spec in op.attrs.items():
        default = inspect.Parameter.empty if spec.required else spec.default
        params.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default))
    params.append(inspect.Parameter("span", inspect.Parameter.KEYWORD_ONLY, default=None))
    builder.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    builder.__name__ = builder.__qualname__ = op.name.rsplit(".", 1)[-1]
    builder.__doc__ = f"{op.doc}\n\nPattern: {op.pattern.name}. Declared by {type(op).__name__}."
    return builder


def _constants_for_scalars(op: Op, args: list[Any]) -> list[Expr]:
    """Python/NumPy scalars among the inputs become constants of a tensor input's dtype."""
    like = next((arg for arg in args if isinstance(arg, Expr)), None)
    for index, arg in enumerate(args):
        if not isinstance(arg, Expr):
            if like is None:
                raise OpfusionError(f"{op.name}: input {op.inputs[index]!r} must be an "
                                    "expression; wrap values with opf.const()")
            args[index] = _scalar_like(arg, like)
    return args


def builders_for(namespace: str) -> dict[str, Callable[..., Call]]:
    """Builders of the ops named ``namespace.x`` (or with no prefix for ``namespace=""``)."""
    found: dict[str, Callable[..., Call]] = {}
    for name in list_ops():
        prefix, _, short = name.rpartition(".")
        if prefix == namespace:
            found[short] = make_builder(get_op(name))
    return found
