"""Operator declarations (attributes, pattern kind, type inference, NumPy reference), one
family per file. Importing this package registers them all; the ``opf.op`` builders
(:mod:`opfusion.op`) are generated from them."""

from . import (  # noqa: F401
    broadcast,
    elemwise,
    fma,
    image,
    nn,
    reduce,
    sampling,
    scatter,
    signal,
    sort,
    transform,
)
