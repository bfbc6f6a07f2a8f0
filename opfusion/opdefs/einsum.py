"""einsum: Einstein summation over a tuple of tensors, as NumPy's ``np.einsum`` (and ONNX
Einsum) define it.

The equation names each operand's axes with letters (``"ij,jk->ik"``); a letter repeated in
one operand takes its diagonal, a letter missing from the output is summed over, ``...``
stands for broadcast leading axes. Without ``->`` the output holds, sorted, the letters that
occur exactly once (implicit mode), after the ``...`` axes. Labelled axes broadcast from
size 1 as in NumPy. kOpaque: a contraction of arbitrary shape is no kernel to fuse into."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import OpAttributeError
from ..ir.op import Attr, Attrs, Op, OpPatternKind, register_op
from ..ir.types import TensorType, Type
from ._nn_common import numeric_dtype, wide

_ELLIPSIS = "."  # one character stands for "..." once the equation is parsed


def parse_equation(equation: str) -> tuple[list[str], str]:
    """The operands' subscripts and the output's, with ``...`` written as ``.`` and the
    implicit output made explicit. Raises ValueError on malformed text."""
    text = equation.replace(" ", "")
    if text.count("->") > 1:
        raise ValueError("more than one '->'")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    parsed = [_parse_term(term) for term in terms]
    if arrow:
        out = _parse_term(rhs)
        if len(set(out)) != len(out):
            raise ValueError(f"output subscripts {rhs!r} repeat a letter")
        known = set("".join(parsed))
        missing = [c for c in out if c != _ELLIPSIS and c not in known]
        if missing:
            raise ValueError(f"output letter {missing[0]!r} names no input axis")
        if _ELLIPSIS in out and not any(_ELLIPSIS in term for term in parsed):
            raise ValueError("the output has '...' but no input does")
    else:
        letters = "".join(parsed)
        once = sorted(c for c in set(letters) if c != _ELLIPSIS and letters.count(c) == 1)
        out = (_ELLIPSIS if _ELLIPSIS in letters else "") + "".join(once)
    return parsed, out


def _parse_term(term: str) -> str:
    if term.count("...") > 1:
        raise ValueError(f"subscripts {term!r} hold '...' more than once")
    flat = term.replace("...", _ELLIPSIS)
    bad = [c for c in flat if c != _ELLIPSIS and not (c.isascii() and c.isalpha())]
    if bad:
        raise ValueError(f"subscripts {term!r} hold {bad[0]!r}; use letters a-z, A-Z and '...'")
    return flat


@register_op
class Einsum(Op):
    name = "einsum"
    doc = ("Einstein summation (np.einsum) over a tuple of tensors: ``equation`` such as "
           "'ij,jk->ik' or 'bhqd,bhkd->bhqk'; '...' broadcasts, a letter absent from the "
           "output is summed.")
    inputs = ("data",)
    tuple_input = True
    pattern = OpPatternKind.kOpaque
    attrs = {"equation": Attr("str", required=True,
                              doc="comma-separated operand subscripts, optionally '->' output")}

    def normalize_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        equation = attrs["equation"].replace(" ", "")
        try:
            parse_equation(equation)
        except ValueError as err:
            raise OpAttributeError(f"{self.name} attribute 'equation'={attrs['equation']!r}: "
                                   f"{err}") from None
        attrs["equation"] = equation
        return attrs

    def infer(self, arg_types: Sequence[Type], attrs: Attrs) -> Type:
        types = self.expect_tensors(arg_types)
        names = [f"operand {i}" for i in range(len(types))]
        dtype = numeric_dtype(self, types, names)
        terms, out = parse_equation(attrs.equation)
        if len(terms) != len(types):
            raise self.type_error(f"equation {attrs.equation!r} has {len(terms)} operand "
                                  f"term(s) but {len(types)} tensor(s) were given")
        sizes: dict[str, int] = {}
        ellipsis_shapes: list[tuple[int, ...]] = []
        for index, (term, ty) in enumerate(zip(terms, types)):
            labelled = len(term) - (1 if _ELLIPSIS in term else 0)
            if ty.ndim < labelled or (_ELLIPSIS not in term and ty.ndim != labelled):
                raise self.type_error(
                    f"operand {index} has shape {ty.shape} (rank {ty.ndim}) but its subscripts "
                    f"{term.replace(_ELLIPSIS, '...')!r} name {labelled} axes")
            dims = list(ty.shape)
            if _ELLIPSIS in term:
                at = term.index(_ELLIPSIS)
                count = ty.ndim - labelled
                ellipsis_shapes.append(tuple(dims[at:at + count]))
                dims = dims[:at] + dims[at + count:]
                term = term.replace(_ELLIPSIS, "")
            for letter, size in zip(term, dims):
                known = sizes.get(letter, 1)
                if size != known and 1 not in (size, known):
                    raise self.type_error(
                        f"letter {letter!r} of equation {attrs.equation!r} is size {known} in "
                        f"one place and {size} in operand {index} {ty.shape}; the sizes must "
                        "agree (or be 1)")
                sizes[letter] = max(known, size) if 1 in (size, known) else size
        batch = _broadcast(self, ellipsis_shapes)
        if _ELLIPSIS not in out and batch:
            raise self.type_error(f"equation {attrs.equation!r}: the '...' axes {batch} of the "
                                  "operands must appear in the output; add '...' after '->'")
        shape: list[int] = []
        for letter in out:
            shape.extend(batch if letter == _ELLIPSIS else (sizes[letter],))
        return TensorType(tuple(shape), dtype)

    def reference(self, data: tuple[np.ndarray, ...], equation: str) -> np.ndarray:
        return np.einsum(equation, *[wide(array) for array in data], optimize=len(data) > 2)


def _broadcast(op: Op, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """NumPy broadcasting of the shapes the '...' of each operand stands for."""
    ndim = max((len(shape) for shape in shapes), default=0)
    result = []
    for axis in range(-ndim, 0):
        dims = {shape[axis] for shape in shapes if len(shape) >= -axis} - {1}
        if len(dims) > 1:
            raise op.type_error(f"the '...' axes of the operands, {shapes}, do not broadcast")
        result.append(dims.pop() if dims else 1)
    return tuple(result)
