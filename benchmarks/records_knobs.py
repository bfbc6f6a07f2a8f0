"""What one knob is worth, read from a tuning run's records: per task, the best time with each
of the knob's values.

    python benchmarks/records_knobs.py RECORDS.json KNOB [--rule RULE]

For each task whose records give the knob more than one value (heaviest first: the task's
weight times its best time), the fastest correct search-time record with each value, the
ratio of the best without the knob's best value to the best with it, and how many records
each value has (failed ones in brackets). ``benchmarks/gpu_check.sh`` runs it on a GPU
lease's records for ``double_buffer`` and ``async_stages``, knobs whose worth no static
count can settle.
Only the search's own measurements are compared (not the confirmation's or the model
check's, which time the few best configs again), so every value was timed the same way."""

from __future__ import annotations

import argparse
import collections
import sys
from typing import Any

from opfusion.autotune.records import TuningRecords


def knob_table(records: TuningRecords, knob: str, rule: str | None = None
               ) -> list[dict[str, Any]]:
    """One row per task (heaviest first) whose records give ``knob`` two or more values:
    the task, its rule and operators, and per value its best seconds and record counts."""
    by_task: dict[tuple[str, str], list[Any]] = collections.defaultdict(list)
    for record in records.records:
        if (knob in record.knobs and not record.confirmed and not record.in_model
                and (rule is None or record.rule == rule)):
            by_task[(record.task, record.target)].append(record)
    rows = []
    for (task, target), found in by_task.items():
        values: dict[Any, dict[str, Any]] = {}
        for record in found:
            entry = values.setdefault(record.knobs[knob], {"best": None, "ok": 0, "failed": 0})
            if record.ok:
                entry["ok"] += 1
                if entry["best"] is None or record.seconds < entry["best"]:
                    entry["best"] = record.seconds
            else:
                entry["failed"] += 1
        if len(values) < 2:
            continue
        bests = [v["best"] for v in values.values() if v["best"] is not None]
        rows.append({"task": task, "target": target, "rule": found[0].rule,
                     "ops": "+".join(found[0].ops), "weight": found[0].weight,
                     "values": values, "best": min(bests) if bests else None})
    return sorted(rows, key=lambda r: -(r["weight"] * (r["best"] or 0.0)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records")
    parser.add_argument("knob")
    parser.add_argument("--rule", default=None, help="only this schedule rule's tasks")
    args = parser.parse_args()
    rows = knob_table(TuningRecords.load(args.records), args.knob, args.rule)
    if not rows:
        print(f"no task's records give {args.knob!r} more than one value")
        return 1
    print(f"# {args.knob}: best search time per value (ms), per task, heaviest first")
    wins: collections.Counter[Any] = collections.Counter()
    for row in rows:
        values = row["values"]
        parts = []
        for value in sorted(values, key=str):
            entry = values[value]
            best = "-" if entry["best"] is None else f"{entry['best'] * 1e3:.3f}"
            parts.append(f"{value}={best} ({entry['ok']} [{entry['failed']}])")
        timed = {v: e["best"] for v, e in values.items() if e["best"] is not None}
        if len(timed) >= 2:
            winner = min(timed, key=lambda v: timed[v])
            runner_up = min(t for v, t in timed.items() if v != winner)
            wins[winner] += 1
            parts.append(f"best {winner}: {runner_up / timed[winner]:.2f}x")
        print(f"{row['rule']:16s} {row['ops'][:40]:40s} x{row['weight']:<3d} " + "  ".join(parts))
    print("# tasks won: " + ", ".join(f"{v}: {n}" for v, n in sorted(wins.items(), key=str)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
