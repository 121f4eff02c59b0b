"""The results file: round trip, one os.write per record, truncated last lines, bad lines with file:line."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from perfmodel.errors import InputError
from perfmodel.harness import records as rec
from perfmodel.harness.records import append_record, check_appendable, from_json, read_records, to_json


def test_round_trip_keeps_every_field(tmp_path, synthetic_records):
    path = tmp_path / "r.jsonl"
    for r in synthetic_records:
        append_record(path, r)
    loaded = read_records(path)
    assert loaded.records == tuple(synthetic_records)
    assert [i.where for i in loaded.items] == [f"{path}:{n}" for n in range(1, len(synthetic_records) + 1)]
    assert loaded.warnings == ()


def test_each_record_is_one_os_write_of_a_whole_line_then_fsync(tmp_path, monkeypatch, make_record):
    calls = []
    real_write, real_fsync = os.write, os.fsync
    monkeypatch.setattr(rec.os, "write", lambda fd, data: calls.append(("write", bytes(data))) or real_write(fd, data))
    monkeypatch.setattr(rec.os, "fsync", lambda fd: calls.append(("fsync", None)) or real_fsync(fd))
    path = tmp_path / "r.jsonl"
    r = make_record(expected_s=1e-3, device_s=1e-3)
    append_record(path, r)
    append_record(path, r)
    assert [c[0] for c in calls] == ["write", "fsync", "write", "fsync"]
    for _, data in calls[::2]:
        assert data.endswith(b"\n") and data.count(b"\n") == 1
        assert json.loads(data) == to_json(r)


def test_truncated_last_line_is_skipped_with_file_and_line(tmp_path, make_record):
    path = tmp_path / "r.jsonl"
    r = make_record(expected_s=1e-3, device_s=1e-3)
    append_record(path, r)
    append_record(path, r)
    whole = json.dumps(to_json(r))
    with open(path, "a") as fh:  # a crash in the middle of the third line
        fh.write(whole[: len(whole) // 2])
    loaded = read_records(path)
    assert len(loaded.records) == 2
    assert loaded.warnings == (f"{path}:3: truncated last line skipped (an interrupted write?)",)
    # and appending to such a file is refused (it would glue the next record onto the half line)
    with pytest.raises(InputError, match=rf"`out` {path}:3: the last line is truncated"):
        check_appendable(path)


def test_bad_line_in_the_middle_is_an_error_naming_file_and_line(tmp_path, make_record):
    path = tmp_path / "r.jsonl"
    r = make_record(expected_s=1e-3, device_s=1e-3)
    path.write_text(json.dumps(to_json(r)) + "\n{not json\n" + json.dumps(to_json(r)) + "\n")
    with pytest.raises(InputError, match=rf"^{path}:2: not a valid JSON line"):
        read_records(path)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("kernel"), r":1: field 'kernel' is missing"),
    (lambda d: d["timing"].pop("measured_s"), r":1: field 'timing.measured_s' is missing"),
    (lambda d: d["prediction"].update(op_floor_s="fast"), r":1: field 'prediction.op_floor_s' must be float"),
    (lambda d: d.update(schema="other/9"), r":1: field 'schema' is 'other/9'"),
    (lambda d: d.update(mode="emulated"), r":1: field 'mode' is 'emulated'"),
    (lambda d: d.update(mode="interpret", efficiency=0.5), r":1: field 'efficiency' must be null for an interpret"),
])
def test_malformed_records_name_the_field(tmp_path, mutate, message, make_record):
    d = to_json(make_record(expected_s=1e-3, device_s=1e-3))
    mutate(d)
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(d) + "\n")
    with pytest.raises(InputError, match=message):
        read_records(path)


def test_missing_file_and_directory_are_one_line_errors(tmp_path):
    with pytest.raises(InputError, match=r"no such results file"):
        read_records(tmp_path / "nope.jsonl")
    with pytest.raises(InputError, match=r"`out` '.*': is a directory"):
        check_appendable(tmp_path)


def test_device_time_subtracts_dispatch_only_when_included(make_record):
    # 1.1 ms of device time + 20 us of dispatch were measured together.
    r = make_record(expected_s=1e-3, device_s=1.1e-3)
    assert r.timing.measured_s == pytest.approx(1.12e-3)
    assert r.device_time_s == pytest.approx(1.1e-3)
    assert r.expected_wall_s == pytest.approx(1.02e-3)
    no_dispatch = dataclasses.replace(r, timing=dataclasses.replace(r.timing, includes_dispatch=False))
    assert no_dispatch.device_time_s == pytest.approx(1.12e-3)


def test_interpret_mode_and_other_chip_have_no_efficiency(make_record):
    p = make_record(expected_s=1e-3, device_s=1e-3).prediction
    assert rec.efficiency(p, 2e-3, mode="interpret", device_chip="tpu-v5e") is None
    assert rec.efficiency(p, 2e-3, mode="compiled", device_chip="tpu-v6e") is None
    # floor = 0.92 x 1 ms = 0.92 ms; over 2 ms measured = 46%
    assert rec.efficiency(p, 2e-3, mode="compiled", device_chip="tpu-v5e") == pytest.approx(0.46)


def test_from_json_rejects_non_objects():
    with pytest.raises(InputError, match=r"^f:1: a record must be a JSON object"):
        from_json([1, 2], "f:1")
