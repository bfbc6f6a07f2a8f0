"""Builders of the ``image.*`` operators (``opf.op.image.resize2d``)."""

from ._builders import builders_for

globals().update(builders_for("image"))
__all__ = list(builders_for("image"))
