"""Kernels are taken from the library's own kernel table (opf_kernel_table), never by
looking up a given name: an unknown name, other parameters, or a library without a table
are errors, not calls into whatever symbol the process happens to have."""

import pytest

import opfusion as opf
from opfusion.backend.cpu.module import (
    KernelParam,
    KernelTableError,
    LibraryKernels,
    LibraryLoadError,
    Module,
)
from opfusion.backend.cpu.toolchain import compile_source, have_c_compiler
from opfusion.tir import expr as E
from opfusion.tir import stmt as S

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")


def _fill():
    A = E.Buffer("A", (4, 2), "float32")
    i = E.Var("i")
    body = S.For(i, 0, 8, S.ForKind.SERIAL, S.BufferStore(A, 7.0, [i // 2, i % 2]))
    return opf.build(S.PrimFunc("table_fill", [A], body))


def test_the_table_lists_each_kernel_with_its_parameters():
    kernel = _fill()
    table = LibraryKernels(kernel.library)
    entry = table.entry("table_fill")
    assert [(p.shape, p.dtype, p.written) for p in entry.params] == [((4, 2), "float32", True)]


def test_a_name_outside_the_table_is_refused_even_if_the_process_has_it():
    kernel = _fill()
    with pytest.raises(KernelTableError, match="no kernel 'system'"):
        Module("x", "system", kernel.params, "", kernel.library)


@pytest.mark.parametrize("params", [
    [KernelParam("A", (2, 2), "float32", True)],
    [KernelParam("A", (4, 2), "float64", True)],
    [KernelParam("A", (4, 2), "float32", False)],
    [KernelParam("A", (4, 2), "float32", True)] * 2,
])
def test_parameters_other_than_the_tables_are_refused(params):
    kernel = _fill()
    with pytest.raises(KernelTableError, match="table_fill"):
        Module("x", "table_fill", params, "", kernel.library)


def test_a_library_without_a_table_is_refused():
    library = compile_source("int table_less(void) { return 1; }\n")
    with pytest.raises(LibraryLoadError, match="no kernel table"):
        LibraryKernels(library)
