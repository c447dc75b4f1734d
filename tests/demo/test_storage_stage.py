"""The demo's local object store goes through lmforge's storage layer (S3Bucket, the Store) with
the demo's own credentials, whatever the AWS settings of the process that runs the demo."""

from __future__ import annotations

from lmforge.demo.processes import Supervisor, free_port
from lmforge.demo.stages.storage import demo_store, s3_env, start_s3
from lmforge.demo.stages.train import uploaded_steps


def test_the_demo_store_is_made_and_listed_through_the_storage_layer(tmp_path, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    supervisor = Supervisor(tmp_path / "work")
    try:
        endpoint = start_s3(supervisor, free_port(), "lmf-demo")
        storage = s3_env(endpoint)
        store = demo_store("s3://lmf-demo/runs/demo", storage)
        store.check()
        for rel in ("checkpoints/step-00000003/MANIFEST.json", "checkpoints/step-00000003/x.distcp",
                    "checkpoints/step-00000005/x.distcp", "checkpoints/step-00000007/MANIFEST.json"):
            store.put_bytes(rel, b"{}")
        store.close()
        assert uploaded_steps("s3://lmf-demo/runs/demo", storage) == [3, 7]  # step 5 has no manifest yet
    finally:
        supervisor.stop_all()
