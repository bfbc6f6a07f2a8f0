"""Builders of the ``nn.*`` operators (``opf.op.nn.conv2d``, ``opf.op.nn.relu``, ...)."""

from ._builders import builders_for

globals().update(builders_for("nn"))
__all__ = list(builders_for("nn"))
