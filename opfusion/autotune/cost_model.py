"""Cost models: learn, from one task's measurements, which untried candidates look fastest.

A model is trained online on the features (:mod:`.features`) and measured times of the
task's correct candidates so far (failed ones are not passed) and scores new candidates;
only the order of the scores matters (higher: predicted faster). Both models regress
``log2(best / seconds)``, the candidate's speed relative to the best so far in octaves: the
log evens out times that span orders of magnitude, and relative to the best it is the same
whatever the task's size.

- :class:`GradientBoostedModel`: LightGBM's boosted trees, as TVM's and Ansor's XGBoost
  models; ``lightgbm`` is an optional dependency, imported when first fitted.
- :class:`RidgeNeighbourModel`: pure NumPy, the fallback without LightGBM.

:func:`default_cost_model` picks the first that is available. Every model is deterministic,
scores zeros (no preference) until it has :data:`MIN_SAMPLES` measurements, and takes
degenerate data (constant features, equal times, NaN) without raising."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from ..errors import OpfusionError

logger = logging.getLogger("opfusion.autotune")

#: Fewer measurements than this teach nothing: the model scores zeros until it has them.
MIN_SAMPLES = 4


class CostModel(ABC):
    """Scores candidates from their features; trained on measured ones.

    Subclasses implement :meth:`_fit` (on clean data: at least :data:`MIN_SAMPLES` rows,
    finite features, targets that are not all equal) and :meth:`_predict`."""

    name: str = "cost model"

    def __init__(self) -> None:
        self._trained = False
        self._width: int | None = None

    def fit(self, features: np.ndarray, seconds: np.ndarray) -> None:
        """Train on ``features`` (n x d) of measured candidates and their times (n, in
        seconds), replacing what was learned before. Rows with a time that is not a positive
        finite number are left out."""
        x, y = _training_data(features, seconds)
        self._width = x.shape[1]
        self._trained = False
        if len(y) < MIN_SAMPLES or np.ptp(y) == 0 or np.ptp(x, axis=0).max(initial=0) == 0:
            return  # too few samples, or nothing to tell them apart: no preference
        self._fit(x, y)
        self._trained = True

    def predict(self, features: np.ndarray) -> np.ndarray:
        """Scores of the candidates with ``features`` (n x d): higher is predicted faster;
        zeros before the model has learned anything."""
        x = _as_matrix(features, "features")
        if self._width is not None and x.shape[1] != self._width and len(x):
            raise CostModelError(f"{self.name}: candidates have {x.shape[1]} features but the "
                                 f"model was fitted on {self._width}; use one model per task")
        if not self._trained or not len(x):
            return np.zeros(len(x))
        return np.asarray(self._predict(x), dtype=np.float64)

    @abstractmethod
    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        """Learn ``y`` (relative speed in octaves, higher is faster) from ``x``."""

    @abstractmethod
    def _predict(self, x: np.ndarray) -> np.ndarray:
        """The learned ``y`` of ``x``."""

    def __repr__(self) -> str:
        return f"<{self.name}, {'trained' if self._trained else 'untrained'}>"


class CostModelError(OpfusionError):
    """A cost model was given features of the wrong shape."""


class GradientBoostedModel(CostModel):
    """LightGBM's gradient-boosted regression trees, sized for tens to hundreds of samples:
    small trees (few leaves) that may split down to a couple of samples, a fixed seed, one
    thread and LightGBM's deterministic mode, so the same data gives the same scores. It
    uses LightGBM's own training API (no scikit-learn needed). Regression on the relative
    speed rather than a ranking objective (lambdarank): with one task's few samples the two
    order candidates alike, and regression needs no query groups or relevance grades."""

    name = "gradient-boosted trees (lightgbm)"

    def __init__(self, rounds: int = 100, learning_rate: float = 0.1, num_leaves: int = 8,
                 seed: int = 0) -> None:
        super().__init__()
        self.rounds = rounds
        self.params: dict[str, Any] = {
            "objective": "regression", "learning_rate": learning_rate,
            "num_leaves": num_leaves, "min_data_in_leaf": 2, "min_data_in_bin": 1,
            "lambda_l2": 1e-3, "seed": seed, "deterministic": True, "force_col_wise": True,
            "feature_pre_filter": False, "num_threads": 1, "verbose": -1,
        }
        self._booster: Any = None

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        import lightgbm  # optional: only this model needs it

        data = lightgbm.Dataset(x, y, params=self.params, free_raw_data=True)
        self._booster = lightgbm.train(self.params, data, num_boost_round=self.rounds)

    def _predict(self, x: np.ndarray) -> np.ndarray:
        return self._booster.predict(x, num_threads=1)


class RidgeNeighbourModel(CostModel):
    """Pure NumPy: ridge regression blended with a k-nearest-neighbour average.

    Features are standardised (constant ones dropped). The ridge regression fits them and
    their squares, so it follows smooth trends (bigger tiles faster, up to a point) and
    extrapolates to unseen regions; the neighbour average (the ``k`` closest measured
    candidates, weighted by inverse distance) follows what the squares cannot, such as a
    cliff where a tile stops fitting in registers. The ridge strength and the blend are
    chosen by leave-one-out error on the training data (exact and cheap for both parts), so
    nothing needs tuning per task. Deterministic: no random state at all."""

    name = "ridge regression + nearest neighbours (numpy)"

    #: The ridge strengths tried, relative to the number of samples.
    ALPHAS = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
    #: The shares of the ridge prediction tried in the blend (the rest is the neighbours').
    BLENDS = (0.0, 0.25, 0.5, 0.75, 1.0)

    def __init__(self, k: int = 5) -> None:
        super().__init__()
        self.k = k

    def _fit(self, x: np.ndarray, y: np.ndarray) -> None:
        std = x.std(axis=0)
        self._keep = std > 1e-12 * np.maximum(1.0, np.abs(x).max(axis=0))
        self._mean = x.mean(axis=0)[self._keep]
        self._scale = std[self._keep]
        z = self._standardise(x)
        self._z, self._y, self._offset = z, y, y.mean()
        basis = self._basis(z)
        alpha, ridge_loo = self._choose_alpha(basis, y - self._offset)
        self._weights = _ridge(basis, y - self._offset, alpha)
        knn_loo = self._neighbours(z, exclude_self=True)
        errors = [np.mean((b * ridge_loo + (1 - b) * knn_loo - y) ** 2) for b in self.BLENDS]
        self._blend = self.BLENDS[int(np.argmin(errors))]

    def _predict(self, x: np.ndarray) -> np.ndarray:
        z = self._standardise(x)
        ridge = self._basis(z) @ self._weights + self._offset
        return self._blend * ridge + (1 - self._blend) * self._neighbours(z)

    def _standardise(self, x: np.ndarray) -> np.ndarray:
        return (x[:, self._keep] - self._mean) / self._scale

    @staticmethod
    def _basis(z: np.ndarray) -> np.ndarray:
        """The features and their squares less 1 (a standardised feature's mean square)."""
        return np.hstack([z, z * z - 1.0])

    def _choose_alpha(self, basis: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """The ridge strength with the least leave-one-out error, and the leave-one-out
        predictions under it (``y - r / (1 - h)``, from the hat matrix's diagonal)."""
        n = len(y)
        best: tuple[float, float, np.ndarray] | None = None
        for relative in self.ALPHAS:
            alpha = relative * n
            hat = basis @ np.linalg.solve(basis.T @ basis + alpha * np.eye(basis.shape[1]),
                                          basis.T)
            residual = y - hat @ y
            leverage = np.clip(1.0 - np.diag(hat), 1e-6, None)
            loo = y - residual / leverage
            error = float(np.mean((loo - y) ** 2))
            if best is None or error < best[0]:
                best = (error, alpha, loo + self._offset)
        assert best is not None
        return best[1], best[2]

    def _neighbours(self, z: np.ndarray, exclude_self: bool = False) -> np.ndarray:
        """The inverse-distance-weighted mean target of each row's ``k`` nearest training
        samples (without itself when ``exclude_self``: the leave-one-out prediction)."""
        squared = ((z * z).sum(axis=1)[:, None] + (self._z * self._z).sum(axis=1)[None, :]
                   - 2.0 * z @ self._z.T)
        distance = np.sqrt(np.maximum(squared, 0.0))
        if exclude_self:
            np.fill_diagonal(distance, np.inf)
        k = min(self.k, len(self._y) - int(exclude_self))
        nearest = np.argsort(distance, axis=1, kind="stable")[:, :k]
        near = np.take_along_axis(distance, nearest, axis=1)
        weights = 1.0 / (near + 1e-9)
        return (weights * self._y[nearest]).sum(axis=1) / weights.sum(axis=1)


def default_cost_model() -> CostModel:
    """A :class:`GradientBoostedModel` when ``lightgbm`` is installed, else a
    :class:`RidgeNeighbourModel`."""
    try:
        import lightgbm  # noqa: F401 - optional; a broken install (no libgomp) is an OSError
    except (ImportError, OSError) as err:
        logger.debug("cost model: ridge regression + nearest neighbours (lightgbm does not "
                     "import: %s; pip install lightgbm for boosted trees)", err)
        return RidgeNeighbourModel()
    logger.debug("cost model: LightGBM's gradient-boosted trees")
    return GradientBoostedModel()


# ---------------------------------------------------------------------------------------------
# helpers


def _as_matrix(features: Any, what: str) -> np.ndarray:
    x = np.asarray(features, dtype=np.float64)
    if x.ndim == 1 and x.size == 0:
        x = x.reshape(0, 0)
    if x.ndim != 2:
        raise CostModelError(f"cost model {what} must be a matrix (candidates x features), "
                             f"not an array of shape {x.shape}")
    return np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


def _training_data(features: Any, seconds: Any) -> tuple[np.ndarray, np.ndarray]:
    """The rows with a positive finite time, and their relative speed in octaves."""
    x = _as_matrix(features, "features")
    t = np.asarray(seconds, dtype=np.float64).reshape(-1)
    if len(t) != len(x):
        raise CostModelError(f"cost model: {len(x)} feature rows but {len(t)} times")
    ok = np.isfinite(t) & (t > 0)
    x, t = x[ok], t[ok]
    if not len(t):
        return x, t
    return x, np.log2(t.min() / t)


def _ridge(basis: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    return np.linalg.solve(basis.T @ basis + alpha * np.eye(basis.shape[1]), basis.T @ y)


__all__ = ["MIN_SAMPLES", "CostModel", "CostModelError", "GradientBoostedModel",
           "RidgeNeighbourModel", "default_cost_model"]
