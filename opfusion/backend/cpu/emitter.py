"""The CPU emitter: one PrimFunc becomes one exported C function with GCC vectors and OpenMP.

The function is ``int32_t name(T0* restrict p0, ...)``, one pointer per buffer parameter in
the PrimFunc's order (``const`` for the buffers it only reads); it returns 0 (``KERNEL_OK``),
-1 (``KERNEL_NO_MEMORY``) when a heap scratch buffer could not be allocated, or -2
(``KERNEL_CANCELLED``) when it was asked to stop: each iteration of every PARALLEL or outermost
loop that holds other loops first reads ``*opf_cancel_flag``, an ``int32_t volatile*`` that the
file exports (pointing at a zero that nothing sets); when the flag is set the iteration is
skipped and the kernel returns -2 with its outputs unfinished. The host points
the flag at one it sets on Ctrl-C (:mod:`opfusion.runtime.interrupt`, which also defines
the status codes). Loops map to C as follows:

- PARALLEL: ``#pragma omp parallel for schedule(static)`` (see ``omp_schedule``), or a plain
  loop in a kernel whose work is below the target's ``min_parallel_work``;
- VECTORIZED: straight-line code on GCC vector types as wide as the target's vector registers
  when the body allows it (see :mod:`.vector`), otherwise a plain loop under
  ``#pragma omp simd``. Code generation never adds a guard inside a vectorized loop;
- an accumulation nest: a register tile (see :mod:`.regtile`);
- UNROLLED: ``#pragma GCC unroll N``;
- SERIAL: a plain ``for``.

Local allocations become aligned stack arrays up to :attr:`CodegenOptions.stack_bytes` and
64-byte aligned heap blocks beyond. Which loops become vector code or register tiles, and
where streaming stores need a fence, is decided before printing by
:func:`.loop_planning.plan_loops` for the :class:`~opfusion.target.Target`; this module reads
the plans. Everything else (expressions, plain statements, names) is the C-family printing of
:class:`~opfusion.backend.c_family.CFamilyEmitter`. All kernels of a model go in one file with
one kernel table (:func:`kernel_table_c`), laid out in sections (:func:`assemble_c`) that the
toolchain compiles as several translation units in parallel; the same PrimFuncs and target
always give byte-identical source."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import BuildError
from ...runtime.interrupt import CANCEL_FLAG_SYMBOL, KERNEL_CANCELLED
from ...runtime.model_layout import ModelLayout
from ...target import Target, as_target
from ...tir import expr as E
from ...tir import stmt as S
from ...tir.shared_values import bind_shared_values
from ...tir.work import kernel_work
from ..c_family import CFamilyEmitter, WorkItem, has_inner_loop
from ..c_names import NameTable, c_type, sanitize_identifier
from .loop_planning import LoopPlans, plan_loops
from .model_entry import MODEL_TYPES_C, model_entry_c
from .module import (
    DTYPE_CODES,
    KERNEL_TABLE_MAGIC,
    KERNEL_TABLE_SYMBOL,
    KERNEL_TABLE_VERSION,
    KernelParam,
)
from .regtile import MatrixTileEmitter, RegisterTileEmitter
from .units import SECTION_MARKER
from .vector import VectorEmitter
from .vector_math import (
    HELPER_INTRINSICS,
    WORD_DOTS,
    expand_intrinsics,
    scalar_exp_helper,
)

#: The helper key of the cancel flag's declaration (its definition is in the table section).
_CANCEL_FLAG_HELPER = "0_opf_cancel_flag"


#: Work (innermost statement executions) from which a parallel loop is scheduled ``guided``
#: rather than ``static`` when a whole model is compiled: OpenMP's guided schedule hands out
#: halving chunks, so a thread that a busy (virtual) machine slows does not hold the other
#: at the loop's end, as static halves do; below it, static's fixed halves keep each thread's
#: data in its own cache from kernel to kernel and cost no atomics. First 10^7, measured on
#: 2 vCPUs of a Zen 3 host (AVX2), each model compiled both ways and run interleaved in one
#: process: ResNet-50 (convolution loops of 5e7 statements and more) 1.02-1.03x faster, and
#: 1.13x while the host was busy; DenseNet-121 1.04x, AlexNet 1.02x, SqueezeNet 1.00-1.05x,
#: Inception-v1 0.99x. On a Xeon with AVX-512 and 2 MB of L2 a core, a guided producer
#: scattered the rows that a static consumer then read from the other core's cache:
#: MobileNet v3's 16 -> 64 layer at 112 x 112 (1.3e7) and the depthwise layer after it took
#: 150 + 115 us guided, 125 + 100 static. 10^8 keeps guided for the loops whose data
#: outgrows the L2 anyway (VGG's, ResNet-50's largest): ``benchmarks/ab_checkouts.py``,
#: 10^8 against 10^7, MobileNet v3 0.974x the time, SqueezeNet 0.962x, Inception-v2 0.961x,
#: DenseNet-121 0.968x, ResNet-50 0.978x, VGG-19 0.973x, ShuffleNet v2 1.003x; geomean
#: 0.977 over ten models.
BALANCED_WORK = 10**8


@dataclass(frozen=True)
class CodegenOptions:
    """Choices of the C code generator (the vector width is the target's, not a choice).

    ``stack_bytes``: a local allocation up to this size lives on the stack, larger ones on the
    heap. ``streaming_store_bytes``: vectorized stores to an output parameter at least this
    large, which the kernel never reads back, use non-temporal (streaming) stores that bypass
    the cache; 0 disables them, None (the default) takes a quarter of the target's L3
    (:func:`~.loop_planning.streaming_threshold`). ``omp_schedule``: the OpenMP schedule of
    parallel loops ("static" gives each thread the same iterations on every call, which
    keeps its caches warm; "dynamic" or "guided" balance better on a machine busy with other
    work).
    ``balanced_work``: a parallel loop of at least this much work
    (:func:`opfusion.tir.work.kernel_work`) is scheduled ``guided`` instead of
    ``omp_schedule`` (0: never; see :data:`BALANCED_WORK`).
    ``register_tiles``: emit accumulation nests with named vector accumulators (see
    :mod:`opfusion.backend.cpu.regtile`); False leaves them to the C compiler.
    ``min_parallel_work``: a kernel whose work (:func:`opfusion.tir.work.kernel_work`) is
    below it runs its parallel loops on the calling thread; None takes the target's
    :attr:`~opfusion.target.Target.min_parallel_work` (as whole models are compiled), 0 (the
    default, for a schedule written by hand) keeps every parallel loop."""

    stack_bytes: int = 64 * 1024
    streaming_store_bytes: int | None = None
    omp_schedule: str = "static"
    balanced_work: int = 0
    register_tiles: bool = True
    min_parallel_work: int | None = 0


@dataclass(frozen=True)
class CSource:
    """Generated C: the text, the exported function's name and its parameters."""

    code: str
    entry_name: str
    params: tuple[KernelParam, ...]


@dataclass(frozen=True)
class CParts:
    """The pieces of one generated kernel, for joining several kernels into one file:
    its includes, its helper definitions (by key: equal keys hold equal text) and its
    function."""

    entry_name: str
    params: tuple[KernelParam, ...]
    includes: list[str]
    helpers: dict[str, str]
    function: str


class CPUEmitter(CFamilyEmitter):
    """C for one PrimFunc on a CPU ``target``. Use :func:`codegen_c`; one emitter per
    function."""

    def __init__(self, func: S.PrimFunc, entry_name: str, options: CodegenOptions,
                 target: Target) -> None:
        # Large values a store reads more than once are bound by lets (printed once: see
        # opfusion.tir.shared_values), before the intrinsics bind their arguments.
        super().__init__(expand_intrinsics(bind_shared_values(func)), entry_name)
        self.options = options
        self.target = target
        self.status_name = "opf_status"
        self.vector = VectorEmitter(self, target)
        self.plans: LoopPlans | None = None
        self.serial = False

    def emit_parts(self) -> CParts:
        """Emit the function; its text, includes and helpers."""
        function = self.emit_function()
        params = tuple(KernelParam(buffer.name, buffer.shape, buffer.dtype, written)
                       for buffer, written in self.param_buffers)
        return CParts(self.entry_name, params, sorted(self.includes), dict(self.helpers),
                      function)

    # -- hooks of the C-family emitter ------------------------------------------------------

    def _call(self, node: E.Call, args: list[str]) -> str:
        """The intrinsics :mod:`.vector_math` computes (float32 exp, exp_neg, exp_normal) by
        its scalar helper, the same algorithm as the vector one; ``dot4_u8s8`` and
        ``dot2_s16`` by loops over their parts; the rest as libm calls."""
        if node.name in WORD_DOTS:
            self.need_helper(f"1_opf_{node.name}", WORD_DOTS[node.name]())
            return f"opf_{node.name}({args[0]}, {args[1]})"
        if node.dtype in HELPER_INTRINSICS.get(node.name, ()):
            name = f"opf_{node.name}_{node.dtype}"
            self.includes.add("string.h")
            self.need_helper(f"1_{name}", scalar_exp_helper(name, node.name))
            return f"{name}({args[0]})"
        return super()._call(node, args)

    def begin_body(self) -> None:
        # A kernel too small to pay for waking the other threads runs on the calling one.
        grain = self.options.min_parallel_work
        grain = self.target.min_parallel_work if grain is None else grain
        self.serial = grain > 0 and kernel_work(self.func.body) < grain
        self.plans = plan_loops(self.func, self.target,
                                register_tiles=self.options.register_tiles,
                                streaming_store_bytes=self.options.streaming_store_bytes)
        self.status_name = self.names.reserve("opf_status")

    def end_body(self) -> None:
        assert self.plans is not None
        if self.plans.fence_at_end:
            self._fence(1)
        if self.plans.matrix_tiles:
            # Every thread that ran a task leaves the tiles released (see .matrix_tiles): one
            # parallel region of the same team, not a release per task, whose next task
            # would load the configuration again (0.1 us or more each: ShuffleNet's small
            # 1x1 convolutions, 64 tasks each, 1.2x the model's time).
            if not self.serial:
                self.line(1, "#pragma omp parallel")
            self.line(1, "opf_tiles_release();")

    def function_text(self, declarations: list[str], body: list[str]) -> list[str]:
        """``int32_t name(...)``: returns 0, or the status a heap allocation or a cancel set."""
        signature = ", ".join(declarations) if declarations else "void"
        return [f"int32_t {self.entry_name}({signature}) {{",
                f"  int32_t {self.status_name} = 0;", *body,
                f"  return {self.status_name};", "}"]

    def loop_pragma(self, loop: S.For) -> str | None:
        kind = loop.kind
        if kind is S.ForKind.PARALLEL:
            if self.serial:
                return None
            schedule = self.options.omp_schedule
            if 0 < self.options.balanced_work <= kernel_work(loop):
                schedule = "guided"
            return f"#pragma omp parallel for schedule({schedule})"
        if kind is S.ForKind.VECTORIZED:
            # OpenMP allows no construct inside a simd loop; a vectorized loop around other
            # loops (whose pragmas may be OpenMP ones) gets GCC's dependence hint instead.
            return "#pragma GCC ivdep" if has_inner_loop(loop) else "#pragma omp simd"
        if kind is S.ForKind.UNROLLED:
            extent = loop.extent.value if isinstance(loop.extent, E.IntImm) else 8
            return f"#pragma GCC unroll {max(1, min(extent, 65534))}"
        return None

    def emit_for(self, loop: S.For, indent: int, stack: list[WorkItem]) -> None:
        assert self.plans is not None
        if self.plans.skips(loop):
            return
        tile = self.plans.tile(loop)
        if tile is not None:
            emitter = MatrixTileEmitter if tile.matrix is not None else RegisterTileEmitter
            emitter(self, self.vector, tile).emit(indent)
            return
        plan = self.plans.vector(loop)
        if plan is not None:
            self.vector.emit(loop, plan, indent)
            return
        self.open_loop(loop, indent)
        if (loop.kind is S.ForKind.PARALLEL or self.loop_depth == 0) and has_inner_loop(loop):
            self._emit_cancel_check(indent + 1)
        self.push_loop_close(loop, indent, stack)
        if self.plans.fences(loop):
            stack.append(lambda: self._fence(indent + 1))
        stack.append((loop.body, indent + 1))

    def local_array(self, ctype: str, name: str, size: int) -> str:
        return f"{ctype} {name}[{size}] __attribute__((aligned(64)));"

    def emit_allocate(self, alloc: S.Allocate, indent: int, stack: list[WorkItem]) -> None:
        """Up to :attr:`CodegenOptions.stack_bytes` an aligned stack array; beyond, a 64-byte
        aligned heap block, freed after the body; when it cannot be had the body is skipped
        and the kernel returns -1 (``KERNEL_NO_MEMORY``)."""
        buffer = alloc.buffer
        nbytes = buffer.size * np.dtype(buffer.dtype).itemsize
        if nbytes <= self.options.stack_bytes:
            super().emit_allocate(alloc, indent, stack)
            return
        ctype = c_type(buffer.dtype)
        name = self.bind_buffer(buffer)
        self.includes.add("stdlib.h")
        padded = -(-nbytes // 64) * 64
        self.line(indent, f"{ctype}* restrict {name} = ({ctype}*)aligned_alloc(64, {padded});")
        self.line(indent, f"if ({name} != NULL) {{")
        stack.append(lambda: self.line(indent, "}"))
        stack.append(lambda: self.line(
            indent + 1, f"__atomic_store_n(&{self.status_name}, -1, __ATOMIC_RELAXED);"))
        stack.append(lambda: self.line(indent, "} else {"))
        stack.append(lambda: self.line(indent + 1, f"free({name});"))
        stack.append((alloc.body, indent + 1))

    # -- CPU statements ---------------------------------------------------------------------

    def _emit_cancel_check(self, indent: int) -> None:
        """The first statement of an iteration of a parallel or outermost loop that holds other
        loops: when the host has set ``*opf_cancel_flag``, skip the iteration (``continue``,
        the only way out of an OpenMP loop) and make the kernel return ``KERNEL_CANCELLED``.
        One predictable load per iteration of a loop whose iterations are whole tasks: no
        measurable cost, and a cancelled kernel stops within one task. A loop without inner
        loops is left alone: its iterations are single elements (too cheap to be worth a
        check, and a check would keep GCC from vectorizing it)."""
        self.need_helper(_CANCEL_FLAG_HELPER,
                         f"extern int32_t volatile* {CANCEL_FLAG_SYMBOL};")
        self.line(indent, f"if (__builtin_expect(*{CANCEL_FLAG_SYMBOL} != 0, 0)) {{ "
                          f"__atomic_store_n(&{self.status_name}, {KERNEL_CANCELLED}, "
                          "__ATOMIC_RELAXED); continue; }")


    def _fence(self, indent: int) -> None:
        self.line(indent, "opf_stream_fence();")


def assemble_c(parts: list[CParts], header: str, model: ModelLayout | None = None) -> str:
    """One C file holding every kernel of ``parts``, in sections the toolchain can compile as
    separate translation units (:func:`~.units.translation_units`):

    - the prelude: includes and helpers (types, ``static inline`` functions, declarations:
      no definition that two units could both hold);
    - one section per kernel (``//@opfusion-section kernel <name>``): its function, global
      with default visibility, as in a one-unit build;
    - the table section (``//@opfusion-section table``): a prototype of every kernel, the
      cancel flag's definition and the kernel table with the thunks, and the model's native
      entry when ``model`` (its layout) is given (see :mod:`.model_entry`).

    The whole file is also one valid translation unit (the toolchain compiles it so when it
    is small), so the library's exported symbols do not depend on how it was split: the
    kernels, ``opf_kernel_table``, ``opf_cancel_flag`` and the entry's two hook pointers."""
    includes = {name for part in parts for name in part.includes}
    if model is not None:
        includes |= {"omp.h", "string.h"}
    helpers: dict[str, str] = {}
    for part in parts:
        for key, text in part.helpers.items():
            helpers.setdefault(key, text)
    out = [header]
    out += [f"#include <{name}>" for name in sorted(includes)]
    out.append("")
    # Types first, then functions; within each, the order of first use (which puts a helper
    # after the helpers it calls, and is deterministic).
    for key in sorted(helpers, key=lambda k: k.split("_", 1)[0]):
        out.append(helpers[key])
    if helpers:
        out.append("")
    for part in parts:
        out.append(f"{SECTION_MARKER}kernel {part.entry_name}")
        out.append(part.function)
        out.append("")
    out.append(f"{SECTION_MARKER}table")
    out += [prototype(part) for part in parts]
    if _CANCEL_FLAG_HELPER in helpers:
        out += cancel_flag_c()
    out += kernel_table_c(parts, model)
    return "\n".join(out).rstrip("\n") + "\n"


def prototype(part: CParts) -> str:
    """The declaration of a kernel: its definition's first line, ending in ``;``."""
    first_line = part.function.split("\n", 1)[0]
    assert first_line.endswith(" {"), first_line
    return first_line.removesuffix(" {") + ";"


def cancel_flag_c() -> list[str]:
    """The definition of ``opf_cancel_flag`` (declared ``extern`` in the prelude): a pointer
    to a zero that nothing sets, until the host points it at its own flag."""
    return ["static volatile int32_t opf_cancel_never = 0;",
            f"int32_t volatile* {CANCEL_FLAG_SYMBOL} = &opf_cancel_never;"]


def kernel_table_c(parts: list[CParts], model: ModelLayout | None = None) -> list[str]:
    """Lines of C defining ``opf_kernel_table()``: what the library holds, for the loader.

    The table lists every kernel of the file with its exported name, a pointer to the
    function and, per parameter, the dtype code, rank, dimensions and whether the kernel
    writes it, and its thunk (:func:`thunk_c`); the table also points at the model's native
    entry and its tables when ``model`` is given (:mod:`.model_entry`), else holds a null
    pointer there (layout: :mod:`opfusion.backend.cpu.module`). The loader takes
    function pointers from this table and never looks a symbol up by a name it was given, so a
    library can only be asked to run its own kernels, with the shapes they were compiled for.
    Names are written with the preprocessor's ``#`` (they are plain identifiers), so the file
    has no string literal."""
    lines = [
        "#define OPF_NAME(x) #x",
        "typedef int32_t (*opf_entry_t)(void);",
        "typedef int32_t (*opf_thunk_t)(void* const*);",
        "typedef struct { int32_t dtype; int32_t rank; int32_t written; int32_t reserved; "
        "const int64_t* dims; } opf_param_info_t;",
        "typedef struct { const char* name; opf_entry_t function; int32_t num_params; "
        "int32_t reserved; const opf_param_info_t* params; opf_thunk_t thunk; } "
        "opf_kernel_info_t;",
        *MODEL_TYPES_C,
        "typedef struct { uint32_t magic; uint32_t version; int64_t num_kernels; "
        "const opf_kernel_info_t* kernels; const opf_model_info_t* model; } "
        "opf_kernel_table_t;",
    ]
    kernels = []
    for k, part in enumerate(parts):
        infos = []
        for p, param in enumerate(part.params):
            dims = "0"
            if param.shape:
                dims = f"opf_dims_{k}_{p}"
                values = ", ".join(str(int(d)) for d in param.shape)
                lines.append(f"static const int64_t {dims}[] = {{{values}}};")
            infos.append(f"{{{DTYPE_CODES[param.dtype]}, {len(param.shape)}, "
                         f"{int(param.written)}, 0, {dims}}}")
        params = "0"
        if infos:
            params = f"opf_params_{k}"
            lines.append(f"static const opf_param_info_t {params}[] = {{{', '.join(infos)}}};")
        lines.append(thunk_c(f"opf_thunk_{k}", part))
        kernels.append(f"{{OPF_NAME({part.entry_name}), (opf_entry_t){part.entry_name}, "
                       f"{len(part.params)}, 0, {params}, opf_thunk_{k}}}")
    table = "0"
    if kernels:
        table = "opf_kernels"
        lines.append("static const opf_kernel_info_t opf_kernels[] = {")
        lines += [f"  {entry}," for entry in kernels]
        lines.append("};")
    entry = "0"
    if model is not None and kernels:
        lines += model_entry_c(model)
        entry = "&opf_model_info"
    lines.append(f"static const opf_kernel_table_t opf_table = {{{KERNEL_TABLE_MAGIC}u, "
                 f"{KERNEL_TABLE_VERSION}u, {len(kernels)}, {table}, {entry}}};")
    lines.append(f"const opf_kernel_table_t* {KERNEL_TABLE_SYMBOL}(void) {{ return &opf_table; }}")
    return lines


def thunk_c(name: str, part: CParts) -> str:
    """A kernel's uniform entry: ``int32_t name(void* const* args)`` calls the kernel with
    ``args[i]`` as its i-th pointer, converted to the parameter's type. Every thunk has the
    same C type, so the model's entry (:mod:`.model_entry`) calls any kernel through one
    function-pointer type, as C allows (casting the kernels themselves to one type would
    not be)."""
    args = ", ".join(f"({'' if p.written else 'const '}{c_type(p.dtype)}*)a[{i}]"
                     for i, p in enumerate(part.params))
    unused = "" if part.params else " (void)a;"
    return f"static int32_t {name}(void* const* a) {{{unused} return {part.entry_name}({args}); }}"


def codegen_c_module(funcs: list[S.PrimFunc], options: CodegenOptions | None = None,
                     header: str = "// Generated by opfusion. Do not edit; rebuild instead.",
                     target: str | Target | None = None, model: ModelLayout | None = None
                     ) -> tuple[str, list[CParts]]:
    """One C file for several kernels, for ``target`` (None: the current target);
    ``parts[i].entry_name`` is the C name of ``funcs[i]``. With ``model`` (a layout whose
    kernel indices are positions in ``funcs``) the file also holds the model's native entry.

    Exported names are handed out by one name table for the whole file, so they differ even
    when kernel names are equal or differ only beyond :data:`MAX_NAME_LENGTH` characters."""
    cpu = _cpu_target(target)
    options = options or CodegenOptions()
    parts = []
    entry_names = NameTable()
    seen: dict[str, str] = {}
    for func in funcs:
        emitter = CPUEmitter(func, entry_names.fresh(func.name), options, cpu)
        part = emitter.emit_parts()
        if part.entry_name in seen:  # the name table rules this out; a wrong build must not link
            raise BuildError(f"kernels {seen[part.entry_name]!r} and {func.name!r} both export "
                             f"the C name {part.entry_name!r}")
        seen[part.entry_name] = func.name
        parts.append(part)
    return assemble_c(parts, header, model), parts


def codegen_c(func: S.PrimFunc, name: str | None = None,
              options: CodegenOptions | None = None,
              target: str | Target | None = None) -> CSource:
    """Generate C for ``func`` on ``target`` (a CPU target; None: the current target, e.g.
    ``Target("c -mattr=+avx512f")`` gives 64-byte vectors); the exported function is
    ``name`` (default ``func.name``), sanitized to a safe C identifier."""
    if not isinstance(func, S.PrimFunc):
        raise BuildError(f"codegen_c needs a PrimFunc, got {type(func).__name__}")
    emitter = CPUEmitter(func, func.name if name is None else name,
                         options or CodegenOptions(), _cpu_target(target))
    part = emitter.emit_parts()
    header = (f"// Generated by opfusion: kernel {sanitize_identifier(func.name)!s}. "
              "Do not edit; rebuild instead.")
    return CSource(assemble_c([part], header), part.entry_name, part.params)


def _cpu_target(target: str | Target | None) -> Target:
    resolved = as_target(target)
    if resolved.device != "cpu":
        raise BuildError(f"the C code generator emits code for CPU targets, not {resolved}")
    return resolved
