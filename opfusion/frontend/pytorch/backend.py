"""The ``torch.compile`` backend ``opfusion``: ``torch.compile(model, backend="opfusion")``.

Registered through the ``torch_dynamo_backends`` entry point, so it needs no import. Dynamo
hands the backend an FX graph of torch calls and example inputs; the backend returns a
callable that, on each call:

1. looks up the input shapes (and the int inputs dynamo passes for symbolic sizes) in a
   per-shape cache (:class:`~opfusion.compiler.specialize.SpecializationCache`, the one
   ``opf.compile``'s specialising executor keeps), so a graph dynamo made dynamic is
   compiled once per concrete shape, and a recompilation dynamo triggers reuses nothing
   stale;
2. on a miss, exports the graph for those shapes with ``torch.export`` (non-strict), decomposes
   it to core ATen as :func:`~opfusion.frontend.pytorch.from_torch` does, and binds the
   model's parameters and buffers (inputs dynamo marks static) as constants — the graph is
   frozen, as Inductor's ``freezing`` does. A weight changed in place later (its version
   counter moves) drops the cache, so the next call compiles again: never stale weights;
3. converts and compiles the whole graph with ``opf.compile`` when every node converts;
   otherwise partitions it with torch's capability-based partitioner: each maximal
   supported piece is compiled by opfusion, the rest runs in PyTorch, and a
   :class:`TorchFallbackWarning` says which nodes fell back and why.

Inputs and outputs cross as NumPy views of contiguous CPU tensors (no copy). A graph that
needs gradients runs in eager PyTorch, with a warning: opfusion compiles inference."""

from __future__ import annotations

import copy
import functools
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ...compiler.specialize import SpecializationCache
from ...errors import OpfusionError, TorchImportError
from ...ir.expr import Constant, Var
from .graph import convert_graph, describe, unsupported_reason
from .importer import decomposition_table
from .tensors import constant_of, lifted_tensor, numpy_view, tensor_var, torch_tensor

MAX_REPARTITIONS = 8
"""How many times a graph is partitioned again around a node whose converter refused it."""

COMPILE_OPTIONS = ("target", "opt_level", "fusion", "num_threads", "records")
"""The ``opf.compile`` settings the backend takes as options."""


class TorchFallbackWarning(UserWarning):
    """Part of a graph given to the ``opfusion`` backend runs in PyTorch (or all of it)."""


def opfusion_backend(gm: Any, example_inputs: Sequence[Any],
                     options: dict[str, Any] | None = None, **settings: Any) -> Callable:
    """The ``torch.compile`` backend: ``gm`` (dynamo's FX graph) as a callable that runs it
    with opfusion. ``options`` (``torch.compile(..., options={...})``) and ``settings`` are
    ``opf.compile``'s (``target``, ``opt_level``, ``fusion``, ``num_threads``, ``records``);
    ``max_specializations`` bounds the per-shape cache."""
    import torch

    options = {**(options or {}), **settings}
    unknown = sorted(set(options) - {*COMPILE_OPTIONS, "max_specializations"})
    if unknown:
        raise OpfusionError(f"unknown opfusion backend option(s) {unknown}; it takes "
                            f"{', '.join(COMPILE_OPTIONS)} and max_specializations")
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False)
                                       for t in example_inputs):
        warnings.warn("opfusion compiles inference graphs; this one needs gradients, so it "
                      "runs in eager PyTorch (call the model under torch.no_grad() or "
                      "torch.inference_mode() to compile it)", TorchFallbackWarning,
                      stacklevel=2)
        return gm.forward
    return CompiledGraph(gm, example_inputs, options)


def backend(**options: Any) -> Callable:
    """The backend with ``opf.compile`` settings: ``torch.compile(model,
    backend=opf.frontend.pytorch.backend(opt_level=2))``."""
    return functools.partial(opfusion_backend, **options)


class CompiledGraph:
    """Dynamo's graph compiled per input signature; see the module's docstring."""

    def __init__(self, gm: Any, example_inputs: Sequence[Any], options: dict[str, Any]) -> None:
        import torch

        self.gm = gm
        self.options = {k: v for k, v in options.items() if k in COMPILE_OPTIONS}
        self.capacity = options.get("max_specializations")
        # Parameters and buffers: dynamo passes them as inputs and marks them static.
        self.frozen = [i for i, t in enumerate(example_inputs)
                       if isinstance(t, torch.nn.Parameter)
                       or hasattr(t, "_dynamo_static_input_type")]
        self.cache: SpecializationCache = self.new_cache()
        self.weights: tuple = ()
        self.lock = threading.Lock()
        self.fallbacks: list[str] = []
        """What ran in PyTorch in the last compilation: one line per node."""

    def new_cache(self) -> SpecializationCache:
        return SpecializationCache() if self.capacity is None \
            else SpecializationCache(self.capacity)

    def __call__(self, *args: Any) -> Any:
        weights = self.weights_state(args)
        with self.lock:
            if weights != self.weights:  # a weight changed in place: compile again
                self.cache, self.weights = self.new_cache(), weights
            cache = self.cache
        runner = cache.get(_signature(args), lambda: self.build(args))
        return runner(args)

    def weights_state(self, args: Sequence[Any]) -> tuple:
        """Identity and version of every frozen input: any in-place update moves it."""
        state = []
        for index in self.frozen:
            tensor = args[index]
            try:
                version = tensor._version
            except RuntimeError:  # an inference tensor keeps no version counter
                version = None
            state.append((tensor.data_ptr(), version, tuple(tensor.shape)))
        return tuple(state)

    def build(self, args: Sequence[Any]) -> Callable:
        """Export, convert and compile for these inputs."""
        import torch

        devices = sorted({str(a.device) for a in args if isinstance(a, torch.Tensor)} - {"cpu"})
        if devices:
            return self.eager(f"inputs on {', '.join(devices)}; opfusion compiles for the CPU "
                              "(its CUDA backend is not there yet)")

        try:
            with torch.no_grad():
                program = torch.export.export(self.gm, tuple(args), strict=False)
                program = program.run_decompositions(decomposition_table())
        except Exception as err:  # noqa: BLE001 - torch's tracing errors vary by version
            return self.eager(f"torch.export could not trace the graph "
                              f"({type(err).__name__}: {err})")
        kinds = [spec.kind.name for spec in program.graph_signature.output_specs]
        if any(kind != "USER_OUTPUT" for kind in kinds):
            return self.eager("the graph updates its inputs or buffers in place")
        try:
            binding = _Binding(program, args, set(self.frozen))
        except OpfusionError as err:  # an input or weight of a dtype the IR lacks
            return self.eager(str(err))
        graph = program.graph_module.graph
        failed: dict[str, str] = {}
        if not any(unsupported_reason(node) for node in graph.nodes
                   if node.op == "call_function"):
            try:
                return self.whole(program, binding)
            except TorchImportError as err:
                if err.node is None:
                    return self.eager(str(err))
                failed[err.node] = str(err)
            except OpfusionError as err:  # the compiler refused the converted graph
                return self.eager(f"opfusion could not compile the graph: {err}")
        return self.partitioned(program, binding, failed)

    def compile(self, mod: Any) -> Any:
        from ...compiler.compile import compile as opf_compile

        return opf_compile(mod, **self.options)

    def whole(self, program: Any, binding: _Binding) -> Callable:
        names = [spec.arg.name for spec in program.graph_signature.output_specs]
        mod = convert_graph(program.graph_module.graph, binding.bound, binding.params, names)
        executor = self.compile(mod)
        self.fallbacks = []
        return _WholeRunner(executor, binding.positions, program.call_spec.out_spec)

    def partitioned(self, program: Any, binding: _Binding, failed: dict[str, str]) -> Callable:
        """Supported pieces compiled by opfusion, the rest left to PyTorch. A node whose
        converter refuses its arguments (a 3-D convolution) is known only when its piece
        converts: it joins ``failed`` and the graph is partitioned again, so only that node
        falls back, not its whole piece (up to :data:`MAX_REPARTITIONS` times; after that a
        piece that fails runs in PyTorch whole)."""
        names = {node.name for node in program.graph_module.graph.nodes}
        for attempt in range(MAX_REPARTITIONS + 1):
            module = copy.deepcopy(program.graph_module)  # fusing rewrites the module
            fused, reasons, refused = self.fuse_and_compile(module, binding, failed,
                                                            retry=attempt < MAX_REPARTITIONS)
            if refused is None or refused[0] not in names or refused[0] in failed:
                break
            failed[refused[0]] = refused[1]
        order = {node.name: index for index, node in enumerate(program.graph_module.graph.nodes)}
        self.fallbacks = [reasons[name] for name in
                          sorted(reasons, key=lambda name: order.get(name, len(order)))]
        if self.fallbacks:
            listing = "\n  ".join(self.fallbacks)
            warnings.warn(f"opfusion: {len(self.fallbacks)} node(s) of this graph run in "
                          f"PyTorch:\n  {listing}", TorchFallbackWarning, stacklevel=3)
        return _PartitionedRunner(fused, binding, program.call_spec.out_spec)

    def fuse_and_compile(self, module: Any, binding: _Binding, failed: dict[str, str],
                         retry: bool) -> tuple[Any, dict[str, str], tuple[str, str] | None]:
        """Partition ``module`` around ``failed`` and the nodes without a converter, and
        compile each piece: (the fused module, why each node falls back, and the node and
        reason of a piece that failed on one node when ``retry``, else None)."""
        from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
        from torch.fx.passes.operator_support import OperatorSupport

        reasons: dict[str, str] = dict(failed)

        class _Supported(OperatorSupport):
            def is_node_supported(self, submodules: Any, node: Any) -> bool:
                if node.op != "call_function" or node.name in failed:
                    return False
                reason = unsupported_reason(node)
                if reason is not None:
                    reasons[node.name] = describe(node, reason)
                return reason is None

        partitioner = CapabilityBasedPartitioner(module, _Supported(),
                                                 allows_single_node_partition=True)
        fused = partitioner.fuse_partitions(partitioner.propose_partitions())
        for node in list(fused.graph.nodes):
            if node.op == "call_module" and node.target.startswith("fused_"):
                error = self.compile_piece(fused, node, binding)
                if error is None:
                    continue
                if retry and isinstance(error, TorchImportError) and error.node is not None:
                    return fused, reasons, (error.node, str(error))
                size = len(getattr(fused, node.target).graph.nodes)
                reasons[node.target] = f"{node.target} (a piece of {size} nodes): {error}"
        return fused, reasons, None

    def compile_piece(self, fused: Any, node: Any, binding: _Binding) -> OpfusionError | None:
        """Replace submodule ``node.target`` by opfusion's compilation of it; on failure it
        stays in PyTorch and the error is returned."""
        piece = getattr(fused, node.target)
        bound, params, positions = {}, [], []
        placeholders = [n for n in piece.graph.nodes if n.op == "placeholder"]
        for index, (inner, outer) in enumerate(zip(placeholders, node.args)):
            constant = binding.constant_for(outer)
            if constant is not None:
                bound[inner.name] = constant
                continue
            value = outer.meta.get("val")
            if not hasattr(value, "shape"):
                bound[inner.name] = value
                continue
            var = tensor_var(inner.name, value)
            bound[inner.name], positions = var, [*positions, index]
            params.append(var)
        output = next(n for n in piece.graph.nodes if n.op == "output").args[0]
        many = isinstance(output, (list, tuple))
        count = len(output) if many else 1
        try:
            mod = convert_graph(piece.graph, bound, params, [f"out{i}" for i in range(count)])
            executor = self.compile(mod)
        except OpfusionError as err:
            return err
        setattr(fused, node.target, executor_module(executor, positions, many))
        return None

    def eager(self, reason: str) -> Callable:
        self.fallbacks = [reason]
        warnings.warn(f"opfusion: the graph runs in eager PyTorch: {reason}",
                      TorchFallbackWarning, stacklevel=3)
        gm = self.gm
        return lambda args: gm(*args)


class _Binding:
    """How the exported graph's placeholders are bound: weights (the export's own parameters
    and constants, and the inputs dynamo marks static) as constants, ints as their values,
    the other tensors as variables, with their positions among the call's arguments."""

    def __init__(self, program: Any, args: Sequence[Any], frozen: set[int]) -> None:
        self.bound: dict[str, Any] = {}
        self.params: list[Var] = []
        self.positions: list[int] = []
        self.flat_constants: list[Any] = []  # the non-user inputs, in the graph's order
        user = 0
        for spec in program.graph_signature.input_specs:
            name = spec.arg.name
            if spec.kind.name != "USER_INPUT":
                tensor = lifted_tensor(program, spec)
                self.flat_constants.append(tensor)
                self.bound[name] = constant_of(tensor, f"{spec.target!r}")
                continue
            value = args[user]
            if user in frozen:
                self.bound[name] = constant_of(value, f"weight {name!r}")
            elif hasattr(value, "shape"):
                var = tensor_var(name, value)
                self.bound[name] = var
                self.params.append(var)
                self.positions.append(user)
            else:
                self.bound[name] = value
            user += 1

    def constant_for(self, node: Any) -> Any:
        """The constant a placeholder of the exported graph is bound to, or None."""
        value = self.bound.get(node.name) if node.op == "placeholder" else None
        return value if isinstance(value, Constant) else None


class _WholeRunner:
    """Runs a graph compiled whole: tensors in as NumPy views, outputs back as tensors in
    the structure the graph returns."""

    def __init__(self, executor: Any, positions: Sequence[int], out_spec: Any) -> None:
        self.executor = executor
        self.positions = list(positions)
        self.out_spec = out_spec

    def __call__(self, args: Sequence[Any]) -> Any:
        from torch.utils import _pytree

        outs = self.executor.run([numpy_view(args[i]) for i in self.positions])
        return _pytree.tree_unflatten([torch_tensor(out) for out in outs], self.out_spec)


class _PartitionedRunner:
    """Runs the partitioned graph module: weights as the export lifted them, then the call's
    arguments."""

    def __init__(self, module: Any, binding: _Binding, out_spec: Any) -> None:
        self.module = module
        self.flat_constants = binding.flat_constants
        self.out_spec = out_spec

    def __call__(self, args: Sequence[Any]) -> Any:
        from torch.utils import _pytree

        outs = self.module(*self.flat_constants, *args)
        return _pytree.tree_unflatten(list(outs), self.out_spec)


@functools.cache
def _executor_module_class() -> Any:
    import torch

    class ExecutorModule(torch.nn.Module):
        """A compiled piece inside a partitioned graph module."""

        def __init__(self, executor: Any, positions: Sequence[int], many: bool) -> None:
            super().__init__()
            self.executor, self.positions, self.many = executor, list(positions), many

        def forward(self, *args: Any) -> Any:
            outs = self.executor.run([numpy_view(args[i]) for i in self.positions])
            tensors = tuple(torch_tensor(out) for out in outs)
            return tensors if self.many else tensors[0]

    return ExecutorModule


def executor_module(executor: Any, positions: Sequence[int], many: bool) -> Any:
    """A ``torch.nn.Module`` that runs ``executor`` on the arguments at ``positions``."""
    return _executor_module_class()(executor, positions, many)


def _signature(args: Sequence[Any]) -> tuple:
    """What a compilation depends on: each tensor's shape and dtype, each number's value."""
    return tuple((tuple(a.shape), str(a.dtype)) if hasattr(a, "shape") else (type(a).__name__, a)
                 for a in args)
