"""`lmforge-dataprep sample`: random kept and removed documents, for spot checks, of the whole
run or of one step.

One pass over the Parquet files with a reservoir per side, so memory holds only the
documents shown, whatever the size of the run. A document passed step X when it reached the
run's output (the docs Parquet) or was removed by a step after X: the order is the run's own
(the reader, the config's pipeline, then the global dedup, which removes documents that are
in the docs Parquet)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import TextIO

import pyarrow as pa
import pyarrow.compute as pc

from lmforge.common.errors import ConfigError
from lmforge.common.storage import open_store
from lmforge.common.store import Store
from lmforge.dataprep import layout
from lmforge.dataprep.dedup_global import load_removed
from lmforge.dataprep.parquet_io import iter_batches
from lmforge.dataprep.step_registry import DEFAULT_PIPELINE

SIDES = ("kept", "removed")
READER_STEP = "read"
GLOBAL_DEDUP_STEP = "global_dedup"
DOC_COLUMNS = ["doc_id", "url", "text", "language"]
REJECT_COLUMNS = ["doc_id", "url", "stage", "reason", "text_preview"]


def _rows(store: Store, prefix: str, columns: list[str]) -> Iterator[dict]:
    for rel in store.list(prefix):
        if rel.endswith(".parquet"):
            for batch in iter_batches(store, rel, columns):
                yield from batch.to_pylist()


class Reservoir:
    """k rows drawn uniformly from a stream (Algorithm R), and how many rows were offered."""

    def __init__(self, k: int, rng: random.Random):
        self.k, self.rng = k, rng
        self.chosen: list[dict] = []
        self.seen = 0

    def offer(self, row: dict) -> None:
        self.seen += 1
        if len(self.chosen) < self.k:
            self.chosen.append(row)
        else:
            slot = self.rng.randrange(self.seen)
            if slot < self.k:
                self.chosen[slot] = row


def reservoir(rows: Iterator[dict], k: int, rng: random.Random) -> tuple[list[dict], int]:
    """k rows drawn uniformly from the stream (Algorithm R), and how many rows there were."""
    sample = Reservoir(k, rng)
    for row in rows:
        sample.offer(row)
    return sample.chosen, sample.seen


def run_step_ids(store: Store) -> list[str]:
    """The run's steps in the order documents meet them: the reader, the enabled steps of the
    pipeline its config (work/config.json) lists, the global dedup."""
    config = json.loads(store.read_text(layout.CONFIG))
    settings = config.get("steps") or {}
    pipeline = [step_id for step_id in config.get("pipeline", DEFAULT_PIPELINE)
                if (settings.get(step_id) or {}).get("enabled", True)]
    return [READER_STEP, *pipeline, GLOBAL_DEDUP_STEP]


def _n_inputs(store: Store) -> int:
    return len(json.loads(store.read_text(layout.INPUTS)))


def _doc(row: dict, step: str | None) -> dict:
    return {"side": "kept", "step": step, "reason": None, "url": row["url"], "text": row["text"],
            "language": row["language"], "doc_id": row["doc_id"], "later": None}


def _reject(row: dict, side: str, step: str | None) -> dict:
    removed = side == "removed"
    return {"side": side, "step": row["stage"] if removed else step, "reason": row["reason"] if removed else None,
            "url": row["url"], "text": row["text_preview"] or "", "language": None, "doc_id": row["doc_id"],
            "later": None if removed else f"{row['stage']}/{row['reason']}"}


def _matching(store: Store, rel: str, stages: list[str]) -> Iterator[dict]:
    """The reject rows of one file whose stage is one of `stages`."""
    if not store.exists(rel):
        return
    wanted = pa.array(stages, pa.string())
    for batch in iter_batches(store, rel, REJECT_COLUMNS):
        yield from batch.filter(pc.is_in(batch.column("stage"), value_set=wanted)).to_pylist()


def _final_docs(store: Store, i: int, step: str | None) -> Iterator[dict]:
    """Input i's documents in the output: the filters kept them, and dedup did not remove them
    (once dedup has run)."""
    if not store.exists(layout.docs(i)):
        return
    removed = set(load_removed(store, i)[0].tolist()) if store.exists(layout.DEDUP_STATS) else set()
    for batch in iter_batches(store, layout.docs(i), DOC_COLUMNS):
        yield from (_doc(row, step) for row in batch.to_pylist() if row["doc_id"] not in removed)


def _whole_run(store: Store) -> Iterator[dict]:
    """The run's output (kept) and every rejected document (removed, by whichever step)."""
    for i in range(_n_inputs(store)):
        yield from _final_docs(store, i, None)
    yield from (_reject(row, "removed", None) for row in _rows(store, "rejects", REJECT_COLUMNS))


def _at_step(store: Store, step: str, order: list[str]) -> Iterator[dict]:
    """The documents that passed `step` (kept) and those it removed, input by input."""
    per_input = order[: order.index(GLOBAL_DEDUP_STEP)]
    for i in range(_n_inputs(store)):
        if step == GLOBAL_DEDUP_STEP:
            yield from _final_docs(store, i, step)
            yield from (_reject(row, "removed", step) for row in _matching(store, layout.dedup_rejects(i), [step]))
            continue
        if store.exists(layout.docs(i)):  # every document here passed every per-input step
            for batch in iter_batches(store, layout.docs(i), DOC_COLUMNS):
                yield from (_doc(row, step) for row in batch.to_pylist())
        later = per_input[per_input.index(step) + 1:]
        for row in _matching(store, layout.filter_rejects(i), [step, *later]):
            yield _reject(row, "removed" if row["stage"] == step else "kept", step)


def draw(output: str, n: int, seed: int, step: str | None = None,
         sides: tuple[str, ...] = SIDES) -> tuple[dict[str, list[dict]], dict[str, int]]:
    """Up to n documents drawn at random, split between `sides` (half each when both, the rest
    to the other side when one has fewer), and how many documents each side has in all."""
    store = open_store(output)
    if step is None:
        rows = _whole_run(store)
    else:
        order = run_step_ids(store)
        if step not in order:
            raise ConfigError(f"unknown step {step!r}; this run's steps: {', '.join(order)}")
        rows = _at_step(store, step, order)
    rng = random.Random(seed)
    samples = {side: Reservoir(n, rng) for side in sides}
    for row in rows:
        if row["side"] in samples:
            samples[row["side"]].offer(row)
    for sample in samples.values():
        rng.shuffle(sample.chosen)  # a prefix of a shuffled uniform sample is a uniform sample
    if len(sides) == 2:
        kept, removed = samples["kept"].chosen, samples["removed"].chosen
        n_kept = max((n + 1) // 2, n - len(removed))
        del kept[n_kept:]
        del removed[n - len(kept):]
    return {side: samples[side].chosen for side in sides}, {side: samples[side].seen for side in sides}


def print_sample(output: str, n: int, seed: int, chars: int, out: TextIO, *, step: str | None = None,
                 sides: tuple[str, ...] = SIDES, as_json: bool = False, err: TextIO | None = None) -> None:
    chosen, totals = draw(output, n, seed, step, sides)
    for side in SIDES:
        for row in chosen.get(side, []):
            if as_json:
                out.write(json.dumps({key: row[key] for key in ("url", "step", "side", "reason", "text", "doc_id")},
                                     ensure_ascii=False) + "\n")
                continue
            text = row["text"][:chars].replace("\n", " ")
            if side == "kept":
                later = f"  (passed {step}; removed later by {row['later']})" if row["later"] else ""
                out.write(f"KEPT     [{row['language'] or '?'}] {row['url']}{later}\n    {text}\n\n")
            else:
                out.write(f"DROPPED  {row['step']}/{row['reason']} {row['url']}\n    {text}\n\n")
    shown = " and ".join(f"{len(chosen[side])} {_word(side)}" for side in sides)
    of = " and ".join(f"{totals[side]} {_word(side)}" for side in sides)
    at = f" at step {step}" if step else ""
    (err if as_json and err is not None else out).write(f"# {shown} shown, of {of}{at}\n")


def _word(side: str) -> str:
    return "kept" if side == "kept" else "dropped"
