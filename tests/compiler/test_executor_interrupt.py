"""Ctrl-C during a long kernel: the kernels poll a cancellation flag that SIGINT sets, so a run
returns within a task of the signal instead of when the kernel ends, and the executor gives
the right numbers afterwards."""

import ctypes
import os
import signal
import threading
import time

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.errors import RunInterrupted
from opfusion.runtime.interrupt import CANCEL_FLAG_SYMBOL, KERNEL_CANCELLED

pytestmark = [
    pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed"),
    pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix",
                       reason="SIGINT handling is POSIX"),
]



@pytest.fixture(autouse=True)
def python_handles_ctrl_c():
    """Python's own SIGINT handler, as in an interactive session: a process started in the
    background by a non-interactive shell (as CI may be) inherits SIGINT ignored, and then
    Ctrl-C reaches neither Python nor the kernels."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


SIZE = 3072  # one dense kernel of 58 GFLOP: about 2 s on the 2-core CI machine


@pytest.fixture(scope="module")
def long_dense():
    """An executor whose single kernel runs long, its input, its output and the seconds one
    uninterrupted run took."""
    x = opf.var("x", (SIZE, SIZE), "float32")
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((SIZE, SIZE)) / np.sqrt(SIZE)).astype(np.float32)
    exe = opf.compile(opf.IRModule.from_expr(opf.Function([x], opf.op.nn.dense(x, opf.const(w)))))
    data = rng.standard_normal((SIZE, SIZE)).astype(np.float32)
    start = time.perf_counter()
    want = exe(data)
    return exe, data, want, time.perf_counter() - start


def interrupt_after(seconds):
    """Send this process SIGINT (as Ctrl-C does) after ``seconds``, from another thread."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_ctrl_c_stops_a_long_kernel_and_the_next_run_is_right(long_dense):
    exe, data, want, seconds = long_dense
    delay = min(0.3, seconds / 4)
    timer = interrupt_after(delay)
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        exe(data)
    elapsed = time.perf_counter() - start
    timer.join()
    # Without cancellation the run would return only when its one kernel ends.
    assert elapsed < delay + min(1.5, (seconds - delay) / 2), (elapsed, seconds)
    np.testing.assert_array_equal(exe(data), want)


def test_ctrl_c_stops_a_run_in_another_thread(long_dense):
    exe, data, want, seconds = long_dense
    delay = min(0.3, seconds / 4)
    outcome = {}
    done = threading.Event()

    def work():
        start = time.perf_counter()
        try:
            exe(data)
        except RunInterrupted:
            outcome["interrupted after"] = time.perf_counter() - start
        finally:
            done.set()

    worker = threading.Thread(target=work)
    try:
        worker.start()
        interrupt_after(delay).join()
        done.wait(60)
    except KeyboardInterrupt:  # Python raises it in the main thread, wherever it is
        done.wait(60)
    worker.join()
    assert outcome["interrupted after"] < delay + min(1.5, (seconds - delay) / 2)
    np.testing.assert_array_equal(exe(data), want)


def test_a_ctrl_c_between_runs_cancels_no_later_run():
    small = opf.compile(opf.IRModule.from_expr(
        opf.Function([x := opf.var("x", (64, 64), "float32")], opf.op.nn.relu(x))))
    ones = np.ones((64, 64), np.float32)
    small(ones)  # the first run installs the handler
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)  # sets the flag while no run is in progress
    np.testing.assert_array_equal(small(ones), ones)


def test_a_kernel_returns_cancelled_when_its_flag_is_set():
    """The kernel ABI: each kernel library exports ``opf_cancel_flag``; a kernel that finds
    the flag it points at set returns -2 without finishing."""
    small = opf.compile(opf.IRModule.from_expr(
        opf.Function([x := opf.var("x", (4096,), "float32")], opf.op.nn.relu(x))))
    assert f"*{CANCEL_FLAG_SYMBOL}" in small.source()
    (module,) = small.modules.values()
    pointer = ctypes.c_void_p.in_dll(ctypes.CDLL(str(module.library.path)), CANCEL_FLAG_SYMBOL)
    data = np.ones(4096, np.float32)
    out = np.zeros(4096, np.float32)
    raised = ctypes.c_int32(1)
    saved = pointer.value
    pointer.value = ctypes.addressof(raised)
    try:
        status = module._function(data.ctypes.data, out.ctypes.data)
    finally:
        pointer.value = saved
    assert status == KERNEL_CANCELLED
    assert not out.any()  # every iteration was skipped
    np.testing.assert_array_equal(small(data), data)


def test_ctrl_c_during_a_compile_returns_at_once_and_leaves_no_partial_files(tmp_path,
                                                                            monkeypatch):
    # A cold cache: the C compiler runs for seconds on this model. Ctrl-C must stop it (the
    # compiler process is killed) and leave no half-written library behind, and the next
    # compile must work.
    from opfusion.testing import resnet, workload_input

    monkeypatch.setenv("OPFUSION_CACHE_DIR", str(tmp_path))
    mod, params = resnet(image_shape=(3, 32, 32), num_classes=10)
    delay = 0.2  # the whole compile takes over a second
    timer = interrupt_after(delay)
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        opf.compile(mod, params=params)
        time.sleep(30)  # the compile was faster than the timer: wait for the signal
    elapsed = time.perf_counter() - start
    timer.join()
    assert elapsed < delay + 1.0, elapsed
    assert not list(tmp_path.rglob("*.tmp"))
    inputs = workload_input(mod, params)
    want = opf.ir.evaluate(mod, {**inputs, **params})
    opf.testing.assert_close(opf.compile(mod, params=params)(**inputs), want, rtol=1e-4)
