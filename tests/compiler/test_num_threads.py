"""``opf.compile(..., num_threads=N)`` and ``exe.set_num_threads(N)``: the kernels run on N
OpenMP threads, with the same numbers, and the calling thread's OpenMP setting is left as it
was (another executor or library sharing the thread is unaffected)."""

import ctypes
import ctypes.util

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.errors import OpfusionError
from opfusion.testing import SMALL_WORKLOAD_ARGS, WORKLOADS, workload_input

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")


@pytest.fixture(scope="module")
def model():
    mod, params = WORKLOADS["resnet18"](**SMALL_WORKLOAD_ARGS["resnet18"])
    return mod, params, workload_input(mod, params)


def test_every_thread_count_gives_the_same_numbers(model):
    mod, params, feeds = model
    exe = opf.compile(mod, params=params, num_threads=1)
    assert exe.num_threads == 1
    one = exe.run(None, feeds)
    exe.set_num_threads(2)
    assert exe.num_threads == 2
    np.testing.assert_array_equal(exe.run(None, feeds)[0], one[0])
    exe.set_num_threads(0)
    np.testing.assert_array_equal(exe.run(None, feeds)[0], one[0])


def test_the_callers_openmp_setting_is_restored(model):
    name = ctypes.util.find_library("gomp")
    if name is None:
        pytest.skip("libgomp is not installed where ctypes finds it")
    gomp = ctypes.CDLL(name)
    mod, params, feeds = model
    exe = opf.compile(mod, params=params, num_threads=1)
    before = gomp.omp_get_max_threads()
    exe.run(None, feeds)
    assert gomp.omp_get_max_threads() == before


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", 5000])
def test_a_bad_thread_count_is_refused(bad):
    x = opf.var("x", (4,))
    exe = opf.compile(opf.Function([x], opf.op.exp(x)))
    with pytest.raises(OpfusionError, match="num_threads must be an int"):
        exe.set_num_threads(bad)
    with pytest.raises(OpfusionError, match="num_threads must be an int"):
        opf.compile(opf.Function([x], opf.op.exp(x)), num_threads=bad)


def _exp(n):
    x = opf.var("x", (n,))
    return opf.Function([x], opf.op.exp(x))


def test_a_kernel_too_small_for_threads_runs_on_the_calling_one():
    """Waking the other threads costs more than a small kernel's work: its parallel loop is
    a plain loop (the target's min_parallel_work); a large one keeps OpenMP, unless the target
    has one core. The numbers are the same either way."""
    two_cores = opf.Target("c -num-cores=2")
    small = opf.compile(_exp(64), target=two_cores)
    assert "omp parallel" not in small.source()
    n = 4 * two_cores.min_parallel_work
    large = opf.compile(_exp(n), target=two_cores)
    assert "#pragma omp parallel for" in large.source()
    one_core = opf.compile(_exp(n), target=opf.Target("c -num-cores=1"))
    assert "omp parallel" not in one_core.source()
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    np.testing.assert_array_equal(large.run([x])[0], one_core.run([x])[0])
    np.testing.assert_allclose(large.run([x])[0], np.exp(x), rtol=1e-5)


def test_a_parallel_loop_of_much_work_is_scheduled_guided(monkeypatch):
    """Guided chunks let the faster thread take over where a busy machine slows the other
    (BALANCED_WORK); smaller loops keep static halves. The numbers are the same either way.
    The threshold is lowered here: at its value (10^8) the input alone would take 800 MB."""
    import opfusion.backend.cpu.emitter as emitter

    monkeypatch.setattr(emitter, "BALANCED_WORK", 1 << 20)
    target = opf.Target("c -num-cores=2")
    x = np.random.default_rng(0).standard_normal(2 << 20).astype(np.float32)
    for n, schedule in ((4 * target.min_parallel_work, "static"), (2 << 20, "guided")):
        exe = opf.compile(_exp(n), target=target)
        assert f"#pragma omp parallel for schedule({schedule})" in exe.source()
        np.testing.assert_allclose(exe.run([x[:n]])[0], np.exp(x[:n]), rtol=1e-6)
