"""The pass infrastructure: passes as values, decorators, Sequential, PassContext, instruments."""

import numpy as np
import pytest

import opfusion as opf
from opfusion.ir import structural_equal
from opfusion.testing import assert_close
from opfusion.testing.examples import seed_example
from opfusion.transform import (
    DumpIR,
    PassContext,
    PassInstrument,
    PassTimingInstrument,
    PrintIR,
    Sequential,
    function_pass,
    module_pass,
)


def exp_module() -> opf.IRModule:
    x = opf.var("x", (4,))
    return opf.IRModule.from_expr(opf.Function([x], opf.op.exp(x)))


@module_pass(opt_level=1, name="AddHelper")
def add_helper(mod, ctx):
    y = opf.var("y", (4,))
    return mod.with_function("helper", opf.Function([y], y))


@module_pass(opt_level=3, name="Expensive")
def expensive(mod, ctx):
    return mod.with_function("expensive", mod["main"])


@function_pass(opt_level=0, name="DoubleOutput")
def double_output(func, mod, ctx):
    return opf.Function(func.params, func.body * opf.const(2.0), func.ret_type, func.attrs)


def test_a_decorated_function_is_a_pass_with_its_info():
    assert add_helper.info.name == "AddHelper" and add_helper.info.opt_level == 1
    new = add_helper(exp_module())
    assert list(new) == ["main", "helper"]


def test_a_pass_never_changes_its_input_module():
    mod = exp_module()
    before = mod.astext()

    @module_pass(opt_level=0)
    def vandal(mod, ctx):
        mod["main"] = opf.Function(mod["main"].params, mod["main"].params[0])
        return mod

    new = vandal(mod)
    assert mod.astext() == before
    assert "exp" not in new.astext()


def test_function_pass_applies_to_every_function():
    mod = add_helper(exp_module())
    new = double_output(mod)
    assert "multiply" in new.astext().split("def @helper")[1]
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(opf.ir.evaluate(new, [x]), np.exp(x) * 2)


def test_decorated_class_is_a_factory_of_passes():
    @function_pass(opt_level=0, name="Scale")
    class Scale:
        def __init__(self, factor):
            self.factor = factor

        def transform_function(self, func, mod, ctx):
            body = func.body * opf.const(self.factor)
            return opf.Function(func.params, body, func.ret_type, func.attrs)

    x = np.ones(4, np.float32)
    new = Scale(3.0)(exp_module())
    np.testing.assert_allclose(opf.ir.evaluate(new, [x]), np.exp(x) * 3, rtol=1e-6)
    assert Scale.info.name == "Scale"


def test_class_without_the_transform_method_is_rejected():
    with pytest.raises(opf.OpfusionError, match="has no transform_module method"):
        @module_pass(opt_level=0)
        class Broken:
            pass


def test_sequential_skips_passes_above_the_opt_level():
    seq = Sequential([add_helper, expensive])
    with PassContext(opt_level=2):
        assert list(seq(exp_module())) == ["main", "helper"]
    with PassContext(opt_level=3):
        assert list(seq(exp_module())) == ["main", "helper", "expensive"]


def test_required_and_disabled_pass_lists_override_the_level():
    seq = Sequential([add_helper, expensive])
    with PassContext(opt_level=0, required_pass=["Expensive"]):
        assert list(seq(exp_module())) == ["main", "expensive"]
    with PassContext(opt_level=3, disabled_pass=["AddHelper"]):
        assert list(seq(exp_module())) == ["main", "expensive"]


def test_a_pass_runs_its_required_passes_first():
    seen = []

    class Record(PassInstrument):
        def run_before_pass(self, mod, info):
            seen.append(info.name)

    @module_pass(opt_level=0, name="NeedsTypes", required=["InferType"])
    def needs_types(mod, ctx):
        return mod

    with PassContext(instruments=[Record()]):
        Sequential([needs_types])(exp_module())
    assert seen == ["Sequential", "InferType", "NeedsTypes"]


def test_contexts_nest_and_restore():
    outer = PassContext.current()
    with PassContext(opt_level=3) as ctx:
        assert PassContext.current() is ctx
        with PassContext(opt_level=0):
            assert PassContext.current().opt_level == 0
        assert PassContext.current() is ctx
    assert PassContext.current() is outer


def test_config_keys_are_declared_and_type_checked():
    ctx = PassContext(config={"FoldConstant.max_elements": 10})
    assert ctx.get_config("FoldConstant.max_elements") == 10
    assert PassContext().get_config("FoldConstant.max_elements") > 10
    with pytest.raises(opf.OpfusionError, match="did you mean 'FoldConstant.max_elements'"):
        PassContext(config={"FoldConstant.max_element": 10})
    with pytest.raises(opf.OpfusionError, match="takes a int, got str"):
        PassContext(config={"FoldConstant.max_elements": "10"})
    with pytest.raises(opf.OpfusionError, match="takes a int, got bool"):
        PassContext(config={"FoldConstant.max_elements": True})


def test_bad_opt_level_and_pass_lists_are_errors():
    with pytest.raises(opf.OpfusionError, match="opt_level must be an int"):
        PassContext(opt_level=-1)
    with pytest.raises(opf.OpfusionError, match="required_pass takes pass names"):
        PassContext(required_pass=[3])


def test_calling_a_pass_on_an_expression_explains_what_to_do():
    with pytest.raises(opf.OpfusionError, match="IRModule.from_expr"):
        add_helper(opf.var("x", (2,)))


def test_timing_instrument_prints_one_line_per_pass():
    timing = PassTimingInstrument()
    with PassContext(opt_level=3, instruments=[timing]):
        opf.transform.optimize(seed_example())
    text = str(timing)
    assert text.splitlines()[0] == "pass timings:"
    assert "  Optimize:" in text
    for name in ("InferType", "SimplifyInference", "FoldConstant", "FoldScaleAxis",
                 "SimplifyExpr", "EliminateCommonSubexpr", "DeadCodeElimination"):
        assert f"    {name}: " in text, name
    assert set(timing.totals()) >= {"Optimize", "FoldConstant"}


def test_print_ir_shows_the_module_after_chosen_passes(capsys):
    with PassContext(instruments=[PrintIR(passes=["DoubleOutput"])]):
        Sequential([add_helper, double_output])(exp_module())
    out = capsys.readouterr().out
    assert out.startswith("# IR after DoubleOutput\n")
    assert "multiply" in out and "AddHelper" not in out


def test_dump_ir_writes_one_file_per_pass_in_order(tmp_path):
    dump = DumpIR(tmp_path / "dump", show_meta_data=True)
    with PassContext(opt_level=3, instruments=[dump]):
        opf.transform.optimize(seed_example())
    names = sorted(p.name for p in (tmp_path / "dump").iterdir())
    assert names[0] == "000_input.txt"
    assert [n.split("_", 1)[1] for n in names[1:]] == [
        "InferType.txt", "SimplifyInference.txt", "FoldConstant.txt", "FoldScaleAxis.txt",
        "FoldConstant.txt", "SimplifyExpr.txt", "EliminateCommonSubexpr.txt",
        "DeadCodeElimination.txt", "InferType.txt"]
    last = opf.parse((tmp_path / "dump" / names[-1]).read_text())
    assert structural_equal(last, opf.transform.optimize(seed_example(), opt_level=3))


def test_optimize_takes_the_level_from_the_context_or_the_argument():
    x = opf.var("x", (2,))
    folded = opf.op.add(opf.const(np.ones(2, np.float32)), opf.const(np.ones(2, np.float32)))
    mod = opf.IRModule.from_expr(opf.Function([x], x + folded))
    with PassContext(opt_level=1):
        assert opf.transform.optimize(mod).astext().count("add(") == 2
        assert opf.transform.optimize(mod, opt_level=2).astext().count("add(") == 1
    with PassContext(opt_level=2):
        assert opf.transform.optimize(mod).astext().count("add(") == 1


def test_one_default_opt_level_for_contexts_passes_and_compile():
    from opfusion.transform.context import DEFAULT_OPT_LEVEL

    assert DEFAULT_OPT_LEVEL == 3
    assert PassContext().opt_level == PassContext.current().opt_level == DEFAULT_OPT_LEVEL
    # Outside any context optimize runs the level-3 passes: CSE merges the two exps.
    x = opf.var("x", (2,))
    mod = opf.IRModule.from_expr(opf.Function([x], opf.op.exp(x) + opf.op.exp(x)))
    assert opf.transform.optimize(mod).astext().count("exp(") == 1
    with PassContext(opt_level=2):
        assert opf.transform.optimize(mod).astext().count("exp(") == 2


def test_optimize_binds_params():
    x = opf.var("x", (2,))
    w = opf.var("w", (2,))
    mod = opf.IRModule.from_expr(opf.Function([x, w], x * opf.op.exp(w)))
    new = opf.transform.optimize(mod, params={"w": np.zeros(2, np.float32)}, opt_level=2)
    assert [p.name_hint for p in new["main"].params] == ["x"]
    x_value = np.array([1.5, -2.0], np.float32)
    np.testing.assert_array_equal(opf.ir.evaluate(new, [x_value]), x_value)
    assert new["main"].body is new["main"].params[0]  # x * exp(0) folded to x * 1, then x


PUBLIC_PASS_FACTORIES = (
    "InferType", "FoldConstant", "DeadCodeElimination", "EliminateCommonSubexpr",
    "LegalizeCheckedIndices", "SimplifyInference", "SimplifyExpr", "FoldScaleAxis",
    "BackwardFoldScaleAxis", "ForwardFoldScaleAxis", "FuseOps", "FusionMerge",
    "FuseMultiplyAdd", "FuseDenseAdd")


@pytest.mark.parametrize("name", PUBLIC_PASS_FACTORIES)
def test_every_public_pass_is_a_factory(name):
    made = getattr(opf.transform, name)()
    assert isinstance(made, opf.transform.Pass)
    assert made.info.name == name
    mod = exp_module()
    x = np.linspace(-1.0, 1.0, 4, dtype=np.float32)
    assert_close(opf.ir.evaluate(made(opf.transform.InferType()(mod)), [x]), np.exp(x))


@pytest.mark.parametrize("name", PUBLIC_PASS_FACTORIES + ("BindParams", "PatternRewrite"))
def test_calling_a_factory_on_a_module_says_how_to_write_it(name):
    with pytest.raises(opf.OpfusionError, match=rf"write {name}\(\)\(mod\)"):
        getattr(opf.transform, name)(exp_module())
