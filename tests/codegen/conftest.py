"""Every test here builds kernels into a private cache directory, never into ~/.cache."""

import pytest


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("opfusion-cache")


@pytest.fixture(autouse=True)
def kernel_cache(_session_cache, monkeypatch: pytest.MonkeyPatch):
    """A kernel cache shared by the session's tests (so each kernel compiles once)."""
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(_session_cache))
    return _session_cache / "kernels"
