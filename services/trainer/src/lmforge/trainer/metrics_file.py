"""metrics.jsonl: a run's log, one JSON object per line, one file per run (rank 0 appends to it).

Every record has `kind` and `attempt`. Each time the trainer starts on a run directory is an
attempt, numbered from the file itself rather than from TORCHELASTIC_RESTART_COUNT, which a
replaced pod's torchrun starts from 0 again. An attempt's first record says where it picks up:
`{"kind": "start", "attempt": 2, "resumed_from": 19, "first_step": 20, ...}` (`resumed_from`
null: from scratch). Kinds: start, step, eval, memory, checkpoint (a save committed), weights (a weights
package committed, lmforge.trainer.weights_checkpoint: step, tokens, source "model_save"|"checkpoint",
blocked_seconds, seconds, final; `error` when it failed).

A resumed attempt logs again the steps between its checkpoint and where the attempt before it
stopped; `latest_per_step` gives each step once, from the newest attempt.

evals.jsonl, beside it: the checkpoint evaluations (kind `checkpoint_eval`; not `eval`, the
in-loop val loss above). Its sole writer is the uploader sidecar's evaluation launcher
(lmforge.uploader.eval_launcher), one record per weights checkpoint as each job ends, no `attempt`:
`{"kind": "checkpoint_eval", "step", "tokens" (consumed by the end of that step), "timestamp",
"package" (its URI), "heldout": {source: {"loss", "perplexity"}}, "tasks": {task: {metric: value}},
"score" (the value promotion ranks by, or null), "best_step", "promoted" (it became the best and
was promoted), "skipped": false, "regressed": ["task/metric" or "heldout/<source>", ...]}`; a
checkpoint overtaken before its job started `{"kind", "step", "timestamp", "skipped": true}`, a
failed job `{"kind", "step", "timestamp", "failed": true, "skipped": false}`.
`read_checkpoint_evals` reads it (the training report draws it).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path


def read_records(path: Path, kind: str | None = None) -> list[dict]:
    """The records of `path` in file order (of one kind, if given). A line that does not parse
    (the last one of a process killed mid-write) is skipped."""
    records = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and (kind is None or record.get("kind") == kind):
                records.append(record)
    return records


EVALS_FILE = "evals.jsonl"
CHECKPOINT_EVAL = "checkpoint_eval"


def read_checkpoint_evals(path: Path) -> list[dict]:
    """The `checkpoint_eval` records of an evals.jsonl, each step once (the last record of it: a
    re-ingested result is written again), in step order; [] when there is no file yet."""
    if not path.exists():
        return []
    latest = {r["step"]: r for r in read_records(path, CHECKPOINT_EVAL) if isinstance(r.get("step"), int)}
    return [latest[step] for step in sorted(latest)]


def attempt_of(record: dict) -> int:
    return int(record.get("attempt", 1))  # records written before the field existed: the first attempt


def latest_per_step(records: list[dict], kind: str = "step") -> list[dict]:
    """Each step's record once, in step order: the newest attempt's (file order breaks ties)."""
    latest: dict[int, tuple[int, int, dict]] = {}
    for index, record in enumerate(records):
        if record.get("kind") != kind:
            continue
        key = (attempt_of(record), index)
        if record["step"] not in latest or key > latest[record["step"]][:2]:
            latest[record["step"]] = (*key, record)
    return [latest[step][2] for step in sorted(latest)]


def by_attempt(records: list[dict], kind: str = "step") -> dict[int, list[dict]]:
    """The records of one kind, grouped by attempt (in file order within each)."""
    grouped: dict[int, list[dict]] = defaultdict(list)
    for record in records:
        if record.get("kind") == kind:
            grouped[attempt_of(record)].append(record)
    return dict(sorted(grouped.items()))


def newest_attempt(path: Path) -> int:
    """The attempt of the file's last record (the file is in time order; 0: no record). Reads
    from the end: a long run's file is large."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        block = 1 << 16
        while True:
            start = max(0, size - block)
            fh.seek(start)
            lines = fh.read(size - start).split(b"\n")
            for line in reversed(lines[1:] if start else lines):  # the block's first line may be cut
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    return attempt_of(record)
            if start == 0:
                return 0
            block *= 4


class MetricsFile:
    """Appends one attempt's records to metrics.jsonl, each stamped with `attempt`: one more than
    the newest attempt already in the file."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.attempt = (newest_attempt(path) if path.exists() else 0) + 1
        self._fh = open(path, "ab")  # noqa: SIM115 - closed in close()
        if self._fh.tell() > 0:
            with open(path, "rb") as tail:
                tail.seek(-1, os.SEEK_END)
                if tail.read(1) != b"\n":  # an earlier attempt was killed mid-line: start on a new one
                    self._fh.write(b"\n")

    def write(self, record: dict) -> None:
        # `kind` first, then `attempt`, then the rest (a repeated key keeps its first position)
        line = json.dumps({"kind": record["kind"], "attempt": self.attempt, **record}) + "\n"
        self._fh.write(line.encode("utf-8"))
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
