"""The table of ONNX operator converters, and the view of one node that a converter reads.

A converter is a function ``(node: OnnxNode) -> Expr | list[Expr]`` registered for an ONNX
op type and the first opset version it handles::

    @converter("Relu")
    def relu(node):
        return op.nn.relu(node.input(0))

    @converter("Clip", since=11)         # min/max moved from attributes to inputs in opset 11
    def clip_11(node): ...

The importer picks, for each node, the converter with the greatest ``since`` that is not newer
than the model's opset. A converter of another domain's operator names it (``domain=
"com.microsoft"``: ONNX Runtime's contrib operators); its ``since`` is compared with the
model's version of ONNX's own domain too (no contrib operator has changed with it). A
converter may return ``NotImplemented`` for a form of its operator that it leaves to ONNX's
function body (the importer then converts the body instead)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...errors import DataDependentError, OnnxImportError, OpfusionError
from ...ir.expr import Constant, Expr

Converter = Callable[["OnnxNode"], "Expr | Sequence[Expr | None]"]
# (graph proto, values bound to its inputs, a label for errors) -> its outputs
GraphRunner = Callable[[Any, list[Expr], str], list[Expr]]

#: ONNX's own domain, as the importer names it ("" in a model means the same).
ONNX_DOMAIN = "ai.onnx"

_CONVERTERS: dict[tuple[str, str], list[tuple[int, Converter]]] = {}


def converter(op_type: str, since: int = 1,
              domain: str = ONNX_DOMAIN) -> Callable[[Converter], Converter]:
    """Register ``fn`` as the converter of ``op_type`` (of ``domain``) from opset ``since``
    on."""

    def register(fn: Converter) -> Converter:
        versions = _CONVERTERS.setdefault((domain, op_type), [])
        assert all(v != since for v, _ in versions), f"{op_type} since {since} registered twice"
        versions.append((since, fn))
        versions.sort(key=lambda item: item[0])
        return fn

    return register


def lookup_converter(op_type: str, opset: int, domain: str = ONNX_DOMAIN) -> Converter | None:
    """The converter for ``op_type`` of ``domain`` at ``opset``, or None if there is none."""
    chosen = None
    for since, fn in _CONVERTERS.get((domain, op_type), ()):
        if since <= opset:
            chosen = fn
    return chosen


class OnnxNode:
    """What a converter sees of one ONNX node: its inputs as IR expressions (None for an
    omitted optional input), its attributes as Python values, and the model's opset."""

    def __init__(self, name: str, op_type: str, inputs: Sequence[Expr | None],
                 attrs: dict[str, Any], opset: int, num_outputs: int,
                 run_graph: GraphRunner | None = None) -> None:
        self.name = name
        self.run_graph_fn = run_graph
        self.op_type = op_type
        self.inputs = list(inputs)
        self.attrs = attrs
        self.opset = opset
        self.num_outputs = num_outputs

    def input(self, index: int) -> Expr:
        """Input ``index``; missing or omitted is an error naming the node."""
        if index >= len(self.inputs) or self.inputs[index] is None:
            raise self.error(f"input {index} is required but missing")
        return self.inputs[index]  # type: ignore[return-value]

    def optional_input(self, index: int) -> Expr | None:
        """Input ``index`` or None when it is absent or given as the empty name."""
        return self.inputs[index] if index < len(self.inputs) else None

    def const_input(self, index: int, what: str = "") -> np.ndarray | None:
        """The value of input ``index`` if it is a constant (after import-time folding),
        None if the input is absent; an error if it is present but computed at run time."""
        expr = self.optional_input(index)
        if expr is None:
            return None
        if not isinstance(expr, Constant):
            raise DataDependentError(
                f"{self.op_type} (node {self.name!r}, opset {self.opset}): input {index}"
                f"{f' ({what})' if what else ''} must be a constant known at import time "
                "(opfusion compiles static shapes); it is computed from the model's inputs",
                node=self.name, input_index=index)
        return expr.data

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def run_graph(self, name: str, inputs: Sequence[Expr], what: str = "") -> list[Expr]:
        """Convert graph attribute ``name`` (a control-flow body) with its formal inputs bound
        to ``inputs``; names of the enclosing graphs stay visible in it. Returns its outputs."""
        graph = self.attrs.get(name)
        if graph is None or self.run_graph_fn is None or isinstance(graph, (str, int, float,
                                                                             list, np.ndarray)):
            raise self.error(f"graph attribute {name!r} is required but missing")
        return self.run_graph_fn(graph, list(inputs), f"{name}{f' ({what})' if what else ''}")

    def error(self, message: str) -> OpfusionError:
        """An :class:`OnnxImportError` naming this node, for the converter to raise."""
        return OnnxImportError(f"{self.op_type} (node {self.name!r}, opset {self.opset}): "
                               f"{message}")
