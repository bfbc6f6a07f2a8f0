"""The builder of primitive (fused) functions, shared by FuseOps and FusionMerge.

A fused group becomes ``fn (%p0, %p1, ..., Primitive=1) { body }`` called with the values the
group reads from outside. This is the one place that decides what those parameters are:

* one parameter per distinct outside value, numbered ``%p<n>`` in order of first use;
* a scalar (0-d) constant stays inline wherever it is read: lowering turns it into a literal
  in the kernel's code (``compiler/lower_group.py``), which is what lets the C compiler fold
  ``x * 0.5``; as a parameter it would be a 0-d tensor read from memory;
* any other constant becomes a parameter, unless ``link_params`` (the ``FuseOps.link_params``
  config) keeps it inside, where lowering makes it a constant parameter of the kernel."""

from __future__ import annotations

from ...ir.expr import Call, Constant, Expr, Function, Var
from ...ir.op import Attrs
from ...ir.types import Type
from ...ir.visitor import post_order

PRIMITIVE = Attrs({"Primitive": 1})


def stays_inline(value: Expr, link_params: bool) -> bool:
    """Whether the outside value ``value`` stays inside a fused function instead of becoming
    one of its parameters (see the module docstring)."""
    return isinstance(value, Constant) and (link_params or value.data.ndim == 0)


class PrimitiveFunctionBuilder:
    """The parameters of one group's function, the outside values they are bound to, and the
    call of the function once its body is built."""

    __slots__ = ("link_params", "params", "arguments", "_param_of")

    def __init__(self, link_params: bool = False) -> None:
        self.link_params = link_params
        self.params: list[Var] = []
        self.arguments: list[Expr] = []
        self._param_of: dict[Expr, Var] = {}

    def operand(self, value: Expr, ty: Type) -> Expr:
        """What the group's body reads for the outside value ``value`` (of type ``ty``): the
        value itself if it stays inline, else its parameter, made on first use."""
        if stays_inline(value, self.link_params):
            return value
        param = self._param_of.get(value)
        if param is None:
            param = Var(f"p{len(self.params)}", ty)
            self._param_of[value] = param
            self.params.append(param)
            self.arguments.append(value)
        return param

    def call(self, body: Expr, ret_type: Type | None = None, drop_unused: bool = False) -> Call:
        """The call of ``fn (params) { body }`` with the bound outside values. ``drop_unused``
        leaves out parameters the body no longer reads (a group that only passed a value
        along)."""
        params, arguments = self.params, self.arguments
        if drop_unused:
            used = {node for node in post_order(body, into_functions=False)
                    if isinstance(node, Var)}
            kept = [i for i, param in enumerate(params) if param in used]
            params, arguments = [params[i] for i in kept], [arguments[i] for i in kept]
        return Call(Function(params, body, ret_type, PRIMITIVE), arguments)
