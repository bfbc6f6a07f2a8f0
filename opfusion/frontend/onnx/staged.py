"""Staged runs of ONNX models whose shapes depend on data (see :mod:`opfusion.compiler.staged`).

:func:`~opfusion.frontend.onnx.importer.from_onnx` of a model whose import stops at a
:class:`~opfusion.errors.DataDependentError` (a value it needs is computed from the inputs)
returns an :class:`OnnxStagedModel`; ``opf.compile`` makes it a :class:`StagedExecutor`.

A run goes through the graph's nodes in stages. Each stage tries to import what is left of the
graph with what the run knows so far (the inputs, values computed by earlier stages, small
values frozen into constants). When that import stops at node D:

* the nodes D depends on (and only those) are compiled and run as one model, and every value
  they make that a later node reads comes out of it;
* then, when what D needs is a small integer or bool value (a shape, a trip count, a
  condition: at most ``MAX_FROZEN_ELEMENTS`` elements), that value is frozen: the rest of the
  graph, D included, is imported with it as a constant, so D compiles (specialized on the
  value, as the ONNX backend's value specialization does);
* otherwise (NonZero, Unique, NonMaxSuppression of data; a Loop whose exit depends on data)
  D itself is computed here, by importing it alone with its inputs as constants (which folds
  it with the operators' NumPy references), and its outputs join what the run knows.

The last stage imports and compiles the rest whole. A stage after a cut that is tiny
(``TINY_STAGE_OPS`` operators, ``TINY_STAGE_ELEMENTS`` elements: a gather of the boxes kept)
is interpreted instead, since every new size would compile it again. Every stage is built
once per distinct (remaining nodes, input shapes and dtypes, frozen values) and kept in a
:class:`~opfusion.compiler.specialize.SpecializationCache` of ``max_stages`` entries: a new
size of a data-dependent output (another count of boxes kept) compiles the stages after it
once. A run with more stages than the graph has nodes is an error, not a hang."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...compiler.signature import output_positions, parse_run_arguments
from ...compiler.specialize import SpecializationCache
from ...compiler.staged import CompileSettings, StagedModel
from ...errors import DataDependentError, OpfusionError
from ...ir.evaluate import evaluate
from .functions import outer_scope_reads
from .tensors import read_tensor

MAX_FROZEN_ELEMENTS = 64
"""A needed integer/bool value of at most this many elements is frozen (the rest compiles
specialized on it); a larger one, or one of floats, is data: its node runs in NumPy."""


@dataclass(frozen=True)
class _Stage:
    """One step of a staged run: run ``executor`` on ``inputs`` (None when no node is to run
    before the cut), giving ``outputs``; then either the end (``cut`` None), or go on with
    ``rest`` after freezing value ``freeze`` (when the run finds it small: the cut node then
    stays in the rest) or computing node ``cut``."""

    executor: Any
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    cut: int | None = None
    freeze: str | None = None
    rest: tuple[int, ...] = ()


class OnnxStagedModel(StagedModel):
    """An ONNX model (a copy, its external data read) whose import needs values it computes;
    ``opf.compile`` runs it in stages. ``error`` is what stopped the plain import."""

    def __init__(self, proto: Any, input_shapes: Mapping[str, tuple[int, ...]],
                 input_dtypes: Mapping[str, str], error: DataDependentError) -> None:
        self.proto = proto
        self.input_names = list(input_shapes)
        self.input_shapes = dict(input_shapes)
        self.input_dtypes = dict(input_dtypes)
        self.output_names = [value.name for value in proto.graph.output]
        self.error = error

    def compile(self, settings: CompileSettings) -> StagedExecutor:
        return StagedExecutor(self, settings)

    def __repr__(self) -> str:
        return (f"OnnxStagedModel(inputs={self.input_names}, outputs={self.output_names}; "
                f"data-dependent at: {self.error})")


class StagedExecutor:
    """Runs an :class:`OnnxStagedModel` stage by stage (see the module's docstring). Answers
    ``run`` and ``__call__`` as :class:`~opfusion.compiler.executor.Executor` does; safe to run
    from many threads at once."""

    def __init__(self, model: OnnxStagedModel, settings: CompileSettings) -> None:
        self.model = model
        self.settings = settings
        self.input_names = model.input_names
        self.output_names = model.output_names
        graph = model.proto.graph
        self._nodes = list(graph.node)
        self._initializers = {tensor.name: tensor for tensor in graph.initializer}
        self._reads = [_names_read(node) for node in self._nodes]
        self._cache: SpecializationCache[tuple, _Stage] = SpecializationCache(
            settings.max_stages)
        self._num_threads = settings.num_threads
        self._loop_bodies: SpecializationCache[tuple, Any] = SpecializationCache(
            settings.max_stages)

    # -- running ---------------------------------------------------------------------------
    def run(self, output_names: Any = None, input_feed: Any = None, run_options: Any = None,
            *, profile: bool = False) -> list[np.ndarray]:
        """Run every stage on ``input_feed`` and return the outputs (the forms of
        :meth:`Executor.run <opfusion.compiler.executor.Executor.run>`)."""
        if profile:
            raise OpfusionError("profile=True is not available for a model run in stages "
                                "(its shapes depend on data); profile a model with static "
                                "shapes")
        wanted, feeds = parse_run_arguments(output_names, input_feed, run_options)
        positions = output_positions(self.output_names, wanted)
        known = self._bind(feeds)
        frozen: dict[str, np.ndarray] = {}
        remaining = tuple(range(len(self._nodes)))
        for _ in range(2 * len(self._nodes) + 2):
            stage = self._stage_for(remaining, known, frozen)
            if stage.executor is not None:
                results = stage.executor.run([known[name] for name in stage.inputs])
                known.update(zip(stage.outputs, results))
            if stage.cut is None:
                break
            if stage.freeze is not None and _small_shape_value(known[stage.freeze]):
                frozen[stage.freeze] = np.asarray(known[stage.freeze])
                remaining = tuple(sorted((*stage.rest, stage.cut)))  # the cut node compiles
            else:
                known.update(self._evaluate_node(stage.cut, known))
                remaining = stage.rest
        else:
            raise OpfusionError("a staged run took more stages than the model has nodes; "
                                "please report this model")
        outputs = [np.asarray(known[name]) for name in self.output_names]
        return outputs if positions is None else [outputs[i] for i in positions]

    def __call__(self, *arrays: Any, **named: Any) -> Any:
        feeds: Any = dict(zip(self.input_names, arrays)) if arrays else {}
        feeds.update(named)
        outputs = self.run(feeds)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def set_num_threads(self, num_threads: int) -> None:
        """Run every stage's kernels on ``num_threads`` threads (0: every core)."""
        self._num_threads = num_threads
        for stage in self._cache.values():
            if stage.executor is not None:
                stage.executor.set_num_threads(num_threads)

    @property
    def stages_compiled(self) -> int:
        """How many stages this executor has built (evicted ones included)."""
        return self._cache.builds

    @property
    def loop_bodies_compiled(self) -> int:
        """How many Loop bodies (one per Loop node and set of input shapes) were compiled to
        run Loops as loops."""
        return self._loop_bodies.builds

    def export(self, path: Any) -> None:
        raise OpfusionError("a model whose shapes depend on data runs in stages compiled as "
                            "it runs and cannot be exported to one file; export a model with "
                            "static shapes")

    def _bind(self, feeds: Any) -> dict[str, np.ndarray]:
        if isinstance(feeds, Mapping):
            missing = [name for name in self.input_names if name not in feeds]
            if missing:
                raise OpfusionError(f"missing input(s) {', '.join(map(repr, missing))}; the "
                                    f"model's inputs are {', '.join(self.input_names)}")
            arrays = [feeds[name] for name in self.input_names]
        else:
            arrays = list(feeds or [])
            if len(arrays) != len(self.input_names):
                raise OpfusionError(f"the model takes {len(self.input_names)} inputs "
                                    f"({', '.join(self.input_names)}); got {len(arrays)}")
        known = {}
        for name, array in zip(self.input_names, arrays):
            array = np.asarray(array)
            want_shape, want_dtype = self.model.input_shapes[name], self.model.input_dtypes[name]
            if array.shape != tuple(want_shape) or array.dtype != np.dtype(want_dtype):
                raise OpfusionError(f"input {name!r} must be {want_dtype} of shape "
                                    f"{tuple(want_shape)}; got {array.dtype} of shape "
                                    f"{array.shape}")
            known[name] = array
        return known

    # -- stages ----------------------------------------------------------------------------
    def _stage_for(self, remaining: tuple[int, ...], known: dict[str, np.ndarray],
                   frozen: dict[str, np.ndarray]) -> _Stage:
        reads = self._free_names(remaining) | set(self.output_names)
        # Sorted: the stage's inputs, hence its code, must not follow a set's order.
        visible = sorted(name for name in reads if name in known and name not in frozen)
        key = (remaining,
               tuple((name, known[name].shape, known[name].dtype.str) for name in visible),
               tuple((name, value.dtype.str, value.shape, value.tobytes())
                     for name, value in sorted(frozen.items()) if name in reads))
        return self._cache.get(key, lambda: self._build(
            remaining, {name: known[name] for name in visible},
            {name: value for name, value in frozen.items() if name in reads}))

    def _build(self, remaining: tuple[int, ...], known: dict[str, np.ndarray],
               frozen: dict[str, np.ndarray]) -> _Stage:
        from .importer import from_onnx

        outputs = [name for name in self.output_names if name not in known]
        nodes = [self._nodes[i] for i in remaining]
        if not nodes:
            return _Stage(None, (), ())
        stage_proto = self._stage_model(nodes, known, frozen, outputs)
        try:
            mod, params = from_onnx(stage_proto, data_dependent="raise")
        except DataDependentError as err:
            if err.graph_index is None:
                raise
            return self._cut(remaining, known, frozen, err)
        after_cut = len(remaining) < len(self._nodes)
        return _Stage(self._compile(mod, params, after_cut), _input_names(stage_proto),
                      tuple(outputs))

    def _cut(self, remaining: tuple[int, ...], known: dict[str, np.ndarray],
             frozen: dict[str, np.ndarray], err: DataDependentError) -> _Stage:
        """The stage that runs what node ``err.graph_index`` of ``remaining`` depends on,
        then freezes the value it needs or computes the node."""
        from .importer import from_onnx

        cut = remaining[err.graph_index]
        before = set(remaining[:err.graph_index])
        needed = self._ancestors(cut, before)
        prefix = [i for i in remaining if i in needed]
        rest = tuple(i for i in remaining if i not in needed and i != cut)
        later_reads = self._free_names(rest) | set(self._reads[cut]) | set(self.output_names)
        produced = [name for i in prefix for name in self._nodes[i].output if name]
        exported = [name for name in produced if name in later_reads]
        freeze = err.value_name if self._freezable(err, prefix, known) else None
        executor, inputs = None, ()
        if prefix:
            stage_proto = self._stage_model([self._nodes[i] for i in prefix], known, frozen,
                                            exported)
            mod, params = from_onnx(stage_proto, data_dependent="raise")
            executor = self._compile(mod, params, len(remaining) < len(self._nodes))
            inputs = _input_names(stage_proto)
        return _Stage(executor, inputs, tuple(exported), cut=cut, freeze=freeze, rest=rest)

    def _freezable(self, err: DataDependentError, prefix: list[int],
                   known: dict[str, np.ndarray]) -> bool:
        """Whether the needed value is one the run will know before the cut (an input or a
        value the prefix makes); whether it is small enough to freeze is decided per run."""
        name = err.value_name
        return name is not None and (name in known or any(name in self._nodes[i].output
                                                          for i in prefix))

    def _evaluate_node(self, index: int, known: dict[str, np.ndarray]
                       ) -> dict[str, np.ndarray]:
        """Node ``index`` computed from its inputs as constants (folded at import)."""
        from .importer import evaluate_node

        node = self._nodes[index]
        if node.op_type == "Loop" and (node.domain or "") in ("", "ai.onnx"):
            return self._run_loop(index, known)
        reads = {name: self._value(name, known) for name in self._reads[index]}
        return evaluate_node(node, self.model.proto, reads)

    def _run_loop(self, index: int, known: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """ONNX Loop node ``index`` run as a loop: its body compiled as a model (once per
        set of input shapes: loop-carried values may change shape) and called per iteration;
        scan outputs stacked. At most ``MAX_LOOP_ITERATIONS`` iterations, never a hang."""
        node = self._nodes[index]
        inputs = list(node.input) + [""] * max(0, 2 - len(node.input))
        trip = _loop_scalar(self._value(inputs[0], known), "trip count M", node)
        first = _loop_scalar(self._value(inputs[1], known), "condition", node)
        running = True if first is None else bool(first)
        limit = None if trip is None else max(int(trip), 0)
        states = [np.asarray(self._value(name, known)) for name in inputs[2:]]
        body = next(attr.g for attr in node.attribute if attr.name == "body")
        captured = [name for name in dict.fromkeys(n for _, _, n in outer_scope_reads(body))
                    if name in known or name in self._initializers]
        outer = {name: self._value(name, known) for name in captured}
        scans: list[list[np.ndarray]] = []
        count = 0
        counter_shape, cond_shape = (_declared_scalar_shape(value) for value in body.input[:2])
        flag = np.ones(cond_shape, np.bool_)
        outer_values = list(outer.values())
        shapes, executor = None, None
        while running and (limit is None or count < limit):
            if count >= MAX_LOOP_ITERATIONS:
                raise OpfusionError(f"Loop (node {node.name or node.output[0]!r}) reached "
                                    f"{MAX_LOOP_ITERATIONS} iterations (its trip count "
                                    f"{limit}, its condition still true); it would not end in "
                                    "reasonable time")
            feeds = [np.full(counter_shape, count, np.int64), flag, *states]
            now = [(value.shape, value.dtype) for value in states]
            if now != shapes:  # loop-carried values may change shape: look the body up again
                shapes, executor = now, self._body_executor(index, body, feeds, outer)
            results = executor.run([*feeds, *outer_values])
            if len(results) < 1 + len(states):
                raise OpfusionError(f"Loop (node {node.name!r}): the body gives "
                                    f"{len(results)} outputs; it must give the condition and "
                                    f"the {len(states)} loop-carried values first")
            running = bool(np.asarray(results[0]).reshape(-1)[0])
            states = [np.asarray(value) for value in results[1:1 + len(states)]]
            scans.append([np.asarray(value) for value in results[1 + len(states):]])
            count += 1
        if scans:
            stacked = [np.stack(values) for values in zip(*scans)]
        else:  # no iteration: the scan outputs' shapes come from running the body once
            feeds = [np.zeros(counter_shape, np.int64), flag, *states]
            results = self._body_executor(index, body, feeds, outer).run(
                [*feeds, *outer.values()])
            stacked = [np.zeros((0, *np.shape(value)), np.asarray(value).dtype)
                       for value in results[1 + len(states):]]
        outputs = [*states, *stacked]
        return {name: value for name, value in zip(node.output, outputs) if name}

    def _value(self, name: str, known: dict[str, np.ndarray]) -> np.ndarray | None:
        """A value the run knows, or an initializer's; None for an omitted input ('')."""
        if not name:
            return None
        if name in known:
            return known[name]
        if name in self._initializers:
            return read_tensor(self._initializers[name], f"initializer {name!r}")
        raise OpfusionError(f"the staged run does not know {name!r}; please report this model")

    def _body_executor(self, index: int, body: Any, feeds: list[np.ndarray],
                       outer: dict[str, np.ndarray]) -> Any:
        """The compiled body of Loop node ``index`` for these input shapes (cached)."""
        from onnx import helper

        from .importer import from_onnx

        key = ("loop", index, tuple((v.shape, v.dtype.str) for v in [*feeds,
                                                                       *outer.values()]))

        def build() -> Any:
            inputs = [helper.make_tensor_value_info(
                value_info.name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
                for value_info, value in zip(body.input, feeds)]
            inputs += [helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
                for name, value in outer.items()]
            graph = helper.make_graph(list(body.node), "loop_body", inputs, list(body.output),
                                      list(body.initializer))
            proto = helper.make_model(graph, opset_imports=list(self.model.proto.opset_import))
            proto.ir_version = self.model.proto.ir_version
            mod, params = from_onnx(proto)
            if isinstance(mod, OnnxStagedModel):
                return mod.compile(self.settings)
            return _Runner(self._compile(mod, params))

        return self._loop_bodies.get(key, build)

    def _compile(self, mod: Any, params: dict[str, np.ndarray], after_cut: bool = False
                 ) -> Any:
        """The stage's executor. A tiny stage after a cut (a detection head's gather of the
        kept boxes) is interpreted: it would be compiled again for every new size of what
        the cut computed, seconds each for microseconds of work."""
        from ...compiler.compile import compile as compile_model

        settings = self.settings
        if settings.reference or (after_cut and _tiny(mod)):
            return _Evaluated(mod, params)
        context = settings.context
        with context if context is not None else _nullcontext():
            return compile_model(mod, target=settings.target, params=params,
                                 opt_level=settings.opt_level, fusion=settings.fusion,
                                 verify=settings.verify, num_threads=self._num_threads,
                                 records=settings.records)

    # -- graphs ----------------------------------------------------------------------------
    def _free_names(self, indices: Sequence[int]) -> set[str]:
        """Names the nodes ``indices`` read that none of them makes."""
        made = {name for i in indices for name in self._nodes[i].output}
        return {name for i in indices for name in self._reads[i] if name not in made}

    def _ancestors(self, index: int, candidates: set[int]) -> set[int]:
        """The nodes among ``candidates`` that node ``index`` depends on (a worklist)."""
        producer = {name: i for i in candidates for name in self._nodes[i].output if name}
        found: set[int] = set()
        pending = [name for name in self._reads[index]]
        while pending:
            i = producer.get(pending.pop())
            if i is None or i in found:
                continue
            found.add(i)
            pending.extend(self._reads[i])
        return found

    def _stage_model(self, nodes: list[Any], known: Mapping[str, np.ndarray],
                     frozen: Mapping[str, np.ndarray], outputs: Sequence[str]) -> Any:
        """An ONNX model of ``nodes``: the known values they read as inputs (with their
        shapes and dtypes), the frozen ones and the model's initializers as initializers."""
        from onnx import TensorProto, helper, numpy_helper

        made = {name for node in nodes for name in node.output}
        reads = {name for node in nodes for name in _names_read(node)} | set(outputs)
        reads -= made
        inputs = [helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
            for name, array in known.items() if name in reads and name not in frozen]
        initializers = [numpy_helper.from_array(np.asarray(value), name)
                        for name, value in frozen.items() if name in reads]
        initializers += [tensor for name, tensor in self._initializers.items()
                         if name in reads and name not in frozen and name not in known]
        graph = helper.make_graph(
            nodes, "stage", inputs,
            [helper.make_tensor_value_info(name, TensorProto.UNDEFINED, None)
             for name in outputs], initializers)
        proto = helper.make_model(graph, opset_imports=list(self.model.proto.opset_import))
        proto.ir_version = self.model.proto.ir_version
        return proto


MAX_LOOP_ITERATIONS = 10_000_000
"""A Loop run as a loop stops with an error after this many iterations (it would not end)."""


class _Runner:
    """An executor whose ``run`` takes the inputs in order and returns a list."""

    def __init__(self, executor: Any) -> None:
        self.executor = executor

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        return list(self.executor.run(inputs))


def _loop_scalar(value: np.ndarray | None, what: str, node: Any) -> Any:
    """A Loop node's trip count or condition as one value (None when not given); an
    OpfusionError naming the node when it holds more or fewer (ONNX's Loop takes a scalar
    or a one-element tensor)."""
    if value is None:
        return None
    value = np.asarray(value)
    if value.size != 1:
        raise OpfusionError(f"Loop (node {node.name or node.output[0]!r}): its {what} must "
                            f"hold one value, got shape {value.shape}; ONNX's Loop takes a "
                            "scalar or a one-element tensor")
    return value.reshape(-1)[0]


def _declared_scalar_shape(declared: Any) -> tuple[int, ...]:
    """The shape a Loop body declares for its counter or condition: () or (1,)."""
    dims = declared.type.tensor_type.shape.dim if declared.type.HasField("tensor_type") else []
    return (1,) if len(dims) == 1 else ()


def _input_names(proto: Any) -> tuple[str, ...]:
    return tuple(value.name for value in proto.graph.input)


def _small_shape_value(value: Any) -> bool:
    """An integer or bool value of at most ``MAX_FROZEN_ELEMENTS`` elements: a shape, a
    count, a condition, which the rest of a staged run is compiled specialized on."""
    array = np.asarray(value)
    return array.size <= MAX_FROZEN_ELEMENTS and array.dtype.kind in "biu"


def _names_read(node: Any) -> list[str]:
    """The names ``node`` reads: its inputs and what its control-flow bodies read from the
    enclosing scope."""
    from onnx import AttributeProto

    names = [name for name in node.input if name]
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            names.extend(name for _, _, name in outer_scope_reads(attr.g))
    return list(dict.fromkeys(names))


TINY_STAGE_OPS = 32
TINY_STAGE_ELEMENTS = 1 << 16
"""A stage after a cut of at most this many operators, whose results hold at most this many
elements in all, is run by the reference interpreter, not compiled."""


def _tiny(mod: Any) -> bool:
    from ...ir.expr import Call
    from ...ir.types import TensorType
    from ...ir.visitor import post_order

    calls = 0
    elements = 0
    for expr in post_order(mod["main"].body):
        if isinstance(expr, Call):
            calls += 1
            ty = expr.checked_type
            elements += ty.size if isinstance(ty, TensorType) else 0
            if calls > TINY_STAGE_OPS or elements > TINY_STAGE_ELEMENTS:
                return False
    return True


class _Evaluated:
    """A stage run by the reference interpreter (the ONNX backend's reference engine)."""

    def __init__(self, mod: Any, params: dict[str, np.ndarray]) -> None:
        self.mod, self.params = mod, list(params.values())

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        values = evaluate(self.mod, [*inputs, *self.params])
        return list(values) if isinstance(values, tuple) else [values]

    def set_num_threads(self, num_threads: int) -> None:
        return None


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None
