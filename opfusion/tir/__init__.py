"""Loop IR: scalar expressions, statements, PrimFunc and the arithmetic simplifier.

:mod:`.expr` and :mod:`.stmt` list every node, its fields and the guarantees of lowered code;
:mod:`.printer` prints them; :mod:`.simplify` is the arithmetic simplifier and :mod:`.bound`
its symbolic intervals; :mod:`.verify` checks a PrimFunc's invariants; :mod:`.interp` runs a
PrimFunc on NumPy arrays (the oracle of the tests). Lowering a schedule into a PrimFunc
(``opf.lower``) lives with the tensor expressions, in :mod:`opfusion.te.lower`: ``te/``
imports the loop IR, never the other way round."""

from .expr import (
    EQ,
    GE,
    GT,
    INTRINSICS,
    LE,
    LT,
    NE,
    Add,
    And,
    Buffer,
    BufferLoad,
    Call,
    Cast,
    Div,
    FloatImm,
    FloorDiv,
    FloorMod,
    IntImm,
    Let,
    Max,
    Min,
    Mul,
    Not,
    Or,
    PrimExpr,
    Select,
    Sub,
    Var,
    const,
)
from .simplify import const_bound, prove, simplify, simplify_stmt
from .stmt import (
    THREAD_TAGS,
    Allocate,
    AsyncCommit,
    AsyncCopy,
    AsyncWait,
    Barrier,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    Prefetch,
    PrimFunc,
    SeqStmt,
    Stmt,
)

__all__ = [
    "EQ", "GE", "GT", "INTRINSICS", "LE", "LT", "NE", "THREAD_TAGS", "Add", "Allocate", "And",
    "AsyncCommit", "AsyncCopy", "AsyncWait", "Barrier", "Buffer",
    "BufferLoad", "BufferStore", "Call", "Cast", "Div", "Evaluate", "FloatImm", "FloorDiv",
    "FloorMod", "For", "ForKind", "IfThenElse", "IntImm", "Let", "LetStmt", "Max", "Min", "Mul",
    "Not", "Or", "Prefetch", "PrimExpr", "PrimFunc", "Select", "SeqStmt", "Stmt", "Sub", "Var",
    "const", "const_bound", "prove", "simplify", "simplify_stmt",
]
