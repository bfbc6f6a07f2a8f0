"""Statements, PrimFunc printing and the reference interpreter."""

import numpy as np
import pytest

from opfusion.errors import EvaluationError, TensorExprError
from opfusion.tir import expr as E
from opfusion.tir import interp
from opfusion.tir import stmt as S


def _vecadd_func():
    a, b, c = (E.Buffer(n, (10,)) for n in "ABC")
    i = E.Var("i")
    body = S.For(i, 0, 10, S.ForKind.PARALLEL,
                 S.BufferStore(c, a.load([i]) + b.load([i]), [i]))
    return S.PrimFunc("vecadd", [a, b, c], body)


def test_primfunc_prints_like_python():
    assert str(_vecadd_func()) == (
        "def vecadd(A: float32[10], B: float32[10], C: float32[10]):\n"
        "  for i in parallel(10):\n"
        "    C[i] = A[i] + B[i]"
    )


def test_statement_printing_covers_every_node():
    a = E.Buffer("A", (4, 5))
    t = E.Buffer("T", (3,), scope="local")
    x, y, v = E.Var("x"), E.Var("y"), E.Var("v")
    body = S.Allocate(t, S.For(x, 0, 4, S.ForKind.SERIAL, S.SeqStmt([
        S.LetStmt(v, x * 2, S.BufferStore(t, 0.5, [E.IntImm(0)])),
        S.For(y, 0, E.minimum(5, 10 - x * 4), S.ForKind.VECTORIZED,
              S.IfThenElse(x < 2, S.BufferStore(a, a.load([x, y]) * 2.0, [x, y]),
                           S.BufferStore(a, 1.5, [x, y]))),
        S.Evaluate(E.IntImm(0)),
    ])))
    assert str(body) == (
        "with allocate(T: float32[3]):\n"
        "  for x in range(4):\n"
        "    let v: int32 = x*2\n"
        "    T[0] = 0.5f\n"
        "    for y in vectorized(min(5, 10 - x*4)):\n"
        "      if x < 2:\n"
        "        A[x, y] = A[x, y]*2.0f\n"
        "      else:\n"
        "        A[x, y] = 1.5f\n"
        "    evaluate(0)"
    )


def test_seqstmt_flattens_and_refuses_empty():
    s1 = S.Evaluate(E.IntImm(0))
    nested = S.SeqStmt([S.SeqStmt([s1, s1]), s1])
    assert len(nested.stmts) == 3
    with pytest.raises(TensorExprError):
        S.SeqStmt([])


def test_allocate_needs_a_local_buffer():
    with pytest.raises(TensorExprError, match="local"):
        S.Allocate(E.Buffer("A", (3,)), S.Evaluate(E.IntImm(0)))


def test_store_casts_value_to_buffer_dtype():
    b = E.Buffer("A", (3,), "float32")
    store = S.BufferStore(b, E.Var("i"), [E.IntImm(0)])
    assert store.value.dtype == "float32"


def test_interpreter_runs_a_function():
    a = np.arange(10, dtype="float32")
    b = np.ones(10, dtype="float32")
    c = np.zeros(10, dtype="float32")
    interp.run(_vecadd_func(), a, b, c)
    np.testing.assert_array_equal(c, a + 1)


def test_interpreter_reports_out_of_bounds_access():
    a = E.Buffer("A", (4,))
    i = E.Var("i")
    func = S.PrimFunc("f", [a], S.For(i, 0, 5, S.ForKind.SERIAL, S.BufferStore(a, 1.0, [i])))
    with pytest.raises(EvaluationError, match="index 4 out of range"):
        interp.run(func, np.zeros(4, "float32"))


def test_interpreter_catches_negative_indices():
    a = E.Buffer("A", (4,))
    i = E.Var("i")
    func = S.PrimFunc("f", [a], S.For(i, 0, 4, S.ForKind.SERIAL,
                                      S.BufferStore(a, 1.0, [i - 1])))
    with pytest.raises(EvaluationError, match="index -1"):
        interp.run(func, np.zeros(4, "float32"))


def test_interpreter_checks_argument_shapes():
    with pytest.raises(EvaluationError, match=r"float32\[10\]"):
        interp.run(_vecadd_func(), *(np.zeros(9, "float32") for _ in range(3)))


def test_interpreter_floor_division_and_intrinsics():
    out = E.Buffer("O", (2,))
    i = E.Var("i")
    value = E.call("exp", E.cast((i - 3) // 2, "float32")) + E.call("erf", E.FloatImm(0.5))
    func = S.PrimFunc("f", [out], S.For(i, 0, 2, S.ForKind.SERIAL,
                                        S.BufferStore(out, value, [i])))
    got = np.zeros(2, "float32")
    interp.run(func, got)
    from math import erf, exp
    np.testing.assert_allclose(got, [exp(-2) + erf(0.5), exp(-1) + erf(0.5)], rtol=1e-6)


def test_verify_accepts_a_well_formed_function():
    from opfusion.tir.verify import verify

    verify(_vecadd_func())


def test_verify_reports_a_variable_used_outside_its_loop():
    from opfusion.tir.verify import VerifyError, verify

    a = E.Buffer("A", (4,))
    i, j = E.Var("i"), E.Var("j")
    body = S.For(i, 0, 4, S.ForKind.SERIAL, S.BufferStore(a, 1.0, [j]))
    with pytest.raises(VerifyError, match="variable j is used outside"):
        verify(S.PrimFunc("f", [a], body))


def test_verify_reports_nested_parallel_loops_and_unknown_buffers():
    from opfusion.tir.verify import VerifyError, verify

    a, t = E.Buffer("A", (4, 4)), E.Buffer("T", (4,), scope="local")
    i, j = E.Var("i"), E.Var("j")
    inner = S.For(j, 0, 4, S.ForKind.PARALLEL, S.BufferStore(a, 1.0, [i, j]))
    with pytest.raises(VerifyError, match="inside another parallel"):
        verify(S.PrimFunc("f", [a], S.For(i, 0, 4, S.ForKind.PARALLEL, inner)))
    with pytest.raises(VerifyError, match="neither a parameter nor allocated"):
        verify(S.PrimFunc("f", [a], S.For(i, 0, 4, S.ForKind.SERIAL,
                                          S.BufferStore(t, 1.0, [i]))))
