"""Operator declarations, one family per file. Importing this package registers them all."""

from . import broadcast, elemwise, fma, image, nn, reduce, sort, transform  # noqa: F401
