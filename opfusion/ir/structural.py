"""Structural equality and hashing of expressions and modules, with variables up to renaming.

Two graphs are equal when they compute the same thing by the same operators: same node kinds,
ops, attributes, constants and types, and variables that correspond one-to-one (``%x`` in one
may be ``%p0`` in the other). Sharing is not compared: a subexpression written twice equals
the same subexpression shared. Both walks are iterative."""

from __future__ import annotations

import difflib
from typing import Any

import numpy as np

from .expr import Call, Constant, Expr, Function, GlobalVar, Tuple, TupleGetItem, Var
from .module import IRModule
from .visitor import children, post_order


class _Mismatch(Exception):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


def structural_equal(lhs: Expr | IRModule, rhs: Expr | IRModule) -> bool:
    """True if ``lhs`` and ``rhs`` are the same program up to variable names."""
    try:
        _compare(lhs, rhs)
    except _Mismatch:
        return False
    return True


def assert_structural_equal(lhs: Expr | IRModule, rhs: Expr | IRModule) -> None:
    """Raise AssertionError naming the first difference and showing a diff of the two texts."""
    try:
        _compare(lhs, rhs)
    except _Mismatch as mismatch:
        from .printer import astext

        left = astext(lhs, show_meta_data=False).splitlines()
        right = astext(rhs, show_meta_data=False).splitlines()
        diff = list(difflib.unified_diff(left, right, "lhs", "rhs", lineterm="", n=2))
        if len(diff) > 80:
            diff = diff[:80] + [f"... ({len(diff) - 80} more diff lines)"]
        shown = "\n".join(diff) if diff else "(the texts are identical; the difference is in "
        if not diff:
            shown += "types, constant values beyond print precision, or sharing)"
        raise AssertionError(f"not structurally equal at {mismatch.path}: {mismatch.reason}\n"
                             f"{shown}") from None


def _compare(lhs: Expr | IRModule, rhs: Expr | IRModule) -> None:
    if isinstance(lhs, IRModule) or isinstance(rhs, IRModule):
        if not (isinstance(lhs, IRModule) and isinstance(rhs, IRModule)):
            raise _Mismatch("top", f"{type(lhs).__name__} vs {type(rhs).__name__}")
        if sorted(lhs) != sorted(rhs):
            raise _Mismatch("module", f"functions {sorted(lhs)} vs {sorted(rhs)}")
        for name in lhs:
            _Comparison().run(lhs[name], rhs[name], f"@{name}")
        return
    _Comparison().run(lhs, rhs, "expr")


class _Comparison:
    def __init__(self) -> None:
        self.var_map: dict[Var, Var] = {}
        self.var_map_back: dict[Var, Var] = {}
        self.done: set[tuple[Expr, Expr]] = set()
        # (label, parent frame) for each pushed pair, so a mismatch can print its path.
        self.frames: list[tuple[str, int]] = []

    def path(self, frame: int) -> str:
        parts = []
        while frame >= 0:
            label, frame = self.frames[frame]
            parts.append(label)
        return ".".join(reversed(parts))

    def run(self, lhs: Expr, rhs: Expr, label: str) -> None:
        self.frames.append((label, -1))
        stack: list[tuple[Expr, Expr, int]] = [(lhs, rhs, 0)]
        while stack:
            left, right, frame = stack.pop()
            if (left, right) in self.done:
                continue
            self.done.add((left, right))
            for index, label, lchild, rchild in self.compare_node(left, right, frame):
                self.frames.append((label, frame))
                stack.append((lchild, rchild, len(self.frames) - 1))
                del index

    def fail(self, frame: int, reason: str) -> _Mismatch:
        return _Mismatch(self.path(frame), reason)

    def compare_node(self, left: Expr, right: Expr, frame: int) -> list:
        """Compare the node's own fields; return the operand pairs still to compare."""
        if type(left) is not type(right):
            raise self.fail(frame, f"{_describe(left)} vs {_describe(right)}")
        if isinstance(left, Var):
            self.match_var(left, right, frame)  # type: ignore[arg-type]
            return []
        if isinstance(left, GlobalVar):
            if left.name_hint != right.name_hint:  # type: ignore[attr-defined]
                raise self.fail(frame, f"@{left.name_hint} vs @{right.name_hint}")  # type: ignore[attr-defined]
            return []
        if isinstance(left, Constant):
            _compare_constants(self, left, right, frame)  # type: ignore[arg-type]
            return []
        if isinstance(left, Call):
            return self.compare_call(left, right, frame)  # type: ignore[arg-type]
        if isinstance(left, Tuple):
            if len(left.fields) != len(right.fields):  # type: ignore[attr-defined]
                raise self.fail(frame, f"tuple of {len(left.fields)} vs "
                                       f"{len(right.fields)} fields")  # type: ignore[attr-defined]
            return [(i, f"field[{i}]", a, b) for i, (a, b) in
                    enumerate(zip(left.fields, right.fields))][::-1]  # type: ignore[attr-defined]
        if isinstance(left, TupleGetItem):
            if left.index != right.index:  # type: ignore[attr-defined]
                raise self.fail(frame, f"tuple index {left.index} vs {right.index}")  # type: ignore[attr-defined]
            return [(0, "tuple", left.tuple_value, right.tuple_value)]  # type: ignore[attr-defined]
        assert isinstance(left, Function) and isinstance(right, Function)
        return self.compare_function(left, right, frame)

    def compare_call(self, left: Call, right: Call, frame: int) -> list:
        pending: list = []
        if isinstance(left.op, Expr) or isinstance(right.op, Expr):
            if not (isinstance(left.op, Expr) and isinstance(right.op, Expr)):
                raise self.fail(frame, f"call of {_callee(left)} vs {_callee(right)}")
            pending.append((0, "op", left.op, right.op))
        elif left.op is not right.op:
            raise self.fail(frame, f"op {left.op.name} vs {right.op.name}")
        if left.attrs != right.attrs:
            raise self.fail(frame, f"{_callee(left)} attributes {dict(left.attrs)} vs "
                                   f"{dict(right.attrs)}")
        if len(left.args) != len(right.args):
            raise self.fail(frame, f"{_callee(left)} has {len(left.args)} vs {len(right.args)} "
                                   "arguments")
        pending.extend((i, f"{_callee(left)}.args[{i}]", a, b)
                       for i, (a, b) in enumerate(zip(left.args, right.args)))
        return pending[::-1]

    def compare_function(self, left: Function, right: Function, frame: int) -> list:
        if len(left.params) != len(right.params):
            raise self.fail(frame, f"function of {len(left.params)} vs {len(right.params)} "
                                   "parameters")
        if left.attrs != right.attrs:
            raise self.fail(frame, f"function attributes {dict(left.attrs)} vs "
                                   f"{dict(right.attrs)}")
        if left.ret_type != right.ret_type:
            raise self.fail(frame, f"return type {left.ret_type!r} vs {right.ret_type!r}")
        for lparam, rparam in zip(left.params, right.params):
            self.match_var(lparam, rparam, frame)
        return [(0, "body", left.body, right.body)]

    def match_var(self, left: Var, right: Var, frame: int) -> None:
        mapped = self.var_map.get(left)
        if mapped is not None:
            if mapped is not right:
                raise self.fail(frame, f"%{left.name_hint} corresponds to %{mapped.name_hint} "
                                       f"elsewhere but meets %{right.name_hint} here")
            return
        if right in self.var_map_back:
            raise self.fail(frame, f"%{right.name_hint} corresponds to "
                                   f"%{self.var_map_back[right].name_hint} elsewhere but meets "
                                   f"%{left.name_hint} here")
        if left.type_annotation != right.type_annotation:
            raise self.fail(frame, f"%{left.name_hint}: {left.type_annotation!r} vs "
                                   f"%{right.name_hint}: {right.type_annotation!r}")
        self.var_map[left] = right
        self.var_map_back[right] = left


def _compare_constants(cmp: _Comparison, left: Constant, right: Constant, frame: int) -> None:
    a, b = left.data, right.data
    if a.dtype != b.dtype or a.shape != b.shape:
        raise cmp.fail(frame, f"constant {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
    if not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
        raise cmp.fail(frame, f"constant {a.dtype}{list(a.shape)} values differ "
                              f"({_first_difference(a, b)})")


def _first_difference(a: np.ndarray, b: np.ndarray) -> str:
    unequal = a != b
    if a.dtype.kind == "f":
        unequal &= ~(np.isnan(a) & np.isnan(b))
    index = tuple(int(i) for i in np.argwhere(unequal)[0]) if a.ndim else ()
    return f"at {index}: {a[index]!r} vs {b[index]!r}"


def _describe(node: Expr) -> str:
    if isinstance(node, Call):
        return f"call of {_callee(node)}"
    if isinstance(node, Var):
        return f"variable %{node.name_hint}"
    return type(node).__name__


def _callee(call: Call) -> str:
    if isinstance(call.op, Function):
        return "fn"
    if isinstance(call.op, GlobalVar):
        return f"@{call.op.name_hint}"
    return call.op.name


# ---------------------------------------------------------------------------------------------
# hashing


def structural_hash(node: Expr | IRModule) -> int:
    """A hash consistent with :func:`structural_equal` (equal values hash alike)."""
    if isinstance(node, IRModule):
        return hash(tuple((name, structural_hash(node[name])) for name in sorted(node)))
    hashes: dict[Expr, int] = {}
    for item in post_order(node):
        hashes[item] = hash((_local_key(item), tuple(hashes[c] for c in children(item))))
    return hashes[node]


def _local_key(node: Expr) -> Any:
    if isinstance(node, Var):
        return ("Var", node.type_annotation)
    if isinstance(node, GlobalVar):
        return ("GlobalVar", node.name_hint)
    if isinstance(node, Constant):
        data = node.data
        return ("Constant", data.dtype.str, data.shape, hash(np.ascontiguousarray(data).tobytes()))
    if isinstance(node, Call):
        op = node.op.name if not isinstance(node.op, Expr) else type(node.op).__name__
        return ("Call", op, node.attrs, len(node.args))
    if isinstance(node, Tuple):
        return ("Tuple", len(node.fields))
    if isinstance(node, TupleGetItem):
        return ("TupleGetItem", node.index)
    assert isinstance(node, Function)
    return ("Function", tuple(p.type_annotation for p in node.params), node.ret_type, node.attrs)
