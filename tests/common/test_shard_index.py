"""The split index and the block sidecar (lmforge.common.shard_index): written and read back the
same, and anything missing, truncated, corrupt or foreign is one line of ShardFormatError."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from lmforge.common.errors import ShardFormatError
from lmforge.common.shard_index import (
    ShardEntry,
    check_sidecar,
    parse_manifest,
    read_split_index,
    split_totals,
    write_split_index,
)
from lmforge.common.shards import write_shard

TOK_SHA = hashlib.sha256(b"tokenizer").hexdigest()
VOCAB = 1000
BLOCK = 4096


def written(tmp_path, shards: dict[str, list[int]]) -> tuple[dict, dict[str, bytes]]:
    """Real shards of the given token counts per split; (manifest, every file of the output by path)."""
    files: dict[str, bytes] = {}
    splits = {}
    for split, sizes in shards.items():
        entries = []
        for k, size in enumerate(sizes):
            path = tmp_path / f"{split}_{k}.bin"
            digest = write_shard(path, np.arange(size) % VOCAB, np.array([size]), eot_id=0, vocab_size=VOCAB,
                                 tokenizer_sha256=TOK_SHA, block_bytes=BLOCK)
            rel = f"shards/{split}_{k}.bin"
            files[rel], files[rel.removesuffix(".bin") + ".blocks"] = path.read_bytes(), digest.sidecar()
            entries.append(ShardEntry(rel, size, 1, path.stat().st_size, **digest.index_fields()))
        splits[split] = write_split_index(files.__setitem__, split, entries)
    manifest = {"format": "lmforge-shards", "version": 2, "tokenizer": {"sha256": TOK_SHA, "vocab_size": VOCAB},
                "splits": splits}
    files["manifest.json"] = json.dumps(manifest).encode()
    return parse_manifest(files["manifest.json"], "out/manifest.json"), files


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_an_index_reads_back_what_was_written(tmp_path):
    manifest, files = written(tmp_path, {"train": [5000, 300, 2048], "val": [700]})
    train = read_split_index(manifest, "train", files.get, "out")
    assert [(e.path, e.tokens, e.documents) for e in train] == [
        ("shards/train_0.bin", 5000, 1), ("shards/train_1.bin", 300, 1), ("shards/train_2.bin", 2048, 1)]
    for entry in train:
        raw = files[entry.path]
        assert entry.size == len(raw) and entry.sha256 == hashlib.sha256(raw).hexdigest()
        digests = check_sidecar(files[entry.sidecar_path], entry, "out")
        assert digests == b"".join(hashlib.sha256(raw[i : i + BLOCK]).digest() for i in range(0, len(raw), BLOCK))
    assert train[0].blocks == 3  # 1024 + 5000 × 2 bytes in 4 KiB blocks
    assert split_totals(manifest) == {"train": {"shards": 3, "tokens": 7348}, "val": {"shards": 1, "tokens": 700}}
    assert read_split_index(manifest, "test", files.get, "out") == []  # a split the output does not have


def test_a_version_1_manifest_lists_its_shards_itself(tmp_path):
    _, files = written(tmp_path, {"train": [5000]})
    raw = files["shards/train_0.bin"]
    blocks = [hashlib.sha256(raw[i : i + BLOCK]).hexdigest() for i in range(0, len(raw), BLOCK)]
    older = {"format": "lmforge-shards", "version": 1, "tokenizer": {"sha256": TOK_SHA, "vocab_size": VOCAB},
             "shards": [{"path": "shards/train_0.bin", "split": "train", "tokens": 5000, "documents": 1,
                         "sha256": hashlib.sha256(raw).hexdigest(), "block_bytes": BLOCK, "block_sha256": blocks},
                        {"path": "shards/val_0.bin", "split": "val", "tokens": 10, "sha256": "ab" * 32}]}
    manifest = parse_manifest(json.dumps(older).encode(), "old/manifest.json")
    [entry] = read_split_index(manifest, "train", lambda rel: pytest.fail(f"read {rel}"), "old")
    assert entry.inline_block_sha256 == tuple(blocks) and entry.blocks_sha256 is None and entry.size == len(raw)
    [val] = read_split_index(manifest, "val", files.get, "old")  # no block hashes: the whole shard is one block
    assert val.block_bytes == val.size == 1024 + 20 and val.inline_block_sha256 == ("ab" * 32,)
    assert split_totals(manifest) == {"train": {"shards": 1, "tokens": 5000}, "val": {"shards": 1, "tokens": 10}}
    older["shards"][0]["block_sha256"] = blocks[:2]
    with pytest.raises(ShardFormatError, match="lists 2 block hashes of 4096 bytes for a 11024-byte shard"):
        read_split_index(parse_manifest(json.dumps(older).encode(), "old"), "train", files.get, "old")


def flipped(raw: bytes, offset: int) -> bytes:
    changed = bytearray(raw)
    changed[offset] ^= 0xFF
    return bytes(changed)


@pytest.mark.parametrize(("change", "message"), [
    (lambda raw: None, "out/index/train.index: listed in manifest.json but missing"),
    (lambda raw: raw[:-7], "out/index/train.index: 377 bytes whose sha256 is not the one manifest.json records"),
    (lambda raw: flipped(raw, 100), "out/index/train.index: 384 bytes whose sha256 is not the one manifest.json "),
    (lambda raw: b"", "0 bytes whose sha256 is not the one manifest.json records for its 384"),
])
def test_a_missing_truncated_or_corrupt_index_is_one_line(tmp_path, change, message):
    manifest, files = written(tmp_path, {"train": [5000, 300]})
    files["index/train.index"] = change(files["index/train.index"])
    with pytest.raises(ShardFormatError) as excinfo:
        read_split_index(manifest, "train", files.get, "out")
    assert message in one_line(excinfo)


def test_an_index_that_is_not_the_one_named_is_refused(tmp_path):
    """An index whose manifest was rewritten to match it (or a hand-made one) is still checked."""
    manifest, files = written(tmp_path, {"train": [5000], "val": [300]})
    for raw, split, message in [
        (files["index/val.index"], "train", "the index of split b'val', not 'train'"),
        (b"GPT2" + files["index/train.index"][4:], "train", "not an lmforge split index"),
        (files["index/train.index"][:-1], "train", "its header's 1 records make 224; the file is truncated"),
    ]:
        info = manifest["splits"][split]
        info.update(index_bytes=len(raw), index_sha256=hashlib.sha256(raw).hexdigest())
        with pytest.raises(ShardFormatError) as excinfo:
            read_split_index(manifest, split, {info["index"]: raw}.get, "out")
        assert message in one_line(excinfo)


@pytest.mark.parametrize(("change", "message"), [
    (lambda raw: None, "out/shards/train_0.blocks: listed in the split index but missing"),
    (lambda raw: raw[:-1], "out/shards/train_0.blocks: 95 bytes that are not the 3 block digests"),
    (lambda raw: flipped(raw, 40), "out/shards/train_0.blocks: 96 bytes that are not the 3 block digests"),
])
def test_a_missing_truncated_or_corrupt_sidecar_is_one_line(tmp_path, change, message):
    manifest, files = written(tmp_path, {"train": [5000]})
    [entry] = read_split_index(manifest, "train", files.get, "out")
    with pytest.raises(ShardFormatError) as excinfo:
        check_sidecar(change(files[entry.sidecar_path]), entry, "out")
    assert message in one_line(excinfo)


TOKENIZER = '"tokenizer": {"sha256": "x", "vocab_size": 10}'


@pytest.mark.parametrize(("manifest", "message"), [
    ("{not json", "not a data-prep manifest"),
    (f'{{"version": 2, {TOKENIZER}}}', "not a data-prep manifest (KeyError('splits'))"),
    (f"{{{TOKENIZER}}}", "not a data-prep manifest (KeyError('shards'))"),
    (f'{{"version": 2, "splits": {{"train": {{"index": 7}}}}, {TOKENIZER}}}', "not a data-prep manifest"),
    (f'{{"version": 3, {TOKENIZER}}}', "manifest version 3; this lmforge reads versions 1 and 2"),
])
def test_a_manifest_that_cannot_be_read_is_one_line(manifest, message):
    with pytest.raises(ShardFormatError) as excinfo:
        parse_manifest(manifest.encode(), "out/manifest.json")
    assert one_line(excinfo).startswith("out/manifest.json: ") and message in str(excinfo.value)
