"""How OpenMP's threads wait: decided when the first kernel library loads, never at import:
Intel's runtime when it is installed (OPFUSION_OPENMP=auto, the default) or asked for, else
libgomp's short spin, then sleep, never over the user's own OMP_WAIT_POLICY or
GOMP_SPINCOUNT."""

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


def _child(child: str = _CHILD, *options: str, **env):
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY",
                                                               "GOMP_SPINCOUNT",
                                                               "OPFUSION_OPENMP")}
    out = subprocess.run([sys.executable, *options, "-c", child], env={**clean, **env},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_first_kernel_library_sets_a_short_spin_not_the_import():
    seen = _child(OPFUSION_OPENMP="gnu")
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


_INTEL_CHILD = """
import json
import numpy as np
import opfusion as opf
from opfusion.runtime.openmp import wait_policy
x = opf.var("x", (64, 4096))
exe = opf.compile(opf.Function([x], opf.op.exp(x)))
a = np.random.default_rng(0).standard_normal((64, 4096)).astype("float32")
gap = float(np.max(np.abs(exe(a) - np.exp(a.astype("float64"))) / np.exp(a)))
maps = [line.split()[-1] for line in open("/proc/self/maps") if "iomp5" in line]
print(json.dumps({"policy": wait_policy(), "gap": gap, "iomp": bool(maps)}))
"""


def test_auto_takes_intels_runtime_when_installed_else_libgomps_short_spin():
    from opfusion.runtime.openmp import intel_library

    seen = _child()
    assert seen["after_import"] is None and seen["before"].startswith("not decided")
    if intel_library("intel") is None:
        assert seen["policy"].startswith(f"spin {seen['spin']} iterations")
    else:
        assert seen["policy"].startswith("Intel's OpenMP runtime")
        assert seen["after_compile"] is None  # libgomp's setting left alone


def test_auto_keeps_libgomp_loaded_before_it_without_a_warning():
    load_first = "import ctypes; ctypes.CDLL('libgomp.so.1', mode=ctypes.RTLD_GLOBAL)\n"
    seen = _child(load_first + _CHILD, "-W", "error")
    assert seen["policy"].startswith("libgomp was loaded before")


def test_an_unknown_openmp_runtime_is_refused_naming_the_choices():
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         env={**os.environ, "OPFUSION_OPENMP": "clang"}, timeout=300)
    assert out.returncode != 0
    assert "OPFUSION_OPENMP='clang'" in out.stderr and "intel-openmp" in out.stderr


def test_intel_library_takes_a_path_of_a_file(tmp_path):
    from opfusion.runtime.openmp import intel_library

    library = tmp_path / "libiomp5.so"
    library.write_bytes(b"")
    assert intel_library(str(library)) == library
    assert intel_library(str(tmp_path / "missing.so")) is None


def test_the_kernels_run_on_intels_runtime_when_asked():
    from opfusion.runtime.openmp import intel_library

    if intel_library("intel") is None:
        pytest.skip("Intel's OpenMP runtime is not installed (pip install intel-openmp)")
    out = subprocess.run([sys.executable, "-c", _INTEL_CHILD], capture_output=True,
                         text=True, env={**os.environ, "OPFUSION_OPENMP": "intel"},
                         timeout=300)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["policy"].startswith("Intel's OpenMP runtime") and "KMP_BLOCKTIME" in seen["policy"]
    assert seen["iomp"] and seen["gap"] < 1e-6
