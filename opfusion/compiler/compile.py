"""opf.compile: a whole model to fused native kernels and an executor.

    exe = opf.compile(mod, params=params)          # the context's opt_level (default 3), TVM fusion
    y = exe(x=array)                               # or exe.run({"x": array}) -> [arrays]

Pipeline: type inference; ``optimize`` (batch-norm folding, constant folding, scale folding,
simplification, CSE, DCE); ``MergeParallelProducts`` (products of one operand by several
constant weights as one, e.g. the queries, keys and values) and ``FuseAttention`` (attention
chains as ``nn.attention``), for the strategies that fuse; the layout passes;
``LegalizeCheckedIndices`` (the indices of checked gathers are checked before their kernels,
which clamp); fusion by the chosen strategy —
"tvm" (FuseOps), "cinn" (FuseOps, then FusionMerge with the registered policies) or "none"
(every operator its own kernel), or any strategy added with
``opf.transform.register_fusion_strategy``; each fused group lowered to one kernel; C
generated and compiled once (cached by content); a static memory plan; the executor."""

from __future__ import annotations

import logging
import math
import re
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backend import Backend, get_backend
from ..backend.c_names import MAX_NAME_LENGTH
from ..errors import DeviceError, OpfusionError
from ..ir.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..ir.op import Op
from ..ir.structural import structural_equal, structural_hash
from ..ir.symbolic import SymbolicModule
from ..ir.types import TensorType, TupleType
from ..ir.visitor import post_order
from ..runtime.model_layout import NO_KERNEL, model_layout
from ..stages import stage
from ..target import Target, as_target
from ..tir.nan_free import Fact, join_facts
from ..transform.alter_op_layout import AlterOpLayout
from ..transform.context import PassContext, register_pass_config
from ..transform.fold_channel_shuffle import FoldChannelShuffle
from ..transform.fold_constant import FoldConstant
from ..transform.fuse_attention import FuseAttention
from ..transform.fusion_strategy import get_fusion_strategy
from ..transform.infer_type import InferType
from ..transform.legalize_checked_indices import LegalizeCheckedIndices
from ..transform.merge_parallel_products import MergeParallelProducts
from ..transform.narrow_group_outputs import NarrowGroupOutputs
from ..transform.optimize import optimize
from ..transform.pack_matmul_weights import PackMatmulWeights
from ..transform.pad_channel_blocks import PadChannelBlocks
from ..transform.pad_conv_channels import PadConvChannels
from ..transform.pass_infra import Sequential
from ..transform.round_tf32_weights import RoundTF32Weights
from ..transform.simplify_expr import RESHAPE_OPS, SimplifyExpr
from ..transform.tabulate_codes import TabulateCodes
from ..transform.word_convolutions import WordConvolutions
from .executor import ExecStep, Executor, ValueInfo, check_num_threads, steps_for_plan
from .limits import check_kernel, check_values, model_values
from .lower_group import LoweredGroup, constant_facts, lower_primitive_function
from .memory_plan import ALIGNMENT, MemoryPlan, plan_memory
from .signature import check_output_names
from .staged import CompileSettings, StagedModel

log = logging.getLogger("opfusion.autotune")

if TYPE_CHECKING:
    from .specialize import SpecializingExecutor


def compile(mod: IRModule | Function | SymbolicModule,  # noqa: A001
            target: str | Target | None = None, params: Mapping[str, Any] | None = None,
            opt_level: int | None = None, fusion: str | None = None, verify: bool = False,
            num_threads: int = 0, *, max_specializations: int | None = None,
            records: Any = None) -> Executor | SpecializingExecutor:
    """Compile ``mod``'s ``@main`` into an :class:`Executor`.

    A :class:`~opfusion.ir.symbolic.SymbolicModule` (``from_onnx`` of a model with symbolic
    input dimensions) becomes a :class:`~opfusion.compiler.specialize.SpecializingExecutor`
    instead, which compiles the model, with these settings and this pass context, for each
    new set of input shapes a run brings, keeping the ``max_specializations`` most recently
    used (default 8).

    ``params`` binds weights by parameter name. ``opt_level`` and ``fusion`` default to the
    current PassContext's opt_level and ``fusion.strategy`` config (``DEFAULT_OPT_LEVEL``, 3,
    and "tvm" outside any ``with PassContext``). ``verify=True`` runs every kernel once on
    standard-normal inputs against the reference interpreter and raises naming the first
    kernel that differs. ``target`` (an :class:`~opfusion.target.Target` or a string such as
    ``"c"`` or ``"c -mattr=+avx2,+fma"``) defaults to the current target (``with target:``),
    else the host CPU. ``num_threads`` is how many threads the kernels run on (0, the
    default: OpenMP's, every core; change it later with ``exe.set_num_threads``).
    ``records`` (a path of ``opf.tune``'s records or a
    :class:`~opfusion.autotune.records.TuningRecords`; default: the PassContext's
    ``tune.records`` config) gives each group the best config measured for it on this target;
    groups without a record (or whose record no longer fits their schedule's space) get the
    heuristic's."""
    resolved = as_target(target)
    backend = get_backend(resolved)  # refuses a target no backend compiles for, before work
    if resolved.device == "cuda":
        return _compile_for_gpu(mod, resolved, params, opt_level, fusion, records)
    check_num_threads(num_threads)
    tuned = _tuning_records(records)
    if isinstance(mod, SymbolicModule):
        return _specializing(mod, resolved, params, opt_level, fusion, verify,
                             max_specializations, num_threads, tuned)
    if isinstance(mod, StagedModel):
        return mod.compile(CompileSettings(resolved, opt_level, fusion, verify, num_threads,
                                           tuned, context=PassContext.current()))
    if max_specializations is not None:
        raise OpfusionError("max_specializations applies to a model with symbolic input "
                            "dimensions; this one has static shapes")
    if isinstance(mod, Function):
        mod = IRModule.from_expr(mod)
    if not isinstance(mod, IRModule) or "main" not in mod:
        raise OpfusionError("opf.compile takes an IRModule with a @main function (or a "
                            "Function)")
    mod = fused_module(mod, params, resolved, opt_level, fusion)
    with resolved:
        executor = build_executor(mod, backend, tuned)
    executor.set_num_threads(num_threads)
    if verify:
        with stage("verify"):
            executor.verify(random_inputs(executor))
    return executor


def _compile_for_gpu(mod: Any, target: Target, params: Mapping[str, Any] | None,
                     opt_level: int | None, fusion: str | None, records: Any) -> Any:
    """A :class:`~opfusion.compiler.gpu.GPUExecutor` on this machine's GPU (a DeviceError
    without one, before any work)."""
    from ..backend.cuda.runtime import cuda_device
    from .gpu import GPUExecutor, build_gpu_model

    if isinstance(mod, (SymbolicModule, StagedModel)):
        raise DeviceError(f"target {target}: a model for a GPU needs static shapes (pass "
                          "shape= to from_onnx); symbolic and staged models run on the CPU")
    device = cuda_device()
    return GPUExecutor(build_gpu_model(mod, params, target, opt_level, fusion, records),
                       device)


def fused_module(mod: IRModule, params: Mapping[str, Any] | None, target: Target,
                 opt_level: int | None = None, fusion: str | None = None) -> IRModule:
    """``mod`` optimized, laid out for ``target`` and fused, as :func:`compile` does before it
    lowers the groups (``opt_level`` and ``fusion`` default to the current PassContext's):
    every primitive function ``@main`` calls is one kernel to be."""
    ctx = PassContext.current()
    level = ctx.opt_level if opt_level is None else opt_level
    strategy = fusion if fusion is not None else ctx.get_config("fusion.strategy")
    get_fusion_strategy(strategy)  # an unknown name fails here, before any work
    with ctx.with_opt_level(level), stage("optimize and fuse"):
        mod = InferType()(mod)
        mod = optimize(mod, params)
        if get_fusion_strategy(strategy).patterns:  # opt_level 3, unless disabled
            mod = Sequential([MergeParallelProducts(), FuseAttention()],
                             name="FusePatterns")(mod)
        mod = alter_layout(mod, target)
        return fuse(mod, strategy, level)


def _specializing(mod: SymbolicModule, target: Target, params: Mapping[str, Any] | None,
                  opt_level: int | None, fusion: str | None, verify: bool,
                  max_specializations: int | None, num_threads: int,
                  records: Any = None) -> SpecializingExecutor:
    """The executor of a symbolic module, with every setting resolved now."""
    from .specialize import DEFAULT_MAX_SPECIALIZATIONS, SpecializingExecutor

    ctx = PassContext.current()
    strategy = fusion if fusion is not None else ctx.get_config("fusion.strategy")
    get_fusion_strategy(strategy)  # an unknown name fails here, before any run
    return SpecializingExecutor(
        mod, target=target, params=params,
        opt_level=ctx.opt_level if opt_level is None else opt_level, fusion=strategy,
        verify=verify, context=ctx, num_threads=num_threads, records=records,
        max_specializations=(DEFAULT_MAX_SPECIALIZATIONS if max_specializations is None
                             else max_specializations))


def random_inputs(executor: Executor, seed: int = 0) -> list[Any]:
    """Standard-normal arrays (random integers for integer inputs) for every model input."""
    rng = np.random.default_rng(seed)
    return [random_array(rng, info.type.shape, info.type.dtype)
            for info in sorted((v for v in executor.values if v.input_index is not None),
                               key=lambda v: v.input_index)]


def random_array(rng: np.random.Generator, shape: Any, dtype: str) -> np.ndarray:
    """Standard-normal values of ``shape`` for a float dtype, coin flips for bool, small
    non-negative integers (0 to 3: valid indices of any non-empty axis) otherwise."""
    shape = tuple(int(d) for d in shape)
    kind = np.dtype(dtype).kind
    if kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(0, 4, shape).astype(dtype)


def alter_layout(mod: IRModule, target: Target | None) -> IRModule:
    """``mod`` with its convolutions' channels rounded up to whole vectors where that pays
    (PadChannelBlocks) and then in the blocked layout of ``target`` (None: the current
    target, else the host) by AlterOpLayout, the constant right operands of products in
    column panels by PackMatmulWeights (all three opt_level 3, unless the pass context disables
    them), and the weights' layout transforms folded into constants; SimplifyExpr again, which
    moves an elementwise operator above the reshapes around a packed product of a batch of
    rows; costly functions of quantized codes become table lookups (TabulateCodes); then a
    channel shuffle that a group-window convolution reads becomes that convolution's
    ``input_shuffle`` (FoldChannelShuffle)."""
    if target is not None and as_target(target).device != "cpu":
        # The GPU schedules read the plain layouts (threads, not vectors, along the rows);
        # convolutions for tensor cores get their input channels in whole 8-steps, and
        # products their constant operands rounded to TF32 once, here.
        return Sequential([PadConvChannels(target), FoldConstant(), RoundTF32Weights(target),
                           InferType()], name="AlterLayout")(mod)
    # SimplifyExpr again: the reshapes around a packed product of a batch of rows keep an
    # elementwise operator after them (a bias) from its epilogue until it moves above them.
    return Sequential([PadChannelBlocks(target), AlterOpLayout(target),
                       PackMatmulWeights(target), FoldConstant(), WordConvolutions(target),
                       SimplifyExpr(), TabulateCodes(), FoldChannelShuffle(), InferType()],
                      name="AlterLayout")(mod)


def fuse(mod: IRModule, strategy: str, opt_level: int) -> IRModule:
    """Group ``mod``'s operators into primitive functions by the registered fusion strategy
    ``strategy`` (see ``opf.transform.fusion_strategies()``).

    Checked gathers are legalized first, whatever the strategy and level (a pass list cannot
    turn this off): the groups must hold the ``check_indices`` steps, since a kernel clamps
    an out-of-range index that the reference refuses. A group that ends in a dequantize
    then writes its 8-bit codes for its readers to dequantize (NarrowGroupOutputs, at
    opt_level 3)."""
    pipeline = get_fusion_strategy(strategy).pipeline
    fused = pipeline(LegalizeCheckedIndices()(mod), opt_level)
    return Sequential([NarrowGroupOutputs()], name="NarrowGroups")(fused)


def build_executor(mod: IRModule, backend: Backend | None = None,
                   records: Any = None) -> Executor:
    """An executor for a fused module: one kernel per primitive function called by
    ``@main`` (identical functions share a kernel), generated by ``backend`` (default: the
    current target's), each scheduled by the best config of ``records`` (a
    :class:`~opfusion.autotune.records.TuningRecords`) for it, else by the heuristic."""
    main = mod["main"]
    with stage("lower"):
        builder = _ExecutorBuilder(main, backend or get_backend(), records)
    return builder.finish()


TUNE_RECORDS = "tune.records"
register_pass_config(
    TUNE_RECORDS, str, "",
    "The tuning records (a JSON-lines file written by opf.tune / `opfusion tune`) that "
    "opf.compile takes each group's schedule config from, when compile's records argument "
    "is not given; empty: none.")


def _tuning_records(records: Any) -> Any:
    """``records`` (or the pass context's ``tune.records`` path) as TuningRecords; None
    when there are none."""
    from ..autotune.records import as_records

    if records is None:
        records = PassContext.current().get_config(TUNE_RECORDS, "") or None
    return as_records(records)


INPLACE_CONCATENATE = "compile.inplace_concatenate"
register_pass_config(
    INPLACE_CONCATENATE, bool, True,
    "Concatenations of intermediates whose operands are contiguous pieces of the result "
    "(along the channels at batch 1) run in place: each operand's kernel writes its piece of "
    "the result and no kernel copies them (the memory plan aliases the operands into it).")
INPLACE_RESHAPE = "compile.inplace_reshape"
register_pass_config(
    INPLACE_RESHAPE, bool, True,
    "Kernels that only reshape an intermediate (the same elements in the same order), or "
    "slice one contiguous piece of it, are not run: the memory plan places the intermediate "
    "where the result is, or the slice where it lies in the intermediate.")


class _ExecutorBuilder:
    def __init__(self, main: Function, backend: Backend, records: Any = None) -> None:
        self.backend = backend
        self.records = records
        self.values: list[ValueInfo] = []
        self.steps: list[ExecStep] = []
        self.kernels: list[tuple[Function, LoweredGroup]] = []
        self.kernel_by_hash: dict[int, list[int]] = {}
        #: what every call of each distinct primitive function passes as constants
        #: (:func:`call_facts`, joined over its calls), by structural hash
        self.facts_by_hash: dict[int, list[tuple[Function, dict[int, Fact]]]] = {}
        self._gather_facts(main)
        #: the slices read in place (see _slice_view), aliased into the values they slice
        self.views: list[int] = []
        self.value_of: dict[Expr, Any] = {}
        self.input_names: list[str] = []
        for index, param in enumerate(main.params):
            if not isinstance(param.type_annotation, TensorType):
                raise OpfusionError(f"model input %{param.name_hint} is "
                                    f"{param.type_annotation!r}; inputs must be tensors")
            self.value_of[param] = self._new_value(param.type_annotation, input_index=index)
            self.input_names.append(param.name_hint)
        for node in post_order(main.body, into_functions=False):
            if node not in self.value_of:
                self.value_of[node] = self._visit(node)
        result = self.value_of[main.body]
        self.tuple_output = isinstance(main.body.checked_type, TupleType)
        self.outputs = _flatten(result)
        # The model's output names (an ONNX graph's), when @main records as many as it has.
        self.output_names = check_output_names(main.attrs.get("output_names"),
                                               len(self.outputs))

    def _new_value(self, ty: TensorType, **kwargs: Any) -> int:
        self.values.append(ValueInfo(ty, **kwargs))
        return len(self.values) - 1

    def _visit(self, node: Expr) -> Any:
        if isinstance(node, Constant):
            return self._new_value(node.checked_type, constant=node.data)
        if isinstance(node, Tuple):
            return [self.value_of[f] for f in node.fields]
        if isinstance(node, TupleGetItem):
            return self.value_of[node.tuple_value][node.index]
        if isinstance(node, Call):
            func = node.op
            if isinstance(func, Op):
                func = _wrap_op_call(node)
            if not isinstance(func, Function) or not func.is_primitive:
                raise OpfusionError(f"the fused module calls {node.op!r}; opf.compile runs "
                                    f"operators and primitive functions only")
            return self._call_group(func, node.args)
        if isinstance(node, Function):
            return None  # a primitive function value: handled at its call
        raise OpfusionError(f"opf.compile cannot run a {type(node).__name__} here")

    def _gather_facts(self, main: Function) -> None:
        """The facts of the constants each primitive function's calls pass, joined over its
        calls (so that identical layers of different weights still share one kernel)."""
        for node in post_order(main.body, into_functions=False):
            if not (isinstance(node, Call) and isinstance(node.op, Function)
                    and node.op.is_primitive):
                continue
            facts = call_facts(node.args, self.backend.target.allow_tf32)
            entries = self.facts_by_hash.setdefault(structural_hash(node.op), [])
            for index, (known, joined) in enumerate(entries):
                if structural_equal(known, node.op):
                    entries[index] = (known, join_facts(joined, facts))
                    break
            else:
                entries.append((node.op, facts))

    def _facts_of(self, func: Function, key: int) -> dict[int, Fact]:
        """The joined facts of ``func`` (its structural hash ``key``)."""
        for known, facts in self.facts_by_hash.get(key, []):
            if structural_equal(known, func):
                return facts
        return {}

    def _call_group(self, func: Function, args: tuple[Expr, ...]) -> Any:
        reads = [v for arg in args for v in _flatten(self.value_of[arg])]
        group = self._kernel_for(func)
        reads += [self._new_value(TensorType(c.shape, c.dtype), constant=c)
                  for c in group.constants]
        writes = [self._new_value(ty) for ty in group.output_types]
        self.steps.append(ExecStep(group, None, reads, writes))
        ret = func.body.checked_type
        return writes if isinstance(ret, TupleType) else writes[0]

    def _kernel_for(self, func: Function) -> LoweredGroup:
        key = structural_hash(func)
        for index in self.kernel_by_hash.get(key, []):
            known, group = self.kernels[index]
            if structural_equal(known, func):
                return group
        name = _kernel_name(func, len(self.kernels))
        # before lowering, which would meet a result no allocation holds (or no int64
        # indexes) as an overflow that does not say which kernel
        ret = func.body.checked_type
        check_values((f"the result of kernel {name}", ty)
                     for ty in (ret.fields if isinstance(ret, TupleType) else [ret])
                     if isinstance(ty, TensorType))
        config = None if self.records is None else tuned_config(func, self.backend,
                                                                  self.records)
        group = lower_primitive_function(func, name, self.backend, config,
                                         self._facts_of(func, key))
        check_kernel(name, group.op_names, group.prim_func and group.prim_func.body)
        self.kernel_by_hash.setdefault(key, []).append(len(self.kernels))
        self.kernels.append((func, group))
        return group

    def finish(self) -> Executor:
        check_values(model_values(self.values, self.steps, self.input_names))  # before any C
        aliases = self._concatenate_in_place()
        plan = self._plan_memory(aliases)
        used = {step.group.name for step in self.steps}
        groups = [group for _, group in self.kernels
                  if group.prim_func is not None and group.name in used]
        functions: dict[str, Any] = {}
        source = ""
        if groups:
            position = {g.name: k for k, g in enumerate(groups)}
            layout = model_layout(self.values, self.steps, self.outputs, plan,
                                  [position.get(s.group.name, NO_KERNEL) for s in self.steps])
            with stage("generate C"):
                source, parts = self.backend.generate(
                    [g.prim_func for g in groups], model=layout if layout.fits_int64 else None)
            with stage("load kernels"):  # the C compiler's time is its own stage, inside
                modules = self.backend.load(source, [(g.name, part.entry_name, part.params)
                                                     for g, part in zip(groups, parts)])
            functions = {g.name: module for g, module in zip(groups, modules)}
        for step in self.steps:
            module = functions.get(step.group.name)
            step.function = None if module is None else module._function
        executor = Executor(self.input_names, self.values, self.steps, self.outputs, plan,
                            self.tuple_output, self.output_names)
        executor.modules = functions
        executor.source_code = source
        executor.target = self.backend.target
        return executor

    def _concatenate_in_place(self) -> dict[int, tuple[int, int]]:
        context = PassContext.current()
        concatenate = context.get_config(INPLACE_CONCATENATE, True)
        reshape = context.get_config(INPLACE_RESHAPE, True)
        if not (concatenate or reshape):
            return {}
        return self._alias_concatenations(concatenate, reshape)

    def _alias_concatenations(self, concatenate: bool = True, reshape: bool = True
                              ) -> dict[int, tuple[int, int]]:
        """Remove the steps that only concatenate intermediates along an axis with nothing
        but ones before it (NCHW or NCHW<x>c channels at batch 1, so each operand is one
        contiguous piece of the result), having their operands written where the result
        has them instead: the aliases (operand: (result, byte offset)) for the memory plan.
        An operand qualifies when a step writes it (or it is such a result itself: DenseNet's
        growing concatenations nest), it is no model output, this is the only concatenation
        it is placed in, and its offset is aligned; a concatenation whose operands do not
        all qualify stays a copy. Saves a pass over memory per concatenation, and DenseNet's
        copies of every earlier feature map at each layer. A step that only reshapes an
        intermediate is a concatenation of one operand (``reshape``): ViT's reshapes of
        each layer norm's result for the product after it. A step that only slices one
        contiguous piece of an intermediate (also under ``reshape``) becomes a view of it
        (:meth:`_slice_view`), recorded in ``self.views``."""
        keep = set(self.outputs)
        written = {value for step in self.steps for value in step.writes}
        aliases: dict[int, tuple[int, int]] = {}
        kept_steps = []
        for step in self.steps:
            placed = None
            if concatenate:
                placed = self._concatenation_offsets(step, keep, written, aliases)
            if placed is None and reshape and _is_reshape(step.group):
                placed = self._concatenation_offsets(step, keep, written, aliases, whole=True)
            if placed is None and reshape and _is_byte_view(step.group):
                placed = self._concatenation_offsets(step, keep, written, aliases, whole=True,
                                                     same_dtype=False)
            if placed is None and reshape:
                view = self._slice_view(step, keep, written, aliases)
                if view is not None:
                    aliases[step.writes[0]] = (step.reads[0], view)
                    self.views.append(step.writes[0])
                    continue
            if placed is None:
                kept_steps.append(step)
                continue
            for value, offset in zip(step.reads, placed):
                aliases[value] = (step.writes[0], offset)
        self.steps = kept_steps
        return aliases

    def _concatenation_offsets(self, step: ExecStep, keep: set[int], written: set[int],
                               aliases: dict[int, tuple[int, int]], whole: bool = False,
                               same_dtype: bool = True) -> list[int] | None:
        """The byte offsets of a step's operands in its result when the step is a
        concatenation that can be done in place (see :meth:`_concatenate_in_place`);
        ``whole``: the step is known to place its one operand whole (a reshape), in the same
        dtype unless not ``same_dtype`` (bytes read as words: :func:`_is_byte_view`)."""
        axis = 0 if whole else _concatenation_axis(step.group)
        if axis is None or len(step.writes) != 1 or step.writes[0] in keep:
            return None
        result = self.values[step.writes[0]].type
        if any(int(d) != 1 for d in result.shape[:axis]):
            return None
        offsets, offset = [], 0
        if len(set(step.reads)) != len(step.reads):  # an operand twice: it has one place
            return None
        for value in step.reads:
            ty = self.values[value].type
            if (value in keep or value not in written or value in aliases
                    or (same_dtype and ty.dtype != result.dtype) or offset % ALIGNMENT):
                return None
            offsets.append(offset)
            offset += ty.nbytes
        return offsets if offset == result.nbytes else None

    def _slice_view(self, step: ExecStep, keep: set[int], written: set[int],
                    aliases: dict[int, tuple[int, int]]) -> int | None:
        """The byte offset of a slice's result in its operand when the step only slices an
        intermediate into one contiguous piece (a range of one axis with nothing but ones
        before it: a split's part along the channels or channel blocks at batch 1), so that
        the result can be a view of the operand: no step copies it. None otherwise, or when
        either is a model output, the operand is not an intermediate some step writes, or
        the offset is not aligned."""
        if len(step.reads) != 1 or len(step.writes) != 1:
            return None
        source, result = step.reads[0], step.writes[0]
        if source in keep or result in keep or source not in written or result in aliases:
            return None
        offset = _contiguous_slice_offset(step.group)
        return offset if offset is not None and offset % ALIGNMENT == 0 else None

    def _plan_memory(self, aliases: dict[int, tuple[int, int]]) -> MemoryPlan:
        """The static memory plan of the intermediates (every value a step writes that is not
        an output, and the results of in-place concatenations), checked against the size
        limits."""
        keep = set(self.outputs)
        nbytes = {}
        # (a slice read in place is written by no step: its reads keep its holder alive)
        for value in [*(v for step in self.steps for v in step.writes),
                      *(holder for holder, _ in aliases.values()), *aliases]:
            if value not in keep:
                nbytes[value] = self.values[value].type.nbytes
        with stage("plan memory"):
            plan = plan_memory(steps_for_plan(self.steps), nbytes, keep=list(keep),
                               aliases=aliases, views=self.views)
        check_values([], plan.total_bytes)
        return plan


def tuned_config(func: Function, backend: Backend, records: Any) -> Any:
    """The best config ``records`` hold for primitive function ``func`` on the backend's
    target, checked against the group's config space now (a record from another opfusion
    version or a damaged file never reaches the schedule); None for the heuristic."""
    from ..autotune.task import target_key, task_key
    from .lower_group import schedule_space

    target = backend.target
    record = records.best(task_key(func, target), target_key(target))
    if record is None:
        return None
    found = schedule_space(func, backend)
    if found is None or found[0].name != record.rule or record.knobs not in found[1]:
        log.warning("the tuning record of a %s group does not fit its schedule now (rule "
                    "%s, knobs %s); the heuristic's config is used", "+".join(record.ops),
                    record.rule, record.knobs)
        return None
    return found[1].check(record.knobs)


def _is_reshape(group: LoweredGroup) -> bool:
    """Whether a kernel only reshapes its one parameter (reshape-like operators: the same
    elements in the same row-major order, in the same dtype)."""
    func = group.function
    if func is None or group.constants or len(func.params) != 1:
        return False
    node = func.body
    while isinstance(node, Call) and isinstance(node.op, Op) and node.op.name in RESHAPE_OPS:
        node = node.args[0]
    return (node is func.params[0] and isinstance(func.body, Call)
            and func.body.checked_type.dtype == node.checked_type.dtype)


def call_facts(args: tuple[Expr, ...], tf32: bool = False) -> dict[int, Fact]:
    """The facts (:class:`~opfusion.tir.nan_free.Fact`: bounds, NaN, zero; TF32 with
    ``tf32``) of a group call's constant arguments, by kernel input position: what the code
    generator may assume of them (a quantized epilogue's scales and biases, lifted out of
    their group; a product's weights rounded to TF32). None known for a call with a tuple
    argument (its positions are not the arguments')."""
    if any(not isinstance(arg.checked_type, TensorType) for arg in args):
        return {}
    return constant_facts([arg.data if isinstance(arg, Constant) else None for arg in args], 0,
                          tf32)


def _is_byte_view(group: LoweredGroup) -> bool:
    """Whether a kernel only packs its one parameter's bytes into int32 words that are the
    same memory: ``nn.byte_words`` of uint8 values, four a word, along an axis of whole words
    (a little-endian word's first byte is its lowest), so the words can be a view of the
    bytes (a quantized convolution's or product's input: no kernel, no copy)."""
    func = group.function
    if (func is None or group.constants or len(func.params) != 1 or sys.byteorder != "little"
            or not isinstance(func.body, Call) or not isinstance(func.body.op, Op)
            or func.body.op.name != "nn.byte_words" or func.body.args[0] is not func.params[0]):
        return False
    data = func.params[0].checked_type
    return (func.body.attrs.per_word == 4 and data.dtype == "uint8" and data.ndim >= 1
            and data.shape[-1] % 4 == 0)


def _contiguous_slice_offset(group: LoweredGroup) -> int | None:
    """The byte offset of a kernel's result in its one parameter when the kernel is one
    ``strided_slice`` of it whose result is a contiguous piece of it (see
    :meth:`_ExecutorBuilder._slice_view`); None for any other kernel."""
    func = group.function
    if func is None or group.constants or group.op_names != ["strided_slice"] \
            or len(func.params) != 1:
        return None
    body = func.body
    if not (isinstance(body, Call) and isinstance(body.op, Op) and body.args[0] is func.params[0]
            and isinstance(body.checked_type, TensorType)):
        return None
    shape = tuple(int(d) for d in func.params[0].checked_type.shape)
    ranges = [range(*piece.indices(dim))
              for piece, dim in zip(body.op.slices(shape, body.attrs), shape)]
    partial = [axis for axis, (part, dim) in enumerate(zip(ranges, shape))
               if len(part) != dim or (dim > 1 and part.step != 1)]
    if len(partial) > 1 or any(dim != 1 for dim in shape[:partial[0] if partial else 0]):
        return None
    if not partial:
        return 0
    axis = partial[0]
    part = ranges[axis]
    if part.step != 1 or len(part) == 0:
        return None
    return part.start * math.prod(shape[axis + 1:]) * np.dtype(body.checked_type.dtype).itemsize


def _concatenation_axis(group: LoweredGroup) -> int | None:
    """The axis of a kernel that is one ``concatenate`` of its parameters, in order (None
    for any other kernel)."""
    func = group.function
    if func is None or group.constants or group.op_names != ["concatenate"]:
        return None
    body = func.body
    if not (isinstance(body, Call) and isinstance(body.op, Op)
            and body.op.name == "concatenate"):
        return None
    operand = body.args[0]
    # its operands: a tuple of the parameters in order, or one tuple parameter (fusion none)
    fields = operand.fields if isinstance(operand, Tuple) else [operand]
    if len(fields) != len(func.params) or any(f is not p for f, p in zip(fields, func.params)):
        return None
    rank = len(body.checked_type.shape)
    axis = int(body.attrs.axis)
    return axis + rank if axis < 0 else axis


def _wrap_op_call(call: Call) -> Function:
    """A lone operator call outside any group, as a primitive function of its operands."""
    params = [Var(f"p{i}", arg.checked_type) for i, arg in enumerate(call.args)]
    return Function(params, Call(call.op, params, call.attrs), attrs={"Primitive": 1})


def _flatten(value: Any) -> list[int]:
    if isinstance(value, list):
        return [v for item in value for v in _flatten(item)]
    return [value]


def _kernel_name(func: Function, index: int) -> str:
    """``fused_<first operators>_<index>``: the index makes the name unique, so only the
    descriptive stem is ever shortened, to fit the C code generator's identifier length."""
    names = [n.op.name for n in post_order(func.body, into_functions=False)
             if isinstance(n, Call) and isinstance(n.op, Op)]
    stem = "_".join(re.sub(r"[^A-Za-z0-9]", "_", name) for name in names[:4])
    suffix = f"_{index}"
    room = max(0, MAX_NAME_LENGTH - len("fused_") - len(suffix))
    return f"fused_{stem[:room]}".rstrip("_") + suffix
