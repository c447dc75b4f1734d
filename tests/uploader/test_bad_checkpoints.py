"""Checkpoints the trainer marked BAD (they failed to load on resume): never uploaded as the
newest or the best, marked in the store when the store holds the same files, and never
restored as the newest."""

from __future__ import annotations

import json

from lmforge.common.checkpoint_layout import BAD_MARKER, committed_steps, step_dir
from tests.uploader.helpers import fake_checkpoint, in_process_uploader, objects, run_uploader, small_parts

BAD_KEY = "runs/r1/checkpoints/step-00000009/BAD"


def mark_bad(local, step: int) -> bytes:
    """The marker as the trainer writes it."""
    record = json.dumps({"step": step, "file": str(step_dir(local, step) / ".metadata"),
                         "reason": "CheckpointReadError: refused", "rank": 0, "time": 0.0}).encode()
    (step_dir(local, step) / BAD_MARKER).write_bytes(record)
    return record


def restore_into(bucket: str, path, *extra: str):
    return run_uploader("restore", "--src", f"s3://{bucket}/runs/r1", "--dir", str(path), *small_parts(), *extra)


def test_a_bad_checkpoint_is_marked_in_the_store_and_never_restored_as_the_newest(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("bad")
    local = tmp_path / "pod"
    for step in (4, 9):
        fake_checkpoint(local, step, sizes=(1000,))
    uploader = in_process_uploader(local, "s3://bad/runs/r1", keep=1)
    assert uploader.run_once() == [9]  # keep=1: only the newest goes up
    fake_checkpoint(local, 12, sizes=(1000,))
    (local / "best.json").write_text(json.dumps({"step": 12, "val_loss": 1.0}))
    record = mark_bad(local, 12)  # committed and best, but it failed to load: not uploaded
    marker = mark_bad(local, 9)  # already uploaded: the store holds the same files
    assert uploader.run_once() == [4]  # the newest good one now
    store = objects(client, "bad")
    assert not [k for k in store if "step-00000012" in k]
    assert client.get_object(Bucket="bad", Key=BAD_KEY)["Body"].read() == marker != record
    assert "runs/r1/checkpoints/step-00000009/MANIFEST.json" in store  # marked, not deleted
    fake_checkpoint(local, 15, sizes=(1000,))
    assert uploader.run_once() == [15]  # keep=1 prunes 4; the bad 9 neither counts nor goes
    uploader.close()
    steps = {k.split("/")[3] for k in objects(client, "bad") if k.endswith("/MANIFEST.json")}
    assert steps == {"step-00000009", "step-00000015"}

    result = restore_into("bad", tmp_path / "fresh", "--step", "9")  # asked for explicitly: refused
    assert result.returncode == 3 and "marked BAD in the store" in result.stderr
    result = restore_into("bad", tmp_path / "fresh")
    assert result.returncode == 0, result.stderr
    assert committed_steps(tmp_path / "fresh") == [15]


def test_a_bad_local_copy_that_differs_from_the_store_leaves_the_store_copy_restorable(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("bad-local")
    local = tmp_path / "pod"
    for step in (4, 9):
        fake_checkpoint(local, step, sizes=(1000,))
    uploader = in_process_uploader(local, "s3://bad-local/runs/r1")
    assert uploader.run_once() == [4, 9]
    with open(step_dir(local, 9) / "__0_0.distcp", "r+b") as fh:
        fh.truncate(500)  # damaged on this volume after the upload
    mark_bad(local, 9)
    assert uploader.run_once() == []
    uploader.close()
    assert BAD_KEY not in objects(client, "bad-local")  # the store's copy is not the one that failed

    result = restore_into("bad-local", tmp_path / "fresh")  # a new pod on another node: the store's copy
    assert result.returncode == 0, result.stderr
    assert committed_steps(tmp_path / "fresh") == [9]
    result = restore_into("bad-local", local)  # the same volume: not the copy marked bad here
    assert result.returncode == 0, result.stderr
    assert "marked BAD here" in result.stdout and '"restore_present"' in result.stdout
    assert committed_steps(local) == [4] and (step_dir(local, 9) / BAD_MARKER).exists()
