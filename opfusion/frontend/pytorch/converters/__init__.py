"""One converter file per family of core ATen operators; importing this package registers
them all in :mod:`opfusion.frontend.pytorch.registry`."""

from . import elementwise, nn, reduce, tensor  # noqa: F401
