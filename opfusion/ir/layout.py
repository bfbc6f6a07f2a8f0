"""Tensor layouts as strings, TVM's convention: ``"NCHW"``, ``"NCHW16c"``, ``"OIHW16i16o"``.

An upper-case letter is a *primal* axis (N, C, H, W; O, I for weights); a number followed by
the lower-case letter of a primal axis is a *block* of that axis: ``NCHW16c`` is NCHW data with
its channels split in two, ``C // 16`` at position 1 and ``C % 16`` innermost, so that one
vector register holds 16 consecutive channels of one pixel. The blocked layouts are what the
layout pass (:mod:`opfusion.transform.alter_op_layout`) gives convolutions and the operators
between them; ``layout_transform`` converts between any two layouts of the same primal axes.

:class:`Layout` maps shapes and indices both ways; the NumPy and TE forms of
``layout_transform`` are written with it, so they cannot disagree on what a layout means."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import OpfusionError


class LayoutError(OpfusionError):
    """A layout string that does not parse, or a shape that does not fit a layout."""


_TOKEN = re.compile(r"(\d*)([A-Za-z])")


@dataclass(frozen=True)
class Layout:
    """A parsed layout: ``axes`` in order, each ``(letter, factor)`` with factor 0 for a primal
    axis and the block size for a block (lower-case letter)."""

    name: str
    axes: tuple[tuple[str, int], ...]

    @staticmethod
    def parse(text: str) -> Layout:
        """The layout of ``text``; LayoutError for anything but primal letters, each once, and
        blocks ``<size><letter>`` of primal axes it has, each once."""
        if not isinstance(text, str) or not text:
            raise LayoutError(f"a layout is a string such as 'NCHW' or 'NCHW16c', got {text!r}")
        axes: list[tuple[str, int]] = []
        pos = 0
        for match in _TOKEN.finditer(text):
            if match.start() != pos:
                break
            pos = match.end()
            digits, letter = match.groups()
            if letter.isupper():
                if digits:
                    raise LayoutError(f"layout {text!r}: a primal axis ({letter}) has no size; "
                                      "blocks are written <size><lower-case letter>, e.g. 16c")
                axes.append((letter, 0))
            else:
                if not digits or int(digits) < 1:
                    raise LayoutError(f"layout {text!r}: block {letter!r} needs a positive "
                                      "size, e.g. 16c")
                axes.append((letter.upper(), int(digits)))
        if pos != len(text):
            raise LayoutError(f"layout {text!r} does not parse at {text[pos:]!r}; use letters "
                              "and block sizes such as 'NCHW16c'")
        primal = [a for a, f in axes if f == 0]
        blocks = [a for a, f in axes if f != 0]
        for group, what in ((primal, "primal axis"), (blocks, "block of axis")):
            for letter in group:
                if group.count(letter) > 1:
                    raise LayoutError(f"layout {text!r} has {what} {letter} twice")
        for letter in blocks:
            if letter not in primal:
                raise LayoutError(f"layout {text!r} blocks axis {letter} but has no primal "
                                  f"{letter}")
        return Layout(text, tuple(axes))

    @property
    def primal(self) -> str:
        """The primal axes in this layout's order: ``"NCHW"`` for ``"NCHW16c"``."""
        return "".join(a for a, f in self.axes if f == 0)

    def factor(self, letter: str) -> int:
        """The block size of primal axis ``letter`` (1 when it is not blocked)."""
        for axis, size in self.axes:
            if axis == letter and size:
                return size
        return 1

    @property
    def ndim(self) -> int:
        return len(self.axes)

    def shape(self, primal_shape: Sequence[int], primal: str) -> tuple[int, ...]:
        """This layout's shape of a tensor whose shape in the primal layout ``primal`` is
        ``primal_shape``; LayoutError when a blocked extent is not a multiple of its block."""
        sizes = dict(zip(primal, primal_shape))
        out = []
        for letter, size in self.axes:
            extent = sizes[letter]
            block = self.factor(letter)
            if extent % block:
                raise LayoutError(f"axis {letter} has {extent} elements, not a multiple of "
                                  f"the block {block} of layout {self.name!r}")
            out.append(size if size else extent // block)
        return tuple(out)

    def primal_shape(self, shape: Sequence[int]) -> dict[str, int]:
        """The extent of each primal axis of a tensor of ``shape`` in this layout."""
        extents = {letter: 1 for letter in self.primal}
        for (letter, _), extent in zip(self.axes, shape):
            extents[letter] *= int(extent)
        return extents

    def primal_index(self, index: Sequence[Any]) -> dict[str, Any]:
        """Each primal axis's index from an index in this layout (``C = c_outer * 16 +
        c_inner``); works on ints and on TE expressions alike."""
        outer = {letter: i for (letter, size), i in zip(self.axes, index) if size == 0}
        inner = {letter: i for (letter, size), i in zip(self.axes, index) if size}
        return {letter: outer[letter] * self.factor(letter) + inner[letter]
                if letter in inner else outer[letter] for letter in self.primal}

    def index(self, primal: dict[str, Any]) -> list[Any]:
        """The index in this layout of the element at primal index ``primal``."""
        out = []
        for letter, size in self.axes:
            block = self.factor(letter)
            if size:
                out.append(primal[letter] % block)
            elif block > 1:
                out.append(primal[letter] // block)
            else:
                out.append(primal[letter])
        return out


def check_compatible(src: Layout, dst: Layout) -> None:
    """LayoutError unless ``src`` and ``dst`` have the same primal axes."""
    if sorted(src.primal) != sorted(dst.primal):
        raise LayoutError(f"cannot transform layout {src.name!r} to {dst.name!r}: their primal "
                          f"axes differ ({src.primal} vs {dst.primal})")


def transform_array(data: np.ndarray, src: Layout, dst: Layout) -> np.ndarray:
    """``data`` (in layout ``src``) in layout ``dst``, with NumPy: to the primal layout by
    undoing ``src``'s blocks, then into ``dst``'s blocks and order."""
    check_compatible(src, dst)
    # Undo src: move every block next to its primal axis, then merge the two.
    order = []
    for letter in src.primal:
        order.append(src.axes.index((letter, 0)))
        if (letter, src.factor(letter)) in src.axes:  # a block (of any size, 1 included)
            order.append(src.axes.index((letter, src.factor(letter))))
    merged = np.transpose(data, order)
    extents = src.primal_shape(data.shape)
    plain = merged.reshape([extents[letter] for letter in src.primal])
    # Into dst: split each blocked primal axis into (outer, block), then order as dst.
    split_shape: list[int] = []
    position: dict[tuple[str, int], int] = {}
    for letter in src.primal:
        block = dst.factor(letter)
        position[(letter, 0)] = len(split_shape)
        if (letter, block) in dst.axes:
            if extents[letter] % block:
                raise LayoutError(f"axis {letter} has {extents[letter]} elements, not a "
                                  f"multiple of the block {block} of layout {dst.name!r}")
            split_shape += [extents[letter] // block, block]
            position[(letter, block)] = len(split_shape) - 1
        else:
            split_shape.append(extents[letter])
    split = plain.reshape(split_shape)
    return np.ascontiguousarray(np.transpose(split, [position[axis] for axis in dst.axes]))


__all__ = ["Layout", "LayoutError", "check_compatible", "transform_array"]
