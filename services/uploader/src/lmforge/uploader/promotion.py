"""Which evaluated checkpoint is best, and what promoting it does.

A result's score is one number (`evaluation.score`): a task metric of its `tasks`, or
"heldout/loss", the mean held-out loss over its sources, or a weighted sum of those; `mode` says
whether higher or lower is better. Only a strictly better score than the best so far is a new best, and only a new best
is promoted: a regressed checkpoint (one zeroed, or diverged) never is.

Promotion (`evaluation.promote`):
- pointer: copy the package from the store to `<models_store>/<run>-step-N` (each file checked
  against config.json's sha256 as it goes; config.json last, as a package is published, so a
  reader never sees a half-copied one), then point the model pointer at it
  (lmforge.model.pointer.point_to). The copy outlives weights retention.
- propose: write `<dest>/evals/proposal.json`, for the pipeline's rollout (its canary decides).
- off: nothing besides the record.
Each new best also writes `<dest>/evals/best.json` {"step", "score", "package", "promoted_to"},
which pins the step in the store's weights retention.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from lmforge.common.errors import InputError
from lmforge.common.logging import get_logger
from lmforge.common.storage import sha256_file
from lmforge.common.store import Store
from lmforge.model.pointer import point_to, read_pointer
from lmforge.uploader.config import EvaluationSection, score_terms
from lmforge.uploader.manifest import BEST_FILE

log = get_logger("uploader")

HELDOUT_LOSS = "heldout/loss"
PROPOSAL_FILE = "evals/proposal.json"
WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"  # lmforge.model.package's


def heldout_loss(result: dict) -> float | None:
    losses = [s.get("loss") for s in (result.get("heldout") or {}).values() if isinstance(s, dict)]
    losses = [float(x) for x in losses if isinstance(x, int | float)]
    return sum(losses) / len(losses) if losses else None


def score_of(result: dict, score: str) -> float | None:
    """The result's score: "heldout/loss", "TASK/METRIC" of its tasks, or a weighted sum of those
    (config.score_terms); None when a term is missing."""
    total = 0.0
    for weight, name in score_terms(score):
        value = _term(result, name)
        if value is None:
            return None
        total += weight * value
    return total


def _term(result: dict, name: str) -> float | None:
    if name == HELDOUT_LOSS:
        return heldout_loss(result)
    task, _, metric = name.partition("/")
    value = ((result.get("tasks") or {}).get(task) or {}).get(metric)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def is_better(score: float | None, than: float | None, mode: str) -> bool:
    if score is None or score != score:  # None or NaN never wins
        return False
    if than is None:
        return True
    return score > than if mode == "max" else score < than


def best(results: dict[int, dict], score: str, mode: str) -> tuple[int, float] | None:
    """(step, score) of the best result; on a tie the earlier step."""
    found = None
    for step in sorted(results):
        value = score_of(results[step], score)
        if is_better(value, found[1] if found else None, mode):
            found = (step, value)
    return found


def regressed(step: int, result: dict, earlier: dict[int, dict], score_drop: float, loss_rise: float) -> list[str]:
    """The task metrics more than `score_drop` below their best (max) so far, and the held-out
    sources more than `loss_rise` above their best (min) loss so far; "so far": the results of
    steps up to this one (as the eval job's pushed best_score gauges)."""
    before = [r for s, r in earlier.items() if s <= step]
    found = []
    for task, metrics in sorted((result.get("tasks") or {}).items()):
        for metric, value in sorted((metrics or {}).items()):
            values = [((r.get("tasks") or {}).get(task) or {}).get(metric) for r in before]
            values = [v for v in values if isinstance(v, int | float)]
            if isinstance(value, int | float) and values and max(values) - value > score_drop:
                found.append(f"{task}/{metric}")
    for source, figures in sorted((result.get("heldout") or {}).items()):
        losses = [((r.get("heldout") or {}).get(source) or {}).get("loss") for r in before]
        losses = [v for v in losses if isinstance(v, int | float)]
        loss = (figures or {}).get("loss")
        if isinstance(loss, int | float) and losses and loss - min(losses) > loss_rise:
            found.append(f"heldout/{source}")
    return found


def read_json(store: Store, rel: str) -> dict | None:
    data = store.get_bytes(rel)
    if data is None:
        return None
    try:
        body = json.loads(data)
    except ValueError:
        log.warning("unreadable_json", file=store.join(rel))
        return None
    return body if isinstance(body, dict) else None


def write_json(store: Store, rel: str, body: dict) -> None:
    store.put_bytes(rel, (json.dumps(body, indent=1) + "\n").encode())


class Promoter:
    """Promotes a new best as `config.promote` says; `models` is the store under `models_store`
    (promote=pointer)."""

    def __init__(self, dest: Store, config: EvaluationSection, run: str, models: Store | None = None):
        self.dest, self.config, self.run, self.models = dest, config, run, models

    def current(self) -> dict | None:
        return read_json(self.dest, BEST_FILE)

    def promote(self, step: int, score: float, package_rel: str) -> str | None:
        """Promote the package at `package_rel` (in the destination); best.json last. Returns
        where it was promoted to (the copy, the proposal), None with promote=off."""
        package = self.dest.join(package_rel.rstrip("/"))
        promoted_to = None
        if self.config.promote == "pointer":
            promoted_to = self._copy(step, package_rel)
            pointer = read_pointer(self.config.pointer)
            if pointer is None or pointer.model != promoted_to:  # idempotent: no new history entry
                point_to(self.config.pointer, promoted_to,
                         set_by=f"lmforge-uploader evaluation ({self.run} step {step})")
        elif self.config.promote == "propose":
            promoted_to = self.dest.join(PROPOSAL_FILE)
            write_json(self.dest, PROPOSAL_FILE, {"run": self.run, "step": step, "package": package,
                                                  "score": score, "score_name": self.config.score,
                                                  "mode": self.config.mode})
        write_json(self.dest, BEST_FILE, {"step": step, "score": score, "package": package,
                                          "promoted_to": promoted_to})
        log.info("promoted" if promoted_to else "new_best", step=step, score=score, package=package,
                 promoted_to=promoted_to, how=self.config.promote)
        return promoted_to

    def _copy(self, step: int, package_rel: str) -> str:
        """The package copied under models_store (verified); its URI. A copy already complete (its
        config.json is the source's) is kept."""
        assert self.models is not None
        source = package_rel.rstrip("/") + "/"
        target = f"{self.run}-step-{step}/"
        uri = self.models.join(target.rstrip("/"))
        config_bytes = self.dest.get_bytes(source + CONFIG)
        if config_bytes is None:
            raise InputError(f"{self.dest.join(source)}: not a model package ({CONFIG} missing)")
        if self.models.get_bytes(target + CONFIG) == config_bytes:
            return uri
        try:
            files = json.loads(config_bytes)["files"]
            expected = {name: files[name]["sha256"] for name in (WEIGHTS, TOKENIZER)}
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{self.dest.join(source + CONFIG)}: no file checksums ({exc})") from exc
        listing = self.dest.listing(source)
        with tempfile.TemporaryDirectory(prefix="lmforge-promote-") as tmp:
            for name, sha256 in expected.items():
                local = Path(tmp) / name
                stored = listing.get(source + name)
                self.dest.download(source + name, local, size=stored.size if stored else None)
                if sha256_file(local) != sha256:
                    raise InputError(f"{self.dest.join(source + name)}: sha256 does not match {CONFIG}")
                if self.models.upload_file(local, target + name) != sha256:
                    raise InputError(f"{self.models.join(target + name)}: sha256 changed while copying")
        self.models.put_bytes(target + CONFIG, config_bytes)  # last: now it is a package
        return uri

