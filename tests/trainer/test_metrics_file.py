"""metrics.jsonl: one file per run, every record stamped with its attempt (numbered from the file,
not from torchrun's restart count), and readers that give each step once, the newest attempt's."""

from __future__ import annotations

import json

from lmforge.trainer.metrics_file import MetricsFile, by_attempt, latest_per_step, newest_attempt, read_records


def write_attempt(path, resumed_from, steps, loss_offset=0.0, killed=False):
    file = MetricsFile(path)
    file.write({"kind": "start", "resumed_from": resumed_from})
    for step in steps:
        file.write({"kind": "step", "step": step, "loss": 10.0 - step + loss_offset})
    if not killed:
        file.write({"kind": "end", "status": "finished"})
    file.close()
    return file.attempt


def test_each_start_on_the_file_is_the_next_attempt(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    # A replaced pod's torchrun counts restarts from 0 again: the number comes from the file.
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert write_attempt(path, None, range(0, 8), killed=True) == 1
    assert write_attempt(path, 4, range(5, 10), loss_offset=0.5) == 2
    records = read_records(path)
    assert [(r["kind"], r["attempt"]) for r in records][:2] == [("start", 1), ("step", 1)]
    assert list(records[0])[:2] == ["kind", "attempt"]
    assert [r["resumed_from"] for r in read_records(path, "start")] == [None, 4]
    assert {n: [r["step"] for r in rs] for n, rs in by_attempt(records).items()} == {
        1: list(range(8)), 2: list(range(5, 10))}
    assert newest_attempt(path) == 2


def test_the_reader_gives_each_step_once_from_the_newest_attempt(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_attempt(path, None, range(0, 8), killed=True)
    write_attempt(path, 4, range(5, 10), loss_offset=0.5)
    steps = latest_per_step(read_records(path))
    assert [r["step"] for r in steps] == list(range(10))
    assert [r["attempt"] for r in steps] == [1] * 5 + [2] * 5
    assert steps[6]["loss"] == 10.0 - 6 + 0.5  # attempt 2's record of a step both attempts logged


def test_a_line_cut_by_a_kill_is_skipped_and_the_next_attempt_starts_on_a_new_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_attempt(path, None, range(3), killed=True)
    with open(path, "a") as fh:
        fh.write('{"kind": "step", "attempt": 1, "step": 3, "lo')  # SIGKILL mid-write
    assert newest_attempt(path) == 1
    assert write_attempt(path, None, range(2)) == 2
    assert [(r["attempt"], r["step"]) for r in read_records(path, "step")] == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]


def test_records_from_before_the_attempt_field_count_as_the_first_attempt(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"kind": "step", "step": s, "loss": 1.0}) + "\n" for s in range(3)))
    assert write_attempt(path, 1, [2]) == 2
    assert [r.get("attempt", 1) for r in latest_per_step(read_records(path))] == [1, 1, 2]


def test_the_newest_attempt_is_read_from_the_end_even_past_a_long_last_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    write_attempt(path, None, range(3))
    file = MetricsFile(path)
    file.write({"kind": "step", "step": 3, "ranks": ["x" * 100] * 2000})  # 200 kB: longer than one read block
    file.close()
    again = MetricsFile(path)
    again.close()
    assert (file.attempt, again.attempt) == (2, 3)
