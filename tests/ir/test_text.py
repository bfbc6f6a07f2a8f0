"""The text IR: what the printer writes, and that the parser reads it back exactly."""

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import opfusion as opf
from opfusion.ir import assert_structural_equal, astext, get_op, parse
from opfusion.ir.types import DTYPES

SEED_TEXT = """\
def @main(%x: Tensor[(1, 3, 16, 16), float32], %weight: Tensor[(3, 3, 3, 3), float32]) {
  %0 = nn.conv2d(%x, %weight, padding=[0, 0, 0, 0]);
  %1 = add(%0, meta[Constant][0]);
  %2 = nn.relu(%1);
  %3 = multiply(%0, 0.5f);
  add(%2, %3)
}"""

FUSED_TEXT = """\
def @main(%x: Tensor[(1, 3, 16, 16), float32], %weight: Tensor[(3, 3, 3, 3), float32]) \
-> Tensor[(1, 3, 14, 14), float32] {
  %0 = fn (%p0: Tensor[(1, 3, 16, 16), float32], %p1: Tensor[(3, 3, 3, 3), float32], \
%p2: Tensor[(1, 3, 14, 14), float32], Primitive=1) -> Tensor[(1, 3, 14, 14), float32] {
    %0 = nn.conv2d(%p0, %p1, padding=[0, 0, 0, 0]);
    %1 = add(%0, %p2);
    %2 = nn.relu(%1);
    %3 = multiply(%0, 0.5f);
    add(%2, %3)
  };
  %0(%x, %weight, meta[Constant][0])
}"""


def round_trip(mod: opf.IRModule) -> str:
    """Print, parse, compare structure, and check that printing again gives the same text."""
    text = str(mod)
    parsed = parse(text)
    assert_structural_equal(parsed, mod)
    assert str(parsed) == text
    return text


def body_of(text: str) -> str:
    """The text without its metadata section."""
    return text.split("\n\n#[metadata]")[0]


def module(params, body, **kwargs) -> opf.IRModule:
    return opf.IRModule.from_expr(opf.Function(params, body, **kwargs))


def seed_module() -> opf.IRModule:
    x = opf.var("x", (1, 3, 16, 16))
    weight = opf.var("weight", (3, 3, 3, 3))
    conv = opf.op.nn.conv2d(x, weight)
    act = opf.op.nn.relu(opf.op.add(conv, opf.const(np.ones((1, 3, 14, 14), "float32"))))
    return module([x, weight], act + conv * opf.const(0.5))


def fused_module() -> opf.IRModule:
    out_type = opf.TensorType((1, 3, 14, 14))
    p0, p1 = opf.var("p0", (1, 3, 16, 16)), opf.var("p1", (3, 3, 3, 3))
    p2 = opf.var("p2", out_type)
    conv = opf.op.nn.conv2d(p0, p1)
    fused = opf.Function([p0, p1, p2], opf.op.nn.relu(conv + p2) + conv * opf.const(0.5),
                         ret_type=out_type, attrs={"Primitive": 1})
    x = opf.var("x", (1, 3, 16, 16))
    weight = opf.var("weight", (3, 3, 3, 3))
    bias = opf.const(np.ones((1, 3, 14, 14), "float32"))
    return module([x, weight], fused(x, weight, bias), ret_type=out_type)


# ---------------------------------------------------------------------------------------------
# the printed form


def test_seed_example_prints_like_tvm():
    assert body_of(str(seed_module())) == SEED_TEXT


def test_seed_example_round_trips():
    round_trip(seed_module())


def test_metadata_section_holds_the_large_constant():
    text = str(seed_module())
    assert "\n\n#[metadata]\nConstant[0] = Tensor[(1, 3, 14, 14), float32] \"" in text
    const = parse(text)["main"].body.args[0].args[0].args[1]
    np.testing.assert_array_equal(const.data, np.ones((1, 3, 14, 14), "float32"))


def test_fused_module_prints_nested_primitive_function():
    text = round_trip(fused_module())
    assert body_of(text) == FUSED_TEXT


def test_nested_function_temporaries_restart_and_shadow():
    parsed = parse(str(fused_module()))
    call = parsed["main"].body
    assert isinstance(call.op, opf.Function) and call.op.is_primitive
    assert [p.name_hint for p in call.op.params] == ["p0", "p1", "p2"]


def test_two_global_functions_and_a_global_call():
    a = opf.var("a", (2,))
    helper = opf.GlobalVar("helper")
    b = opf.var("b", (2,))
    mod = opf.IRModule()
    mod["main"] = opf.Function([b], opf.Call(helper, [b]) + b)
    mod[helper] = opf.Function([a], opf.op.nn.relu(a))
    text = round_trip(mod)
    assert "  %0 = @helper(%b);\n" in text
    assert text.index("def @main") < text.index("\n\ndef @helper(")


def test_global_function_may_be_used_before_its_definition():
    text = """
    def @main(%b: Tensor[(2,), float32]) { @helper(%b) }
    def @helper(%a: Tensor[(2,), float32]) { nn.relu(%a) }
    """
    mod = parse(text)
    assert mod["main"].body.op is mod.get_global_var("helper")


def test_tuples_and_tuple_access():
    x = opf.var("x", (2, 3))
    pair = opf.Tuple([opf.op.exp(x), x])
    single = opf.Tuple([x])
    body = opf.Tuple([pair[0] + pair[1], single[0], opf.Tuple([])])
    assert round_trip(module([x], body)) == """\
def @main(%x: Tensor[(2, 3), float32]) {
  %0 = exp(%x);
  %1 = (%0, %x);
  %2 = %1.0;
  %3 = %1.1;
  %4 = add(%2, %3);
  %5 = (%x,);
  %6 = %5.0;
  %7 = ();
  (%4, %6, %7)
}"""


def test_tuple_access_of_a_variable_quotes_its_name():
    t = opf.var("t", opf.TupleType([opf.TensorType((2,)), opf.TensorType((3,))]))
    text = round_trip(module([t], opf.op.exp(opf.TupleGetItem(t, 1))))
    assert '%0 = %"t".1;' in text
    assert "%t: (Tensor[(2,), float32], Tensor[(3,), float32])" in text


def test_shared_nodes_print_once_and_parse_shared():
    x = opf.var("x", (2,))
    shared = opf.op.exp(x)
    text = round_trip(module([x], shared * shared))
    assert "multiply(%0, %0)" in text
    call = parse(text)["main"].body
    assert call.args[0] is call.args[1]


def test_quoted_names():
    names = ["input:0", "1", "a b", 'say "hi"', "back\\slash", "0", "layer1.0.conv"]
    params = [opf.var(name, (2,)) for name in names]
    body = params[0]
    for param in params[1:]:
        body = body + param
    text = round_trip(module(params, body))
    header = text.splitlines()[0]
    for printed in ['%"input:0"', '%"1"', '%"a b"', r'%"say \"hi\""', r'%"back\\slash"',
                    '%"0"', "%layer1.0.conv"]:
        assert printed + ": Tensor" in header
    parsed = parse(text)["main"]
    assert [p.name_hint for p in parsed.params] == names


def test_variable_named_0_does_not_clash_with_temporary_0():
    zero = opf.var("0", (2,))
    tmp = opf.op.exp(zero)
    text = round_trip(module([zero], tmp + zero))
    assert 'add(%0, %"0")' in text


def test_duplicate_names_are_disambiguated():
    first, second, third = opf.var("x", (2,)), opf.var("x", (2,)), opf.var("x_1", (2,))
    text = round_trip(module([first, second, third], first - second + third))
    assert text.splitlines()[0].startswith("def @main(%x: Tensor[(2,), float32], "
                                           "%x_1: Tensor[(2,), float32], %x_1_1: ")
    assert "subtract(%x, %x_1)" in text


def test_nested_function_params_do_not_shadow_outer_names():
    x = opf.var("x", (2,))
    inner_x = opf.var("x", (2,))
    inner = opf.Function([inner_x], inner_x + x)  # the inner body also uses the outer %x
    round_trip(module([x], inner(x)))


@pytest.mark.parametrize("dtype, value, printed", [
    ("float32", 0.1, "0.1f"),
    ("float32", 1.0, "1f"),
    ("float32", -2.5, "-2.5f"),
    ("float32", 1e20, "1e+20f"),
    ("float32", np.nan, "nanf"),
    ("float32", np.inf, "inff"),
    ("float32", -np.inf, "-inff"),
    ("float64", 0.1, "0.1f64"),
    ("float64", np.nan, "nanf64"),
    ("float16", 0.1, "0.1f16"),
    ("float16", -np.inf, "-inff16"),
    ("int32", 3, "3"),
    ("int64", -3, "-3i64"),
    ("int8", -128, "-128i8"),
    ("int16", 300, "300i16"),
    ("uint8", 255, "255u8"),
    ("bool", True, "True"),
    ("bool", False, "False"),
])
def test_scalar_constants_of_every_dtype(dtype, value, printed):
    x = opf.var("x", (2,))
    const = opf.const(np.array(value, dtype=dtype))
    text = round_trip(module([x], opf.Tuple([x, const])))
    assert f"(%x, {printed})" in text
    parsed = parse(text)["main"].body.fields[1]
    assert parsed.data.dtype == dtype and parsed.data.shape == ()


def test_float_constants_keep_every_bit():
    rng = np.random.default_rng(0)
    for dtype in ("float16", "float32", "float64"):
        values = rng.standard_normal(50).astype(dtype) * np.asarray(10.0, dtype) ** rng.integers(
            -5, 5, 50).astype(dtype)
        consts = [opf.const(value) for value in values]
        parsed = parse(str(module([], opf.Tuple(consts))))["main"].body
        got = np.array([field.data for field in parsed.fields])
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"),
                                      values.view(f"u{values.itemsize}"))


def test_small_tensors_print_inline():
    matrix = opf.const(np.array([[1, 2], [3, 4]], "float32"))
    flags = opf.const(np.array([True, False]))
    one = opf.const(np.array([7], "int64"))
    text = round_trip(module([], opf.Tuple([matrix, flags, one])))
    assert "([[1f, 2f], [3f, 4f]], [True, False], [7i64])" in text
    assert "#[metadata]" not in text


def test_large_and_empty_tensors_go_to_metadata_in_order_of_appearance():
    big = opf.const(np.arange(9, dtype="int64"))
    empty = opf.const(np.zeros((0, 3), "float32"))
    text = round_trip(module([], opf.Tuple([empty, big, empty])))
    assert "(meta[Constant][0], meta[Constant][1], meta[Constant][0])" in text
    assert "Constant[1] = Tensor[(9,), int64] \"" in text
    fields = parse(text)["main"].body.fields
    assert fields[0] is fields[2]
    np.testing.assert_array_equal(fields[1].data, np.arange(9))


def test_metadata_numbering_spans_the_whole_module():
    a, b = opf.var("a", (9,)), opf.var("b", (9,))
    mod = opf.IRModule()
    mod["main"] = opf.Function([a], a + opf.const(np.zeros(9, "float32")))
    mod["other"] = opf.Function([b], b * opf.const(np.ones(9, "float32")))
    text = round_trip(mod)
    assert "add(%a, meta[Constant][0])" in text
    assert "multiply(%b, meta[Constant][1])" in text


def test_without_metadata_parse_says_how_to_get_it():
    text = seed_module().astext(show_meta_data=False)
    assert "#[metadata]" not in text
    assert body_of(text).startswith(SEED_TEXT)
    assert "show_meta_data=True" in text.splitlines()[-1]
    with pytest.raises(opf.ParseError, match="show_meta_data=True") as info:
        parse(text)
    assert (info.value.line, info.value.column) == (3, 16)


def test_attributes_print_when_not_default_and_round_trip():
    x = opf.var("x", (2, 3))
    body = opf.Tuple([
        opf.op.clip(x, a_min=-1.5, a_max=float("inf")),
        opf.op.cast(x, dtype="int32"),
        opf.op.nn.leaky_relu(x),
        opf.op.nn.leaky_relu(x, alpha=0.1),
    ])
    text = round_trip(module([x], body))
    assert "clip(%x, a_min=-1.5, a_max=inf)" in text
    assert 'cast(%x, dtype="int32")' in text
    assert "nn.leaky_relu(%x)" in text
    assert "nn.leaky_relu(%x, alpha=0.1)" in text


def test_attrs_are_rebuilt_equal_to_the_original():
    x = opf.var("x", (1, 3, 8, 8))
    w = opf.var("w", (3, 3, 3, 3))
    call = opf.op.nn.conv2d(x, w, strides=2, padding=(1, 1))
    parsed = parse(str(module([x, w], call)))["main"].body
    assert parsed.attrs == call.attrs
    assert "strides=[2, 2], padding=[1, 1, 1, 1]" in str(parsed)


def test_function_attributes_and_types():
    x = opf.var("x", (4,), dtype="int64")
    t = opf.var("t", opf.TupleType([opf.TensorType(()), opf.TensorType((2, 2), "uint8")]))
    f = opf.var("f", opf.FuncType([opf.TensorType((4,), "int64")], opf.TensorType((4,), "int64")))
    func = opf.Function([x, t, f], x, ret_type=opf.TensorType((4,), "int64"),
                        attrs={"Primitive": 1, "Name": 'fused "add"', "Scale": 0.5,
                               "Inline": True})
    text = round_trip(opf.IRModule.from_expr(func))
    assert text.splitlines()[0] == (
        'def @main(%x: Tensor[(4,), int64], %t: (Tensor[(), float32], Tensor[(2, 2), uint8]), '
        '%f: fn (Tensor[(4,), int64]) -> Tensor[(4,), int64], Primitive=1, '
        'Name="fused \\"add\\"", Scale=0.5, Inline=True) -> Tensor[(4,), int64] {')


def test_printing_expressions_that_are_not_modules():
    x = opf.var("x", (2,))
    y = opf.op.exp(x)
    assert astext(y * y) == "%0 = exp(%x);\nmultiply(%0, %0)"
    assert str(x) == "%x"
    assert str(opf.const(2.0)) == "2f"
    func = opf.Function([x], y)
    assert str(func) == "fn (%x: Tensor[(2,), float32]) {\n  exp(%x)\n}"
    assert_structural_equal(parse(str(func))["main"], func)


def test_tvm_flavoured_text_parses():
    text = """#[version = "0.0.5"]
    // TVM prints the types of values in comments, and 1-D shapes as (4)
    fn (%x: Tensor[(4), float32] /* ty=Tensor[(4), float32] */) -> Tensor[(4), float32] {
      %4 = fn (%p0: Tensor[(4), float32], Primitive=1) -> Tensor[(4), float32] {
        %0 = exp(%p0) /* ty=Tensor[(4), float32] */;
        /* a block
           comment */
        multiply(%0, 0.5f)
      }
      %4(%x) /* ty=Tensor[(4), float32] */
    }
    """
    func = parse(text)["main"]
    assert func.params[0].type_annotation == opf.TensorType((4,))
    assert func.body.op.is_primitive


def test_empty_text_is_an_empty_module():
    assert len(parse("  // nothing\n")) == 0


# ---------------------------------------------------------------------------------------------
# errors


HEADER = "def @main(%x: Tensor[(2, 3), float32]) {\n"


def parse_error(text: str) -> opf.ParseError:
    with pytest.raises(opf.ParseError) as info:
        parse(text)
    return info.value


def test_missing_paren_is_reported_where_it_is_missing():
    error = parse_error(HEADER + "  %0 = add(%x, 1f;\n  %0\n}")
    assert (error.line, error.column) == (2, 18)
    assert "expected ')' after call arguments, found ';'" in str(error)


def test_unknown_variable():
    error = parse_error(HEADER + "  %0 = add(%x, %y);\n  %0\n}")
    assert (error.line, error.column) == (2, 16)
    assert "unknown variable %y" in str(error)


def test_unknown_temporary():
    error = parse_error(HEADER + "  %0 = exp(%x);\n  add(%0, %1)\n}")
    assert (error.line, error.column) == (3, 11)
    assert "unknown temporary %1" in str(error)


def test_unknown_op_suggests_the_closest():
    error = parse_error(HEADER + "  %0 = nn.conv3d(%x, %x);\n  %0\n}")
    assert (error.line, error.column) == (2, 8)
    assert "unknown operator 'nn.conv3d'; did you mean 'nn.conv2d'?" in str(error)


def test_bad_attribute_value_points_at_the_value():
    error = parse_error(HEADER + '  clip(%x, a_min="low", a_max=1.0)\n}')
    assert (error.line, error.column) == (2, 18)
    assert "a_min" in str(error)


def test_unknown_attribute_points_at_its_name():
    error = parse_error(HEADER + "  clip(%x, a_mn=0.0, a_max=1.0)\n}")
    assert (error.line, error.column) == (2, 12)
    assert "did you mean 'a_min'?" in str(error)


def test_missing_required_attribute():
    error = parse_error(HEADER + "  clip(%x, a_min=0.0)\n}")
    assert (error.line, error.column) == (2, 3)
    assert "'a_max' is required" in str(error)


@pytest.mark.parametrize("text, line, column, message", [
    (HEADER + "  %0 = exp(%x)\n  %0\n}", 3, 3, "expected ';'"),
    (HEADER + "  exp(%x)\n", 2, 10, "found end of input"),
    (HEADER + "  add(%x, 300u8)\n}", 2, 11, "does not fit in uint8"),
    (HEADER + "  add(%x, [1f, 2i64])\n}", 2, 16, "one dtype"),
    (HEADER + "  add(%x, [[1f], [2f, 3f]])\n}", 2, 18, "ragged"),
    (HEADER + "  @g(%x)\n}", 2, 3, "unknown global function @g"),
    (HEADER + '  add(%x, "abc)\n}', 2, 11, "unterminated"),
    (HEADER + "  %0 = exp(%x);\n  %0 = exp(%x);\n  %0\n}", 3, 3, "already bound"),
    ("def @main(%x: Tensor[(2, 3), flot32]) { %x }", 1, 30, "expected a dtype"),
    ("def @main(%x) { %x }", 1, 13, "expected ':' and a type"),
    ("def @main(%x: Tensor[(2,), float32], %x: Tensor[(2,), float32]) { %x }", 1, 38,
     "declared twice"),
    ("def @f() { 1f }\ndef @f() { 2f }", 2, 5, "defined twice"),
    ("hello", 1, 1, "expected 'def @name(...)'"),
    (HEADER + "  meta[Constant][0]\n}\n#[metadata]\n"
     "Constant[0] = Tensor[(2,), float32] \"AAAA\"",
     5, 37, "has 3 bytes of data but Tensor[(2,), float32] needs 8"),
    (HEADER + "  meta[Constant][1]\n}\n#[metadata]\n"
     "Constant[0] = Tensor[(1,), float32] \"AAAAAA==\"",
     2, 3, "no Constant[1]"),
])
def test_syntax_errors_say_where_and_what(text, line, column, message):
    error = parse_error(text)
    assert (error.line, error.column) == (line, column), str(error)
    assert message in str(error)


def test_deep_nesting_is_a_parse_error_not_a_crash():
    text = HEADER + "  " + "(" * 5000 + "%x" + ")" * 5000 + "\n}"
    assert "nests too deeply" in str(parse_error(text))


# ---------------------------------------------------------------------------------------------
# random graphs

UNARY = ["exp", "nn.relu", "negative", "tanh", "sigmoid", "abs"]
BINARY = ["add", "subtract", "multiply", "maximum", "minimum"]
NAMES = ["x", "x", "x_1", "input:0", "a b", "0", 'q"uote', "layer1.0.conv", "p0"]
SHAPE = (2, 3)
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
any32 = st.floats(width=32)


@st.composite
def constants(draw):
    shape = draw(st.sampled_from([(), (3,), (1, 3), (2, 1), (2, 3), (4, 2, 3), (0, 3)]))
    dtype = draw(st.sampled_from(DTYPES)) if draw(st.booleans()) else "float32"
    return opf.const(draw(hnp.arrays(dtype, shape)))


@st.composite
def graphs(draw):
    params = [opf.var(draw(st.sampled_from(NAMES)), SHAPE)
              for _ in range(draw(st.integers(1, 3)))]
    nodes: list = list(params)
    pick = lambda: draw(st.sampled_from(nodes))  # noqa: E731
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["unary", "binary", "const", "tuple", "clip", "fn"]))
        if kind == "unary":
            nodes.append(opf.Call(get_op(draw(st.sampled_from(UNARY))), [pick()]))
        elif kind == "binary":
            nodes.append(opf.Call(get_op(draw(st.sampled_from(BINARY))), [pick(), pick()]))
        elif kind == "const":
            nodes.append(opf.Call(get_op(draw(st.sampled_from(BINARY))),
                                  [pick(), draw(constants())]))
        elif kind == "tuple":
            fields = [pick() for _ in range(draw(st.integers(1, 3)))]
            tup = opf.Tuple(fields)
            nodes.append(tup[draw(st.integers(0, len(fields) - 1))])
        elif kind == "clip":
            low, high = sorted([draw(finite32), draw(any32.filter(lambda v: v == v))])
            nodes.append(opf.op.clip(pick(), a_min=low, a_max=high))
        else:
            inner = [opf.var(draw(st.sampled_from(NAMES)), SHAPE) for _ in range(2)]
            op = get_op(draw(st.sampled_from(BINARY)))
            value = opf.op.exp(opf.Call(op, inner)) if draw(st.booleans()) else opf.Call(op, inner)
            ret = opf.TensorType(SHAPE) if draw(st.booleans()) else None
            fn = opf.Function(inner, value, ret_type=ret, attrs={"Primitive": 1})
            nodes.append(fn(pick(), pick()))
    outputs = nodes[len(params):]
    count = draw(st.integers(1, min(3, len(outputs))))
    body = outputs[-1] if count == 1 else opf.Tuple(outputs[-count:])
    return module(params, body)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_random_graphs_round_trip(mod):
    round_trip(mod)


@settings(max_examples=60, deadline=None)
@given(constants())
def test_random_constants_round_trip(const):
    x = opf.var("x", SHAPE)
    round_trip(module([x], opf.Tuple([x, const])))


# ---------------------------------------------------------------------------------------------
# scale

NODES = 100_000


def plus_chain(count: int) -> opf.IRModule:
    x = opf.var("x", (4,))
    one = opf.const(1.0)  # printed inline at each use, parsed as distinct constants
    y = x
    for _ in range(count):
        y = y + one
    return module([x], y)


def wide_dag(count: int, width: int = 1000) -> opf.IRModule:
    """``width`` branches off x, then layers that each combine neighbours: every node has two
    users, and the result sums the last layer pairwise."""
    x = opf.var("x", (4,))
    layer = [opf.op.exp(x) * opf.const(float(k)) for k in range(width // 2)]
    made = len(layer) * 2
    while made + len(layer) < count:
        layer = [layer[k] - layer[(k + 1) % len(layer)] for k in range(len(layer))]
        made += len(layer)
    while len(layer) > 1:
        layer = [layer[k] + layer[k + 1] if k + 1 < len(layer) else layer[k]
                 for k in range(0, len(layer), 2)]
    return module([x], layer[0])


@pytest.fixture
def low_recursion_limit():
    # A small limit makes any recursion over graph size fail at once instead of by luck.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    yield
    sys.setrecursionlimit(old)


@pytest.mark.parametrize("build", [plus_chain, wide_dag], ids=["chain", "wide_dag"])
def test_100k_node_graphs_print_and_parse(build, low_recursion_limit):
    mod = build(NODES)
    text = str(mod)
    assert text.count("\n") >= NODES - 1
    assert str(parse(text)) == text
