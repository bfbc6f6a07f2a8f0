"""Kernel names stay unique however long the fused operator chains are: the index that tells
two groups apart is never cut, and C names are unique across the generated file."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.c_names import MAX_NAME_LENGTH, NameTable, sanitize_identifier
from opfusion.backend.cpu.emitter import codegen_c_module
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.compiler.compile import _kernel_name
from opfusion.testing import assert_close
from opfusion.tir import expr as E
from opfusion.tir import stmt as S

needs_cc = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "names"))


def _shuffle_branch(x, offset: int):
    """strided_slice, strided_slice, concatenate, reshape, transpose: a ShuffleNet channel
    shuffle, whose fused group gets a descriptive stem longer than a C name may be."""
    a = opf.op.strided_slice(x, begin=[0, offset, 0], end=[1, offset + 2, 4])
    b = opf.op.strided_slice(x, begin=[0, offset + 2, 0], end=[1, offset + 4, 4])
    c = opf.op.concatenate(opf.Tuple([b, a]), axis=1)
    r = opf.op.reshape(c, newshape=[1, 2, 2, 4])
    return opf.op.transpose(r, axes=[0, 2, 1, 3])


def test_kernel_name_keeps_the_index_whole_and_fits_a_c_name():
    x = opf.var("x", (1, 16, 4))
    func = opf.Function([x], _shuffle_branch(x, 0))
    names = [_kernel_name(func, index) for index in (0, 8, 15, 123456)]
    for index, name in zip((0, 8, 15, 123456), names):
        assert name.endswith(f"_{index}") and name.startswith("fused_strided_slice")
        assert len(name) <= MAX_NAME_LENGTH
        assert sanitize_identifier(name) == name  # the C name is the kernel name, uncut
    assert len(set(names)) == len(names)


def test_long_identifiers_that_differ_only_at_the_end_stay_distinct():
    stem = "fused_strided_slice_concatenate_reshape_transpose"
    first, second = sanitize_identifier(stem + "_8"), sanitize_identifier(stem + "_15")
    assert first != second
    assert len(first) == len(second) == MAX_NAME_LENGTH
    assert sanitize_identifier(first) == first
    table = NameTable()
    taken = [table.fresh("y" * 60) for _ in range(12)]
    assert len(set(taken)) == 12 and all(len(n) <= MAX_NAME_LENGTH for n in taken)
    assert all(sanitize_identifier(n) == n for n in taken)


def test_a_module_of_kernels_with_one_long_name_exports_distinct_c_names():
    funcs = []
    for value in range(3):
        A = E.Buffer("A", (4,), "float32")
        i = E.Var("i")
        body = S.For(i, 0, 4, S.ForKind.SERIAL, S.BufferStore(A, float(value), [i]))
        funcs.append(S.PrimFunc("k" * 70, [A], body))
    _, parts = codegen_c_module(funcs)
    assert len({p.entry_name for p in parts}) == 3


@needs_cc
def test_many_groups_with_one_long_stem_compile_and_match_the_reference():
    # Twelve channel shuffles of different slices: several kernels named
    # fused_strided_slice_concatenate_reshape_transpose_<index>, which once collided in C.
    x = opf.var("x", (1, 16, 4))
    branches = [_shuffle_branch(x, offset) for offset in range(12)]
    mod = opf.IRModule.from_expr(opf.Function([x], opf.Tuple(branches)))
    exe = opf.compile(mod)
    long_stems = [n for n in exe.modules if n.startswith("fused_strided_slice_concatenate")]
    assert len(long_stems) >= 4
    assert len({m.entry_name for m in exe.modules.values()}) == len(exe.modules)
    xv = np.random.default_rng(0).standard_normal((1, 16, 4)).astype(np.float32)
    assert_close(exe(xv), opf.ir.evaluate(mod, [xv]))
