"""Checkpoint directories as the trainer lays them out, and ways to run the uploader."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from lmforge.common.checkpoint_layout import COMMIT_MARKER, step_dir

MIB = 1 << 20


def fake_checkpoint(root: Path, step: int, sizes=(12 * MIB, 3 * MIB, 1000), *, commit=True, meta=None,
                    seed=None) -> Path:
    """Files of random bytes in a step directory, meta.json, and (commit=True) the marker."""
    path = step_dir(root, step)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(step if seed is None else seed)
    for rank, size in enumerate(sizes):
        (path / f"__{rank}_0.distcp").write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    (path / ".metadata").write_bytes(b"dcp metadata " + str(step).encode())
    (path / "meta.json").write_text(json.dumps({"step": step, **(meta or {})}))
    if commit:
        (path / COMMIT_MARKER).write_bytes(b"")
    return path


def fake_weights(root: Path, step: int, *, final: bool = False, tokens: int | None = None) -> Path:
    """A real (tiny) model package as the trainer commits one in RUN_DIR/weights: write_package's
    files, meta.json, the commit marker."""
    import torch

    from lmforge.model.config import GPTConfig
    from lmforge.model.package import write_package
    from lmforge.model.transformer import GPT

    torch.manual_seed(step)
    tokenizer = root.parent / "tokenizer.json"
    if not tokenizer.exists():
        root.mkdir(parents=True, exist_ok=True)
        tokenizer.write_text("{}")
    model = GPT(GPTConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, context_length=8))
    path = write_package(model, tokenizer, step_dir(root, step), step=step)
    (path / "meta.json").write_text(json.dumps({"step": step, "tokens": tokens if tokens is not None else step * 100,
                                                "run": root.parent.name, "val_loss": None, "final": final}))
    (path / COMMIT_MARKER).write_bytes(b"")
    return path


def uploader_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "lmforge.uploader", *args]


def run_uploader(*args: str, timeout: float = 120, env_extra=None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(uploader_command(*args), capture_output=True, text=True, timeout=timeout, env=env)


def small_parts(*extra: str) -> list[str]:
    """Config overrides for tests: 5 MiB parts (S3's minimum), quick retries and polling."""
    return ["--set", "transfer.part_size_mb=5", "--set", "transfer.backoff_seconds=0.05",
            "--set", "transfer.backoff_max_seconds=0.5", "--set", "poll_seconds=0.2",
            "--set", "retry_failed_after_seconds=0", *extra]


def files_of(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def in_process_uploader(local: Path, dest: str, endpoint_url: str | None = None, *, start: bool = True,
                        kind: str = "checkpoints", pinned=None, **config):
    """A CheckpointUploader in this process, started unless start=False (tests drive it with run_once())."""
    from lmforge.uploader.cli import open_destination
    from lmforge.uploader.config import UploaderConfig
    from lmforge.uploader.watcher import CheckpointUploader

    config = UploaderConfig.model_validate({"retry_failed_after_seconds": 0, **config})
    uploader = CheckpointUploader(local, open_destination(dest, config.transfer, endpoint_url=endpoint_url), config,
                                  kind=kind, pinned=pinned)
    if start:
        uploader.start()
    return uploader


def objects(client, bucket: str) -> dict[str, dict]:
    return {o["Key"]: o for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])}


def store_state(client, bucket: str) -> list[int]:
    """Asserts that every manifest's files exist with its sizes and sha256 and that no
    multipart upload is open; returns the steps with a manifest."""
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    steps = []
    for key in sorted(k for k in objects(client, bucket) if k.endswith("/MANIFEST.json")):
        manifest = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        base = key[: -len("MANIFEST.json")]
        for entry in manifest["files"]:
            body = client.get_object(Bucket=bucket, Key=base + entry["path"])["Body"].read()
            assert (len(body), hashlib.sha256(body).hexdigest()) == (entry["size"], entry["sha256"]), key
        steps.append(manifest["step"])
    return steps


def wait_for(predicate, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
