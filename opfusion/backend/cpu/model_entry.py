"""The model's native entry: the C that runs every kernel of a model in order, in one call.

A library built for a whole model (``opf.compile``) holds, besides its kernels, the model's
layout (:class:`opfusion.compiler.model_layout.ModelLayout`) as static tables and one function
over them::

    typedef struct {
      const void* const* constants; const void* const* inputs; void* const* outputs;
      void* workspace; int64_t failed; int32_t num_threads; int32_t reserved;
    } opf_model_call_t;
    int32_t opf_model_run(int64_t first, int64_t stop, opf_model_call_t* call);

(the call's pointers in a struct the caller keeps ready: a foreign call of three arguments
costs Python less than one of eight). It calls the kernels of steps ``first`` to
``stop - 1`` (through their thunks, skipping the steps without a kernel, which the caller
runs), each on pointers into the four places a
value can live (constants, inputs, outputs, the workspace at a byte offset), and after the
last step copies the outputs that no kernel writes in place. It returns 0, or the first
failing kernel's status with its step in ``call->failed`` (-3 for a range outside the
model).
``num_threads > 0`` runs the kernels on that many OpenMP threads (the calling thread's
setting is restored before returning). The library's ``opf_run_begin_hook`` and
``opf_run_end_hook``, null unless the host sets them (:func:`opfusion.runtime.interrupt.
connect`), bracket each call: the Ctrl-C bookkeeping costs the host no call of its own.

The tables are reachable from the kernel table (``opf_model_info_t``), so that the loader
can read them back and check them against the layout it derives itself before it calls the
entry (see :mod:`opfusion.backend.cpu.module`). The tables are data, not code: a model of
10^5 steps costs the C compiler a few large arrays, not a function of 10^5 calls."""

from __future__ import annotations

from ...runtime.model_layout import MODEL_BAD_RANGE, ModelArg, ModelLayout

#: Type declarations shared by the library's model tables and the loader's ctypes mirror.
MODEL_TYPES_C = [
    "typedef struct { int32_t kind; int32_t index; int64_t offset; } opf_model_arg_t;",
    "typedef struct { int32_t output; int32_t reserved; opf_model_arg_t source; "
    "int64_t nbytes; } opf_model_copy_t;",
    "typedef struct { const void* const* constants; const void* const* inputs; "
    "void* const* outputs; void* workspace; int64_t failed; int32_t num_threads; "
    "int32_t reserved; } opf_model_call_t;",
    "typedef int32_t (*opf_model_run_t)(int64_t, int64_t, opf_model_call_t*);",
    "typedef struct { int64_t num_steps; const int32_t* step_kernels; const int64_t* "
    "step_args; const opf_model_arg_t* args; int64_t num_copies; const opf_model_copy_t* "
    "copies; int64_t num_constants; const int64_t* constant_bytes; int64_t num_inputs; "
    "const int64_t* input_bytes; int64_t num_outputs; const int64_t* output_bytes; "
    "int64_t workspace_bytes; int64_t max_args; opf_model_run_t run; } opf_model_info_t;",
]


def _array(ctype: str, name: str, items: list[str]) -> list[str]:
    """A static const array (one dummy element when empty: C has no empty arrays), eight
    items a line."""
    if not items:
        items = ["{0, 0, 0}"] if ctype == "opf_model_arg_t" else ["0"]
    lines = [f"static const {ctype} {name}[] = {{"]
    for start in range(0, len(items), 8):
        lines.append("  " + ", ".join(items[start:start + 8]) + ",")
    lines.append("};")
    return lines


def _arg(arg: ModelArg) -> str:
    return f"{{{arg.kind}, {arg.index}, {arg.offset}}}"


def model_tables_c(layout: ModelLayout) -> list[str]:
    """The layout as static arrays (``opf_model_*``)."""
    args = [a for step in layout.step_args for a in step]
    starts, total = [], 0
    for step in layout.step_args:
        starts.append(str(total))
        total += len(step)
    starts.append(str(total))
    copies = [f"{{{c.output}, 0, {_arg(c.source)}, {c.nbytes}}}" for c in layout.copies]
    lines: list[str] = []
    lines += _array("int32_t", "opf_model_step_kernels", [str(k) for k in layout.step_kernels])
    lines += _array("int64_t", "opf_model_step_args", starts)
    lines += _array("opf_model_arg_t", "opf_model_args", [_arg(a) for a in args])
    if copies:
        lines += _array("opf_model_copy_t", "opf_model_copies", copies)
    for name, sizes in (("constant", layout.constant_bytes), ("input", layout.input_bytes),
                        ("output", layout.output_bytes)):
        lines += _array("int64_t", f"opf_model_{name}_bytes", [str(n) for n in sizes])
    return lines


def model_entry_c(layout: ModelLayout) -> list[str]:
    """Lines of C defining the tables, ``opf_model_run`` and ``opf_model_info`` (the
    library's kernel table must be defined before them, as ``opf_kernels``)."""
    steps = layout.num_steps
    lines = model_tables_c(layout)
    copy_loop = []
    if layout.copies:
        copy_loop = [
            f"  if (status == 0 && stop == {steps}) {{",
            f"    for (int64_t i = 0; i < {len(layout.copies)}; ++i) {{",
            "      const opf_model_copy_t* k = &opf_model_copies[i];",
            "      void* from = opf_model_place(&k->source, constants, inputs, outputs, w);",
            "      if (from != outputs[k->output]) memcpy(outputs[k->output], from, "
            "(size_t)k->nbytes);",
            "    }",
            "  }",
        ]
    lines += [
        "static inline void* opf_model_place(const opf_model_arg_t* p, const void* const* "
        "constants, const void* const* inputs, void* const* outputs, char* w) {",
        "  switch (p->kind) {",
        "    case 0: return (void*)constants[p->index];",
        "    case 1: return (void*)inputs[p->index];",
        "    case 2: return outputs[p->index];",
        "    default: return w + p->offset;",
        "  }",
        "}",
        "int32_t (*opf_run_begin_hook)(void) = 0;  // set by the host: Ctrl-C bookkeeping",
        "void (*opf_run_end_hook)(void) = 0;",
        "static int32_t opf_model_run(int64_t first, int64_t stop, opf_model_call_t* call) {",
        f"  if (first < 0 || first > stop || stop > {steps}) return {MODEL_BAD_RANGE};",
        "  const void* const* constants = call->constants;",
        "  const void* const* inputs = call->inputs;",
        "  void* const* outputs = call->outputs;",
        "  const int32_t num_threads = call->num_threads;",
        "  if (opf_run_begin_hook) opf_run_begin_hook();",
        f"  void* a[{max(1, layout.max_args)}];",
        "  char* w = (char*)call->workspace;",
        "  const int previous = omp_get_max_threads();",
        "  if (num_threads > 0) omp_set_num_threads(num_threads);",
        "  int32_t status = 0;",
        "  for (int64_t s = first; s < stop && status == 0; ++s) {",
        "    const int32_t k = opf_model_step_kernels[s];",
        "    if (k < 0) continue;  // no native code: the caller runs this step",
        "    for (int64_t i = opf_model_step_args[s]; i < opf_model_step_args[s + 1]; ++i)",
        "      a[i - opf_model_step_args[s]] = opf_model_place(&opf_model_args[i], constants, "
        "inputs, outputs, w);",
        "    status = opf_kernels[k].thunk(a);",
        "    if (status != 0) call->failed = s;",
        "  }",
        "  if (num_threads > 0) omp_set_num_threads(previous);",
        *copy_loop,
        "  if (opf_run_end_hook) opf_run_end_hook();",
        "  return status;",
        "}",
        "static const opf_model_info_t opf_model_info = {",
        f"  {steps}, opf_model_step_kernels, opf_model_step_args, opf_model_args,",
        f"  {len(layout.copies)}, {'opf_model_copies' if layout.copies else '0'},",
        f"  {len(layout.constant_bytes)}, opf_model_constant_bytes,",
        f"  {len(layout.input_bytes)}, opf_model_input_bytes,",
        f"  {len(layout.output_bytes)}, opf_model_output_bytes,",
        f"  {layout.workspace_bytes}, {layout.max_args}, opf_model_run,",
        "};",
    ]
    return lines
