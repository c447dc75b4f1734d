"""Two uploaders on one destination (a pod being replaced while its successor starts; one
sidecar per pod): neither aborts nor prunes what the other is still uploading, a dead one's
leftovers are cleaned up once provably stale, and a failed checkpoint is retried with a
growing wait."""

from __future__ import annotations

import json
import subprocess
import threading
import time

from lmforge.uploader.lease import LEASE_PREFIX
from tests.uploader.fault_proxy import FaultProxy
from tests.uploader.helpers import (
    fake_checkpoint,
    in_process_uploader,
    objects,
    small_parts,
    store_state,
    uploader_command,
    wait_for,
)

DEST = "runs/r1"
STEP1 = f"{DEST}/checkpoints/step-00000001/"


def open_uploads(client, bucket: str) -> list[str]:
    return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


def test_a_starting_uploader_leaves_another_uploaders_live_upload_alone(s3, tmp_path):
    endpoint, make_bucket = s3
    client = make_bucket("shared")
    pod_a, pod_b = tmp_path / "pod-a", tmp_path / "pod-b"
    fake_checkpoint(pod_a, 1, sizes=(30 << 20,))  # 6 parts of 5 MiB, one at a time, each held back
    for step in (2, 3):
        fake_checkpoint(pod_b, step, sizes=(1000,))
    with FaultProxy(endpoint, delay=1.0, delay_seconds=0.4, methods={"PUT"}) as proxy:
        first = in_process_uploader(pod_a, f"s3://shared/{DEST}", proxy.url, identity="trainer-a",
                                    transfer={"part_size_mb": 5, "concurrency": 1})
        result: list[list[int]] = []
        uploading = threading.Thread(target=lambda: result.append(first.run_once()))
        uploading.start()
        try:
            # Mid-checkpoint: its small files are in the store, its large one is a multipart upload.
            wait_for(lambda: open_uploads(client, "shared") and f"{STEP1}meta.json" in objects(client, "shared"),
                     what="the first uploader mid-checkpoint")
            second = in_process_uploader(pod_b, f"s3://shared/{DEST}", endpoint, identity="trainer-b", keep=1)
            assert open_uploads(client, "shared") == [f"{STEP1}__0_0.distcp"]  # not aborted at start
            assert second.run_once() == [3]  # and its prune left the unpublished step 1 alone
            assert f"{STEP1}meta.json" in objects(client, "shared")
            assert uploading.is_alive()  # all of this happened while step 1 was being uploaded
            second.close()
        finally:
            uploading.join(timeout=120)
        first.close()
    assert result == [[1]]
    assert store_state(client, "shared") == [1, 3]  # every manifest's files whole, no upload left open
    assert not [k for k in objects(client, "shared") if k.startswith(f"{DEST}/{LEASE_PREFIX}")]  # leases released


def test_a_dead_uploaders_upload_is_aborted_once_its_lease_is_stale(s3, tmp_path):
    endpoint, make_bucket = s3
    client = make_bucket("dead-peer")
    fake_checkpoint(tmp_path / "pod-x", 1, sizes=(30 << 20,))
    stale = ["--set", "stale_upload_seconds=5"]
    with FaultProxy(endpoint, delay=1.0, delay_seconds=0.4, methods={"PUT"}) as proxy:
        sidecar = subprocess.Popen(uploader_command("watch", "--dir", str(tmp_path / "pod-x"), "--dest",
                                                    f"s3://dead-peer/{DEST}", "--endpoint-url", proxy.url,
                                                    *small_parts(), *stale, "--set", "identity=trainer-x",
                                                    "--set", "transfer.concurrency=1"),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: open_uploads(client, "dead-peer"), what="a multipart upload in flight")
        finally:
            sidecar.kill()  # the pod is gone: its lease is no longer refreshed
            sidecar.wait(timeout=10)
    killed = time.monotonic()
    other = in_process_uploader(tmp_path / "pod-y", f"s3://dead-peer/{DEST}", endpoint, identity="trainer-y",
                                stale_upload_seconds=5)
    assert open_uploads(client, "dead-peer") == [f"{STEP1}__0_0.distcp"]  # its lease is fresh: maybe alive
    lease = f"{DEST}/{LEASE_PREFIX}trainer-x.json"
    assert json.loads(client.get_object(Bucket="dead-peer", Key=lease)["Body"].read())["prefixes"] == [
        "checkpoints/step-00000001/"]
    time.sleep(max(0.0, killed + 6.5 - time.monotonic()))  # past the stale age (one-second store clock)
    other.sweep()
    other.close()
    assert open_uploads(client, "dead-peer") == []
    assert lease not in objects(client, "dead-peer")


def test_a_failed_checkpoint_is_retried_with_a_doubling_wait(s3, tmp_path):
    endpoint, make_bucket = s3
    client = make_bucket("backoff")
    local = tmp_path / "ckpt"
    fake_checkpoint(local, 1, sizes=(1000,))
    with FaultProxy(endpoint) as proxy:
        uploader = in_process_uploader(local, f"s3://backoff/{DEST}", proxy.url, retry_failed_after_seconds=0.5,
                                       retry_failed_max_seconds=1.0, transfer={"attempts": 1})
        proxy.set_faults(error_500=1.0, methods={"PUT"})

        def attempt() -> bool:
            """One pass; True when it tried the step (and failed)."""
            before = proxy.stats["error_500"]
            assert uploader.run_once() == []
            return proxy.stats["error_500"] > before

        assert attempt()  # 1st failure: next try after 0.5 s
        failed_at = time.monotonic()
        assert not attempt()
        time.sleep(max(0.0, failed_at + 0.6 - time.monotonic()))
        assert attempt()  # 2nd failure: next try after 1.0 s
        failed_at = time.monotonic()
        time.sleep(0.6)
        assert not attempt()
        time.sleep(max(0.0, failed_at + 1.1 - time.monotonic()))
        proxy.set_faults()
        assert uploader.run_once() == [1]
        uploader.close()
    assert store_state(client, "backoff") == [1]
