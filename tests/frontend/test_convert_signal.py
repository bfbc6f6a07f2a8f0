"""DFT, STFT, MelWeightMatrix and TfIdfVectorizer: imported graphs agree with onnx.reference
(interpreted, and compiled for some), and shape-deciding inputs must be constants."""

import itertools

import numpy as np
import pytest

pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402
from onnx_one_node import check, make_model  # noqa: E402

import opfusion as opf  # noqa: E402
from opfusion.errors import DataDependentError, OnnxImportError, OpfusionError  # noqa: E402
from opfusion.frontend import from_onnx  # noqa: E402
from opfusion.frontend.onnx.staged import OnnxStagedModel  # noqa: E402
from opfusion.testing import assert_close  # noqa: E402

rng = np.random.default_rng(5)


def normal(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def scalar(value, dtype=np.int64):
    return np.array(value, dtype)


# -- DFT -------------------------------------------------------------------------------------

REAL = normal(2, 8, 5, 1)
COMPLEX = normal(2, 8, 5, 2)


@pytest.mark.parametrize("signal,inverse,onesided,axis", [
    (s, i, o, a) for s, i, o, a in itertools.product(("real", "complex"), (0, 1), (0, 1),
                                                     (1, 2, -2, -3))
    if not (s == "real" and i and not o)])
def test_dft_opset20(signal, inverse, onesided, axis):
    x = REAL if signal == "real" else COMPLEX
    check("DFT", {"x": x}, {"axis": scalar(axis)}, names=["x", "", "axis"], inverse=inverse,
          onesided=onesided)


@pytest.mark.parametrize("length", [3, 8, 11])
@pytest.mark.parametrize("inverse,onesided", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_dft_length(length, inverse, onesided):
    check("DFT", {"x": COMPLEX}, {"n": scalar(length), "axis": scalar(1)},
          names=["x", "n", "axis"], inverse=inverse, onesided=onesided)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_dft_opset17_axis_attribute_and_compiled(axis):
    check("DFT", {"x": REAL}, opset=17, axis=axis, compiled=axis == 1)
    check("DFT", {"x": COMPLEX}, {"n": scalar(6)}, opset=17, names=["x", "n"], axis=axis,
          inverse=1)


def test_dft_default_axis_opset20_and_float64():
    check("DFT", {"x": normal(3, 6, 2).astype(np.float64)}, onesided=1)


def test_dft_length_computed_at_run_time_runs_in_stages():
    inputs = {"x": REAL, "n": scalar(4)}
    model = make_model(helper.make_node("DFT", ["x", "n"], ["y"]), inputs, opset=17)
    with pytest.raises(DataDependentError, match="dft_length"):
        from_onnx(model, data_dependent="raise")
    mod, params = from_onnx(model)
    assert isinstance(mod, OnnxStagedModel)
    exe = opf.compile(mod, params=params)
    for length in (4, 9):
        inputs["n"] = scalar(length)
        assert_close(exe.run(inputs)[0], ReferenceEvaluator(model).run(None, inputs)[0])


def test_dft_on_the_complex_axis_is_refused():
    model = make_model(helper.make_node("DFT", ["x"], ["y"], axis=3), {"x": REAL}, opset=17)
    with pytest.raises(OpfusionError, match="axis"):
        from_onnx(model)


# -- STFT ------------------------------------------------------------------------------------

SIGNAL = normal(2, 40, 1)


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("step,length", [(4, 16), (5, 9), (16, 16)])
def test_stft_without_window(onesided, step, length):
    check("STFT", {"x": SIGNAL}, {"step": scalar(step), "length": scalar(length)},
          opset=17, names=["x", "step", "", "length"], onesided=onesided)


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_with_window_compiled(onesided):
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(12) / 12)).astype(np.float32)
    check("STFT", {"x": SIGNAL, "window": window}, {"step": scalar(7)}, opset=17,
          names=["x", "step", "window"], onesided=onesided, compiled=True)


def test_stft_complex_signal():
    check("STFT", {"x": normal(1, 30, 2)}, {"step": scalar(6), "length": scalar(10)},
          opset=17, names=["x", "step", "", "length"], onesided=0)


def test_stft_window_length_must_match_frame_length():
    model = make_model(helper.make_node("STFT", ["x", "step", "w", "n"], ["y"]),
                       {"x": SIGNAL, "w": np.ones(8, np.float32)},
                       {"step": scalar(4), "n": scalar(10)}, opset=17)
    with pytest.raises(OpfusionError, match="window"):
        from_onnx(model)


# -- MelWeightMatrix -------------------------------------------------------------------------


@pytest.mark.parametrize("bins,length,rate,low,high", [
    (8, 16, 8192, 0.0, 4096.0), (10, 64, 16000, 300.0, 7000.0), (20, 32, 8000, 100.0, 3000.0)])
def test_mel_weight_matrix(bins, length, rate, low, high):
    consts = {"bins": scalar(bins), "length": scalar(length), "rate": scalar(rate),
              "low": scalar(low, np.float32), "high": scalar(high, np.float32)}
    mod = check("MelWeightMatrix", {}, consts, opset=17)
    assert "mel" not in mod.astext()  # folded to a constant
    check("MelWeightMatrix", {}, consts, opset=17, output_datatype=TensorProto.DOUBLE)


def test_mel_weight_matrix_beyond_nyquist_is_an_error():
    consts = {"bins": scalar(4), "length": scalar(8), "rate": scalar(1000),
              "low": scalar(0.0, np.float32), "high": scalar(5000.0, np.float32)}
    with pytest.raises(OpfusionError, match="sample_rate / 2"):
        from_onnx(make_model(helper.make_node("MelWeightMatrix", list(consts), ["y"]), {},
                             consts, opset=17))


# -- TfIdfVectorizer -------------------------------------------------------------------------

# Unigrams 2 3 5 4; bigrams (5 6) (7 8) (5 6): a repeat, which counts in its last column;
# one trigram (5 6 7), which shares column 2 with unigram 5.
POOL = dict(ngram_counts=[0, 4, 10], ngram_indexes=[0, 1, 2, 3, 4, 5, 6, 2],
            pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 5, 6, 5, 6, 7])
TOKENS = rng.integers(2, 9, (3, 12)).astype(np.int32)


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("grams,skip", [((1, 1), 0), ((2, 2), 0), ((1, 2), 3), ((2, 3), 5),
                                        ((1, 3), 1)])
def test_tfidf_vectorizer(mode, grams, skip):
    weights = {} if mode == "TF" else {"weights": list(rng.uniform(0.5, 2, 7))}
    check("TfIdfVectorizer", {"x": TOKENS}, opset=9, mode=mode, min_gram_length=grams[0],
          max_gram_length=grams[1], max_skip_count=skip, **POOL, **weights)


def test_tfidf_vectorizer_one_row_int64_no_weights_compiled():
    # onnx.reference fails without weights; then IDF is 1 where TF counts, TFIDF is TF.
    inputs = {"x": TOKENS[0].astype(np.int64)}
    attrs = dict(min_gram_length=1, max_gram_length=3, max_skip_count=2, **POOL)
    check("TfIdfVectorizer", inputs, opset=9, mode="TF", compiled=True, **attrs)
    counts = ReferenceEvaluator(make_model(helper.make_node(
        "TfIdfVectorizer", ["x"], ["y"], mode="TF", **attrs), inputs, opset=9)).run(
        None, inputs)[0]
    assert counts.max() > 1
    for mode, want in (("IDF", (counts > 0).astype(np.float32)), ("TFIDF", counts)):
        mod, params = from_onnx(make_model(helper.make_node(
            "TfIdfVectorizer", ["x"], ["y"], mode=mode, **attrs), inputs, opset=9))
        assert_close(opf.compile(mod, params=params).run(inputs)[0], want)


def test_tfidf_vectorizer_string_pool_is_refused():
    model = make_model(helper.make_node("TfIdfVectorizer", ["x"], ["y"], mode="TF",
                                        min_gram_length=1, max_gram_length=1, max_skip_count=0,
                                        ngram_counts=[0], ngram_indexes=[0],
                                        pool_strings=["a"]), {"x": TOKENS}, opset=9)
    with pytest.raises(OnnxImportError, match="pool_strings"):
        from_onnx(model)
