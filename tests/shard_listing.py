"""Every shard a data-prep output lists, read through its split indexes as the trainer reads them
(lmforge.common.shard_index.read_split_index), for tests that check an output's shards on disk or
in a bucket."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

from lmforge.common.shard_index import parse_manifest, read_split_index, split_totals


def listed_shards(manifest: dict, read: Callable[[str], bytes | None], where: str = "") -> list[dict]:
    """Each split's shards in the manifest's split order, as dicts with their `split` and `sidecar_path`."""
    return [{"split": split, **dataclasses.asdict(entry), "sidecar_path": entry.sidecar_path}
            for split in split_totals(manifest) for entry in read_split_index(manifest, split, read, where)]


def local_shards(root: Path) -> list[dict]:
    """listed_shards of a data-prep output directory."""
    manifest = parse_manifest((root / "manifest.json").read_bytes(), str(root / "manifest.json"))
    return listed_shards(manifest, lambda rel: (root / rel).read_bytes() if (root / rel).exists() else None,
                         str(root))


def bucket_shards(client, bucket: str, prefix: str) -> list[dict]:
    """listed_shards of a data-prep output at s3://bucket/prefix, read with a boto3 client."""
    def read(rel: str) -> bytes:
        return client.get_object(Bucket=bucket, Key=f"{prefix}/{rel}")["Body"].read()

    return listed_shards(json.loads(read("manifest.json")), read, f"s3://{bucket}/{prefix}")
