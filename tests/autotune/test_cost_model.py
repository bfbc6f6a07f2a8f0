"""The tuner's cost models: they rank unseen candidates of a synthetic task in the order of
their true times, score zeros until they have learned something, take degenerate data
without raising, and give the same scores for the same data."""

import sys

import numpy as np
import pytest

from opfusion.autotune.cost_model import (
    MIN_SAMPLES,
    CostModelError,
    GradientBoostedModel,
    RidgeNeighbourModel,
    default_cost_model,
)


@pytest.fixture(params=["ridge_neighbours", "lightgbm"])
def make_model(request):
    """A factory of each model (the LightGBM one only where lightgbm is installed)."""
    if request.param == "lightgbm":
        pytest.importorskip("lightgbm", reason="lightgbm (optional) is not installed")
        return GradientBoostedModel
    return RidgeNeighbourModel


def synthetic_task(n=200, seed=0):
    """``n`` candidates of 6 features and their times: a smooth function of the features
    (linear, quadratic, an interaction, a wiggle) with 10 % log-normal noise."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 6))
    log_time = (1.0 * x[:, 0] - 0.7 * x[:, 1] + 0.8 * x[:, 2] ** 2 + 0.5 * x[:, 3] * x[:, 4]
                + 0.3 * np.sin(3 * x[:, 5]))
    return x, 1e-3 * np.exp(log_time + rng.normal(0, 0.1, n))


def ranks(values):
    out = np.empty(len(values))
    out[np.argsort(values, kind="stable")] = np.arange(len(values))
    return out


def spearman(a, b):
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


@pytest.mark.parametrize("seed", [0, 1])
def test_the_model_ranks_held_out_candidates_by_their_time(make_model, seed):
    x, seconds = synthetic_task(seed=seed)
    model = make_model()
    model.fit(x[:150], seconds[:150])
    scores = model.predict(x[150:])
    assert spearman(scores, -seconds[150:]) > 0.7  # higher score: faster


def test_predict_before_fit_is_no_preference(make_model):
    x, _ = synthetic_task(n=10)
    assert np.array_equal(make_model().predict(x), np.zeros(10))


def test_too_few_samples_teach_nothing(make_model):
    x, seconds = synthetic_task(n=MIN_SAMPLES - 1)
    model = make_model()
    model.fit(x, seconds)
    assert np.array_equal(model.predict(x), np.zeros(len(x)))


@pytest.mark.parametrize("case", ["constant_features", "equal_times", "one_sample",
                                  "bad_times", "nan_features", "empty"])
def test_degenerate_data_does_not_raise(make_model, case):
    x, seconds = synthetic_task(n=20)
    if case == "constant_features":
        x = np.ones_like(x)
    elif case == "equal_times":
        seconds = np.full(20, 1e-3)
    elif case == "one_sample":
        x, seconds = x[:1], seconds[:1]
    elif case == "bad_times":
        seconds = seconds.copy()
        seconds[:15] = [np.nan, np.inf, 0.0, -1.0, np.nan] * 3  # 5 good ones are left
    elif case == "nan_features":
        x = x.copy()
        x[::3, 2] = np.nan
    else:
        x, seconds = np.zeros((0, 6)), np.zeros(0)
    model = make_model()
    model.fit(x, seconds)
    scores = model.predict(synthetic_task(n=7, seed=3)[0])
    assert scores.shape == (7,) and np.isfinite(scores).all()
    if case in ("constant_features", "equal_times", "one_sample", "empty"):
        assert np.array_equal(scores, np.zeros(7))


def test_the_same_data_gives_the_same_scores(make_model):
    x, seconds = synthetic_task(n=60)
    scores = []
    for _ in range(2):
        model = make_model()
        model.fit(x[:40], seconds[:40])
        scores.append(model.predict(x[40:]))
    assert np.array_equal(scores[0], scores[1])


def test_features_of_another_width_are_an_error(make_model):
    x, seconds = synthetic_task(n=20)
    model = make_model()
    model.fit(x, seconds)
    with pytest.raises(CostModelError, match="6"):
        model.predict(x[:, :4])


def test_the_default_model_is_lightgbm_when_it_imports():
    pytest.importorskip("lightgbm", reason="lightgbm (optional) is not installed")
    assert isinstance(default_cost_model(), GradientBoostedModel)


def test_the_default_model_falls_back_to_numpy_without_lightgbm(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightgbm", None)  # import lightgbm -> ImportError
    assert isinstance(default_cost_model(), RidgeNeighbourModel)
