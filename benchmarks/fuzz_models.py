"""Fuzz the ONNX pipeline with mutated models and count the outcomes by category.

    python benchmarks/fuzz_models.py [--cases 5000] [--seed 0] [--jobs 2] [--timeout 20]
                                     [--start 0] [--compile-every 1] [--memory-gb 4]
                                     [--examples 3] [--json out.json]
    python benchmarks/fuzz_models.py --case N [--seed S] [--show] [--save model.onnx]

Each case is a small seed model with one to three seeded mutations (see
:mod:`opfusion.testing.fuzz`), imported, compiled, run on standard-normal inputs and
compared with the reference interpreter, in worker processes: a crash (a signal) or a hang
(past ``--timeout`` seconds) is recorded and the worker replaced. Prints the counts: ok,
OpfusionError by subclass, other exceptions by type, wrong answers, crashes by signal, hangs;
then the first examples of every category that is not ok or an OpfusionError (case number,
mutations, stage, innermost opfusion frame, message).

``--case N`` replays one case in this process and lets its exception propagate, with the
full traceback (``--show`` prints the mutated model first, ``--save`` writes it)."""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opfusion.testing.fuzz import (  # noqa: E402
    is_acceptable,
    make_case,
    run_case,
    run_cases,
    summarize,
)


def replay(number: int, seed: int, show: bool, save: str | None, memory_gb: float) -> int:
    """Run one case in-process (under the same address-space cap as the workers); an
    exception propagates with its traceback."""
    if memory_gb > 0:
        limit = int(memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    case = make_case(number, seed)
    print(f"case {number} (seed {seed}): model {case.model_name}, "
          f"{'imported from a file' if case.from_file else 'imported from bytes'}")
    for mutation in case.mutations:
        print(f"  mutation {mutation!r}")
    if save:
        Path(save).write_bytes(case.data)
        print(f"model written to {save}")
    if show:
        import onnx

        model = onnx.ModelProto()
        try:
            model.ParseFromString(case.data)
            print(onnx.printer.to_text(model))
        except Exception as err:  # noqa: BLE001 - the bytes may be deliberately broken
            print(f"(the model cannot be printed: {type(err).__name__}: {err})")
    outcome = run_case(case, reraise=True)
    print(f"outcome: {outcome.key}, stage {outcome.stage}"
          + (f": {outcome.message}" if outcome.message else ""))
    return 0 if is_acceptable(outcome) else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=5000, help="number of cases")
    parser.add_argument("--start", type=int, default=0, help="first case number")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per case")
    parser.add_argument("--compile-every", type=int, default=1,
                        help="compile and run every k-th case, import the others (0: none)")
    parser.add_argument("--memory-gb", type=float, default=4.0,
                        help="address-space cap per worker, GiB (0: none)")
    parser.add_argument("--examples", type=int, default=3, help="examples per category")
    parser.add_argument("--json", help="write every outcome to this file")
    parser.add_argument("--case", type=int, help="replay this case in-process")
    parser.add_argument("--show", action="store_true", help="with --case: print the model")
    parser.add_argument("--save", help="with --case: write the mutated model here")
    args = parser.parse_args()
    if args.case is not None:
        return replay(args.case, args.seed, args.show, args.save, args.memory_gb)

    start = time.perf_counter()
    done = 0

    def progress(outcome: object) -> None:
        nonlocal done
        done += 1
        if done % 100 == 0:
            print(f"  {done}/{args.cases} cases, {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)

    outcomes = run_cases(range(args.start, args.start + args.cases), args.seed,
                         jobs=args.jobs, timeout=args.timeout,
                         compile_every=args.compile_every,
                         memory_limit=int(args.memory_gb * (1 << 30)), progress=progress)
    elapsed = time.perf_counter() - start
    print(summarize(outcomes, examples=args.examples))
    print(f"{len(outcomes)} cases in {elapsed:.0f} s with {args.jobs} job(s)")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return 0 if all(is_acceptable(o) for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
