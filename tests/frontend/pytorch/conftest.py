"""The PyTorch frontend's tests need torch (the ``torch`` extra); they skip without it."""

import pytest

pytest.importorskip("torch", reason="the PyTorch frontend needs torch: pip install "
                                    "'opfusion[torch]'")
