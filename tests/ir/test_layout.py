"""Layout strings (opfusion.ir.layout): parsing, shapes, index maps and the NumPy transform,
checked against each other and against hand-written reshapes."""

import numpy as np
import pytest

from opfusion.ir.layout import Layout, LayoutError, transform_array


def arange(*shape):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape)


def test_parse_primal_and_blocked_axes():
    layout = Layout.parse("NCHW16c")
    assert layout.axes == (("N", 0), ("C", 0), ("H", 0), ("W", 0), ("C", 16))
    assert layout.primal == "NCHW" and layout.factor("C") == 16 and layout.factor("H") == 1
    assert Layout.parse("OIHW8i16o").factor("I") == 8
    assert Layout.parse("OIHW8i16o").factor("O") == 16


@pytest.mark.parametrize("text, words", [
    ("", "a string"), ("NCHW0c", "positive"), ("NC16HW", "no size"), ("NCHWC", "twice"),
    ("NCHW4c8c", "twice"), ("NCHW4x", "no primal X"), ("NCHW-", "does not parse"),
    ("NCHWc", "positive"),
])
def test_bad_layouts_are_layout_errors_that_say_why(text, words):
    with pytest.raises(LayoutError, match=words):
        Layout.parse(text)


def test_shape_and_primal_shape_are_inverse():
    layout = Layout.parse("NCHW8c")
    assert layout.shape((2, 32, 5, 7), "NCHW") == (2, 4, 5, 7, 8)
    assert layout.primal_shape((2, 4, 5, 7, 8)) == {"N": 2, "C": 32, "H": 5, "W": 7}
    with pytest.raises(LayoutError, match="not a multiple of the block 8"):
        layout.shape((1, 12, 5, 5), "NCHW")


def test_to_blocked_matches_a_reshape_and_transpose():
    x = arange(2, 32, 3, 5)
    got = transform_array(x, Layout.parse("NCHW"), Layout.parse("NCHW16c"))
    want = x.reshape(2, 2, 16, 3, 5).transpose(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(got, want)


def test_weights_to_blocked_matches_a_reshape_and_transpose():
    w = arange(32, 8, 3, 3)
    got = transform_array(w, Layout.parse("OIHW"), Layout.parse("OIHW4i16o"))
    want = w.reshape(2, 16, 2, 4, 3, 3).transpose(0, 2, 4, 5, 3, 1)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("src, dst", [("NCHW", "NCHW8c"), ("NCHW16c", "NCHW4c"),
                                      ("NCHW4c", "NCHW"), ("NCHW", "NHWC"),
                                      ("NCHW8c", "NHWC")])
def test_transforms_round_trip_and_agree_with_the_index_maps(src, dst):
    plain = arange(1, 16, 3, 2)
    source = transform_array(plain, Layout.parse("NCHW"), Layout.parse(src))
    out = transform_array(source, Layout.parse(src), Layout.parse(dst))
    back = transform_array(out, Layout.parse(dst), Layout.parse("NCHW"))
    np.testing.assert_array_equal(back, plain)
    # Every element of the result is where the index maps say.
    layout_src, layout_dst = Layout.parse(src), Layout.parse(dst)
    for index in np.ndindex(*out.shape):
        primal = layout_dst.primal_index(index)
        assert out[index] == source[tuple(layout_src.index(primal))]


def test_layouts_of_different_axes_do_not_transform():
    with pytest.raises(LayoutError, match="primal axes differ"):
        transform_array(arange(1, 4, 2, 2), Layout.parse("NCHW"), Layout.parse("OIHW"))
