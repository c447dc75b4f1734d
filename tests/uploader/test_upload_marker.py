"""The UPLOADED marker says which store holds a checkpoint and which manifest there; "uploaded"
is checked in that store (one HEAD), never the bare file: `watch --exit-when-done`, disk freeing
and the trainer's purge_requires_upload, against moto's S3 server."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from lmforge.common.checkpoint_layout import (
    UPLOADED_MARKER,
    committed_steps,
    is_uploaded,
    step_dir,
    upload_record,
)
from tests.uploader.fault_proxy import FaultProxy
from tests.uploader.helpers import (
    fake_checkpoint,
    in_process_uploader,
    run_uploader,
    small_parts,
    store_state,
    uploader_command,
    wait_for,
)

PREFIX = "runs/r1/checkpoints/"


def manifest_key(step: int) -> str:
    return f"{PREFIX}step-{step:08d}/MANIFEST.json"


def rewrite_manifest(client, bucket: str, step: int) -> None:
    """The same files listed in another manifest object (as another uploader would write it): another ETag."""
    manifest = json.loads(client.get_object(Bucket=bucket, Key=manifest_key(step))["Body"].read())
    client.put_object(Bucket=bucket, Key=manifest_key(step), Body=json.dumps(manifest).encode())


def test_exit_when_done_waits_for_the_store_not_a_stale_marker(s3, tmp_path):
    """A finished run whose checkpoints carry empty UPLOADED markers (an earlier watch's or
    restore's): while no upload gets through, and while the store is unreachable (its proxy
    stopped), `watch --exit-when-done` goes on trying; once the store is back it uploads and
    exits 0 with the final manifest in the store."""
    endpoint, make_bucket = s3
    client = make_bucket("stale-marker")
    local = tmp_path / "ckpt"
    for step in (1, 2):
        fake_checkpoint(local, step, sizes=(1000,), meta={"config": {"steps": 3}})  # step 2 is the final one
        (step_dir(local, step) / UPLOADED_MARKER).write_bytes(b"")
    proxy = FaultProxy(endpoint, reset=1.0, methods={"PUT", "POST"}).start()  # listings pass, no upload does
    port = int(proxy.url.rsplit(":", 1)[1])
    sidecar = subprocess.Popen(uploader_command("watch", "--dir", str(local), "--dest", "s3://stale-marker/runs/r1",
                                                "--exit-when-done", "--endpoint-url", proxy.url,
                                                *small_parts("--set", "transfer.attempts=2")),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []

    def read() -> None:
        for line in sidecar.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def seen(event: str) -> int:
        return sum(f'"event": "{event}"' in line for line in list(lines))

    try:
        wait_for(lambda: seen("upload_failed") >= 2 or sidecar.poll() is not None, what="both uploads failing")
        assert sidecar.poll() is None, "".join(lines)
        proxy.close()  # the store is unreachable
        failed = seen("pass_failed")
        wait_for(lambda: seen("pass_failed") > failed or sidecar.poll() is not None, what="a pass with no store")
        assert sidecar.poll() is None, "".join(lines)
        assert seen("done") == 0
        assert store_state(client, "stale-marker") == []

        proxy = FaultProxy(endpoint, port=port).start()  # the store is back, at the same address
        assert sidecar.wait(timeout=120) == 0, "".join(lines)
    finally:
        sidecar.kill()
        proxy.close()
    reader.join(timeout=10)
    assert seen("done") == 1
    assert store_state(client, "stale-marker") == [1, 2]
    record = upload_record(step_dir(local, 2))
    assert record is not None and record.destination == "s3://stale-marker/runs/r1"
    assert record.manifest == "checkpoints/step-00000002/MANIFEST.json"
    assert record.etag == client.head_object(Bucket="stale-marker", Key=manifest_key(2))["ETag"]


def test_a_checkpoint_restored_from_one_store_is_not_uploaded_to_another(s3, tmp_path):
    _, make_bucket = s3
    make_bucket("marker-a")
    client_b = make_bucket("marker-b")
    source = tmp_path / "source"
    fake_checkpoint(source, 1, sizes=(1000,))
    uploader = in_process_uploader(source, "s3://marker-a/runs/r1")
    assert uploader.run_once() == [1]
    uploader.close()

    local = tmp_path / "ckpt"
    result = run_uploader("restore", "--src", "s3://marker-a/runs/r1", "--dir", str(local))
    assert result.returncode == 0, result.stderr
    restored = step_dir(local, 1)
    assert upload_record(restored).destination == "s3://marker-a/runs/r1"
    assert is_uploaded(restored, "s3://marker-a/runs/r1")
    assert not is_uploaded(restored, "s3://marker-b/runs/r1")

    fake_checkpoint(local, 2, sizes=(1000,))  # training goes on after the restore
    watch = in_process_uploader(local, "s3://marker-b/runs/r1", free_disk_above=1e-9)  # the volume always "full"
    watch.free_disk()
    assert committed_steps(local) == [1, 2]  # not in store B: kept
    assert watch.run_once() == [1, 2]  # uploaded to B, then freed there (never the newest)
    watch.close()
    assert store_state(client_b, "marker-b") == [1, 2]
    assert committed_steps(local) == [2]


def test_disk_freeing_keeps_a_checkpoint_whose_manifest_is_gone_or_replaced(s3, tmp_path):
    _, make_bucket = s3
    client = make_bucket("marker-gone")
    local = tmp_path / "ckpt"
    for step in (1, 2, 3):
        fake_checkpoint(local, step, sizes=(1000,))
    uploader = in_process_uploader(local, "s3://marker-gone/runs/r1")
    assert uploader.run_once() == [1, 2, 3]
    uploader.close()
    rewrite_manifest(client, "marker-gone", 1)
    client.delete_object(Bucket="marker-gone", Key=manifest_key(2))
    rewrite_manifest(client, "marker-gone", 3)

    sidecar = in_process_uploader(local, "s3://marker-gone/runs/r1", keep=2, free_disk_above=1e-9)
    sidecar.free_disk()
    assert committed_steps(local) == [1, 2, 3]  # no marker matches what the store holds
    # The next pass uploads step 2 again and marks step 3 anew (its files match the manifest there);
    # retention prunes step 1 from the store, which holds newer ones now: all but the newest are freed.
    assert sidecar.run_once() == [2]
    sidecar.close()
    assert store_state(client, "marker-gone") == [2, 3]
    assert committed_steps(local) == [3]


@pytest.mark.filterwarnings("ignore::UserWarning")  # DCP warns when no process group exists
def test_trainer_purge_keeps_a_checkpoint_whose_manifest_is_gone_or_replaced(s3, tmp_path):
    import torch

    from lmforge.trainer.checkpoint import Checkpointer

    _, make_bucket = s3
    client = make_bucket("marker-purge")
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    local = tmp_path / "checkpoints"
    checkpointer = Checkpointer(local, keep=1, async_save=False, purge_requires_upload=True)
    checkpointer.save(1, model, optimizer, {})
    checkpointer.save(2, model, optimizer, {})
    assert committed_steps(local) == [1, 2]  # step 1 not uploaded: kept
    uploader = in_process_uploader(local, "s3://marker-purge/runs/r1")
    assert uploader.run_once() == [1, 2]
    client.delete_object(Bucket="marker-purge", Key=manifest_key(1))
    rewrite_manifest(client, "marker-purge", 2)

    checkpointer.save(3, model, optimizer, {})
    assert committed_steps(local) == [1, 2, 3]  # their markers no longer match the store: kept
    assert uploader.run_once() == [1, 3]  # step 1 again: its manifest is gone
    uploader.close()
    checkpointer.save(4, model, optimizer, {})
    checkpointer.close()
    assert committed_steps(local) == [4]
