"""Shared by the tuner's tests: a private kernel cache, a small ResNet, and a way to break
chosen candidates' kernels (a crash, a hang, other numbers) as a faulty schedule would."""

import pytest

import opfusion.autotune.measure as measure
from opfusion.testing import resnet

#: C statements that break a kernel at its entry: a crash, a hang, and returning before any
#: output is written (which leaves the outputs' NaN fill: other numbers than the reference).
BREAKS = {"crashed": "__builtin_trap();", "timeout": "for (;;) {}", "wrong": "return 0;"}


@pytest.fixture(autouse=True)
def private_kernel_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))


@pytest.fixture(scope="session")
def small_resnet():
    return resnet(num_layers=18, image_shape=(3, 32, 32), num_classes=10)


def break_kernel(candidate, statement):
    """Put ``statement`` first in the body of ``candidate``'s kernel."""
    head = f"int32_t {candidate.entry_name}("
    start = candidate.source.index(head)
    brace = candidate.source.index("{\n", start) + 2
    candidate.source = candidate.source[:brace] + f"  {statement}\n" + candidate.source[brace:]


@pytest.fixture
def breaks():
    """The ways of breaking a kernel: failure kind -> C statement (see BREAKS)."""
    return dict(BREAKS)


@pytest.fixture
def break_configs(monkeypatch):
    """``break_configs({config: statement})``: from now on, building those configs gives
    kernels broken by the statements (see BREAKS)."""
    original = measure._generate

    def install(breaks):
        def generate(task, config, backend):
            candidate = original(task, config, backend)
            if config in breaks:
                break_kernel(candidate, breaks[config])
            return candidate
        monkeypatch.setattr(measure, "_generate", generate)
    return install
