"""Operator builders: ``opf.op.add(x, y)``, ``opf.op.sum(x, axis=1)``; ``opf.op.nn`` and
``opf.op.image`` hold the namespaced ones. Generated from :mod:`opfusion.opdefs`."""

from .. import opdefs as _declarations  # noqa: F401  (registers every operator)
from ..ir.op import get_op, list_ops
from ._builders import builders_for, make_builder

globals().update(builders_for(""))

from . import image, nn  # noqa: E402

__all__ = ["get_op", "image", "list_ops", "make_builder", "nn", *builders_for("")]
