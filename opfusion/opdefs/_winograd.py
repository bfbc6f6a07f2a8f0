"""Winograd's minimal filtering F(m x m, 3 x 3) (Lavin and Gray, 2015): the transform
matrices and the algorithm in NumPy, shared by the operators' references and their computes.

A 3x3 convolution of stride 1 computes each m x m block of outputs ("tile") from an
alpha x alpha patch of input (alpha = m + 2) as ``A^T [(G g G^T) * (B^T d B)] A``: the filter
``g`` and the patch ``d`` are transformed, multiplied element by element, and transformed back.
Over C input channels the element-wise products are summed, so one tile costs alpha^2 x C x K
multiply-adds instead of m^2 x 9 x C x K: 2.25 times fewer for F(2x2) (alpha 4) and 4 times
fewer for F(4x4) (alpha 6), plus the transforms, whose cost grows with C + K, not C x K.

The points are 0, +-1, +-2 and infinity (F(4x4)) and 0, +-1, infinity (F(2x2)); other point
sets (+-1/2, -3) measured no better. Rounding: F(2x2)'s transforms only add and halve, so its
float32 error is that of direct convolution (measured on random 3x3 layers of 64 to 512
channels: 3e-7 to 9e-7 of the largest output, direct 1e-6 to 3e-6; resnet50's light model
2e-4 end to end, as direct). F(4x4)'s multiply by up to 8 and divide by up to 24: 6e-6 to
2e-5 per layer, 4.8e-4 on resnet50, which is why the layout pass uses F(2x2) unless told
(``AlterOpLayout.winograd``). ``tests/ops/test_winograd.py`` holds both to these bounds."""

from __future__ import annotations

import numpy as np

#: Output tile sizes with matrices here.
TILE_SIZES = (2, 4)

_MATRICES: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {
    2: (
        np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
        np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64),
    ),
    4: (
        np.array([[4, 0, -5, 0, 1, 0],
                  [0, -4, -4, 1, 1, 0],
                  [0, 4, -4, -1, 1, 0],
                  [0, -2, -1, 2, 1, 0],
                  [0, 2, -1, -2, 1, 0],
                  [0, 4, 0, -5, 0, 1]], np.float64),
        np.array([[1 / 4, 0, 0],
                  [-1 / 6, -1 / 6, -1 / 6],
                  [-1 / 6, 1 / 6, -1 / 6],
                  [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6],
                  [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 1, 1, 0],
                  [0, 1, -1, 2, -2, 0],
                  [0, 1, 1, 4, 4, 0],
                  [0, 1, -1, 8, -8, 1]], np.float64),
    ),
}


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
