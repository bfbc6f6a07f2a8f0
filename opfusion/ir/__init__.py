"""The graph IR: typed, immutable expressions, modules, traversals, text format, equality
and the NumPy reference interpreter."""

from .evaluate import evaluate
from .expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    Tuple,
    TupleGetItem,
    Var,
    const,
    var,
)
from .infer import infer_type
from .module import IRModule
from .op import Attr, Attrs, Op, OpPatternKind, get_op, list_ops, register_op
from .parser import parse
from .printer import astext
from .structural import assert_structural_equal, structural_equal, structural_hash
from .symbolic import SymbolicModule, SymbolicShapeError, SymbolicTensor
from .types import FuncType, TensorType, TupleType, Type
from .visitor import ExprMutator, ExprVisitor, free_vars, post_order

__all__ = [
    "Attr", "Attrs", "Call", "Constant", "Expr", "ExprMutator", "ExprVisitor", "FuncType",
    "Function", "GlobalVar", "IRModule", "Op", "OpPatternKind", "TensorType", "Tuple",
    "TupleGetItem", "TupleType", "Type", "Var", "assert_structural_equal", "astext", "const",
    "evaluate", "free_vars", "get_op", "infer_type", "list_ops", "parse", "post_order",
    "register_op", "structural_equal", "structural_hash", "SymbolicModule",
    "SymbolicShapeError", "SymbolicTensor", "var",
]
