"""One executor, many threads: every concurrent run gets the numbers a lone run gives for the
same input, and the executor keeps no more workspaces than runs were in progress at once."""

import dataclasses
import threading

import numpy as np
import pytest

import opfusion as opf
from opfusion.backend.cpu.toolchain import have_c_compiler
from opfusion.testing import run_in_threads
from opfusion.testing.workloads import SMALL_WORKLOAD_ARGS, WORKLOADS

pytestmark = pytest.mark.skipif(not have_c_compiler(), reason="no C compiler installed")

THREADS = 8
RUNS = 50


def compile_squeezenet():
    """SqueezeNet (40 kernels, intermediates sharing planned blocks) and its input shape."""
    mod, params = WORKLOADS["squeezenet"](**SMALL_WORKLOAD_ARGS["squeezenet"])
    exe = opf.compile(mod, params=params)
    return exe, mod["main"].params[0].type_annotation.shape


@pytest.fixture(scope="module")
def squeezenet():
    return compile_squeezenet()


def test_concurrent_runs_give_the_single_threaded_outputs(squeezenet):
    exe, shape = squeezenet
    inputs = [np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
              for seed in range(THREADS)]
    wants = [exe(x) for x in inputs]
    assert all(not np.array_equal(wants[0], want) for want in wants[1:])
    mismatches = []

    def work(index):
        for _ in range(RUNS):
            got = exe.run([inputs[index]])[0]
            if not np.array_equal(got, wants[index]):
                mismatches.append(index)

    run_in_threads(THREADS, work)
    assert mismatches == []
    for x, want in zip(inputs, wants):
        np.testing.assert_array_equal(exe(x), want)


def test_results_never_alias_another_runs_memory(squeezenet):
    exe, shape = squeezenet
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    first, second = exe(x), exe(x)
    assert not np.shares_memory(first, second)
    workspace = exe.workspaces.take()
    try:
        for workspace_array in workspace.arrays.values():
            assert not np.shares_memory(first, workspace_array)
    finally:
        exe.workspaces.give(workspace)


def test_the_pool_holds_no_more_workspaces_than_concurrent_runs():
    exe, shape = compile_squeezenet()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for _ in range(5):
        exe(x)
    built_alone = exe.workspaces.built
    assert built_alone == 1
    # Four runs held inside their native call at once need four workspaces, no more; a
    # second round of four finds them all free again.
    plan = exe._native_plan()
    barrier = threading.Barrier(4, timeout=30)

    def waiting_run(*args):
        barrier.wait()
        return plan.run(*args)

    exe._native = dataclasses.replace(plan, run=waiting_run)
    try:
        for _ in range(2):
            run_in_threads(4, lambda index: exe(x))
            assert exe.workspaces.built == 4
    finally:
        exe._native = plan


def test_profiles_of_concurrent_runs_stay_with_their_thread(squeezenet):
    exe, shape = squeezenet
    x = np.zeros(shape, np.float32)
    seen = {}

    def work(index):
        assert exe.last_profile is None
        exe.run([x], profile=True)
        seen[index] = exe.last_profile

    run_in_threads(4, work)
    names = [step.group.name for step in exe.steps]
    assert all([name for name, _ in profile] == names for profile in seen.values())
    assert exe.last_profile is None  # the main thread ran nothing with profile=True
