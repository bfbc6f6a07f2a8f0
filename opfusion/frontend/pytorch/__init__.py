"""The PyTorch frontend: ``from_torch`` (``torch.export``, core ATen decompositions, one
converter per ATen op family in ``converters/``) and the ``torch.compile`` backend
(``backend``), which hands what opfusion cannot convert back to PyTorch piece by piece.

Nothing here imports torch until it is used: opfusion runs without it."""

from ...errors import TorchImportError
from .graph import UnsupportedTorchError
from .importer import TorchSymbolicModule, from_exported_program, from_torch

__all__ = ["TorchImportError", "TorchSymbolicModule", "UnsupportedTorchError",
           "from_exported_program", "from_torch"]
