"""The uploader against a real S3 REST server (moto): committed checkpoints go up with the
manifest last, come back byte-identical, and the store keeps the last K plus the best."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from lmforge.common.checkpoint_layout import COMMIT_MARKER, UPLOADED_MARKER, committed_steps, step_dir
from lmforge.common.storage import sha256_file
from tests.uploader.helpers import (
    fake_checkpoint,
    files_of,
    in_process_uploader,
    run_uploader,
    small_parts,
    uploader_command,
)


def manifest_steps(client, bucket: str, prefix: str) -> list[int]:
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    return sorted(int(k.split("/")[-2][5:]) for k in keys if k.endswith("/MANIFEST.json"))


def test_committed_checkpoints_upload_and_restore_byte_identical(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("ckpt-a")
    local = tmp_path / "ckpt"
    for step in (4, 9):
        fake_checkpoint(local, step)
    fake_checkpoint(local, 14, commit=False)  # still being written: never uploaded
    uploader = in_process_uploader(local, "s3://ckpt-a/runs/r1", transfer={"part_size_mb": 5})
    assert uploader.run_once() == [4, 9]
    uploader.close()
    assert manifest_steps(client, "ckpt-a", "runs/r1/") == [4, 9]
    keys = {o["Key"] for o in client.list_objects_v2(Bucket="ckpt-a").get("Contents", [])}
    assert not any("step-00000014" in k for k in keys)
    assert not any(k.endswith(COMMIT_MARKER) for k in keys)
    assert (step_dir(local, 9) / UPLOADED_MARKER).exists()
    manifest = json.loads(client.get_object(Bucket="ckpt-a", Key="runs/r1/checkpoints/step-00000009/MANIFEST.json")
                          ["Body"].read())
    by_path = {f["path"]: f for f in manifest["files"]}
    assert by_path["__0_0.distcp"]["sha256"] == sha256_file(step_dir(local, 9) / "__0_0.distcp")
    assert client.list_multipart_uploads(Bucket="ckpt-a").get("Uploads", []) == []

    restored = tmp_path / "restored"
    result = run_uploader("restore", "--src", "s3://ckpt-a/runs/r1", "--dir", str(restored), *small_parts())
    assert result.returncode == 0, result.stderr
    assert committed_steps(restored) == [9]
    want = files_of(step_dir(local, 9))
    got = files_of(step_dir(restored, 9))
    assert {k: v for k, v in got.items() if k != UPLOADED_MARKER} == {k: v for k, v in want.items()
                                                                       if k != UPLOADED_MARKER}


def test_restore_with_nothing_in_the_store_starts_fresh(s3, tmp_path):
    _, make_bucket = s3
    make_bucket("ckpt-empty")
    result = run_uploader("restore", "--src", "s3://ckpt-empty/runs/none", "--dir", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    assert committed_steps(tmp_path / "c") == []
    assert '"restore_nothing"' in result.stdout


def test_retention_keeps_the_last_k_plus_the_best(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("ckpt-keep")
    local = tmp_path / "ckpt"
    uploader = in_process_uploader(local, "s3://ckpt-keep/r", keep=2)
    for step, best in ((1, True), (2, True), (3, False), (4, False), (5, False)):
        fake_checkpoint(local, step, sizes=(1000,), meta={"best": best, "val_loss": 1.0 / step})
        uploader.run_once()
    uploader.close()
    assert manifest_steps(client, "ckpt-keep", "r/") == [2, 4, 5]
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="ckpt-keep").get("Contents", [])]
    assert not any("step-00000001" in k or "step-00000003" in k for k in keys)  # nothing half-deleted left


@pytest.mark.parametrize("dest", ["ftp://x/y", "s3://", "not-a-uri"])
def test_bad_destination_is_a_config_error(tmp_path, dest):
    result = run_uploader("watch", "--dir", str(tmp_path), "--dest", dest, timeout=30)
    assert result.returncode == 2
    assert "expected s3://BUCKET/PREFIX or file:///PATH" in result.stderr


def test_missing_bucket_fails_fast(s3, tmp_path):
    result = run_uploader("watch", "--dir", str(tmp_path), "--dest", "s3://no-such-bucket/x", timeout=30)
    assert result.returncode == 4
    assert "bucket 'no-such-bucket' does not exist" in result.stderr


def test_unreachable_endpoint_fails_instead_of_hanging(tmp_path):
    result = run_uploader("watch", "--dir", str(tmp_path), "--dest", "s3://b/x", "--endpoint-url",
                          "http://127.0.0.1:9", timeout=60,
                          env_extra={"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                                     "AWS_DEFAULT_REGION": "us-east-1"})
    assert result.returncode == 4
    assert "cannot reach the object store" in result.stderr


def test_file_destination_round_trip(tmp_path):
    local = tmp_path / "ckpt"
    fake_checkpoint(local, 3, sizes=(2000, 10))
    store = tmp_path / "store"
    final = {"step": 3, "config": {"steps": 4}}
    (step_dir(local, 3) / "meta.json").write_text(json.dumps(final))
    result = run_uploader("watch", "--dir", str(local), "--dest", f"file://{store}", "--exit-when-done",
                          *small_parts())
    assert result.returncode == 0, result.stderr
    assert (store / "checkpoints/step-00000003/MANIFEST.json").exists()
    result = run_uploader("restore", "--src", f"file://{store}", "--dir", str(tmp_path / "back"), "--latest")
    assert result.returncode == 0, result.stderr
    assert files_of(step_dir(tmp_path / "back", 3))["__0_0.distcp"] == files_of(step_dir(local, 3))["__0_0.distcp"]


def test_wrong_credentials_fail_fast_with_a_clear_error(tmp_path):
    """A moto server that checks credentials (INITIAL_NO_AUTH_ACTION_COUNT=0): unknown keys are refused."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from tests.ports import free_port

    port = free_port()
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"), "-H", "127.0.0.1",
                               "-p", str(port)], env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        started = time.monotonic()
        result = run_uploader("watch", "--dir", str(tmp_path), "--dest", "s3://bucket/run", "--endpoint-url",
                              f"http://127.0.0.1:{port}", timeout=60,
                              env_extra={"AWS_ACCESS_KEY_ID": "wrong", "AWS_SECRET_ACCESS_KEY": "wrong"})
        assert result.returncode == 4, result.stderr
        assert "access denied" in result.stderr and "check the credentials" in result.stderr
        assert time.monotonic() - started < 30
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_metrics_report_bytes_steps_and_lag(s3, tmp_path):
    _, make_bucket = s3
    make_bucket("ckpt-metrics")
    local = tmp_path / "ckpt"
    sizes = (6 << 20, 1000)
    fake_checkpoint(local, 7, sizes=sizes)
    uploader = in_process_uploader(local, "s3://ckpt-metrics/r", transfer={"part_size_mb": 5})
    port = uploader.metrics.serve(0)
    assert uploader.run_once() == [7]
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    uploader.metrics.close()
    uploader.close()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    other_files = sum(p.stat().st_size for p in step_dir(local, 7).iterdir()
                      if p.name not in ("__0_0.distcp", "__1_0.distcp", COMMIT_MARKER, UPLOADED_MARKER))
    assert samples["lmforge_uploader_uploaded_bytes_total"] == sum(sizes) + other_files
    assert samples["lmforge_uploader_last_uploaded_step"] == 7
    assert samples["lmforge_uploader_upload_seconds_count"] == 1
    assert 0 < samples["lmforge_uploader_lag_seconds"] < 60
    assert "lmforge_uploader_failures_total" not in samples or samples["lmforge_uploader_failures_total"] == 0


def test_every_part_and_object_carries_a_correct_crc32c_checksum(s3, tmp_path):
    """moto neither stores nor checks CRC32C, so the requests themselves are inspected."""
    import base64

    import crc32c

    _, make_bucket = s3
    make_bucket("ckpt-crc")
    local = tmp_path / "ckpt"
    fake_checkpoint(local, 2, sizes=(11 << 20, 1000))
    uploader = in_process_uploader(local, "s3://ckpt-crc/r", transfer={"part_size_mb": 5})
    seen = []

    def capture(request, **_):
        if request.method == "PUT":
            body = request.body
            if not isinstance(body, bytes):  # a stream: read it, then put it back where it was
                position = body.tell()
                body, _ = body.read(), body.seek(position)
            header = request.headers.get("x-amz-checksum-crc32c")
            seen.append((request.url, header.decode() if isinstance(header, bytes) else header, body))

    uploader.dest.objects.client.meta.events.register("before-send.s3", capture)
    assert uploader.run_once() == [2]
    uploader.close()
    parts = [s for s in seen if "partNumber=" in s[0]]
    assert len(parts) == 3  # 11 MiB in 5 MiB parts
    assert len(seen) >= 3 + 4  # the parts, .metadata, meta.json, the small shard and MANIFEST.json
    for url, header, body in seen:
        expected = base64.b64encode(crc32c.crc32c(body).to_bytes(4, "big")).decode()
        assert header == expected, url


def test_a_late_sidecar_uploads_the_newest_k_and_the_best(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("ckpt-late")
    local = tmp_path / "ckpt"
    for step in range(1, 6):
        fake_checkpoint(local, step, sizes=(100,), meta={"best": step == 1, "val_loss": float(step)})
    (local / "best.json").write_text(json.dumps({"step": 1, "val_loss": 1.0}))
    uploader = in_process_uploader(local, "s3://ckpt-late/r", keep=2)
    assert uploader.run_once() == [1, 4, 5]
    uploader.close()
    assert manifest_steps(client, "ckpt-late", "r/") == [1, 4, 5]


def test_on_a_shared_volume_only_node_rank_0_restores_and_uploads(s3, tmp_path):
    """Every pod of a TrainJob carries the restore and uploader containers (one pod template);
    on the volume they share, ranks other than 0 leave both jobs to rank 0."""
    _, make_bucket = s3
    client = make_bucket("ckpt-ranks")
    source = tmp_path / "source"
    fake_checkpoint(source, 3, sizes=(1000,))
    uploader = in_process_uploader(source, "s3://ckpt-ranks/runs/r")
    assert uploader.run_once() == [3]
    uploader.close()

    volume = tmp_path / "volume"
    result = run_uploader("restore", "--src", "s3://ckpt-ranks/runs/r", "--dir", str(volume), "--node-rank", "1")
    assert result.returncode == 0, result.stderr
    assert '"standing_by"' in result.stdout and committed_steps(volume) == []
    result = run_uploader("restore", "--src", "s3://ckpt-ranks/runs/r", "--dir", str(volume), "--node-rank", "0")
    assert result.returncode == 0, result.stderr
    assert committed_steps(volume) == [3]

    fake_checkpoint(volume, 5, sizes=(1000,))  # committed by the trainers: rank 1's watch leaves it alone
    watch = subprocess.Popen(uploader_command("watch", "--dir", str(volume), "--dest", "s3://ckpt-ranks/runs/r",
                                              "--node-rank", "1", *small_parts()),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(3)
        assert watch.poll() is None, "a native sidecar that exits is restarted: it must stand by"
        assert manifest_steps(client, "ckpt-ranks", "runs/r/") == [3]
    finally:
        watch.send_signal(signal.SIGTERM)
        output, _ = watch.communicate(timeout=30)
    assert watch.returncode == 0, output
    assert '"standing_by"' in output
