"""Every script in examples/ runs to completion (each checks its own numbers)."""

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("script", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(script):
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "an example should show what it did"


def test_the_fusion_policy_example_changes_the_partition():
    script = next(p for p in EXAMPLES if p.stem == "custom_fusion_policy")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300).stdout
    assert "no fusion at reshapes: [['exp', 'multiply'], ['reshape'], ['nn.relu', 'sum']]" in out
