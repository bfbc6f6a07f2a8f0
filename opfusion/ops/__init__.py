"""Operator declarations, one family per file. Importing this package registers them all."""

from . import broadcast, elemwise, image, nn, reduce, sort, transform  # noqa: F401
