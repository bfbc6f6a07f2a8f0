"""from_torch: import a PyTorch module into the graph IR through ``torch.export``.

The module is exported (``torch.export.export``, non-strict) and decomposed to the core ATen
opset (``run_decompositions``), except that ``scaled_dot_product_attention`` is kept whole so
it becomes one ``nn.attention`` (the fused attention kernel) instead of its matmul/softmax
pieces. Parameters, buffers and lifted constants become constants of the graph (copied at
import), so FoldScaleAxis, the layout pass and weight packing see them; the user inputs
become the parameters of ``@main``.

With ``dynamic_shapes`` the export keeps symbolic sizes; :func:`from_torch` then returns a
:class:`TorchSymbolicModule`, which converts the same exported graph for each concrete set
of input shapes (``opf.compile`` makes it an executor that specialises per shape)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import OpfusionError, TorchImportError
from ...ir.expr import Var
from ...ir.module import IRModule
from ...ir.symbolic import Dim, SymbolicModule, SymbolicTensor
from ...ir.types import TensorType
from .graph import check_supported, convert_graph
from .registry import ir_dtype
from .tensors import constant_of, lifted_tensor


def _torch() -> Any:
    try:
        import torch
    except ImportError as err:
        raise OpfusionError("importing PyTorch models needs torch: pip install "
                            "'opfusion[torch]'") from err
    return torch


def decomposition_table() -> dict[Any, Any]:
    """torch.export's core-ATen decompositions, less those of scaled dot-product attention
    (converted whole to ``nn.attention``)."""
    table = _torch().export.default_decompositions()
    for key in list(table):
        if "scaled_dot_product" in str(key):
            del table[key]
    return table


def from_torch(model: Any, example_inputs: Sequence[Any] | Any,
               dynamic_shapes: Any = None) -> tuple[IRModule | TorchSymbolicModule,
                                                    dict[str, np.ndarray]]:
    """Import ``model`` (a ``torch.nn.Module``) traced on ``example_inputs`` (a tensor or a
    tuple of them) as an IRModule; ``params`` is empty (the weights are constants).

    ``dynamic_shapes`` is ``torch.export``'s (``{"x": {0: torch.export.Dim("batch")}}``): the
    dims it makes symbolic are decided per run, and the result is a
    :class:`TorchSymbolicModule` (compile it with ``opf.compile``). Trace the model in the
    mode it will run in (``model.eval()`` for inference). Every ATen operator opfusion
    cannot convert is listed in one :class:`UnsupportedTorchError`, with its node and source
    line; ``torch.compile(model, backend="opfusion")`` runs such operators in PyTorch
    instead."""
    torch = _torch()
    if not isinstance(model, torch.nn.Module):
        raise OpfusionError(f"from_torch takes a torch.nn.Module, got {type(model).__name__}")
    args = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) \
        else (example_inputs,)
    with torch.no_grad():
        try:
            program = torch.export.export(model, args, dynamic_shapes=dynamic_shapes,
                                          strict=False)
        except Exception as err:  # noqa: BLE001 - torch's tracing errors vary by version
            raise TorchImportError(f"torch.export could not trace the model: "
                                   f"{type(err).__name__}: {err}") from err
    return from_exported_program(program)


def from_exported_program(program: Any) -> tuple[IRModule | TorchSymbolicModule,
                                                  dict[str, np.ndarray]]:
    """Import a ``torch.export.ExportedProgram`` (decomposed here to core ATen); as
    :func:`from_torch`."""
    with _torch().no_grad():
        program = program.run_decompositions(decomposition_table())
    graph = ExportedGraph(program)
    check_supported(graph.graph)
    if all(tensor.is_static for tensor in graph.inputs):
        return graph.convert({}), {}
    return TorchSymbolicModule(graph), {}


class ExportedGraph:
    """A decomposed ExportedProgram read for conversion: its weights as constants, its user
    inputs (names, dims with symbolic ones by name, dtypes) and the range of each symbol."""

    def __init__(self, program: Any) -> None:
        self.program = program
        self.graph = program.graph_module.graph
        self.bound: dict[str, Any] = {}
        self.inputs: list[SymbolicTensor] = []
        placeholders = {node.name: node for node in self.graph.nodes if node.op == "placeholder"}
        for spec in program.graph_signature.input_specs:
            self.read_input(spec, placeholders[spec.arg.name])
        self.output_names = self.user_outputs()
        self.ranges = _symbol_ranges(program)

    def read_input(self, spec: Any, node: Any) -> None:
        kind, name = spec.kind.name, spec.arg.name
        if kind in ("PARAMETER", "BUFFER", "CONSTANT_TENSOR"):
            self.bound[name] = constant_of(lifted_tensor(self.program, spec),
                                           f"{kind.lower()} {spec.target!r}")
        elif kind == "USER_INPUT":
            value = node.meta.get("val")
            if hasattr(value, "shape"):
                dims = tuple(_dim(d) for d in value.shape)
                self.inputs.append(SymbolicTensor(name, dims, ir_dtype(value.dtype,
                                                                       f"input {name!r}")))
            else:  # an int, float or bool input: the export specialised it to this value
                self.bound[name] = value
        else:
            raise TorchImportError(f"input {name!r} is a {kind.lower()}; opfusion imports "
                                   "tensors and numbers only")

    def user_outputs(self) -> list[str]:
        names = []
        for spec in self.program.graph_signature.output_specs:
            if spec.kind.name != "USER_OUTPUT":
                raise TorchImportError(
                    f"the model's forward updates {spec.target!r} in place "
                    f"({spec.kind.name.lower().replace('_', ' ')}); opfusion compiles "
                    "functions without side effects: call model.eval() before importing (a "
                    "batch norm in training mode updates its running statistics), and do "
                    "not update buffers or inputs in forward")
            names.append(spec.arg.name)
        return names

    def convert(self, shapes: Mapping[str, Sequence[int]]) -> IRModule:
        """The graph as an IRModule with these shapes for the symbolic inputs."""
        bound = dict(self.bound)
        params = []
        for tensor in self.inputs:
            dims = tuple(shapes.get(tensor.name, tensor.dims or ()))
            var = Var(tensor.name, TensorType(dims, tensor.dtype))
            bound[tensor.name] = var
            params.append(var)
        return convert_graph(self.graph, bound, params, self.output_names)

    def check_shapes(self, shapes: Mapping[str, Sequence[int]]) -> None:
        """Each symbolic input given a shape of its rank, static dims kept, one size per
        symbol, and that size inside the range the export allowed."""
        sizes: dict[str, int] = {}
        for tensor in self.inputs:
            dims = tensor.dims or ()
            if tensor.is_static and tensor.name not in shapes:
                continue
            if tensor.name not in shapes:
                raise OpfusionError(f"input {tensor.name!r} has symbolic dims "
                                    f"{tensor.shape_text()}; give its shape")
            given = tuple(int(d) for d in shapes[tensor.name])
            if len(given) != len(dims):
                raise OpfusionError(f"input {tensor.name!r} has {len(dims)} dims "
                                    f"{tensor.shape_text()}, got shape {given}")
            for axis, (dim, size) in enumerate(zip(dims, given)):
                self.check_dim(tensor.name, axis, dim, size, sizes)

    def check_dim(self, name: str, axis: int, dim: Dim, size: int, sizes: dict[str, int]
                  ) -> None:
        where = f"input {name!r} axis {axis}"
        if isinstance(dim, int):
            if size != dim:
                raise OpfusionError(f"{where} is {dim} in the exported model, got {size}")
            return
        if dim is None:
            return
        if sizes.setdefault(dim, size) != size:
            raise OpfusionError(f"{where} is the symbolic size {dim!r}, which another input "
                                f"gives as {sizes[dim]}; got {size}")
        low, high = self.ranges.get(dim, (0, None))
        if size < low or (high is not None and size > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise OpfusionError(f"{where} (symbolic size {dim!r}) must be {bound}, as the "
                                f"export allowed, got {size}; export again with a wider "
                                "torch.export.Dim range")


class TorchSymbolicModule(SymbolicModule):
    """A PyTorch model exported with symbolic sizes: :func:`from_torch`'s result when
    ``dynamic_shapes`` makes some dims symbolic. :meth:`specialize` converts the exported
    graph for concrete shapes (no new trace)."""

    def __init__(self, graph: ExportedGraph) -> None:
        outputs = [SymbolicTensor(name, None, None) for name in graph.output_names]
        super().__init__(graph.inputs, outputs)
        self.graph = graph

    def specialize(self, shapes: Mapping[str, Sequence[int]]
                   ) -> tuple[IRModule, dict[str, np.ndarray]]:
        """The model as an IRModule for these input shapes, and no params."""
        self.graph.check_shapes(shapes)
        return self.graph.convert(shapes), {}


def _dim(size: Any) -> Dim:
    """A traced size: an int, a symbol's name, or None for a symbolic expression."""
    if isinstance(size, int):
        return size
    node = getattr(size, "node", None)
    expr = getattr(node, "expr", None)
    if expr is not None and getattr(expr, "is_Integer", False):
        return int(expr)
    if expr is not None and getattr(expr, "is_Symbol", False):
        return str(expr)
    return None


def _symbol_ranges(program: Any) -> dict[str, tuple[int, int | None]]:
    """Each size symbol's (lowest, highest or None) from the export's range constraints."""
    ranges: dict[str, tuple[int, int | None]] = {}
    for symbol, value_range in getattr(program, "range_constraints", {}).items():
        low, high = value_range.lower, value_range.upper
        ranges[str(symbol)] = (int(low) if low.is_finite else 0,
                               int(high) if high.is_finite else None)
    return ranges
