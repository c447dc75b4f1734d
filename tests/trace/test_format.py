"""index.json: what format.py writes it reads back, and what it cannot serve it refuses in one line."""

import json

import pytest

from lmforge.common.errors import InputError
from lmforge.trace.format import (
    ENGINE,
    ENGINE_VERSION,
    INDEX_VERSION,
    PARTITION_FILES,
    index_json,
    index_token_dtype,
    installed_engine_version,
    partition_dir,
    read_index_json,
)


def _entry(p: int, tokens: int, documents: int) -> dict:
    return {"name": partition_dir(p), "tokens": tokens, "documents": documents,
            "files": {f: {"bytes": 10 * (i + 1), "sha256": f"{i:064x}"} for i, f in enumerate(PARTITION_FILES)}}


def _manifest(**changes) -> str:
    info = index_json([_entry(1, 70, 3), _entry(0, 50, 2)], vocab_size=320, eos_token_id=0,
                      tokenizer_sha256="ab" * 32, data_manifest_sha256="cd" * 32)
    info.update(changes)
    return json.dumps(info)


def test_round_trip_sums_and_orders_partitions():
    info = read_index_json(_manifest())
    assert info["engine"] == ENGINE and info["engine_version"] == ENGINE_VERSION == installed_engine_version()
    assert info["index_version"] == INDEX_VERSION and info["token_dtype"] == "u16"
    assert [e["name"] for e in info["partitions"]] == ["partition-000000", "partition-000001"]
    assert (info["tokens"], info["documents"], info["bytes"]) == (120, 5, 2 * sum(10 * (i + 1) for i in range(6)))
    assert info["tokenizer_sha256"] == "ab" * 32 and info["data_manifest_sha256"] == "cd" * 32
    assert read_index_json(json.dumps(info)) == info


def test_token_width_and_names():
    assert index_token_dtype(65534) == "u16"  # ids 0..65533, 0xFFFF stays free for the separator
    assert index_token_dtype(65535) == "u32"
    assert partition_dir(3) == "partition-000003"


@pytest.mark.parametrize("text, message", [
    (_manifest(engine_version="2.5.9"), "built by infini-gram 2.5.9"),
    (_manifest(engine="suffix-arrays"), "built by suffix-arrays"),
    (_manifest(index_version=5), "(index v5)"),
    (_manifest(format_version=2), "format_version 2"),
    (_manifest(token_dtype="u32"), "token_dtype u32 does not fit vocab_size 320"),
    (_manifest(vocab_size=70000), "token_dtype u16 does not fit vocab_size 70000"),
    (json.dumps({k: v for k, v in json.loads(_manifest()).items() if k not in ("tokens", "eos_token_id")}),
     "missing eos_token_id, tokens"),
    (_manifest(partitions=[{"name": "partition-000000", "files": {"table.0": {}}}]), "does not list exactly"),
    ("{not json", "is not JSON"),
    ("[1, 2]", "not a JSON object"),
])
def test_refusals_are_one_line(text, message):
    with pytest.raises(InputError) as raised:
        read_index_json(text, source="idx/index.json")
    assert message in str(raised.value) and str(raised.value).startswith("idx/index.json")
    assert "\n" not in str(raised.value)
