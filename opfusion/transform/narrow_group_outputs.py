"""NarrowGroupOutputs: a fused group that ends in a dequantize writes the 8-bit codes, and the
groups that read it dequantize them.

A QDQ model (ONNX Runtime's ``quantize_static``) quantizes every result and dequantizes it
for its readers; the import keeps each pair in float (``(where(isnan(c), 0, c) - z) * s``,
``c`` the codes ``clip(round(x / s) + z, 0, 255)``). FuseOps puts the whole pair in the
producer's kernel, after its convolution or product, whenever the reader is in another
group: ResNet's projection shortcut feeds the residual add of the block's last convolution,
the BERT layer's products the residual adds and head transposes. The kernel then writes the
dequantized floats, four bytes a value, and its reader reads them back, although every value
is one of 256 codes: ResNet-50's 56 x 56 shortcut wrote 3.2 MB where 0.8 would do, and the
add that read it took 0.38 ms instead of 0.24.

After fusion, such a group returns ``cast(c, uint8)`` (``int8`` for signed codes) instead,
and each reader group dequantizes its parameter where it reads it::

    fn (...) { ...; multiply(subtract(where(isnan(c), 0, c), z), s) }
        ->  fn (...) { ...; cast(c, uint8) }
    fn (%p, ...) { add(..., %p) }
        ->  fn (%q: uint8, ...) { add(..., multiply(subtract(cast(%q, float32), z), s)) }

The module computes the same values, bit for bit: ``c`` holds whole numbers in the 8-bit
range or NaN, and the cast maps NaN to 0 as the ``where`` does. (In C, the reader's product
may then be contracted with the add after it into one FMA, as the producer's was with what
followed it: a rounding the reference does not make, here as everywhere else.)

Only readers whose operators read each value once, in loops that widen bytes as cheaply as
they load floats, take the codes: elementwise and broadcasting operators, reshapes and
transposes (:data:`_MOST_READER`, :data:`_MOVES`). A max pool takes them too, and pools the
bytes themselves before it dequantizes the maxima (:func:`_pools_codes`: the dequantize is
non-decreasing, and every window holds an input value, so the bytes' padding, their lowest
value, never wins where -inf did): QDQ ResNet's stem writes bytes and its pool reads them,
0.10 -> 0.03 ms. Other pools would dequantize at every tap of a window, and ShuffleNet's
concatenated shuffles and MobileNet v3's global pools ran 1.4-2.5x slower on bytes; a group
whose result is a model output, or is read by anything else, keeps its floats.

The pass runs on the fused module in ``opf.compile`` at opt_level 3, whatever the fusion
strategy; ``disabled_pass=["NarrowGroupOutputs"]`` turns it off."""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.expr import Call, Constant, Expr, Function, Var
from ..ir.infer import infer_type
from ..ir.module import IRModule
from ..ir.op import Op, OpPatternKind, get_op
from ..ir.types import TensorType
from ..ir.visitor import ExprMutator, children, post_order
from .context import PassContext
from .int8_products import dequantized_codes
from .pass_infra import Pass, function_pass, pass_factory, register_pass
from .simplify_expr import windows_hold_input as _windows_hold_input

#: The most an operator that reads a narrowed value may be: elementwise or broadcasting.
_MOST_READER = OpPatternKind.kBroadcast
#: Moves whose kernels read bytes as well as floats (the BERT layer's head transposes:
#: 0.013 -> 0.007 ms).
_MOVES = ("reshape", "transpose")


@pass_factory
def NarrowGroupOutputs() -> Pass:  # noqa: N802 - a pass name
    """Fused groups that end in a dequantize write their 8-bit codes instead of floats, and
    their readers dequantize them (see the module docstring)."""
    return _narrow_group_outputs_pass()


@function_pass(opt_level=3, name="NarrowGroupOutputs")
class _narrow_group_outputs_pass:  # noqa: N801 - a pass class, named like the others
    def transform_function(self, func: Function, mod: IRModule, ctx: PassContext) -> Function:
        if func.is_primitive:
            return func
        infer_type(func, mod)
        narrowed = _narrowed_groups(func)
        if not narrowed:
            return func
        new = _GroupRewriter(narrowed).visit(func)
        infer_type(new, mod)
        return new


register_pass("NarrowGroupOutputs", NarrowGroupOutputs)


@dataclass(frozen=True)
class _Dequantize:
    """A group's dequantizing tail: the codes it dequantizes (``cast`` to ``dtype`` they are
    exact) and the tail's calls from the result down, each with the index of the operand
    the chain continues through (-1 for the ``where`` that the cast replaces)."""

    codes: Expr
    dtype: str
    tail: tuple[tuple[Call, int], ...]

    def codes_type(self, result: TensorType) -> TensorType:
        return TensorType(result.shape, self.dtype)

    def applied(self, codes: Expr) -> Expr:
        """The tail rebuilt on ``codes`` (8-bit): the same values the group computed."""
        value: Expr = Call(get_op("cast"), [codes], {"dtype": "float32"})
        for call, index in reversed(self.tail):
            if index >= 0:
                args = list(call.args)
                args[index] = value
                value = Call(call.op, args, call.attrs, call.span)
        return value


def _group(expr: Expr) -> Function | None:
    """The fused function ``expr`` calls, if it is a call of one."""
    if isinstance(expr, Call) and isinstance(expr.op, Function) and expr.op.is_primitive:
        return expr.op
    return None


def _dequantize_tail(group: Function) -> _Dequantize | None:
    """The tail of ``group`` when its result is dequantized codes that it computes itself
    (:func:`.int8_products.dequantized_codes`); else None."""
    found = dequantized_codes(group.body)
    if found is None or isinstance(found[0], Var):
        return None
    codes, dtype = found[0], found[1]
    tail: list[tuple[Call, int]] = []
    node = group.body
    while node is not codes:
        assert isinstance(node, Call) and isinstance(node.op, Op)
        name = node.op.name
        if name == "where":
            tail.append((node, -1))
            break
        # multiply(values, scale) or multiply(scale, values); subtract(values, point)
        index = 1 if name == "multiply" and not _one_value(node.args[1]) else 0
        tail.append((node, index))
        node = node.args[index]
    return _Dequantize(codes, dtype, tuple(tail))


def _one_value(expr: Expr) -> bool:
    return isinstance(expr, Constant) and expr.data.size == 1


def _reads_once(group: Function, param: Var) -> bool:
    """Whether every operator of ``group`` that reads ``param`` reads each of its values once
    (so that dequantizing there costs one conversion a value), or is a max pool that can
    pool the codes themselves (:func:`_pools_codes`)."""
    if group.body is param:
        return False
    for node in post_order(group.body, into_functions=False):
        if not (isinstance(node, Call) and any(arg is param for arg in node.args)):
            continue
        if not isinstance(node.op, Op):
            return False
        if _pools_codes(node):
            continue
        if node.op.pattern > _MOST_READER and node.op.name not in _MOVES:
            return False
    return True


def _pools_codes(node: Call) -> bool:
    """Whether ``node`` is a max pool that may pool the codes before their tail dequantizes
    them: every window holds an input value (the bytes' padding is their lowest value, not
    -inf). The tail is non-decreasing already: ``dequantized_codes`` takes positive scales
    only, and a zero point."""
    return (isinstance(node.op, Op) and node.op.name == "nn.max_pool2d"
            and _windows_hold_input(node))


def _narrowed_groups(func: Function) -> dict[Call, _Dequantize]:
    """The calls of fused groups whose results should be written as codes, with their tails:
    every reader of the result is a fused group that reads each value once."""
    readers: dict[Call, list[tuple[Function, int]]] = {}
    elsewhere: set[Call] = {func.body} if _group(func.body) is not None else set()
    for node in post_order(func.body, into_functions=False):
        reader = _group(node)
        for index, arg in enumerate(children(node, into_functions=False)):
            if _group(arg) is None:
                continue
            if reader is None:
                elsewhere.add(arg)  # a tuple, or an operator outside any group
            else:
                readers.setdefault(arg, []).append((reader, index))
    narrowed: dict[Call, _Dequantize] = {}
    for call, uses in readers.items():
        if call in elsewhere:
            continue
        tail = _dequantize_tail(call.op)
        if tail is not None and all(_reads_once(group, group.params[index])
                                    for group, index in uses):
            narrowed[call] = tail
    return narrowed


class _GroupRewriter(ExprMutator):
    """The calling function with the narrowed groups returning codes and their readers
    dequantizing them."""

    def __init__(self, narrowed: dict[Call, _Dequantize]) -> None:
        super().__init__()
        self.narrowed = narrowed

    def visit_call(self, call: Call) -> Expr:
        group = _group(call)
        if group is None:
            return super().visit_call(call)
        args = [self.visit(arg) for arg in call.args]
        tail = self.narrowed.get(call)
        if tail is not None:  # (before its parameters change: the codes read them)
            group = Function(group.params,
                             Call(get_op("cast"), [tail.codes], {"dtype": tail.dtype}),
                             None, group.attrs)
        reads = {index: self.narrowed[arg] for index, arg in enumerate(call.args)
                 if arg in self.narrowed}
        if reads:
            group = _dequantizing_reader(group, reads)
        if group is call.op and all(new is old for new, old in zip(args, call.args)):
            return call
        return Call(group, args, call.attrs, call.span)


def _dequantizing_reader(group: Function, reads: dict[int, _Dequantize]) -> Function:
    """``group`` with each parameter at an index of ``reads`` taking the codes, dequantized
    by that tail where it is read."""
    params = list(group.params)
    replace: dict[Var, tuple[Var, _Dequantize]] = {}
    for index, tail in reads.items():
        old = params[index]
        new = Var(old.name_hint, tail.codes_type(old.checked_type))
        params[index] = new
        replace[old] = (new, tail)
    return Function(params, _Substitute(replace).visit(group.body), None, group.attrs)


class _Substitute(ExprMutator):
    """A reader's body with each narrowed parameter replaced by its codes, dequantized; a
    max pool of one pools the codes and dequantizes the maxima."""

    def __init__(self, replace: dict[Var, tuple[Var, _Dequantize]]) -> None:
        super().__init__()
        self.replace = replace

    def visit_var(self, var: Var) -> Expr:
        found = self.replace.get(var)
        return var if found is None else found[1].applied(found[0])

    def visit_call(self, call: Call) -> Expr:
        if len(call.args) == 1 and isinstance(call.args[0], Var) \
                and call.args[0] in self.replace:
            codes, tail = self.replace[call.args[0]]
            if _pools_codes(call):
                return tail.applied(Call(call.op, [codes], call.attrs, call.span))
        return super().visit_call(call)
