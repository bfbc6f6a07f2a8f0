"""Fuzzing the ONNX pipeline: a few hundred seeded mutations of small models, each imported,
compiled, run and compared with the reference interpreter in an isolated worker process.

Every outcome must be success or an ``opfusion.OpfusionError``: another exception type, a
crash, a hang or a wrong answer fails the test, which prints the counts and the first
examples with the command that replays each (``python benchmarks/fuzz_models.py --case N``).
The larger run is ``benchmarks/fuzz_models.py``."""

import pytest

from opfusion.testing.fuzz import (
    CRASH,
    HANG,
    MUTATIONS,
    OK,
    SEED_MODELS,
    is_acceptable,
    make_case,
    run_case,
    run_cases,
    summarize,
)

CI_CASES = 500


def test_fuzz_cases_are_deterministic():
    for number in (0, len(SEED_MODELS), 57, 1234):
        assert make_case(number, seed=3) == make_case(number, seed=3)
    assert make_case(100, seed=0).data != make_case(100, seed=1).data


def test_every_mutation_changes_some_seed():
    import random

    for name, mutation in MUTATIONS.items():
        changed = False
        for seed_name, build in SEED_MODELS.items():
            for trial in range(3):
                model = build()
                before = model.SerializeToString()
                description = mutation(model, random.Random(trial))
                if description is not None:
                    assert model.SerializeToString() != before, (name, seed_name, description)
                    changed = True
        assert changed, f"mutation {name} applies to no seed model"


@pytest.mark.parametrize("number", range(len(SEED_MODELS)), ids=list(SEED_MODELS))
def test_seed_models_compile_and_match_the_reference(number):
    outcome = run_case(make_case(number))
    assert outcome.category == OK and not outcome.kind, summarize([outcome])
    assert outcome.stage == "compare"


def test_harness_records_crashes_and_hangs_and_goes_on():
    outcomes = run_cases(range(20, 24), jobs=1, timeout=1.5,
                         faults={20: "segfault", 21: "hang", 22: "abort"})
    keys = [outcome.key for outcome in outcomes]
    assert keys[0] == f"{CRASH}: SIGSEGV", summarize(outcomes)
    assert keys[1] == f"{HANG}: > 1.5 s", summarize(outcomes)
    assert keys[2] == f"{CRASH}: SIGABRT", summarize(outcomes)
    assert is_acceptable(outcomes[3]), summarize(outcomes)  # the replaced worker goes on
    assert "Fatal Python error" in outcomes[0].message  # faulthandler's stack, from the log


def test_fuzzed_onnx_models_raise_only_opfusion_errors():
    outcomes = run_cases(range(CI_CASES), seed=0, jobs=2, timeout=20.0)
    assert len(outcomes) == CI_CASES
    if not all(is_acceptable(outcome) for outcome in outcomes):
        pytest.fail("\n" + summarize(outcomes), pytrace=False)


def test_integers_cast_from_floats_compare_within_the_floats_rounding():
    """An output that a Cast makes of a float value may differ by one (a truncation's
    boundary) or by the floats' tolerance, relative to its largest value (a product of 24
    values an ulp apart, cast to uint64: fuzz case 2413 of seed 62007); other integer
    outputs must be equal."""
    import numpy as np
    from onnx import TensorProto, helper

    from opfusion.testing.fuzz import _compare, _float_cast_outputs

    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.UINT64),
         helper.make_node("Cast", ["n"], ["m"], to=TensorProto.UINT64)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("n", TensorProto.INT32, [2])],
        [helper.make_tensor_value_info("y", TensorProto.UINT64, [2]),
         helper.make_tensor_value_info("m", TensorProto.UINT64, [2])])
    data = helper.make_model(graph).SerializeToString()
    assert _float_cast_outputs(data) == {0}
    want = (np.array([6183685455872, 3], np.uint64), np.array([6183685455872, 3], np.uint64))
    near = [np.array([6183685980160, 2], np.uint64)] * 2
    assert _compare([near[0], want[1]], want, _float_cast_outputs(data)) == ""
    assert "output 1: 2 of 2" in _compare([want[0], near[1]], want, _float_cast_outputs(data))
    far = np.array([6245522314431, 3], np.uint64)  # 1% off: past the floats' tolerance
    assert "output 0: 1 of 2" in _compare([far, want[1]], want, _float_cast_outputs(data))
