"""How OpenMP's threads wait: decided when the first kernel library loads (a short spin, then
sleep), never at import, and never over the user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT."""

import json
import os
import subprocess
import sys

import pytest

from opfusion.backend.cpu.toolchain import have_c_compiler

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

_CHILD = """
import json, os
import opfusion as opf
from opfusion.runtime.openmp import SPIN_COUNT, wait_policy
seen = {"after_import": os.environ.get("GOMP_SPINCOUNT"), "before": wait_policy()}
x = opf.var("x", (4,))
opf.compile(opf.Function([x], opf.op.exp(x)))
seen.update(after_compile=os.environ.get("GOMP_SPINCOUNT"), policy=wait_policy(),
            spin=SPIN_COUNT, omp=os.environ.get("OMP_WAIT_POLICY"))
print(json.dumps(seen))
"""


def _child(**env):
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY",
                                                               "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", _CHILD], env={**clean, **env},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_first_kernel_library_sets_a_short_spin_not_the_import():
    seen = _child()
    assert seen["after_import"] is None and seen["before"].startswith("not decided")
    assert seen["after_compile"] == str(seen["spin"])
    assert seen["policy"].startswith(f"spin {seen['spin']} iterations")
    assert seen["omp"] is None


@pytest.mark.parametrize("setting", [{"OMP_WAIT_POLICY": "passive"},
                                     {"GOMP_SPINCOUNT": "0"}])
def test_the_users_setting_stands(setting):
    seen = _child(**setting)
    assert seen["policy"].startswith("set by the user")
    assert seen["after_compile"] == setting.get("GOMP_SPINCOUNT")
    assert seen["omp"] == setting.get("OMP_WAIT_POLICY")
