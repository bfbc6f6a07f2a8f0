"""Operator declarations (attributes, pattern kind, type inference, NumPy reference), one
family per file. Importing this package registers them all; the ``opf.op`` builders
(:mod:`opfusion.op`) are generated from them."""

from . import broadcast, elemwise, fma, image, nn, reduce, scatter, sort, transform  # noqa: F401
