"""opfusion: a deep-learning compiler that imports models, fuses operators and runs them.

Graph level::

    import opfusion as opf
    x = opf.var("x", shape=(1, 3, 16, 16))
    w = opf.var("weight", shape=(3, 3, 3, 3))
    mod = opf.IRModule.from_expr(opf.Function([x, w], opf.op.nn.relu(opf.op.nn.conv2d(x, w))))
    print(mod)
"""

from . import autotune, frontend, ir, op, te, transform
from .autotune import tune
from .compiler.artifact import load
from .compiler.compile import compile
from .driver import build
from .errors import (
    EvaluationError,
    OpAttributeError,
    OpfusionError,
    OpfusionTypeError,
    ParseError,
    UnknownOpError,
)
from .ir import (
    Call,
    Constant,
    Function,
    FuncType,
    GlobalVar,
    IRModule,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    Var,
    const,
    parse,
    var,
)
from .runtime import ndarray as nd
from .runtime.device import cpu, device
from .target import Target
from .te.lower import lower

__version__ = "0.1.0"

__all__ = [
    "Call", "Constant", "EvaluationError", "FuncType", "Function", "GlobalVar", "IRModule",
    "OpAttributeError", "OpfusionError", "OpfusionTypeError", "ParseError", "TensorType",
    "Tuple", "TupleGetItem", "TupleType", "UnknownOpError", "Var", "const", "ir", "op", "parse",
    "var", "build", "nd", "device", "cpu", "te", "lower", "frontend", "transform", "compile",
    "load", "Target", "autotune", "tune",
]
