"""LegalizeCheckedIndices: a take / gather_elements built in the graph IR with its default mode
("checked") raises on an out-of-range index in a compiled model as the reference does, under
every fusion strategy; in-range indices give the reference's result; mode "clip" clamps in
both; constant indices are checked at compile time."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.errors import IndexOutOfRangeError
from opfusion.ir import Call, assert_structural_equal, post_order
from opfusion.transform import FuseOps, InferType, LegalizeCheckedIndices

STRATEGIES = ("tvm", "cinn", "none")
DATA = np.arange(15, dtype=np.float32).reshape(5, 3)


def _ops(mod):
    return [(n.op.name, dict(n.attrs)) for n in post_order(mod["main"])
            if isinstance(n, Call) and isinstance(n.op, opf.ir.Op)]


def take_model(mode="checked", axis=0):
    """-take(x + x, i + 1): the indices are computed at run time, the gather sits between
    elementwise ops that fuse with it."""
    x, i = opf.var("x", (5, 3)), opf.var("i", (4,), "int64")
    index = opf.op.add(i, opf.const(np.int64(1)))
    y = opf.op.negative(opf.op.take(opf.op.add(x, x), index, axis=axis, mode=mode))
    return opf.IRModule.from_expr(opf.Function([x, i], y))


def gather_elements_model(mode="checked"):
    x, i = opf.var("x", (5, 3)), opf.var("i", (2, 3), "int32")
    y = opf.op.negative(opf.op.gather_elements(opf.op.abs(x), i, axis=-2, mode=mode))
    return opf.IRModule.from_expr(opf.Function([x, i], y))


GOOD_TAKE = np.array([-6, 0, 3, -2], np.int64)  # + 1: -5, 1, 4, -1
BAD_TAKE = np.array([0, 4, 1, 2], np.int64)  # + 1: 5 is out of range for size 5
GOOD_GATHER = np.array([[0, -5, 4], [-1, 2, 3]], np.int32)
BAD_GATHER = np.array([[0, 1, 2], [3, -6, 4]], np.int32)


@pytest.mark.parametrize("fusion", STRATEGIES)
def test_checked_take_raises_in_compiled_models_as_in_the_reference(fusion):
    mod = take_model()
    exe = opf.compile(mod, fusion=fusion)
    good = {"x": DATA, "i": GOOD_TAKE}
    np.testing.assert_array_equal(exe.run(good)[0], opf.ir.evaluate(mod, good))
    bad = {"x": DATA, "i": BAD_TAKE}
    words = (r"^take along axis 0 \(mode 'checked'; 'clip' would clamp\): index 5 at position "
             r"\(1,\) is out of range for an axis of size 5")
    for run in (lambda: opf.ir.evaluate(mod, bad), lambda: exe.run(bad)):
        with pytest.raises(IndexOutOfRangeError, match=words):
            run()


@pytest.mark.parametrize("fusion", STRATEGIES)
def test_checked_gather_elements_raises_in_compiled_models_as_in_the_reference(fusion):
    mod = gather_elements_model()
    exe = opf.compile(mod, fusion=fusion)
    good = {"x": DATA, "i": GOOD_GATHER}
    np.testing.assert_array_equal(exe.run(good)[0], opf.ir.evaluate(mod, good))
    bad = {"x": DATA, "i": BAD_GATHER}
    for run in (lambda: opf.ir.evaluate(mod, bad), lambda: exe.run(bad)):
        with pytest.raises(IndexOutOfRangeError, match=r"^gather_elements along axis 0 .*"
                                                       r"index -6 at position \(1, 1\)"):
            run()


@pytest.mark.parametrize("fusion", STRATEGIES)
def test_clip_mode_clamps_in_both_engines(fusion):
    for mod, feeds in ((take_model("clip"), {"x": DATA, "i": BAD_TAKE}),
                       (gather_elements_model("clip"), {"x": DATA, "i": BAD_GATHER})):
        want = opf.ir.evaluate(mod, feeds)
        np.testing.assert_array_equal(opf.compile(mod, fusion=fusion).run(feeds)[0], want)
    np.testing.assert_array_equal(want[1], -np.abs(DATA[[3, 0, 4], [0, 1, 2]]))


def test_the_pass_guards_run_time_indices_and_switches_the_gather_to_clip():
    new = LegalizeCheckedIndices()(InferType()(take_model()))
    ops = _ops(new)
    names = [name for name, _ in ops]
    assert sorted(names) == ["add", "add", "check_indices", "negative", "take"]
    check = dict(ops)["check_indices"]
    assert check["bounds"] == (5,) and check["consumer"].startswith("take along axis 0")
    assert dict(ops)["take"]["mode"] == "clip"
    # The result is legal already: a second run changes nothing; clip and wrap are kept.
    assert _ops(LegalizeCheckedIndices()(new)) == ops
    assert "check_indices" not in [n for n, _ in _ops(LegalizeCheckedIndices()(take_model("wrap")))]


def test_indices_already_checked_get_no_second_check_and_shared_indices_one():
    x, i = opf.var("x", (5, 3)), opf.var("i", (2,), "int64")
    checked = opf.op.check_indices(i, bounds=[5], consumer="Gather (node 'g') indices")
    first = opf.op.take(x, checked, axis=0)
    # Two gathers over one run-time index tensor and one bound share one check.
    second = opf.op.take(x, i, axis=0)
    third = opf.op.take(x, i, axis=-2)
    body = opf.Tuple([first, second, third])
    new = LegalizeCheckedIndices()(InferType()(opf.IRModule.from_expr(opf.Function([x, i], body))))
    checks = [attrs["consumer"] for name, attrs in _ops(new) if name == "check_indices"]
    assert checks == ["Gather (node 'g') indices", "take along axis 0 (mode 'checked'; 'clip' "
                                                   "would clamp)"]
    assert all(attrs["mode"] == "clip" for name, attrs in _ops(new) if name == "take")


def test_constant_indices_are_checked_at_compile_time():
    x = opf.var("x", (5, 3))
    ok = opf.op.take(x, opf.const(np.array([4, -5], np.int64)), axis=0)
    new = LegalizeCheckedIndices()(InferType()(opf.IRModule.from_expr(opf.Function([x], ok))))
    assert _ops(new) == [("take", {"axis": 0, "mode": "clip"})]  # no run-time check
    bad = opf.op.take(x, opf.const(np.array([[1, 3]], np.int32)), axis=1, span="picker")
    mod = opf.IRModule.from_expr(opf.Function([x], bad))
    with pytest.raises(IndexOutOfRangeError, match=r"^take along axis 1 .* \(node 'picker'\): "
                                                   r"constant indices: index 3 at position "
                                                   r"\(0, 1\).*mode='clip' to clamp"):
        opf.compile(mod, fusion="none")


def test_fused_groups_are_left_alone():
    """After fusion a check could not be lowered inside a group: the pass runs before it, and
    leaves primitive functions (and their constant arguments) untouched."""
    x = opf.var("x", (5, 3))
    body = opf.op.take(x, opf.const(np.array([7], np.int64)), axis=0)
    fused = FuseOps()(InferType()(opf.IRModule.from_expr(opf.Function([x], body))))
    assert_structural_equal(LegalizeCheckedIndices()(fused), fused)
