"""Converting an FX graph of core ATen operators into the graph IR.

The graph is walked in its (topological) node order, never recursively: placeholders are
bound to IR variables or constants, each ``call_function`` node goes through its converter in
:mod:`opfusion.frontend.pytorch.registry`, and any result whose operands are all constants is
evaluated at once (as the ONNX importer does). Integer arithmetic on sizes (``sym_size``,
``operator.mul`` on SymInts, which dynamic-shape exports are full of) is computed in Python
from the shapes the IR inferred, so a graph exported with symbolic sizes converts for any
concrete input shapes.

Each converted node is checked against what the trace recorded for it (``node.meta["val"]``):
a dtype the IR computes differently (an index type) is cast to the recorded one, and a static
shape that differs is an error naming the node, never a quietly different graph."""

from __future__ import annotations

import contextlib
import functools
import math
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ... import op
from ...errors import OpfusionError, TorchImportError
from ...ir.expr import Expr, Function, Tuple, Var
from ...ir.module import IRModule
from ...ir.types import TensorType
from ...transform.fold_constant import ConstantFolder
from . import converters  # noqa: F401  (registers the converters)
from .registry import TORCH_DTYPES, AtenNode, Unavailable, lookup_converter


class UnsupportedTorchError(TorchImportError):
    """The model uses ATen operators opfusion cannot convert; the message lists all of them."""


# Python functions on sizes that dynamic-shape graphs call (on ints here).
_SIZE_ARITHMETIC: dict[Any, Callable[..., Any]] = {
    operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
    operator.floordiv: operator.floordiv, operator.truediv: operator.truediv,
    operator.mod: operator.mod, operator.pow: operator.pow, operator.neg: operator.neg,
    operator.eq: operator.eq, operator.ne: operator.ne, operator.lt: operator.lt,
    operator.le: operator.le, operator.gt: operator.gt, operator.ge: operator.ge,
    operator.and_: operator.and_, operator.or_: operator.or_, operator.not_: operator.not_,
    math.ceil: math.ceil, math.floor: math.floor, math.sqrt: math.sqrt,
}

# Checks a trace leaves in the graph, with nothing to compute at run time.
_ASSERTIONS = ("aten._assert_scalar.default", "aten._assert_tensor_metadata.default",
               "aten.sym_constrain_range_for_size.default", "aten.sym_constrain_range.default",
               "aten._assert_async.msg", "aten._assert_async.default")


@functools.cache
def _torch_size_functions() -> dict[Any, Callable[..., Any]]:
    import torch

    functions = {torch.sym_max: max, torch.sym_min: min, torch.sym_not: operator.not_,
                 torch.sym_float: float, torch.sym_int: int, torch.sym_sqrt: math.sqrt}
    return {**_SIZE_ARITHMETIC, **functions}


def target_name(target: Any) -> str:
    """``aten.add.Tensor`` for an ATen overload, the function's name otherwise."""
    if callable(target) and hasattr(target, "_schema"):
        return str(target)
    return getattr(target, "__name__", str(target))


def source_location(node: Any) -> str:
    """``, at path.py:12`` — the innermost frame of the node's stack trace outside torch's
    own modules (the model's line), or ``""`` when the trace kept none."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
    own = [frame for frame in frames if "/torch/" not in frame[0].replace("\\", "/")]
    chosen = own[-1] if own else frames[-1] if frames else None
    return f", at {chosen[0]}:{chosen[1]}" if chosen else ""


def is_structural(target: Any) -> bool:
    """Whether a call_function target is graph plumbing opfusion handles itself (tuple
    indexing, size arithmetic, size queries, assertions) rather than an ATen operator."""
    name = target_name(target)
    return (target is operator.getitem or target in _torch_size_functions()
            or name.startswith("aten.sym_") or name in _ASSERTIONS)


def node_dtypes(node: Any) -> list[Any]:
    """The dtypes of the tensors a node produces, as the trace recorded them."""
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v.dtype for v in values if hasattr(v, "dtype")]


def unsupported_reason(node: Any) -> str | None:
    """Why ``node`` cannot be converted (no converter, a dtype the IR lacks), or None."""
    if node.op != "call_function" or is_structural(node.target):
        return None
    name = target_name(node.target)
    if lookup_converter(name) is None:
        return "no converter"
    bad = [str(dtype) for dtype in node_dtypes(node) if str(dtype) not in TORCH_DTYPES]
    if bad:
        return f"dtype {bad[0]}"
    return None


def describe(node: Any, reason: str) -> str:
    """``aten.foo.default (node 'foo', at model.py:12): reason``, a line of a listing."""
    return f"{target_name(node.target)} (node {node.name!r}{source_location(node)}): {reason}"


def unsupported_nodes(graph: Any) -> list[str]:
    """One line per node of ``graph`` that opfusion cannot convert: op, node, source line,
    reason."""
    return [describe(node, reason) for node in graph.nodes
            if (reason := unsupported_reason(node)) is not None]


def check_supported(graph: Any) -> None:
    """Raise :class:`UnsupportedTorchError` listing every node opfusion cannot convert."""
    missing = unsupported_nodes(graph)
    if missing:
        listing = "\n  ".join(missing)
        raise UnsupportedTorchError(
            f"the model uses {len(missing)} ATen node(s) opfusion cannot convert:\n  {listing}"
            "\n(torch.compile(model, backend='opfusion') runs such nodes in PyTorch)")


class GraphConverter:
    """Converts the call_function nodes of one FX graph, given what its placeholders are
    (IR variables or constants for tensors, Python values for ints and floats)."""

    def __init__(self, bound: Mapping[str, Any]) -> None:
        self.env: dict[str, Any] = dict(bound)
        self.folder = ConstantFolder()

    def run(self, graph: Any) -> list[Any]:
        """Convert every node; the values of the graph's output node, flattened."""
        outputs: list[Any] = []
        for node in graph.nodes:
            if node.op == "placeholder":
                if node.name not in self.env:
                    raise TorchImportError(f"placeholder {node.name!r} is not bound to a value",
                                           node=node.name)
            elif node.op == "call_function":
                with converting(node):
                    self.env[node.name] = self.call(node)
            elif node.op == "output":
                outputs = _flatten(self.value(node.args[0]))
            else:
                raise TorchImportError(f"node {node.name!r} is a {node.op} node; opfusion "
                                       "converts graphs of call_function nodes (a graph "
                                       "lifted by torch.export)", node=node.name)
        return outputs

    def value(self, arg: Any) -> Any:
        """An FX argument with its nodes replaced by their converted values."""
        if hasattr(arg, "op") and hasattr(arg, "name"):  # an fx.Node
            value = self.env[arg.name]
            if isinstance(value, Unavailable):
                raise TorchImportError(f"node {arg.name!r}: {value.what}", node=arg.name)
            return value
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.value(item) for item in arg)
        if isinstance(arg, dict):
            return {key: self.value(item) for key, item in arg.items()}
        return arg

    def call(self, node: Any) -> Any:
        target = node.target
        if target is operator.getitem:  # an output of a node with several
            return self.env[node.args[0].name][node.args[1]]
        args = [self.value(arg) for arg in node.args]
        size_functions = _torch_size_functions()
        if target in size_functions:
            return size_functions[target](*args)
        name = target_name(target)
        if name in _ASSERTIONS:
            return None
        if name.startswith("aten.sym_"):
            return _size_query(name, args)
        fn = lookup_converter(name)
        if fn is None:
            raise TorchImportError(describe(node, "no converter for this ATen operator"),
                                   node=node.name)
        view = AtenNode(node.name, name, _by_schema(target, args, self.value(node.kwargs)),
                        _first_dtype(node), source_location(node))
        result = fn(view)
        return self.checked(node, view, result)

    def checked(self, node: Any, view: AtenNode, result: Any) -> Any:
        """Fold the result and hold it to the trace's record of the node's outputs."""
        recorded = node.meta.get("val")
        if isinstance(result, Expr):
            return self.matched(view, self.folder.visit(result), recorded)
        if isinstance(result, (list, tuple)):
            records = recorded if isinstance(recorded, (list, tuple)) else [None] * len(result)
            return tuple(self.matched(view, self.folder.visit(out), rec)
                         if isinstance(out, Expr) else out for out, rec in zip(result, records))
        return result

    @staticmethod
    def matched(view: AtenNode, out: Expr, recorded: Any) -> Expr:
        ty = out.checked_type
        if not isinstance(ty, TensorType) or not hasattr(recorded, "dtype"):
            return out
        want = TORCH_DTYPES.get(str(recorded.dtype))
        if want is not None and ty.dtype != want:
            out = op.cast(out, dtype=want)
        shape = tuple(recorded.shape)
        if all(isinstance(d, int) for d in shape) and shape != tuple(ty.shape):
            raise view.error(f"opfusion computes shape {tuple(ty.shape)} but the trace "
                             f"recorded {shape}; please report this")
        return out


def convert_graph(graph: Any, bound: Mapping[str, Any], params: Sequence[Var],
                  output_names: Sequence[str]) -> IRModule:
    """The IRModule of ``graph``: ``@main(params...)`` returning the graph's outputs, its
    placeholders bound as ``bound`` says."""
    outputs = GraphConverter(bound).run(graph)
    for index, out in enumerate(outputs):
        if not isinstance(out, Expr):
            raise TorchImportError(f"output {index} ({output_names[index]!r}) is "
                                   f"{type(out).__name__} {out!r}, not a tensor; opfusion "
                                   "compiles functions that return tensors")
    body = outputs[0] if len(outputs) == 1 else Tuple(outputs)
    func = Function(list(params), body, attrs={"output_names": tuple(output_names)})
    _ = func.checked_type
    return IRModule.from_expr(func)


@contextlib.contextmanager
def converting(node: Any) -> Iterator[None]:
    """Errors while converting ``node`` name it and its source line; any other exception
    becomes a :class:`TorchImportError` chained to it (never a bare KeyError)."""
    label = f"{target_name(node.target)} (node {node.name!r}{source_location(node)})"
    try:
        yield
    except TorchImportError as err:
        if err.node is None:
            raise TorchImportError(f"{label}: {err}", node=node.name) from None
        raise
    except OpfusionError as err:
        raise TorchImportError(f"{label}: {err}", node=node.name) from None
    except Exception as err:  # noqa: BLE001 - see the docstring
        raise TorchImportError(f"{label}: converting it failed with {type(err).__name__}: "
                               f"{err}; please report this", node=node.name) from err


def _by_schema(target: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The call's arguments by their names in the overload's schema, defaults filled in."""
    values: dict[str, Any] = {}
    for index, argument in enumerate(target._schema.arguments):
        if index < len(args) and not argument.kwarg_only:
            values[argument.name] = args[index]
        elif argument.name in kwargs:
            values[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            values[argument.name] = _plain(argument.default_value)
        else:
            values[argument.name] = None
    return values


def _plain(value: Any) -> Any:
    """A schema default as a plain Python value (torch gives some as its own enums)."""
    return value if isinstance(value, (int, float, bool, str, list, tuple, type(None))) else None


def _first_dtype(node: Any) -> str | None:
    dtypes = node_dtypes(node)
    return TORCH_DTYPES.get(str(dtypes[0])) if dtypes else None


def _size_query(name: str, args: Sequence[Any]) -> Any:
    """``aten.sym_size.int`` and its kin on a converted tensor: from its IR shape."""
    shape = tuple(args[0].checked_type.shape)
    if name == "aten.sym_size.int":
        return shape[args[1]]
    if name == "aten.sym_numel.default":
        return math.prod(shape)
    if name == "aten.sym_storage_offset.default":
        return 0
    if name == "aten.sym_stride.int":
        return math.prod(shape[args[1] % len(shape) + 1:])
    raise TorchImportError(f"{name} is not a size query opfusion knows")


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    return [value]
