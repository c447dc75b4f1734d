"""The synthetic data-prep output the trainer's tests and benchmarks stream: its manifest and split
indexes list each shard's sha256, and each shard's block sidecar the sha256 of its blocks, as data
prep's do, so a streaming reader verifies it."""

from __future__ import annotations

import hashlib
import json

from lmforge.common.shard_index import read_split_index
from lmforge.common.shards import BLOCK_BYTES
from lmforge.sample_data.token_shards import synthetic_output


def test_index_lists_each_shards_hash_and_its_sidecar_the_block_hashes(tmp_path):
    root = synthetic_output(tmp_path / "out", train_tokens=3 * BLOCK_BYTES // 2)  # two train shards of ~6 MiB
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["version"] == 2 and set(manifest["splits"]) == {"train", "val"}
    entries = {split: read_split_index(manifest, split, lambda rel: (root / rel).read_bytes(), str(root))
               for split in ("train", "val")}
    assert [len(entries["train"]), len(entries["val"])] == [2, 1]
    for entry in entries["train"] + entries["val"]:
        raw = (root / entry.path).read_bytes()
        assert entry.sha256 == hashlib.sha256(raw).hexdigest() and entry.size == len(raw)
        assert entry.block_bytes == BLOCK_BYTES
        blocks = [raw[i : i + BLOCK_BYTES] for i in range(0, len(raw), BLOCK_BYTES)]
        sidecar = (root / entry.sidecar_path).read_bytes()
        assert sidecar == b"".join(hashlib.sha256(block).digest() for block in blocks)
        assert entry.blocks_sha256 == hashlib.sha256(sidecar).hexdigest()
    assert any(entry.blocks > 1 for entry in entries["train"])  # a shard spans blocks


def test_documents_end_with_the_end_of_text_token_the_manifest_names(tmp_path):
    from lmforge.sample_data.token_shards import EOT_ID

    plain = synthetic_output(tmp_path / "plain", train_tokens=4000)
    packed = synthetic_output(tmp_path / "packed", train_tokens=4000, document_tokens=20)
    for root in (plain, packed):
        assert json.loads((root / "manifest.json").read_text())["tokenizer"]["eot_id"] == EOT_ID
    documents = train_tokens(packed).count(EOT_ID)
    assert 4000 / 20 / 2 < documents < 4000 / 20 * 2  # about one every 20 tokens
    assert EOT_ID not in train_tokens(plain)  # the pattern never uses it


def train_tokens(root) -> list[int]:
    from lmforge.common.shards import open_shard

    manifest = json.loads((root / "manifest.json").read_text())
    entries = read_split_index(manifest, "train", lambda rel: (root / rel).read_bytes(), str(root))
    return [token for entry in entries for token in open_shard(root / entry.path)[1].tolist()]


def test_a_real_tokenizer_makes_the_data_sets_vocabulary(tmp_path):
    """With `tokenizer`, the data set carries that tokenizer (its sha256 in the manifest, its id space as
    the vocabulary): text encoded against the data set, as an evaluation job's tasks are, decodes."""
    import hashlib
    import json

    from tokenizers import Tokenizer

    from lmforge.sample_data.token_shards import synthetic_output
    from tests.serving import train_tokenizer

    path = train_tokenizer(tmp_path / "tokenizer.json", vocab_size=300)
    out = synthetic_output(tmp_path / "data", train_tokens=4000, tokenizer=path)
    manifest = json.loads((out / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert manifest["tokenizer"]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest["tokenizer"]["vocab_size"] == tokenizer.get_vocab_size() <= 300
    assert tokenizer.decode(tokenizer.encode("a week has seven days").ids) == "a week has seven days"
