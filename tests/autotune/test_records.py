"""Tuning records: JSON lines written as measured, read back as untrusted data (a bad line
is skipped with a warning, never an exception or a config outside its space), the best
correct record per task and target, failures never best."""

import json
import logging

import pytest

from opfusion.autotune.records import (
    MAX_LINE_BYTES,
    Record,
    RecordsError,
    TuningRecords,
    as_records,
    parse_record,
)

TASK = "0123456789abcdef0123456789abcdef"
TARGET = "c -mcpu=x86-64 -mattr=+avx2 cores=2"


def record(seconds=0.001, error=None, task=TASK, target=TARGET, **knobs):
    return Record(task, TARGET if target is None else target, "conv2d_nchwc",
                  knobs or {"channel_tile": 4, "fast": True, "order": "nhwc"}, seconds, error,
                  ("nn.conv2d_nchwc", "add"), 3, "local", 1.0)


def test_a_record_round_trips_through_its_line():
    original = record(0.00125)
    assert parse_record(original.to_json()) == original
    failed = record(None, "crashed: the worker died of SIGSEGV")
    assert parse_record(failed.to_json()) == failed
    assert not failed.ok and original.ok


def test_records_are_appended_as_measured_and_read_back(tmp_path):
    path = tmp_path / "tune.json"
    records = TuningRecords.load(path, create=True)
    records.append(record(0.002, channel_tile=1))
    records.append(record(None, "wrong: output 0 differs", channel_tile=2))
    records.append(record(0.001, channel_tile=4))
    assert len(path.read_text().splitlines()) == 3
    again = TuningRecords.load(path)
    assert len(again) == 3
    assert again.best(TASK, TARGET).knobs == {"channel_tile": 4}
    assert again.best(TASK, "another target") is None
    assert [r.knobs["channel_tile"] for r in again.for_task(TASK, TARGET)] == [1, 2, 4]


def test_a_confirmed_record_is_preferred_to_a_faster_unconfirmed_one():
    records = TuningRecords()
    records.append(record(0.001, channel_tile=1))  # a lucky measurement of the search
    records.append(Record(TASK, TARGET, "conv2d_nchwc", {"channel_tile": 2}, 0.0015,
                          confirmed=True))
    records.append(Record(TASK, TARGET, "conv2d_nchwc", {"channel_tile": 1}, 0.0016,
                          confirmed=True))
    assert records.best(TASK, TARGET).knobs == {"channel_tile": 2}
    assert parse_record(records.records[1].to_json()).confirmed


def test_the_model_checks_records_have_the_last_word():
    records = TuningRecords()
    records.append(Record(TASK, TARGET, "conv2d_nchwc", {"channel_tile": 2}, 0.0015,
                          confirmed=True))  # won alone, side by side with the heuristic
    records.append(Record(TASK, TARGET, "conv2d_nchwc", {"channel_tile": 1}, 0.0030,
                          confirmed=True, in_model=True))  # the heuristic, in the model
    records.append(Record(TASK, TARGET, "conv2d_nchwc", {"channel_tile": 2}, 0.0031,
                          confirmed=True, in_model=True))  # slower there: not kept
    assert records.best(TASK, TARGET).knobs == {"channel_tile": 1}
    assert records.best(TASK, TARGET).in_model
    assert records.best(TASK, TARGET, in_model=False).knobs == {"channel_tile": 2}
    assert parse_record(records.records[2].to_json()) == records.records[2]


def test_a_failed_record_is_never_the_best():
    records = TuningRecords()
    records.append(record(None, "timeout: no result within 20 s (killed)", channel_tile=8))
    assert records.best(TASK, TARGET) is None
    records.append(record(0.5, channel_tile=1))
    assert records.best(TASK, TARGET).knobs == {"channel_tile": 1}


BAD_LINES = [
    "not json at all",
    "[1, 2, 3]",
    json.dumps({"version": 99, "task": TASK}),
    json.dumps({**json.loads(record().to_json()), "task": "../../etc/passwd"}),
    json.dumps({**json.loads(record().to_json()), "seconds": -1.0}),
    json.dumps({**json.loads(record().to_json()), "seconds": float("nan")}),
    json.dumps({**json.loads(record().to_json()), "seconds": True}),
    json.dumps({**json.loads(record().to_json()), "seconds": None, "error": None}),
    json.dumps({**json.loads(record().to_json()), "knobs": {"tile": [1, 2]}}),
    json.dumps({**json.loads(record().to_json()), "knobs": "channel_tile=4"}),
    json.dumps({**json.loads(record().to_json()), "weight": 0}),
    json.dumps({**json.loads(record().to_json()), "ops": "conv"}),
    json.dumps({**json.loads(record().to_json()), "confirmed": "yes"}),
    json.dumps({**json.loads(record().to_json()), "in_model": 1}),
    "[" * 100000,
    json.dumps({**json.loads(record().to_json()), "error": "x" * MAX_LINE_BYTES}),
]


@pytest.mark.parametrize("line", BAD_LINES, ids=range(len(BAD_LINES)))
def test_a_damaged_or_hostile_line_is_skipped_with_a_warning(tmp_path, caplog, line):
    path = tmp_path / "tune.json"
    path.write_text(record(0.003).to_json() + "\n" + line + "\n\n" + record(0.002).to_json()
                    + "\n")
    with caplog.at_level(logging.WARNING, logger="opfusion.autotune"):
        records = TuningRecords.load(path)
    assert records.skipped == 1
    assert len(records) == 2
    assert records.best(TASK, TARGET).seconds == 0.002
    assert "line 2 is not a tuning record" in caplog.text


def test_binary_garbage_is_skipped_not_raised(tmp_path):
    path = tmp_path / "tune.json"
    path.write_bytes(b"\xff\xfe\x00garbage\n" + record().to_json().encode() + b"\n")
    records = TuningRecords.load(path)
    assert records.skipped == 1 and len(records) == 1


def test_missing_records_name_the_command_that_writes_them(tmp_path):
    with pytest.raises(RecordsError, match="opfusion tune"):
        TuningRecords.load(tmp_path / "none.json")
    assert len(TuningRecords.load(tmp_path / "none.json", create=True)) == 0


def test_as_records_takes_paths_records_and_none(tmp_path):
    path = tmp_path / "tune.json"
    path.write_text(record().to_json() + "\n")
    assert len(as_records(str(path))) == 1
    assert len(as_records(path)) == 1
    loaded = TuningRecords.load(path)
    assert as_records(loaded) is loaded
    assert as_records(None) is None
    with pytest.raises(RecordsError, match="path or TuningRecords"):
        as_records(42)
