"""build_partition writes infini-gram v4 files byte for byte as the engine reads them, and the suffix array it gets
from rust_indexing is the sorted order of every suffix, however many parts it was built in."""

import hashlib
import json

import numpy as np
import pytest

from lmforge.common.errors import InputError
from lmforge.trace.build import _part_ranges, build_partition
from lmforge.trace.engine import TraceIndex
from lmforge.trace.format import PARTITION_FILES
from lmforge.trace.query import trace_tokens
from tests.trace_index import build_test_index, doc_metadata


def _docs(docs):
    return ((np.asarray(d), doc_metadata(i)) for i, d in enumerate(docs))


def _sorted_suffixes(data: bytes, width: int) -> list[int]:
    """The suffix array by definition: every token position, ordered by the bytes from there to the end."""
    return sorted(range(0, len(data), width), key=lambda p: data[p:])


def _pointers(table: bytes, count: int) -> list[int]:
    ratio = len(table) // count
    return [int.from_bytes(table[i * ratio:(i + 1) * ratio], "little") for i in range(count)]


def test_files_are_exactly_the_v4_layout(tmp_path):
    docs = [[1, 2, 3], [], [7, 7]]
    entry = build_partition(_docs(docs), tmp_path / "p", "partition-000000", vocab_size=10, eos_token_id=0)
    out = tmp_path / "p"
    tokenized = (out / "tokenized.0").read_bytes()
    assert tokenized == bytes.fromhex("ffff 0100 0200 0300 ffff ffff 0700 0700")
    assert np.frombuffer((out / "offset.0").read_bytes(), "<u8").tolist() == [0, 8, 10]
    lines = (out / "metadata.0").read_bytes().splitlines(keepends=True)
    assert [json.loads(line) for line in lines] == [doc_metadata(i) for i in range(3)]
    assert list(json.loads(lines[0])) == ["doc_id", "url", "record_id", "shard", "token_offset"]
    assert np.frombuffer((out / "metaoff.0").read_bytes(), "<u8").tolist() == [0, len(lines[0]),
                                                                            len(lines[0]) + len(lines[1])]
    assert np.load(out / "unigram.npy").tolist() == [0, 1, 1, 1, 0, 0, 0, 2, 0, 0]
    assert np.load(out / "unigram.npy").dtype == np.uint64
    assert _pointers((out / "table.0").read_bytes(), 8) == _sorted_suffixes(tokenized, 2)
    assert (out / "table.0").stat().st_size == 8  # 16 bytes of tokens: 1-byte pointers
    assert entry == {"name": "partition-000000", "tokens": 5, "documents": 3, "files": {
        f: {"bytes": (out / f).stat().st_size, "sha256": hashlib.sha256((out / f).read_bytes()).hexdigest()}
        for f in PARTITION_FILES}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p"]  # the scratch dir is gone


def test_many_parts_give_the_same_suffix_array_and_answers(tmp_path):
    rng = np.random.default_rng(3)
    passage = rng.integers(1, 40, 30).tolist()
    docs = [rng.integers(1, 40, rng.integers(20, 120)).tolist() for _ in range(30)]
    for d in (2, 9, 17, 25):
        docs[d][5:5] = passage
    one = build_test_index(tmp_path / "one", docs, vocab_size=40, eos_token_id=0)
    many = build_test_index(tmp_path / "many", docs, vocab_size=40, eos_token_id=0, part_tokens=200)
    build_partition(_docs(docs), tmp_path / "threads", "partition-000000", vocab_size=40, eos_token_id=0,
                    part_tokens=200, threads=2)
    ranges, hack = _part_ranges((one / "partition-000000" / "tokenized.0").stat().st_size, 2, 200)
    assert len(ranges) >= 10 and hack > 2 * len(passage)  # the overlap outlasts every repeat
    table = (one / "partition-000000" / "table.0").read_bytes()
    assert (many / "partition-000000" / "table.0").read_bytes() == table
    assert (tmp_path / "threads" / "table.0").read_bytes() == table
    data = (one / "partition-000000" / "tokenized.0").read_bytes()
    assert _pointers(table, len(data) // 2) == _sorted_suffixes(data, 2)
    tail = docs[4][:50]
    query = rng.integers(1, 40, 20).tolist() + passage + tail
    answers = [trace_tokens(TraceIndex.open(root), query, min_span_tokens=3, span_density=None).to_dict()
               for root in (one, many)]
    assert answers[0] == answers[1]
    assert {(s["start"], s["end"], s["count"]) for s in answers[0]["spans"]} >= {(20, 50, 4), (50, 50 + len(tail), 1)}


def test_a_vocabulary_over_65534_ids_is_indexed_as_u32(tmp_path):
    docs = [[65535, 65534, 70000, 1], [3, 65535, 65534, 70000]]
    root = build_test_index(tmp_path / "idx", docs, vocab_size=70001, eos_token_id=0)
    data = (root / "partition-000000" / "tokenized.0").read_bytes()
    assert data[:8] == bytes.fromhex("ffffffff ffff0000")  # the separator, then id 65535 as a real token
    assert _pointers((root / "partition-000000" / "table.0").read_bytes(), len(data) // 4) == \
        _sorted_suffixes(data, 4)
    alphabet = np.array([1, 2, 255, 256, 65534, 65535, 65536, 70000])
    random_docs = [np.random.default_rng(i).choice(alphabet, 25).tolist() for i in range(12)]
    parts = build_test_index(tmp_path / "parts", random_docs, vocab_size=70001, eos_token_id=0, part_tokens=40)
    many = (parts / "partition-000000" / "tokenized.0").read_bytes()
    assert _pointers((parts / "partition-000000" / "table.0").read_bytes(), len(many) // 4) == \
        _sorted_suffixes(many, 4)
    index = TraceIndex.open(root)
    assert index.info["token_dtype"] == "u32"
    result = trace_tokens(index, [65535, 65534, 70000, 5], min_span_tokens=2, span_density=None)
    assert [(s.start, s.end, s.count, sorted(d.doc_id for d in s.documents)) for s in result.spans] == \
        [(0, 3, 2, ["doc-0", "doc-1"])]


def test_an_empty_partition_is_indexed_and_skipped(tmp_path):
    root = build_test_index(tmp_path / "idx", [[1, 2, 3, 4]], vocab_size=10, eos_token_id=0, partitions=3)
    entries = [json.loads((root / f"partition-00000{p}" / "entry.json").read_text()) for p in range(3)]
    assert [e["documents"] for e in entries] == [0, 1, 0]
    assert {f["bytes"] for name, f in entries[0]["files"].items() if name != "unigram.npy"} == {0}
    index = TraceIndex.open(root)
    assert index.partitions == 3 and len(index.partition_dirs) == 1
    assert [(s.start, s.end) for s in trace_tokens(index, [1, 2, 3], min_span_tokens=2).spans] == [(0, 3)]
    nothing = TraceIndex.open(build_test_index(tmp_path / "none", [], vocab_size=10, eos_token_id=0))
    assert nothing.engine is None and trace_tokens(nothing, [1, 2, 3], min_span_tokens=1).spans == []


def test_paths_the_engine_would_misread_are_opened_through_links(tmp_path):
    root = build_test_index(tmp_path / "metadata-offset-table" / "idx", [[1, 2, 3, 4]], vocab_size=10,
                            eos_token_id=0)
    result = trace_tokens(TraceIndex.open(root), [1, 2, 3], min_span_tokens=2)
    assert [(s.start, s.end, s.count) for s in result.spans] == [(0, 3, 1)]


@pytest.mark.parametrize("docs, metadata, message", [
    ([[1, 10]], None, "document 'doc-0': token id 10 is outside the vocabulary (vocab_size 10)"),
    ([[1, -1]], None, "token id -1 is outside"),
    ([[1.5]], None, "must be a 1-d integer array"),
    ([[1]], {"doc_id": "x"}, "has no url, record_id, shard, token_offset in its metadata"),
])
def test_bad_documents_are_refused(tmp_path, docs, metadata, message):
    items = ((np.asarray(d), metadata or doc_metadata(i)) for i, d in enumerate(docs))
    with pytest.raises(InputError, match="^[^\n]+$") as raised:
        build_partition(items, tmp_path / "p", "partition-000000", vocab_size=10, eos_token_id=0)
    assert message in str(raised.value)


def test_a_damaged_partition_is_refused_before_the_engine_maps_it(tmp_path):
    root = build_test_index(tmp_path / "idx", [[1, 2, 3, 4]], vocab_size=10, eos_token_id=0)
    table = root / "partition-000000" / "table.0"
    table.write_bytes(table.read_bytes()[:-1])
    with pytest.raises(InputError, match="table.0 has 4 bytes; index.json says 5"):
        TraceIndex.open(root)
