"""TabulateCodes: a costly function of quantized codes as a lookup in a table of its values.

ONNX Runtime's ``quantize_static`` puts a QuantizeLinear / DequantizeLinear pair after every
operator of an activation: a transformer's GELU becomes a dozen steps around ``erf`` or
``tanh`` (``x / s`` rounded, clipped, dequantized, divided again, ...), each with its
divisions and NaN rules. The import keeps QuantizeLinear's codes in float: ``c = clip(round(x
/ s) + z, low, high)`` takes one of at most 256 values (or NaN). Every value computed from
``c`` alone by elementwise operators and scalar constants is a function of those few values,
so the pass evaluates that function once for each of them, with the operators' references
(the table is the reference's numbers exactly), and replaces the computation by
``nn.code_lookup(c, table)``: a clamped index and one vector gather. On the QDQ GPT block the
GELU's kernel took a third of the model's time (1.2 ms of 3.7).

A chain is tabulated where it costs more than the lookup (:data:`MIN_COST`: one
transcendental function, or four divisions; a plain requantization is cheaper than the
lookup and stays). Its results that the rest of the graph reads (a float32 or int32 value)
become lookups; what only they read goes. ``-0.0`` codes read the entry of ``+0.0``.

The pass needs opt_level 3; ``disabled_pass=["TabulateCodes"]`` turns it off."""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, Constant, Expr, Function
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op, OpPatternKind, get_op
from ..ir.types import TensorType
from ..ir.visitor import ExprMutator, children, post_order
from ..opdefs.nn import CODE_TABLE_DTYPES
from .context import PassContext
from .int8_products import codes_range
from .pass_infra import Pass, module_pass, pass_factory, register_pass
from .simplify_expr import SHAPE_ATTRS, is_scalar_constant

#: The most codes a table holds (8-bit codes).
MAX_CODES = 256
#: The cost of the cheapest chain worth a table: a lookup costs about a dozen simple vector
#: operations (its index) and a gather.
MIN_COST = 16
#: Cost of an operator in a chain, by name (others: 1).
COSTS = {
    **dict.fromkeys(("divide", "floor_divide", "mod"), 4),
    **dict.fromkeys(("exp", "log", "erf", "tanh", "sigmoid", "sqrt", "rsqrt", "power", "sin",
                     "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh",
                     "atanh"), MIN_COST),
}
#: Dtypes a table may hold (nn.code_lookup's).
TABLE_DTYPES = CODE_TABLE_DTYPES


@pass_factory
def TabulateCodes() -> Pass:  # noqa: N802 - a pass name
    """Costly elementwise functions of quantized codes as table lookups (see the module
    docstring)."""
    return _tabulate_codes_pass()


@module_pass(opt_level=3, name="TabulateCodes")
class _tabulate_codes_pass:  # noqa: N801 - a pass class, named like the others
    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        new = IRModule()
        for name, func in mod.functions.items():
            if isinstance(func, Function) and not func.is_primitive:
                infer_type(func, mod)
                func = tabulate_codes(func)
            new[mod.get_global_var(name)] = func
        return new


def tabulate_codes(func: Function) -> Function:
    """``func`` with its costly functions of codes read from tables."""
    order = post_order(func.body, into_functions=False)
    sources = _code_sources(order)
    lookups = _lookups(order, sources, func.body)
    if not lookups:
        return func
    return _Replace(lookups).visit(func)


def _code_sources(order: list[Expr]) -> dict[Expr, Expr]:
    """The codes each node is an elementwise function of, alone (codes are their own)."""
    sources: dict[Expr, Expr] = {}
    for node in order:
        if not isinstance(node, Call) or not isinstance(node.op, Op):
            continue
        source = _inherited_source(node, sources)
        if source is not None:
            sources[node] = source
        elif _codes(node):
            sources[node] = node
    return sources


def _codes(node: Call) -> bool:
    found = codes_range(node)
    return (found is not None and found[1] - found[0] < MAX_CODES
            and node.checked_type.dtype == "float32")


def _inherited_source(node: Call, sources: dict[Expr, Expr]) -> Expr | None:
    """The one source of ``node``'s computed operands when ``node`` is elementwise in them
    (each of the result's shape) and its other operands are scalar constants; else None."""
    if (node.op.pattern > OpPatternKind.kBroadcast or SHAPE_ATTRS.intersection(node.attrs)
            or node.checked_type.dtype not in (*TABLE_DTYPES, "bool")):
        return None  # (a cast of the result to bytes reads the table's values)
    found: Expr | None = None
    shape = node.checked_type.shape if isinstance(node.checked_type, TensorType) else None
    for arg in node.args:
        if is_scalar_constant(arg):
            continue
        source = sources.get(arg)
        if source is None or (found is not None and source is not found):
            return None
        if arg.checked_type.shape != shape:
            return None
        found = source
    return found


def _lookups(order: list[Expr], sources: dict[Expr, Expr], root: Expr) -> dict[Expr, Call]:
    """A lookup for every node worth one that something outside its chain reads."""
    outside: set[Expr] = {root}
    for node in order:
        for arg in children(node, False):
            if arg in sources and sources.get(node) is not sources[arg]:
                outside.add(arg)
    chosen: dict[Expr, list[Expr]] = {}
    for node in order:
        source = sources.get(node)
        if (source is not None and source is not node and node in outside
                and node.checked_type.dtype in TABLE_DTYPES and _costly(node, source)):
            chosen.setdefault(source, []).append(node)
    chains: dict[Expr, list[Expr]] = {}  # each chain's nodes in order, without its source
    for node in order:
        source = sources.get(node)
        if source in chosen and source is not node:
            chains.setdefault(source, []).append(node)
    lookups: dict[Expr, Call] = {}
    for source, outputs in chosen.items():
        tables = _tables(chains[source], source, outputs)
        if tables is None:
            continue
        low = codes_range(source)[0]
        for node, table in zip(outputs, tables):
            lookups[node] = Call(get_op("nn.code_lookup"), [source, Constant(table)],
                                 {"low": low})
    return lookups


def _costly(node: Expr, source: Expr) -> bool:
    """Whether the chain from ``source`` to ``node`` costs at least :data:`MIN_COST`."""
    cost, seen, stack = 0, {node}, [node]
    while stack and cost < MIN_COST:
        current = stack.pop()
        assert isinstance(current, Call)
        cost += COSTS.get(current.op.name, 1)
        for arg in current.args:
            if arg is not source and arg not in seen and not isinstance(arg, Constant):
                seen.add(arg)
                stack.append(arg)
    return cost >= MIN_COST


def _tables(chain: list[Expr], source: Expr,
            outputs: list[Expr]) -> list[np.ndarray] | None:
    """The values of ``outputs`` for NaN and each code of ``source``, by the operators'
    references evaluated along ``chain`` (its nodes in order); None when a reference refuses
    them."""
    low, high = codes_range(source)
    values: dict[Expr, np.ndarray] = {
        source: np.concatenate([[np.nan], np.arange(low, high + 1)]).astype(np.float32)}
    with np.errstate(all="ignore"):
        for node in chain:
            args = [values[a] if a in values else a.data for a in node.args]
            try:
                out = np.asarray(node.op.reference(*args, **node.attrs))
            except (ArithmeticError, ValueError):
                return None
            values[node] = out.astype(node.checked_type.dtype)
    return [np.ascontiguousarray(values[node]) for node in outputs]


class _Replace(ExprMutator):
    def __init__(self, lookups: dict[Expr, Call]) -> None:
        super().__init__()
        self.lookups = lookups

    def visit_call(self, call: Call) -> Expr:
        found = self.lookups.get(call)
        if found is not None:
            return Call(found.op, [self.visit(found.args[0]), found.args[1]], found.attrs)
        return super().visit_call(call)


register_pass("TabulateCodes", TabulateCodes)

__all__ = ["COSTS", "MAX_CODES", "MIN_COST", "TabulateCodes", "tabulate_codes"]
