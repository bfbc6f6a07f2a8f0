"""verify(func): structural checks of a PrimFunc, for tests and for code generators' asserts.

Checked: every variable used is defined by an enclosing For or LetStmt (and defined once);
every buffer is a parameter or an enclosing Allocate; names are unique C identifiers; loads
and stores index every dimension with integers; stored values have the buffer's dtype; no
PARALLEL loop runs inside another; no tensor-expression node (TensorLoad, Reduce) is left."""

from __future__ import annotations

import re

from ..errors import OpfusionError
from . import expr as E
from . import stmt as S

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class VerifyError(OpfusionError):
    """A PrimFunc breaks one of the loop-IR invariants; the message says which and where."""


def verify(func: S.PrimFunc) -> None:
    """Raise :class:`VerifyError` if ``func`` is not well formed."""
    _Verifier(func).run()


class _Verifier:
    def __init__(self, func: S.PrimFunc) -> None:
        self.func = func
        self.names: dict[str, object] = {}
        self.defined: set[int] = set()
        self.keep: list[object] = []

    def fail(self, message: str) -> VerifyError:
        return VerifyError(f"PrimFunc {self.func.name}: {message}")

    def name(self, name: str, owner: object) -> None:
        if not _IDENT.match(name):
            raise self.fail(f"name {name!r} is not a C identifier")
        other = self.names.get(name)
        if other is not None and other is not owner:
            raise self.fail(f"name {name!r} is used by two different variables or buffers")
        self.names[name] = owner

    def run(self) -> None:
        buffers: list[E.Buffer] = []
        for b in self.func.params:
            self.name(b.name, b)
            buffers.append(b)
        self.stmt(self.func.body, [], buffers, False)

    def expr(self, e: E.PrimExpr, scope: list[E.Var], buffers: list[E.Buffer]) -> None:
        for node in E.post_order(e):
            if isinstance(node, E.Var) and not any(node is v for v in scope):
                raise self.fail(f"variable {node.name} is used outside the loop that defines it")
            if isinstance(node, E.BufferLoad):
                self.access(node.buffer, node.indices, buffers)
            if type(node).__module__.startswith("opfusion.te"):
                raise self.fail(f"tensor-expression node {type(node).__name__} ({node}) is left")

    def access(self, buffer: E.Buffer, indices: tuple[E.PrimExpr, ...],
               buffers: list[E.Buffer]) -> None:
        if not any(buffer is b for b in buffers):
            raise self.fail(f"buffer {buffer.name} is neither a parameter nor allocated here")
        if len(indices) != len(buffer.shape):
            raise self.fail(f"buffer {buffer.name} is indexed with {len(indices)} indices")
        for i in indices:
            if not E.is_int(i.dtype):
                raise self.fail(f"index {i} of {buffer.name} is {i.dtype}")

    def define(self, var: E.Var) -> None:
        if id(var) in self.defined:
            raise self.fail(f"variable {var.name} is defined twice")
        self.defined.add(id(var))
        self.keep.append(var)
        self.name(var.name, var)

    def stmt(self, s: S.Stmt, scope: list[E.Var], buffers: list[E.Buffer],
             in_parallel: bool) -> None:
        # Recursion follows statement nesting (loop depth), not sequence length.
        if isinstance(s, S.SeqStmt):
            for child in s.stmts:
                self.stmt(child, scope, buffers, in_parallel)
        elif isinstance(s, S.BufferStore):
            self.access(s.buffer, s.indices, buffers)
            for i in s.indices:
                self.expr(i, scope, buffers)
            self.expr(s.value, scope, buffers)
            if s.value.dtype != s.buffer.dtype:
                raise self.fail(f"store of {s.value.dtype} into {s.buffer.dtype} buffer "
                                f"{s.buffer.name}")
        elif isinstance(s, S.For):
            self.expr(s.min, scope, buffers)
            self.expr(s.extent, scope, buffers)
            if s.kind == S.ForKind.PARALLEL and in_parallel:
                raise self.fail(f"parallel loop {s.loop_var.name} inside another parallel loop")
            self.define(s.loop_var)
            self.stmt(s.body, scope + [s.loop_var], buffers,
                      in_parallel or s.kind == S.ForKind.PARALLEL)
        elif isinstance(s, S.IfThenElse):
            self.expr(s.condition, scope, buffers)
            self.stmt(s.then_case, scope, buffers, in_parallel)
            if s.else_case is not None:
                self.stmt(s.else_case, scope, buffers, in_parallel)
        elif isinstance(s, S.LetStmt):
            self.expr(s.value, scope, buffers)
            self.define(s.var)
            self.stmt(s.body, scope + [s.var], buffers, in_parallel)
        elif isinstance(s, S.Allocate):
            self.name(s.buffer.name, s.buffer)
            self.stmt(s.body, scope, buffers + [s.buffer], in_parallel)
        elif isinstance(s, S.Evaluate):
            self.expr(s.value, scope, buffers)
        elif isinstance(s, S.Prefetch):
            self.access(s.buffer, s.indices, buffers)
            for i in s.indices:
                self.expr(i, scope, buffers)
        elif isinstance(s, S.AsyncCopy):
            self.access(s.buffer, s.indices, buffers)
            for e in S.stmt_exprs(s):
                self.expr(e, scope, buffers)
        elif isinstance(s, (S.Barrier, S.AsyncCommit, S.AsyncWait)):
            pass
        else:
            raise self.fail(f"unknown statement {type(s).__name__}")
