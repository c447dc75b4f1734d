"""The uploader under faults, through the project's fault-injecting proxy in front of moto:
flaky requests, a killed sidecar, SIGTERM mid-upload, corrupted objects, and local disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from lmforge.common.checkpoint_layout import UPLOADED_MARKER, committed_steps, step_dir
from tests.uploader.fault_proxy import FaultProxy
from tests.uploader.helpers import (
    fake_checkpoint,
    files_of,
    in_process_uploader,
    objects,
    run_uploader,
    small_parts,
    store_state,
    uploader_command,
    wait_for,
)

PREFIX = "runs/r1/checkpoints/"
QUICK_RETRIES = {"part_size_mb": 5, "backoff_seconds": 0.01, "backoff_max_seconds": 0.1}


def test_twenty_percent_failing_requests_still_deliver_every_checkpoint_intact(s3, tmp_path):
    endpoint, make_bucket = s3
    client = make_bucket("flaky")
    local = tmp_path / "ckpt"
    for step in (1, 2, 3, 4):
        fake_checkpoint(local, step)
    with FaultProxy(endpoint, seed=3) as proxy:
        # Two attempts per request: some uploads may fail outright and are aborted, then retried.
        uploader = in_process_uploader(local, "s3://flaky/runs/r1", proxy.url, keep=10,
                                       transfer={**QUICK_RETRIES, "attempts": 2})
        proxy.set_faults(reset=0.07, error_500=0.06, slow_down=0.07, delay=0.1, delay_seconds=0.05)
        done: list[int] = []
        for _ in range(40):
            done += uploader.run_once()
            assert sorted(store_state(client, "flaky")) == sorted(done)  # no manifest without all its files
            if sorted(done) == [1, 2, 3, 4]:
                break
        faults = proxy.stats
        assert sorted(done) == [1, 2, 3, 4]
        assert faults["reset"] + faults["error_500"] + faults["slow_down"] >= 5, faults

        # A store that keeps failing: the upload fails, is counted, aborted, and retried later.
        fake_checkpoint(local, 5)
        proxy.set_faults(error_500=1.0, methods={"PUT"})
        assert uploader.run_once() == []
        assert store_state(client, "flaky") == [1, 2, 3, 4]
        failures = uploader.metrics.registry.get_sample_value("lmforge_uploader_failures_total",
                                                              {"reason": "ClientError"})
        assert failures >= 1
        proxy.set_faults()
        assert uploader.run_once() == [5]
        uploader.close()
    assert store_state(client, "flaky") == [1, 2, 3, 4, 5]


def test_a_killed_sidecar_resumes_without_resending_finished_checkpoints(s3, tmp_path):
    """The sidecar container is killed and restarted in the same pod (same identity): the
    restarted one aborts its predecessor's open uploads at once."""
    endpoint, make_bucket = s3
    client = make_bucket("killed")
    local = tmp_path / "ckpt"
    for step in (1, 2, 3):
        fake_checkpoint(local, step, meta={"config": {"steps": 4}})
    with FaultProxy(endpoint, delay=1.0, delay_seconds=0.25, methods={"PUT", "POST"}) as proxy:
        sidecar = subprocess.Popen(uploader_command("watch", "--dir", str(local), "--dest", "s3://killed/runs/r1",
                                                    "--endpoint-url", proxy.url, *small_parts(),
                                                    "--set", "transfer.concurrency=1", "--set", "identity=pod-0"),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: f"{PREFIX}step-00000001/MANIFEST.json" in objects(client, "killed"), what="step 1")
            journal = step_dir(local, 2) / ".upload-journal.json"
            wait_for(lambda: journal.exists() and json.loads(journal.read_text()), what="step 2 partly sent")
            sidecar.kill()
            sidecar.wait(timeout=10)
        finally:
            sidecar.kill()
    before = objects(client, "killed")
    assert f"{PREFIX}step-00000002/MANIFEST.json" not in before  # killed mid-checkpoint: not published
    sent_whole = [e["path"] for e in json.loads(journal.read_text())]
    assert sent_whole
    time.sleep(1.1)  # LastModified has one-second resolution
    result = run_uploader("watch", "--dir", str(local), "--dest", "s3://killed/runs/r1", "--exit-when-done",
                          *small_parts(), "--set", "identity=pod-0")
    assert result.returncode == 0, result.stderr
    after = objects(client, "killed")
    assert store_state(client, "killed") == [1, 2, 3]
    step1 = [k for k in before if k.startswith(f"{PREFIX}step-00000001/")]
    assert step1 and all(after[k]["LastModified"] == before[k]["LastModified"] for k in step1)
    # Files of step 2 recorded as sent whole before the kill were not sent again either.
    step2 = [f"{PREFIX}step-00000002/{path}" for path in sent_whole]
    assert all(after[k]["LastModified"] == before[k]["LastModified"] for k in step2)
    assert not journal.exists()  # done: the journal is gone, the UPLOADED marker is there
    assert (step_dir(local, 2) / UPLOADED_MARKER).exists()


def test_sigterm_mid_upload_ends_within_the_grace_period_with_nothing_half_published(s3, tmp_path):
    endpoint, make_bucket = s3
    client = make_bucket("sigterm")
    local = tmp_path / "ckpt"
    fake_checkpoint(local, 1, sizes=(30 << 20,))  # 6 parts of 5 MiB, one at a time, each PUT delayed 1 s
    with FaultProxy(endpoint, delay=1.0, delay_seconds=1.0, methods={"PUT"}) as proxy:
        sidecar = subprocess.Popen(uploader_command("watch", "--dir", str(local), "--dest", "s3://sigterm/runs/r1",
                                                    "--endpoint-url", proxy.url, *small_parts(),
                                                    "--set", "transfer.concurrency=1", "--set", "grace_seconds=1"),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: proxy.stats["delay"] >= 2, what="parts in flight")
        sidecar.send_signal(signal.SIGTERM)
        stdout, stderr = sidecar.communicate(timeout=30)
    assert sidecar.returncode == 0, stderr
    # Ended at the grace period, not at the end of the upload: the PUTs sent (its lease's among
    # them) are fewer than the file's 6 parts, which take 6 s against the 1 s of grace.
    assert proxy.stats["delay"] < 6, proxy.stats
    assert store_state(client, "sigterm") == []  # no manifest, no open multipart upload
    assert not [k for k in objects(client, "sigterm") if "/.uploaders/" in k]  # its lease released too
    assert '"upload_cancelled"' in stdout


def test_sigterm_lets_a_nearly_done_upload_finish(s3, tmp_path):
    endpoint, make_bucket = s3
    client = make_bucket("graceful")
    local = tmp_path / "ckpt"
    fake_checkpoint(local, 1, sizes=(12 << 20,))
    with FaultProxy(endpoint, delay=1.0, delay_seconds=0.3, methods={"PUT"}) as proxy:
        sidecar = subprocess.Popen(uploader_command("watch", "--dir", str(local), "--dest", "s3://graceful/runs/r1",
                                                    "--endpoint-url", proxy.url, *small_parts(),
                                                    "--set", "grace_seconds=20"),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: proxy.stats["delay"] >= 1, what="upload under way")
        sidecar.send_signal(signal.SIGTERM)
        _, stderr = sidecar.communicate(timeout=30)
    assert sidecar.returncode == 0, stderr
    assert store_state(client, "graceful") == [1]


def test_sigterm_uploads_a_checkpoint_committed_after_the_last_pass(s3, tmp_path):
    """The trainer's final checkpoint lands just before the pod stops: the sidecar, between
    polls, gets SIGTERM and must still publish it before exiting."""
    endpoint, make_bucket = s3
    client = make_bucket("final")
    local = tmp_path / "ckpt"
    fake_checkpoint(local, 1, sizes=(100,))
    sidecar = subprocess.Popen(uploader_command("watch", "--dir", str(local), "--dest", "s3://final/runs/r1",
                                                "--endpoint-url", endpoint, "--set", "poll_seconds=600",
                                                "--set", "grace_seconds=20"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: store_state(client, "final") == [1], what="the first pass")
    fake_checkpoint(local, 2, sizes=(3 << 20,))  # committed while the sidecar sleeps
    sidecar.send_signal(signal.SIGTERM)
    stdout, stderr = sidecar.communicate(timeout=30)
    assert sidecar.returncode == 0, stderr
    assert store_state(client, "final") == [1, 2]
    assert '"drained"' in stdout


def test_restore_skips_a_corrupted_checkpoint_for_the_previous_good_one(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("corrupt")
    local = tmp_path / "ckpt"
    for step in (4, 9):
        fake_checkpoint(local, step, sizes=(6 << 20, 100))
    uploader = in_process_uploader(local, "s3://corrupt/runs/r1", transfer=QUICK_RETRIES)
    assert uploader.run_once() == [4, 9]
    uploader.close()
    key = f"{PREFIX}step-00000009/__0_0.distcp"
    body = bytearray(client.get_object(Bucket="corrupt", Key=key)["Body"].read())
    body[12345] ^= 0xFF  # same size, one flipped byte
    client.put_object(Bucket="corrupt", Key=key, Body=bytes(body))
    result = run_uploader("restore", "--src", "s3://corrupt/runs/r1", "--dir", str(tmp_path / "back"),
                          *small_parts())
    assert result.returncode == 0, result.stderr
    assert committed_steps(tmp_path / "back") == [4]
    assert "sha256 does not match the manifest" in result.stdout
    assert not [p for p in (tmp_path / "back").iterdir() if p.name.startswith(".restore")]
    asked = run_uploader("restore", "--src", "s3://corrupt/runs/r1", "--dir", str(tmp_path / "b2"), "--step", "9")
    assert asked.returncode != 0 and "corrupt" in asked.stderr


def test_restore_verifies_a_present_local_copy_and_replaces_a_corrupt_one(s3, tmp_path):
    """A persistent volume keeps the pod's own committed copy: restore trusts it only if it
    matches the store's manifest, and otherwise brings the store's copy in its place."""
    _, make_bucket = s3
    make_bucket("present")
    local = tmp_path / "ckpt"
    for step in (4, 9):
        fake_checkpoint(local, step, sizes=(6 << 20, 100))
    uploader = in_process_uploader(local, "s3://present/runs/r1", transfer=QUICK_RETRIES)
    assert uploader.run_once() == [4, 9]
    uploader.close()
    good = files_of(step_dir(local, 9))

    def restore() -> subprocess.CompletedProcess:
        result = run_uploader("restore", "--src", "s3://present/runs/r1", "--dir", str(local), *small_parts())
        assert result.returncode == 0, result.stderr
        assert committed_steps(local) == [4, 9]
        assert files_of(step_dir(local, 9)) == good
        return result

    assert '"restore_present_mismatch"' not in restore().stdout  # a good copy is kept as it is
    shard = step_dir(local, 9) / "__0_0.distcp"
    with open(shard, "r+b") as fh:
        fh.truncate(4 << 20)  # a truncated shard
    assert "4194304 bytes, the manifest says 6291456" in restore().stdout
    body = bytearray(shard.read_bytes())
    body[12345] ^= 0xFF  # same size, one flipped byte
    shard.write_bytes(bytes(body))
    assert "sha256 does not match the manifest" in restore().stdout
    (step_dir(local, 9) / "__1_0.distcp").unlink()  # a missing file
    assert "__1_0.distcp: missing" in restore().stdout


def test_a_restarted_sidecar_trusts_a_matching_manifest_and_frees_disk(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("restart")
    local = tmp_path / "ckpt"
    for step in (1, 2, 3):
        fake_checkpoint(local, step, sizes=(1 << 20,))
    first = in_process_uploader(local, "s3://restart/runs/r1")
    assert first.run_once() == [1, 2, 3]
    first.close()
    for step in (1, 2, 3):
        (step_dir(local, step) / UPLOADED_MARKER).unlink()  # as if the markers were lost
    before = objects(client, "restart")
    second = in_process_uploader(local, "s3://restart/runs/r1", free_disk_above=1e-9)  # always "full"
    assert second.run_once() == []  # verified against the manifests, nothing sent
    second.close()
    assert objects(client, "restart") == before
    assert committed_steps(local) == [3]  # uploaded ones freed, never the newest
    assert sorted(os.listdir(local)) == ["step-00000003"]
