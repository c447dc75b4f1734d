"""Inputs and outputs on S3 (moto's S3 server over loopback HTTP)."""

from __future__ import annotations

import json

import boto3

from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import run_cli
from tests.shard_listing import bucket_shards


def test_run_reads_and_writes_s3(s3, tmp_path):
    endpoint, make_bucket = s3
    client = make_bucket("lmf-data")
    for seed in (1, 2):
        local = tmp_path / f"in-{seed}.warc.wet.gz"
        write_sample_wet(local, 120, seed)
        client.upload_file(str(local), "lmf-data", f"crawl/in-{seed}.warc.wet.gz")
    code = run_cli("run", "--input", "s3://lmf-data/crawl/*.warc.wet.gz", "--output", "s3://lmf-data/prepared/run1",
                   "--workers", 1, "--set", "tokenizer.vocab_size=600", "--set", "shards.val_fraction=0.05")
    assert code == 0
    keys = {o["Key"] for o in boto3.client("s3", endpoint_url=endpoint).list_objects_v2(
        Bucket="lmf-data", Prefix="prepared/run1/")["Contents"]}
    manifest = json.loads(client.get_object(Bucket="lmf-data", Key="prepared/run1/manifest.json")["Body"].read())
    inputs = json.loads(client.get_object(Bucket="lmf-data", Key="prepared/run1/work/inputs.json")["Body"].read())
    assert inputs == ["s3://lmf-data/crawl/in-1.warc.wet.gz", "s3://lmf-data/crawl/in-2.warc.wet.gz"]
    assert "inputs" not in manifest
    for shard in bucket_shards(client, "lmf-data", "prepared/run1"):
        assert {f"prepared/run1/{shard['path']}", f"prepared/run1/{shard['sidecar_path']}"} <= keys
    assert {"prepared/run1/tokenizer.json", "prepared/run1/report.html", "prepared/run1/report.json"} <= keys
    assert any(k.startswith("prepared/run1/lineage/") for k in keys)
