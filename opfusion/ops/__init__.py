"""Operator declarations, one family per file. Importing this package registers them all."""

from . import broadcast, elemwise, nn, reduce, transform  # noqa: F401  (registration)
