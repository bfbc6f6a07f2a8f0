"""LegalizeCheckedIndices: make every checked gather safe to compile.

``take`` and ``gather_elements`` default to mode "checked": an index beyond [-n, n) is an
error, as in ONNX Runtime. The reference raises; a kernel cannot stop with an error, so its
computes clamp. This pass closes the gap before fusion: for each checked gather it

* checks constant indices now, raising :class:`IndexOutOfRangeError` naming the op;
* puts indices computed at run time through ``check_indices`` (no TE compute: the executor
  runs it with NumPy between kernels, one vectorized min/max over the indices), unless they
  already come from a ``check_indices`` with the same bound (the ONNX importer inserts its
  own, naming the node);

and then switches the gather to mode "clip", whose kernel clamps. So a kernel's clamping is
only ever applied to indices known to be in range, and a compiled model raises where the
reference raises. Only the indices pass through the check, so the gather's data side fuses
as before; what computes the indices now ends at the check (an opaque step) instead of fusing
into the gather's kernel: the price of a check that can stop the run. Primitive functions
(already fused groups) are left alone: run the pass before fusion, as ``opf.compile`` does."""

from __future__ import annotations

from ..errors import IndexOutOfRangeError
from ..ir.expr import Call, Constant, Expr, Function
from ..ir.module import IRModule
from ..ir.op import Op, get_op
from ..ir.types import TensorType
from ..ir.visitor import ExprMutator, post_order
from ..opdefs.transform import check_in_range, checked_index_context
from .context import PassContext
from .pass_infra import Pass, module_pass, pass_factory, register_pass

#: The gathers with a "checked" mode, and the input that holds their indices.
CHECKED_GATHERS = ("take", "gather_elements")
_INDICES = 1


@pass_factory
def LegalizeCheckedIndices() -> Pass:  # noqa: N802 - TVM's pass name
    """Guard the indices of every checked take / gather_elements (see the module docstring)
    and switch the gather to the clamping mode its kernel implements."""
    return _legalize_checked_indices_pass


@module_pass(opt_level=0, name="LegalizeCheckedIndices")
def _legalize_checked_indices_pass(mod: IRModule, ctx: PassContext) -> IRModule:
    new = IRModule()
    for name, func in mod.functions.items():
        new[mod.get_global_var(name)] = func if func.is_primitive else _Legalizer(func).visit(func)
    return new


def index_bound(call: Call) -> int:
    """The size of the axis a gather's indices index (the whole tensor for a flat take)."""
    data = call.args[0].checked_type
    assert isinstance(data, TensorType)
    axis = call.attrs.axis
    if axis is None:  # take from the flattened tensor
        return data.size
    return data.shape[axis % data.ndim]


def error_context(call: Call) -> str:
    """The words an out-of-range error of ``call`` starts with: the reference's own, plus the
    source node when the call has one."""
    assert isinstance(call.op, Op)
    axis = call.attrs.axis
    if call.op.name == "gather_elements":
        axis %= call.args[0].checked_type.ndim  # the reference names the normalized axis
    text = checked_index_context(call.op.name, axis)
    return f"{text} (node {call.span!r})" if call.span else text


class _Legalizer(ExprMutator):
    def __init__(self, func: Function) -> None:
        super().__init__()
        # One check per (indices, bound): two gathers reading the same indices share it.
        self.guards: dict[tuple[Expr, int], Expr] = {}
        # Fused groups stay as they are (a check_indices inside one could not be lowered):
        # known in advance, the traversal does not even enter them.
        for node in post_order(func.body, into_functions=False):
            if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
                self.memo[node.op] = node.op

    def visit_call(self, call: Call) -> Expr:
        new = super().visit_call(call)
        if not (isinstance(new, Call) and isinstance(new.op, Op)
                and new.op.name in CHECKED_GATHERS and new.attrs.mode == "checked"):
            return new
        args = list(new.args)
        args[_INDICES] = self._guard(new, args[_INDICES])
        return Call(new.op, args, {**new.attrs, "mode": "clip"}, new.span)

    def _guard(self, call: Call, indices: Expr) -> Expr:
        bound = index_bound(call)
        if isinstance(indices, Constant):
            try:
                check_in_range(indices.data, [bound], "constant indices")
            except IndexOutOfRangeError as error:
                raise IndexOutOfRangeError(
                    f"{error_context(call)}: {error}; correct the indices, or build the op "
                    f"with mode='clip' to clamp them") from None
            return indices
        if _already_checked(indices, bound):
            return indices
        key = (indices, bound)
        guard = self.guards.get(key)
        if guard is None:
            guard = self.guards[key] = Call(get_op("check_indices"), [indices],
                                            {"bounds": [bound],
                                             "consumer": error_context(call)})
        return guard


def _already_checked(indices: Expr, bound: int) -> bool:
    """Whether ``indices`` is a ``check_indices`` against exactly ``bound``."""
    return (isinstance(indices, Call) and isinstance(indices.op, Op)
            and indices.op.name == "check_indices" and tuple(indices.attrs.bounds) == (bound,))


register_pass("LegalizeCheckedIndices", LegalizeCheckedIndices)
