"""Every test here builds kernels into a private cache directory, never into ~/.cache."""

import pytest

from opfusion.target import Target, host_arch


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("opfusion-cache")


@pytest.fixture(autouse=True)
def kernel_cache(_session_cache, monkeypatch: pytest.MonkeyPatch):
    """A kernel cache shared by the session's tests (so each kernel compiles once)."""
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(_session_cache))
    return _session_cache / "kernels"


#: The two x86 targets the code generator is tested for: 32-byte and 64-byte vectors.
CPU_TARGETS = {"avx2": "c -mattr=+avx2,+fma", "avx512f": "c -mattr=+avx512f"}


@pytest.fixture(params=list(CPU_TARGETS))
def cpu_target(request: pytest.FixtureRequest) -> Target:
    """Each target of :data:`CPU_TARGETS`; the AVX-512 one only where the host can run it
    (its kernels are built and run, not only printed)."""
    if host_arch() != "x86_64":
        pytest.skip(f"{CPU_TARGETS[request.param]} is an x86-64 target; the host is {host_arch()}")
    target = Target(CPU_TARGETS[request.param])
    if target.missing_on_host():
        pytest.skip(f"the host lacks {', '.join(target.missing_on_host())} to run {target}")
    return target
