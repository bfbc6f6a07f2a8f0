"""The tree is ruff-clean (the house style), when ruff is installed."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_is_clean():
    result = subprocess.run(["ruff", "check", "opfusion", "tests", "benchmarks",
                             "examples"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_test_file_names_are_unique():
    # Test folders have no __init__.py, so pytest imports test files by basename: two files
    # with one name in different folders stop the whole collection.
    names = [path.name for path in (ROOT / "tests").rglob("test_*.py")]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    assert duplicates == [], f"rename these test files: {duplicates}"
