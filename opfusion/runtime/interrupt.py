"""Ctrl-C during native kernels: one process-wide cancellation flag that SIGINT sets.

Python runs its signal handlers in the main thread between bytecodes, so while the main thread
sits in a ctypes call to a kernel that runs for minutes, Ctrl-C waits for minutes. Instead:

- a tiny C library, built once with the kernels' compiler and cached like them, holds the flag
  ``opf_cancel_requested`` and a SIGINT handler that sets it and then calls the handler it
  replaced (Python's, so KeyboardInterrupt is still raised in the main thread);
- every generated kernel library exports ``int32_t volatile* opf_cancel_flag``
  (:data:`CANCEL_FLAG_SYMBOL`); :func:`connect` points it at that flag. The kernels read the
  flag at each iteration of their parallel and outermost loops and return
  :data:`KERNEL_CANCELLED` (-2) when it is set;
- the two C functions of :func:`run_hooks` bracket every executor run (a model's native
  entry calls them itself: :func:`connect` sets its ``opf_run_begin_hook`` and
  ``opf_run_end_hook``). The first run to begin
  while none is in progress clears the flag (a Ctrl-C between runs cancels nothing later) and
  makes sure the handler is still installed (``signal.signal`` replaces it; it is not
  installed while SIGINT is ignored or has its default action, which ends the process anyway).
  They are C, not Python, because KeyboardInterrupt can be raised at any Python function entry
  after a Ctrl-C: a Python bookkeeping function could be skipped half-way and leave the count
  of runs wrong for good. The count is kept per thread too, so an end without its begin (an
  exception came first) changes nothing.

Ctrl-C thus cancels every run in progress in any thread, and the runs that start before all
of those have ended; a cancelled run raises :class:`opfusion.errors.RunInterrupted` (a
KeyboardInterrupt). Without a C compiler (an artifact loaded on a machine without one) the
helper cannot be built and runs are not interruptible, as before."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

from ..errors import BuildError

#: Kernel return codes (the C ABI of every generated kernel): finished; a heap scratch
#: allocation failed; cancelled through ``*opf_cancel_flag`` (the outputs are unfinished).
KERNEL_OK, KERNEL_NO_MEMORY, KERNEL_CANCELLED = 0, -1, -2

#: The pointer every generated kernel library exports and its kernels poll.
CANCEL_FLAG_SYMBOL = "opf_cancel_flag"
#: The function pointers a model's library calls at the start and end of its native entry
#: (see :mod:`opfusion.backend.cpu.model_entry`); :func:`connect` points them at the hooks.
RUN_BEGIN_HOOK, RUN_END_HOOK = "opf_run_begin_hook", "opf_run_end_hook"

_HELPER_SOURCE = r"""// opfusion: the SIGINT handler that asks kernels to stop (interrupt.py).
#include <signal.h>
#include <stddef.h>
#include <stdint.h>

volatile int32_t opf_cancel_requested = 0;
static struct sigaction opf_previous;

static void opf_on_sigint(int sig, siginfo_t* info, void* context) {
  opf_cancel_requested = 1;
  if (opf_previous.sa_flags & SA_SIGINFO) {
    opf_previous.sa_sigaction(sig, info, context);
  } else if (opf_previous.sa_handler != SIG_DFL && opf_previous.sa_handler != SIG_IGN) {
    opf_previous.sa_handler(sig);
  }
}

// Install the handler in front of the current one unless it is there already; returns 1 when
// it is installed, 0 when SIGINT is ignored or has its default action (nothing to chain to),
// -1 on failure. opf_previous never becomes the handler itself.
static int32_t opf_arm_sigint(void) {
  struct sigaction current;
  if (sigaction(SIGINT, NULL, &current) != 0) return -1;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == opf_on_sigint) return 1;
  if (!(current.sa_flags & SA_SIGINFO)
      && (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN)) return 0;
  struct sigaction mine = current;  // the same mask and flags as the handler it chains to
  mine.sa_sigaction = opf_on_sigint;
  mine.sa_flags = current.sa_flags | SA_SIGINFO;
  opf_previous = current;  // written before the handler that reads it can run
  return sigaction(SIGINT, &mine, NULL) == 0 ? 1 : -1;
}

static int32_t opf_active_runs = 0;          // runs in progress, in all threads
static __thread int32_t opf_thread_runs = 0;  // of which on this thread

// A run starts: the first of overlapping runs clears the flag and arms the handler.
int32_t opf_run_begin(void) {
  opf_thread_runs += 1;
  if (__atomic_fetch_add(&opf_active_runs, 1, __ATOMIC_ACQ_REL) != 0) return 1;
  opf_cancel_requested = 0;
  return opf_arm_sigint();
}

// A run ends (finished, cancelled or failed); without a begin on this thread, nothing happens.
void opf_run_end(void) {
  if (opf_thread_runs == 0) return;
  opf_thread_runs -= 1;
  __atomic_fetch_sub(&opf_active_runs, 1, __ATOMIC_ACQ_REL);
}
"""

_HELPER_FLAGS = ("-O2", "-shared", "-fPIC", "-std=gnu11")

_lock = threading.Lock()  # guards everything below
_helper: Any = None  # the loaded helper library; False once it could not be built
_flag: ctypes.c_int32 | None = None  # the helper's opf_cancel_requested
_connected: set[str] = set()  # paths of the kernel libraries already pointed at the flag


def _load_helper() -> Any:
    """The helper library (built on first use), or None when there is no C compiler. Called
    with the lock held."""
    global _helper, _flag
    if _helper is None:
        from ..backend.cpu.toolchain import compile_source

        try:
            library = compile_source(_HELPER_SOURCE, flags=_HELPER_FLAGS)
            helper = ctypes.CDLL(str(library.path))
        except (BuildError, OSError):
            _helper = False
        else:
            helper.opf_run_begin.restype = ctypes.c_int32
            helper.opf_run_begin.argtypes = []
            helper.opf_run_end.restype = None
            helper.opf_run_end.argtypes = []
            _flag = ctypes.c_int32.in_dll(helper, "opf_cancel_requested")
            _helper = helper
    return _helper or None


def connect(library_path: str) -> None:
    """Point the ``opf_cancel_flag`` of the kernel library at ``library_path`` (already
    loaded) at the process-wide flag. Idempotent; a library without the symbol (built
    before kernels could be cancelled) is left alone."""
    with _lock:
        if library_path in _connected or _load_helper() is None:
            return
        library = ctypes.CDLL(library_path)
        try:
            pointer = ctypes.c_void_p.in_dll(library, CANCEL_FLAG_SYMBOL)
        except ValueError:  # no such symbol
            return
        pointer.value = ctypes.addressof(_flag)
        for symbol, function in ((RUN_BEGIN_HOOK, _helper.opf_run_begin),
                                 (RUN_END_HOOK, _helper.opf_run_end)):
            try:  # a model's library calls the hooks from its native entry
                hook = ctypes.c_void_p.in_dll(library, symbol)
            except ValueError:
                continue
            hook.value = ctypes.cast(function, ctypes.c_void_p).value
        _connected.add(library_path)


def _nothing() -> None:
    return None


def run_hooks() -> tuple[Callable[[], Any], Callable[[], None]]:
    """``(begin, end)``: call ``begin()`` first thing inside the ``try`` of a run and ``end()``
    first thing in its ``finally``. C functions (see the module docstring), or functions that
    do nothing when the helper could not be built."""
    with _lock:
        helper = _load_helper()
    if helper is None:
        return _nothing, _nothing
    return helper.opf_run_begin, helper.opf_run_end

