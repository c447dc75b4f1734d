import hashlib

import numpy as np
import pytest

from lmforge.common.errors import ShardFormatError
from lmforge.common.shards import HEADER_BYTES, open_shard, read_doc_ends, token_dtype, write_shard

TOK_SHA = hashlib.sha256(b"tokenizer").hexdigest()


@pytest.mark.parametrize("vocab, dtype", [(50_000, np.uint16), (65_536, np.uint16), (65_537, np.uint32)])
def test_roundtrip_and_dtype(tmp_path, vocab, dtype):
    tokens = np.array([1, 2, 0, vocab - 1, 0], dtype=np.int64)
    path = tmp_path / "train_00000.bin"
    digest = write_shard(path, tokens, np.array([3, 5]), eot_id=0, vocab_size=vocab, tokenizer_sha256=TOK_SHA)
    assert digest.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    header, data = open_shard(path)
    assert token_dtype(vocab) == np.dtype(dtype).newbyteorder("<")
    assert header.itemsize == np.dtype(dtype).itemsize
    assert header.token_count == 5 and header.doc_count == 2 and header.eot_id == 0
    assert header.tokenizer_sha256 == TOK_SHA and header.vocab_size == vocab
    assert data.tolist() == tokens.tolist()
    assert read_doc_ends(path).tolist() == [3, 5]
    assert path.stat().st_size == HEADER_BYTES + 5 * header.itemsize


def test_truncated_and_foreign_files_are_rejected(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(path, np.arange(100), np.array([100]), eot_id=0, vocab_size=1000, tokenizer_sha256=TOK_SHA)
    raw = path.read_bytes()
    (tmp_path / "cut.bin").write_bytes(raw[:-3])
    with pytest.raises(ShardFormatError, match="truncated"):
        open_shard(tmp_path / "cut.bin")
    (tmp_path / "foreign.bin").write_bytes(b"GPT2" + raw[4:])
    with pytest.raises(ShardFormatError, match="not an lmforge shard"):
        open_shard(tmp_path / "foreign.bin")
    (tmp_path / "tiny.bin").write_bytes(b"LMF")
    with pytest.raises(ShardFormatError, match="too short"):
        open_shard(tmp_path / "tiny.bin")


def test_failed_write_leaves_previous_file(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(path, np.arange(10), np.array([10]), eot_id=0, vocab_size=100, tokenizer_sha256=TOK_SHA)
    before = path.read_bytes()
    with pytest.raises(ValueError):
        write_shard(path, np.arange(10), np.array([7]), eot_id=0, vocab_size=100, tokenizer_sha256=TOK_SHA)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []


def test_block_digests_cover_the_file_in_order(tmp_path):
    path = tmp_path / "s.bin"
    tokens = np.arange(5000) % 1000
    digest = write_shard(path, tokens, np.array([5000]), eot_id=0, vocab_size=1000, tokenizer_sha256=TOK_SHA,
                         block_bytes=4096)
    raw = path.read_bytes()
    expected = [hashlib.sha256(raw[i : i + 4096]).hexdigest() for i in range(0, len(raw), 4096)]
    assert list(digest.block_sha256) == expected and len(expected) == 3  # 11024 bytes: the last block short
    sidecar = (tmp_path / "s.blocks").read_bytes()  # the block sidecar: the same digests, 32 bytes each
    assert sidecar == b"".join(bytes.fromhex(h) for h in expected) == digest.sidecar()
    assert digest.index_fields() == {"sha256": hashlib.sha256(raw).hexdigest(), "block_bytes": 4096,
                                     "blocks_sha256": hashlib.sha256(sidecar).hexdigest()}
