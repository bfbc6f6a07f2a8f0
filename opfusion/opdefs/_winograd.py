"""Winograd's minimal filtering F(m x m, 3 x 3) (Lavin and Gray, 2015): the transform
matrices and the algorithm in NumPy, shared by the operators' references and their computes.

A 3x3 convolution of stride 1 computes each m x m block of outputs ("tile") from an
alpha x alpha patch of input (alpha = m + 2) as ``A^T [(G g G^T) * (B^T d B)] A``: the filter
``g`` and the patch ``d`` are transformed, multiplied element by element, and transformed back.
Over C input channels the element-wise products are summed, so one tile costs alpha^2 x C x K
multiply-adds instead of m^2 x 9 x C x K: 2.25 times fewer for F(2x2) (alpha 4) and 4 times
fewer for F(4x4) (alpha 6), plus the transforms, whose cost grows with C + K, not C x K.

The matrices are Toom-Cook's for alpha - 1 finite points and infinity (see
:func:`toom_cook`): 0, +-1 and infinity for F(2x2); 0, +-1, 1/2, -2 and infinity for F(4x4).
Rounding: F(2x2)'s transforms only add and halve, so its float32 error is that of direct
convolution (measured on random 3x3 layers of 64 to 512 channels: 3e-7 to 9e-7 of the
largest output, direct 1e-6 to 3e-6). F(4x4)'s transforms scale by up to 8, so the points
matter: Lavin and Gray's 0, +-1, +-2 round 2.5-3x worse than 0, +-1, 1/2, -2 (Barabasz et
al., "Error analysis and improving the accuracy of Winograd convolution for deep neural
networks", 2020: a point and its reciprocal balance the powers in ``A^T``): in a float32
simulation of post-ReLU layers of 256 channels, 7.8e-6 to 9.4e-6 against 3.0e-6 to 3.4e-6 of
the largest output (direct 1.3e-6; 0, +-1, +-1/2 and 0, +-1, +-3/2 are no better than
Lavin's); compiled, on resnet50's layers, 2.8e-6 to 4.1e-6 against 1.1e-6 to 2.2e-6.
``tests/ops/test_winograd.py`` holds both tiles to these bounds."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

#: The finite interpolation points of each output tile size (infinity is the last point).
POINTS: dict[int, tuple[Fraction, ...]] = {
    2: (Fraction(0), Fraction(1), Fraction(-1)),
    4: (Fraction(0), Fraction(1), Fraction(-1), Fraction(1, 2), Fraction(-2)),
}

#: Output tile sizes with matrices here.
TILE_SIZES = tuple(POINTS)


def _polynomial(roots: list[Fraction]) -> list[Fraction]:
    """The coefficients, lowest power first, of the monic polynomial with these roots."""
    coefficients = [Fraction(1)]
    for root in roots:
        shifted = [Fraction(0), *coefficients]  # x * p(x)
        coefficients = [high - root * low
                        for high, low in zip(shifted, [*coefficients, Fraction(0)])]
    return coefficients


def toom_cook(points: tuple[Fraction, ...], taps: int = 3
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(B^T, G, A^T)`` of F(m, taps) for the finite ``points`` (m = len(points) + 2 - taps)
    and infinity, exactly in rationals, then as float64: ``A^T[i, j] = p_j^i``, ``G[j, k] =
    p_j^k / prod(p_j - p_l)`` and row j of ``B^T`` the coefficients of ``prod(x - p_l)`` over
    l != j; the point at infinity adds the last column of ``A^T`` (its last row), the last row
    of ``G`` (its last tap) and the last row of ``B^T`` (the coefficients of ``prod(x - p_l)``
    over all l). A row of ``B^T`` whose first coefficient is negative is negated, with its
    row of ``G``: the same products, fewer negations."""
    alpha = len(points) + 1
    tile = alpha + 1 - taps
    at = [[point ** i for point in points] + [Fraction(int(i == tile - 1))]
          for i in range(tile)]
    g, bt = [], []
    for j, point in enumerate(points):
        others = [p for i, p in enumerate(points) if i != j]
        scale = Fraction(1)
        for other in others:
            scale *= point - other
        g.append([point ** k / scale for k in range(taps)])
        bt.append([*_polynomial(others), Fraction(0)])
    g.append([Fraction(int(k == taps - 1)) for k in range(taps)])
    bt.append(_polynomial(list(points)))
    for j, row in enumerate(bt):  # a row and its filter row negated: the same products
        if next(c for c in row if c) < 0:
            bt[j], g[j] = [-c for c in row], [-c for c in g[j]]
    return tuple(np.array(m, dtype=np.float64) for m in (bt, g, at))  # type: ignore[return-value]


_MATRICES = {tile: toom_cook(points) for tile, points in POINTS.items()}


def matrices(tile: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(B^T, G, A^T)`` of F(tile x tile, 3 x 3): alpha x alpha, alpha x 3, tile x alpha."""
    return _MATRICES[tile]


def transform_weight(weight: np.ndarray, tile: int) -> np.ndarray:
    """``G g G^T`` of every filter of a blocked weight (KB, CB, 3, 3, i, o): the result is
    (alpha, alpha, KB, CB, i, o), in float64."""
    _, g, _ = matrices(tile)
    return np.einsum("xa,kcabio,yb->xykcio", g, weight.astype(np.float64), g)


def convolve(data: np.ndarray, transformed: np.ndarray, tile: int, padding: tuple,
             out_hw: tuple[int, int]) -> np.ndarray:
    """The convolution of blocked data (N, CB, H, W, i) with a transformed weight (alpha,
    alpha, KB, CB, i, o), in float64: (N, KB, OH, OW, o)."""
    bt, _, at = matrices(tile)
    alpha = tile + 2
    out_h, out_w = out_hw
    tiles_h, tiles_w = -(-out_h // tile), -(-out_w // tile)
    top, left = padding[0], padding[1]
    n, cb, height, width, ib = data.shape
    rows, cols = tiles_h * tile + 2, tiles_w * tile + 2
    padded = np.zeros((n, cb, rows, cols, ib), np.float64)
    h = min(height, rows - top)
    w = min(width, cols - left)
    padded[:, :, top:top + h, left:left + w] = data[:, :, :h, :w]
    patches = np.lib.stride_tricks.sliding_window_view(padded, (alpha, alpha), axis=(2, 3))
    patches = patches[:, :, ::tile, ::tile][:, :, :tiles_h, :tiles_w]  # n cb th tw i a b
    v = np.einsum("xa,nctwiab,yb->xynctwi", bt, patches, bt)
    m = np.einsum("xynctwi,xykcio->xynktwo", v, transformed)
    y = np.einsum("px,xynktwo,qy->nktpwqo", at, m, at)
    kb, ob = transformed.shape[2], transformed.shape[5]
    full = y.reshape(n, kb, tiles_h * tile, tiles_w * tile, ob)
    return full[:, :, :out_h, :out_w]


__all__ = ["TILE_SIZES", "convolve", "matrices", "transform_weight"]
