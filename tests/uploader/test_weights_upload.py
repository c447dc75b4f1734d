"""Weights packages (RUN_DIR/weights/step-N) go to the store's weights/ with the checkpoints'
verified protocol (files, MANIFEST.json last, the local UPLOADED marker) and their own retention:
the newest `weights_keep`, plus the promoted step (evals/best.json) and the launcher's pins.
Checkpoints beside them keep their own prefix, lease and retention."""

from __future__ import annotations

import hashlib
import json

from lmforge.common.checkpoint_layout import is_uploaded, step_dir
from lmforge.model.package import verify_package
from tests.prometheus_tools import registry_samples
from tests.uploader.helpers import fake_checkpoint, fake_weights, in_process_uploader, run_uploader, small_parts


def manifests(store, kind: str) -> list[int]:
    return sorted(int(p.parent.name.removeprefix("step-")) for p in (store / kind).glob("step-*/MANIFEST.json"))


def test_weights_upload_verified_with_their_own_retention_and_the_promoted_step_pinned(tmp_path):
    weights_dir, store = tmp_path / "run" / "weights", tmp_path / "store"
    pins: set[int] = set()
    uploader = in_process_uploader(weights_dir, f"file://{store}", kind="weights", pinned=lambda: pins,
                                   keep=1, weights_keep=2)
    try:
        fake_weights(weights_dir, 10)
        assert uploader.run_once() == [10]
        remote = store / "weights" / "step-00000010"
        manifest = json.loads((remote / "MANIFEST.json").read_text())
        assert {f["path"] for f in manifest["files"]} == {"model.safetensors", "config.json", "tokenizer.json",
                                                          "meta.json"}
        for entry in manifest["files"]:
            assert hashlib.sha256((remote / entry["path"]).read_bytes()).hexdigest() == entry["sha256"]
        verify_package(remote, require_checksums=True)  # a model package as the trainer wrote it
        assert is_uploaded(step_dir(weights_dir, 10), f"file://{store}")
        assert not (store / "checkpoints").exists()

        (store / "evals").mkdir()
        (store / "evals" / "best.json").write_text(json.dumps({"step": 10, "score": 2.0}))  # promoted
        pins.add(20)  # being evaluated
        for step in (20, 30, 40):
            fake_weights(weights_dir, step)
            assert uploader.run_once() == [step]
        assert manifests(store, "weights") == [10, 20, 30, 40]  # newest 2 + promoted + pinned
        pins.clear()
        uploader.run_once()
        assert manifests(store, "weights") == [10, 30, 40]
        assert not [p for p in (store / "weights" / "step-00000020").rglob("*") if p.is_file()]  # every file
    finally:
        uploader.close()


def test_watch_uploads_weights_and_checkpoints_to_their_prefixes_and_exits_when_both_are_final(tmp_path):
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoints", 4, sizes=(1000,), meta={"config": {"steps": 5}})  # the final checkpoint
    fake_weights(run / "weights", 2)
    fake_weights(run / "weights", 4, final=True)
    store = tmp_path / "store"
    result = run_uploader("watch", "--dir", str(run / "checkpoints"), "--weights-dir", str(run / "weights"),
                          "--dest", f"file://{store}", "--exit-when-done", *small_parts(), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert manifests(store, "checkpoints") == [4]
    assert manifests(store, "weights") == [2, 4]
    events = [json.loads(line)["event"] for line in result.stdout.splitlines() + result.stderr.splitlines()
              if line.startswith("{")]
    assert events.count("uploaded") == 3 and "done" in events


def test_weights_uploads_leave_the_checkpoint_gauges_to_the_checkpoints(tmp_path):
    """One registry: the bytes and failures count both kinds; the last uploaded step, lag and pending
    gauges (LmforgeCheckpointUploadStalled reads them) stay the checkpoints'."""
    from lmforge.uploader.cli import open_destination
    from lmforge.uploader.config import UploaderConfig
    from lmforge.uploader.metrics import UploaderMetrics
    from lmforge.uploader.watcher import CheckpointUploader

    run, store = tmp_path / "run", f"file://{tmp_path / 'store'}"
    config, metrics = UploaderConfig(), UploaderMetrics()
    checkpoints = CheckpointUploader(run / "checkpoints", open_destination(store, config.transfer), config, metrics)
    weights = CheckpointUploader(run / "weights", open_destination(store, config.transfer), config,
                                 metrics.for_weights(), kind="weights")
    try:
        fake_checkpoint(run / "checkpoints", 3, sizes=(1000,))
        package = fake_weights(run / "weights", 7)
        for uploader in (checkpoints, weights):
            uploader.start()
        assert weights.run_once() == [7] and checkpoints.run_once() == [3]
        assert metrics.last_uploaded_step.value == 3 and metrics.pending.value == 1
        package_bytes = sum(p.stat().st_size for p in package.iterdir() if p.name not in ("COMMITTED", "UPLOADED"))
        checkpoint_bytes = 1000 + len(b"dcp metadata 3") + len('{"step": 3}')
        assert registry_samples(metrics.registry)["lmforge_uploader_uploaded_bytes_total"] == (
            checkpoint_bytes + package_bytes)
    finally:
        checkpoints.close()
        weights.close()


def test_exit_when_done_needs_no_weights_package_from_a_run_that_writes_none(tmp_path):
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoints", 4, sizes=(1000,), meta={"config": {"steps": 5, "checkpoint": {
        "weights_every": 0, "weights_every_minutes": 0}}})
    result = run_uploader("watch", "--dir", str(run / "checkpoints"), "--weights-dir", str(run / "weights"),
                          "--dest", f"file://{tmp_path / 'store'}", "--exit-when-done", *small_parts(), timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert manifests(tmp_path / "store", "checkpoints") == [4]
