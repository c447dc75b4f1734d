"""The model a run's checkpoint evaluations chose, for the train pipeline's export step.

With evaluation branches on (the chart's training.evaluation), the trainer writes a weights package
(a model package, as `lmforge-train export` writes it) every few steps, the uploader sidecar uploads
each to <run store>/weights/step-NNNNNNNN and has it evaluated, and records the best one so far in
<run store>/evals/best.json = {"step", "score", "package", "promoted_to"}. The export step then
publishes that package instead of exporting the final checkpoint: the package promotion already
copied (`promoted_to`) as it is, else a verified copy of the weights package. A run without the file
(evaluation off, or nothing evaluated) keeps the final checkpoint.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

BEST = "evals/best.json"


class EvaluatedModelError(RuntimeError):
    pass


def evals_best(run_uri: str) -> dict[str, Any] | None:
    """<run_uri>/evals/best.json, checked (a whole step ≥ 0), or None when the run has none."""
    from lmforge.common.storage import open_store

    store = open_store(run_uri)
    if not store.exists(BEST):
        return None
    where = store.join(BEST)
    try:
        best = json.loads(store.read_text(BEST))
    except json.JSONDecodeError as exc:
        raise EvaluatedModelError(f"{where}: not JSON ({exc})") from exc
    step = best.get("step") if isinstance(best, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise EvaluatedModelError(f"{where}: no step (a whole number ≥ 0) in {best!r}")
    return best


def evals_best_step(run_uri: str) -> int | None:
    """The step of the run's best evaluated checkpoint (evals/best.json), or None when it has none."""
    best = evals_best(run_uri)
    return None if best is None else best["step"]


def weights_package(run_uri: str, step: int) -> str:
    """Where the uploader puts the weights package of `step`."""
    from lmforge.common.checkpoint_layout import step_name

    return f"{run_uri.rstrip('/')}/weights/{step_name(step)}"


def copy_package(source: str, dest: str) -> str:
    """Copy the model package at `source` (a path or s3:// URI) to `dest`, verified against its own
    checksums first; config.json goes last, so a reader never finds a package without its files."""
    from lmforge.common.storage import open_store
    from lmforge.model.package import CONFIG, TOKENIZER, WEIGHTS, fetch_package, verify_package

    work = Path(tempfile.mkdtemp(prefix="lmforge-package-"))
    try:
        local = fetch_package(source, work)
        verify_package(local, require_checksums=True)
        store = open_store(dest)
        for name in (WEIGHTS, TOKENIZER, CONFIG):
            with store.open_write(name) as out, open(local / name, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
        return dest
    finally:
        shutil.rmtree(work, ignore_errors=True)
