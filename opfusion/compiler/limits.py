"""Compile-time resource limits: refuse a model whose kernels would run for hours or whose
memory would not fit, before any C is compiled or memory allocated.

Shapes are static, so both costs are known exactly at compile time:

* a kernel's *work* is the number of innermost statement executions of its loop IR (the
  product of the loop extents around each statement, summed over the statements): a
  ``ReduceSum(Expand(x -> 10^6 x 10^6))`` is 10^12 iterations whatever its input size;
* its *allocations* are the temporaries of its loop IR (``Allocate``), and the executor's
  are every value of the model (constants, kernel results) and the blocks of its memory
  plan.

The limits are PassContext config keys, raised with
``PassContext(config={"compile.max_kernel_work": ...})`` around ``opf.compile``; going past
one raises :class:`~opfusion.errors.ResourceLimitError` naming the kernel (and its fused
operators) or the value, the estimate and the key."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import ResourceLimitError
from ..ir.types import TensorType
from ..tir import stmt as S
from ..tir.work import kernel_work
from ..transform.context import PassContext, register_pass_config
from ..transform.fold_constant import MAX_FOLD_ELEMENTS

MAX_KERNEL_WORK = "compile.max_kernel_work"
MAX_ALLOCATION_BYTES = "compile.max_allocation_bytes"

register_pass_config(
    MAX_KERNEL_WORK, int, 10**11,
    "Loop iterations one kernel may run (the product of the loop extents around each "
    "statement of its loop IR, summed): 10^11 is about a minute on one core. opf.compile "
    "raises ResourceLimitError for a kernel beyond it.")


def physical_memory_bytes() -> int:
    """This machine's physical memory (``SC_PAGE_SIZE * SC_PHYS_PAGES``), or 16 GiB where the
    platform does not say (Windows, or a sysconf that fails)."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return 16 << 30
    return pages * page_size if pages > 0 and page_size > 0 else 16 << 30


# The default is the physical memory: an allocation larger than that can only fail (or swap
# the machine to a halt), whatever else runs; a smaller one may still fail when other
# processes hold memory, which the executor then reports as an OutOfMemoryError.
register_pass_config(
    MAX_ALLOCATION_BYTES, int, physical_memory_bytes(),
    "Bytes one allocation may take (a kernel temporary, a model value: input, constant, "
    "intermediate or result) and the executor's memory plan may take in all; by default "
    "the machine's physical memory (SC_PAGE_SIZE * SC_PHYS_PAGES, 16 GiB where unknown). "
    "opf.compile raises ResourceLimitError beyond it, and so does the ONNX importer for a "
    "graph input or a constant it would create (ConstantOfShape, Range) beyond it.")


def kernel_allocations(body: S.Stmt) -> list[tuple[str, int]]:
    """``(buffer name, bytes)`` of every temporary ``body`` allocates."""
    found = []
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, S.Allocate):
            buffer = node.buffer
            found.append((buffer.name, _count(buffer.shape) * _itemsize(buffer.dtype)))
            stack.append(node.body)
        elif isinstance(node, (S.For, S.LetStmt)):
            stack.append(node.body)
        elif isinstance(node, S.SeqStmt):
            stack.extend(node.stmts)
        elif isinstance(node, S.IfThenElse):
            stack.append(node.then_case)
            if node.else_case is not None:
                stack.append(node.else_case)
    return found


def check_kernel(name: str, op_names: Sequence[str], body: S.Stmt | None) -> None:
    """Raise ResourceLimitError if the kernel ``name`` (fusing ``op_names``) would run more
    iterations than ``compile.max_kernel_work`` or allocate a temporary larger than
    ``compile.max_allocation_bytes``."""
    if body is None:
        return
    ctx = PassContext.current()
    what = _kernel_text(name, op_names)
    work_limit = ctx.get_config(MAX_KERNEL_WORK)
    work = kernel_work(body)
    if work > work_limit:
        raise ResourceLimitError(
            f"{what} would run {work:.3g} loop iterations, more than the limit "
            f"{MAX_KERNEL_WORK}={work_limit:.3g}; check the shapes feeding it (a broadcast or "
            f"expand to a huge shape?), or raise the limit: with opf.transform.PassContext("
            f"config={{{MAX_KERNEL_WORK!r}: ...}}): opf.compile(...)")
    byte_limit = ctx.get_config(MAX_ALLOCATION_BYTES)
    for buffer, nbytes in kernel_allocations(body):
        if nbytes > byte_limit:
            raise ResourceLimitError(
                f"{what} would allocate {bytes_text(nbytes)} for its temporary {buffer}, "
                f"more than the limit {_limit_text(byte_limit)}")


def check_values(values: Iterable[tuple[str, TensorType]], plan_bytes: int | None = None
                 ) -> None:
    """Raise ResourceLimitError if one of ``values`` (``(description, type)``: constants,
    intermediates, results) or the memory plan's ``plan_bytes`` in all exceed
    ``compile.max_allocation_bytes``."""
    limit = PassContext.current().get_config(MAX_ALLOCATION_BYTES)
    for what, ty in values:
        check_allocation(f"{what} of type {ty!r}", ty.shape, ty.dtype)
    if plan_bytes is not None and plan_bytes > limit:
        raise ResourceLimitError(
            f"the executor's memory plan for the intermediate values would take "
            f"{bytes_text(plan_bytes)}, more than the limit {_limit_text(limit)}")


def check_allocation(what: str, shape: Sequence[int], dtype: str,
                     raise_with: str = "opf.compile(...)") -> int:
    """The bytes of a ``dtype`` tensor of ``shape``, an exact Python int however large the
    dims (no int64 product to wrap); ResourceLimitError naming ``what`` if they exceed
    ``compile.max_allocation_bytes`` of the current PassContext (``raise_with``: the call
    the message tells to wrap in a PassContext that raises the limit)."""
    nbytes = _count(shape) * _itemsize(dtype)
    limit = PassContext.current().get_config(MAX_ALLOCATION_BYTES)
    if nbytes > limit:
        raise ResourceLimitError(f"{what} would take {bytes_text(nbytes)}, more than the "
                                 f"limit {_limit_text(limit, raise_with)}")
    return nbytes


def import_constant_fits(what: str, shape: Sequence[int], dtype: str) -> bool:
    """Whether the ONNX importer may make the constant ``what`` of ``shape`` and ``dtype`` an
    array: one that holds at most ``FoldConstant.max_elements`` elements (the limit constant
    folding honours) may; a larger one may not, and the importer keeps it as an operator
    (a broadcast, an arange) that compiles to a kernel under the compile limits. One larger
    than ``compile.max_allocation_bytes`` raises ResourceLimitError naming ``what``: no
    kernel could hold it either."""
    check_allocation(what, shape, dtype, raise_with="opf.frontend.from_onnx(...)")
    return _count(shape) <= PassContext.current().get_config(MAX_FOLD_ELEMENTS)


def model_values(values: Sequence[Any], steps: Sequence[Any], input_names: Sequence[str] = ()
                 ) -> list[tuple[str, TensorType]]:
    """``(description, type)`` of the executor's inputs, constants and kernel results
    (``values``: its ValueInfo list, ``steps``: its ExecSteps, ``input_names``: the names of
    its inputs, if known), for :func:`check_values`."""
    described = []
    for info in values:
        if info.input_index is not None:
            index = info.input_index
            name = (repr(input_names[index]) if index < len(input_names) else f"#{index}")
            described.append((f"the input {name}", info.type))
    for step in steps:
        ops = ", ".join(dict.fromkeys(step.group.op_names))
        described += [(f"the result of kernel {step.group.name} ({ops})", values[v].type)
                      for v in step.writes]
    described += [("a constant", info.type) for info in values
                  if info.constant is not None]
    return described


def _kernel_text(name: str, op_names: Sequence[str]) -> str:
    ops = ", ".join(dict.fromkeys(op_names))
    return f"kernel {name} ({ops})" if ops else f"kernel {name}"


def _limit_text(limit: int, raise_with: str = "opf.compile(...)") -> str:
    return (f"{MAX_ALLOCATION_BYTES}={bytes_text(limit)}; check the shapes, or raise the "
            f"limit: with opf.transform.PassContext(config={{{MAX_ALLOCATION_BYTES!r}: ...}}): "
            f"{raise_with}")


def bytes_text(nbytes: int) -> str:
    """``nbytes`` for a message: ``1.5 GiB (1610612736 bytes)``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit} ({nbytes} bytes)"
    return f"{nbytes} bytes"


def _count(shape: Sequence[Any]) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def _itemsize(dtype: str) -> int:
    return 1 if dtype == "bool" else np.dtype(dtype).itemsize


__all__ = ["MAX_ALLOCATION_BYTES", "MAX_KERNEL_WORK", "bytes_text", "check_allocation",
           "check_kernel", "check_values", "import_constant_fits", "kernel_allocations",
           "kernel_work", "model_values", "physical_memory_bytes"]
