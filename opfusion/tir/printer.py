"""Readable text for loop IR: expressions in infix form, statements as Python-like blocks.

    def vecadd(A: float32[1024], B: float32[1024], C: float32[1024]):
      for i_outer in parallel(16):
        for i_inner in range(64):
          C[i_outer*64 + i_inner] = A[i_outer*64 + i_inner] + B[i_outer*64 + i_inner]

Integer constants print bare when int32 (``5``), with a suffix otherwise (``5i64``, ``True``);
float32 constants end in ``f`` (``0.5f``). ``//`` and ``%`` are floor division and remainder."""

from __future__ import annotations

import math

import numpy as np

from . import expr as E
from . import stmt as S

_BINARY = {
    E.Add: ("+", 60), E.Sub: ("-", 60), E.Mul: ("*", 70), E.Div: ("/", 70),
    E.FloorDiv: ("//", 70), E.FloorMod: ("%", 70),
    E.EQ: ("==", 50), E.NE: ("!=", 50), E.LT: ("<", 50), E.LE: ("<=", 50),
    E.GT: (">", 50), E.GE: (">=", 50), E.And: ("&&", 40), E.Or: ("||", 30),
}
_ATOM = 100

_FOR_KIND = {
    S.ForKind.SERIAL: "range", S.ForKind.PARALLEL: "parallel",
    S.ForKind.VECTORIZED: "vectorized", S.ForKind.UNROLLED: "unroll",
    S.ForKind.MMA_TF32: "mma_tf32",
    **{kind: f"bind[{kind.value}]" for kind in S.ForKind if kind.is_thread_binding},
}


def _const_text(node: E.PrimExpr) -> str:
    if isinstance(node, E.IntImm):
        if node.dtype == "int32":
            return str(node.value)
        if node.dtype == "bool":
            return "True" if node.value else "False"
        suffix = {"int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8", "uint16": "u16",
                  "uint32": "u32", "uint64": "u64"}[node.dtype]
        return f"{node.value}{suffix}"
    assert isinstance(node, E.FloatImm)
    v = node.value
    if not math.isfinite(v):
        text = "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return f"{node.dtype}({text})"
    else:
        text = str(np.dtype(node.dtype).type(v))
        if "e" not in text and "." not in text:
            text += ".0"
    return text + {"float32": "f", "float64": "", "float16": "f16"}[node.dtype]


def _text(node: E.PrimExpr, sub: dict[int, tuple[str, int]]) -> tuple[str, int]:
    """Text of ``node`` and its precedence (higher binds tighter), given its children's."""

    def wrap(child: E.PrimExpr, min_prec: int) -> str:
        text, prec = sub[id(child)]
        return f"({text})" if prec < min_prec else text

    if isinstance(node, E.Var):
        return node.name, _ATOM
    if isinstance(node, (E.IntImm, E.FloatImm)):
        text = _const_text(node)
        return text, (_ATOM if not text.startswith("-") else 80)
    op = _BINARY.get(type(node))
    if op is not None:
        sym, prec = op
        a = wrap(node.a, prec)
        # right operand of a non-commutative operator needs parentheses at equal precedence
        b = wrap(node.b, prec + 1)
        if sym == "*":
            return f"{a}*{b}", prec
        return f"{a} {sym} {b}", prec
    if isinstance(node, E.Min):
        return f"min({wrap(node.a, 0)}, {wrap(node.b, 0)})", _ATOM
    if isinstance(node, E.Max):
        return f"max({wrap(node.a, 0)}, {wrap(node.b, 0)})", _ATOM
    if isinstance(node, E.Not):
        return f"!{wrap(node.a, 90)}", 90
    if isinstance(node, E.Select):
        return f"select({', '.join(wrap(c, 0) for c in node.children())})", _ATOM
    if isinstance(node, E.Cast):
        return f"{node.dtype}({wrap(node.value, 0)})", _ATOM
    if isinstance(node, E.Call):
        return f"{node.name}({', '.join(wrap(a, 0) for a in node.args)})", _ATOM
    if isinstance(node, E.BufferLoad):
        return f"{node.buffer.name}[{', '.join(wrap(i, 0) for i in node.indices)}]", _ATOM
    if isinstance(node, E.Let):
        return f"let({node.var.name} = {wrap(node.value, 0)} in {wrap(node.body, 0)})", _ATOM
    custom = getattr(node, "_text", None)  # tensor-expression nodes print themselves
    if custom is not None:
        return custom(lambda e: wrap(e, 0)), _ATOM
    return f"<{type(node).__name__}>", _ATOM


def expr_to_str(node: E.PrimExpr) -> str:
    """The infix text of a scalar expression (iterative: deep expressions print fine)."""
    sub: dict[int, tuple[str, int]] = {}
    for n in E.post_order(node):
        sub[id(n)] = _text(n, sub)
    return sub[id(node)][0]


def _shape_text(buffer: E.Buffer) -> str:
    return f"{buffer.dtype}[{', '.join(str(d) for d in buffer.shape)}]"


def _stmt_lines(stmt: S.Stmt, indent: int, out: list[str]) -> None:
    # Recursion follows statement nesting (loop depth), never the length of a sequence.
    pad = "  " * indent
    if isinstance(stmt, S.SeqStmt):
        for s in stmt.stmts:
            _stmt_lines(s, indent, out)
    elif isinstance(stmt, S.BufferStore):
        index = ", ".join(expr_to_str(i) for i in stmt.indices)
        out.append(f"{pad}{stmt.buffer.name}[{index}] = {expr_to_str(stmt.value)}")
    elif isinstance(stmt, S.For):
        kind = _FOR_KIND[stmt.kind]
        if isinstance(stmt.min, E.IntImm) and stmt.min.value == 0:
            bounds = expr_to_str(stmt.extent)
        else:
            from .simplify import simplify

            end = simplify(E.add(stmt.min, stmt.extent))
            bounds = f"{expr_to_str(stmt.min)}, {expr_to_str(end)}"
        out.append(f"{pad}for {stmt.loop_var.name} in {kind}({bounds}):")
        _stmt_lines(stmt.body, indent + 1, out)
    elif isinstance(stmt, S.IfThenElse):
        out.append(f"{pad}if {expr_to_str(stmt.condition)}:")
        _stmt_lines(stmt.then_case, indent + 1, out)
        if stmt.else_case is not None:
            out.append(f"{pad}else:")
            _stmt_lines(stmt.else_case, indent + 1, out)
    elif isinstance(stmt, S.LetStmt):
        out.append(f"{pad}let {stmt.var.name}: {stmt.var.dtype} = {expr_to_str(stmt.value)}")
        _stmt_lines(stmt.body, indent, out)
    elif isinstance(stmt, S.Allocate):
        scope = "" if stmt.buffer.scope == "local" else f", {stmt.buffer.scope}"
        out.append(f"{pad}with allocate({stmt.buffer.name}: {_shape_text(stmt.buffer)}{scope}):")
        _stmt_lines(stmt.body, indent + 1, out)
    elif isinstance(stmt, S.Evaluate):
        out.append(f"{pad}evaluate({expr_to_str(stmt.value)})")
    elif isinstance(stmt, S.Barrier):
        out.append(f"{pad}sync_threads()")
    elif isinstance(stmt, S.AsyncCopy):
        index = ", ".join(expr_to_str(i) for i in stmt.indices)
        when = "" if stmt.predicate is None else f", if={expr_to_str(stmt.predicate)}"
        out.append(f"{pad}async_copy({stmt.buffer.name}[{index}], "
                   f"{expr_to_str(stmt.source)}{when})")
    elif isinstance(stmt, S.AsyncCommit):
        out.append(f"{pad}async_commit()")
    elif isinstance(stmt, S.AsyncWait):
        out.append(f"{pad}async_wait({stmt.pending})")
    elif isinstance(stmt, S.Prefetch):
        index = ", ".join(expr_to_str(i) for i in stmt.indices)
        out.append(f"{pad}prefetch({stmt.buffer.name}[{index}])")
    else:
        out.append(f"{pad}<{type(stmt).__name__}>")


def stmt_to_str(stmt: S.Stmt, indent: int = 0) -> str:
    """The block text of a statement."""
    out: list[str] = []
    _stmt_lines(stmt, indent, out)
    return "\n".join(out)


def func_to_str(func: S.PrimFunc) -> str:
    """``def name(params):`` followed by the body."""
    params = ", ".join(f"{b.name}: {_shape_text(b)}" for b in func.params)
    return f"def {func.name}({params}):\n{stmt_to_str(func.body, 1)}"
