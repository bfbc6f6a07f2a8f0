"""What tuning buys: each model tuned by opf.tune, then untuned, tuned, ONNX Runtime and
OpenVINO timed interleaved in one run.

    python benchmarks/tune_models.py resnet50 bert_layer [--seconds 1200] [--trials 100000]
                                     [--records-dir DIR] [--no-tune] [--repeat 30]
                                     [--flush-cache]

For each model (a light model, a torchvision model, a transformer block or an .onnx path, as
``benchmarks/models.py`` names them) it runs ``opf.tune`` for at most ``--seconds`` of wall
time (and ``--trials`` candidates), appending to ``DIR/<model>.json`` (default DIR
``tune-records``; ``--no-tune`` only compiles with the records already there), prints the
per-task table, compiles the model without and with the records, checks that both give the
same outputs (to 1e-4 of the largest), and times the four engines interleaved
(``models.timed``). The row: untuned, tuned, ort and openvino latencies, tuned/untuned
(untuned time over tuned: above 1, tuning helped), ort/tuned and ov/tuned, the trials this
run and in the records, and the tuning time."""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import numpy as np
from models import (
    NAME_WIDTH,
    max_relative_diff,
    model_input,
    model_names,
    model_path,
    openvino_engine,
    opfusion_engine,
    ort_engine,
    print_header,
    row_label,
    timed,
)

import opfusion as opf
from opfusion.autotune import MeasureOptions, TuningRecords
from opfusion.frontend import from_onnx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="models to tune (e.g. resnet50 bert_layer)")
    parser.add_argument("--seconds", type=float, default=1200.0,
                        help="tuning time per model (default 1200: 20 minutes)")
    parser.add_argument("--trials", type=int, default=100000, help="at most this many trials")
    parser.add_argument("--records-dir", default="tune-records")
    parser.add_argument("--no-tune", action="store_true", help="use the records as they are")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--flush-cache", action="store_true",
                        help="measure candidates with cold caches (MeasureOptions.flush_cache)")
    args = parser.parse_args()
    os.makedirs(args.records_dir, exist_ok=True)
    print_header()
    rows = []
    for name in model_names(args.names, False):
        rows.append(tune_and_time(name, args))
    print(f"{'model':<{NAME_WIDTH}} {'untuned':>9} {'tuned':>9} {'ort':>9} {'openvino':>9} "
          f"{'tuned/unt':>9} {'ort/tuned':>9} {'ov/tuned':>9} {'trials':>7} {'records':>7} "
          f"{'tuning':>7}")
    for row in rows:
        print(row)
    print(f"# load after: {os.getloadavg()[0]:.2f}")


def tune_and_time(name: str, args: argparse.Namespace) -> str:
    import onnx

    path = model_path(name)
    mod, params = from_onnx(onnx.load(path))
    records_path = Path(args.records_dir) / f"{row_label(name)}.json"
    trials, spent = 0, 0.0
    if not args.no_tune:
        start = time.monotonic()
        result = opf.tune(mod, params, trials=args.trials, records=records_path,
                          seconds=args.seconds,
                          options=MeasureOptions(flush_cache=args.flush_cache))
        spent = time.monotonic() - start
        trials = result.trials
        print(f"# {row_label(name)}: tuned {trials} candidates in {spent:.0f} s")
        print(result.render(), flush=True)
    records = TuningRecords.load(records_path)
    untuned = opf.compile(mod, params=params)
    tuned = opf.compile(mod, params=params, records=records)
    input_name, x = model_input(untuned)
    engines = [opfusion_engine("untuned", untuned, {input_name: x}),
               opfusion_engine("tuned", tuned, {input_name: x})]
    ort = ort_engine(path, x)
    engines += [ort] if ort is not None else []
    openvino = openvino_engine(path, x)
    engines += [openvino[0]] if openvino is not None else []
    want = [np.asarray(a, np.float64) for a in engines[0].outputs()]
    diff = max_relative_diff(engines[1].outputs(), want)
    if diff > 1e-4:
        print(f"# {row_label(name)}: tuned differs from untuned by {diff:.1e} of max|output|")
    seconds = dict(zip([e.name for e in engines], timed(engines, args.repeat)))
    t_untuned, t_tuned = seconds["untuned"], seconds["tuned"]
    peers = [seconds.get(e, math.nan) for e in ("ort", "openvino")]
    return (f"{row_label(name):<{NAME_WIDTH}} {t_untuned * 1e3:>7.2f}ms {t_tuned * 1e3:>7.2f}ms "
            + " ".join(f"{t * 1e3:>7.2f}ms" for t in peers)
            + f" {t_untuned / t_tuned:>8.3f}x"
            + " ".join(f" {t / t_tuned:>8.3f}x" for t in peers)
            + f" {trials:>7} {len(records):>7} {spent:>6.0f}s")


if __name__ == "__main__":
    main()
