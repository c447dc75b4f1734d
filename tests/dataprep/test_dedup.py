"""Dedup building blocks: keys, MinHash, candidate verification, components, partitions."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest

from lmforge.common.errors import InputError
from lmforge.common.storage import LocalStore
from lmforge.dataprep.config import MinHashConfig
from lmforge.dataprep.dedup_global import (
    KIND_CONTENT,
    KIND_NEAR,
    KIND_URL,
    PartitionPlan,
    _components,
    _verified_pairs,
    check_minhash_config,
    write_minhash_config,
)
from lmforge.dataprep.document import Document
from lmforge.dataprep.minhash import MinHasher, estimated_jaccard, lsh_params, verify_threshold
from lmforge.dataprep.steps.dedup import ExactDedupFilter, UrlDedupFilter, content_key, normalize_url, url_key

VOCAB = [f"word{i}" for i in range(5000)]


def shingle_jaccard(a: str, b: str, n: int = 5) -> float:
    def grams(text):
        words = text.lower().split()
        return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}

    x, y = grams(a), grams(b)
    return len(x & y) / len(x | y)


@pytest.mark.parametrize("a, b", [
    ("https://www.Example.com/a/", "https://example.com/a"),
    ("http://example.com:80/a#frag", "http://example.com/a"),
    ("https://example.com/a?utm_source=x&b=2&a=1", "https://example.com/a?a=1&b=2"),
])
def test_equivalent_urls_normalize_alike(a, b):
    assert normalize_url(a) == normalize_url(b) and url_key(a) == url_key(b)


def test_different_urls_stay_different():
    assert url_key("https://example.com/a") != url_key("https://example.com/b")
    assert url_key("https://example.com/a?id=1") != url_key("https://example.com/a?id=2")
    assert normalize_url("not a url at all") == "not a url at all"


def test_keys_are_stable_across_processes():
    code = ("from lmforge.dataprep.steps.dedup import url_key, content_key;"
            "print(url_key('https://x.org/p'), content_key('Hello  World'))")
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
               for _ in range(2)}
    assert outputs == {f"{url_key('https://x.org/p')} {content_key('hello world')}\n"}


def test_local_dedup_steps_drop_repeats_and_record_keys():
    docs = [Document(0, "https://a.org/x", "Same text here."), Document(1, "https://a.org/x/", "Other text."),
            Document(2, "https://b.org/", "same   TEXT here."), Document(3, "https://c.org/", "Fresh.")]
    url_step, exact_step = UrlDedupFilter(), ExactDedupFilter()
    kept = list(exact_step.run(url_step.run(docs)))
    assert [d.doc_id for d in kept] == [0, 3]
    assert url_step.stats.dropped == {"duplicate_url": 1} and exact_step.stats.dropped == {"duplicate_content": 1}
    assert kept[0].metadata["content_key"] == content_key("same text here.")


def test_minhash_estimates_jaccard():
    rng = random.Random(0)
    hasher = MinHasher(MinHashConfig())
    for _ in range(20):
        a = " ".join(rng.choice(VOCAB) for _ in range(400))
        words = a.split()
        for _ in range(rng.randint(0, 60)):
            words[rng.randrange(len(words))] = rng.choice(VOCAB)
        b = " ".join(words)
        true = shingle_jaccard(a, b)
        estimate = float(estimated_jaccard(hasher.signature(a), hasher.signature(b)))
        assert abs(estimate - true) < 0.15, (true, estimate)


def test_lsh_params_favour_recall_and_respect_explicit_values():
    bands, rows = lsh_params(MinHashConfig())
    assert bands * rows <= 128
    p = 1 - (1 - 0.85**rows) ** bands
    assert p >= 0.999  # candidates are verified afterwards, so be generous here
    assert lsh_params(MinHashConfig(bands=8, rows=16)) == (8, 16)
    with pytest.raises(ValueError):
        MinHashConfig(bands=20, rows=8)


def test_verify_threshold_allows_for_estimator_noise():
    assert verify_threshold(MinHashConfig()) == pytest.approx(0.8 - 3 * (0.8 * 0.2 / 128) ** 0.5)
    assert verify_threshold(MinHashConfig(verify_sigmas=0)) == 0.8
    assert verify_threshold(MinHashConfig(num_perm=512)) > verify_threshold(MinHashConfig())


def test_verification_links_only_true_near_duplicates():
    hasher = MinHasher(MinHashConfig())
    rng = random.Random(1)
    base = [rng.choice(VOCAB) for _ in range(300)]
    near = list(base)
    near[150] = "changed"
    other = [rng.choice(VOCAB) for _ in range(300)]
    sigs = np.stack([hasher.signature(" ".join(w)) for w in (base, other, near)])
    members = np.array([10, 11, 12], dtype=np.uint64)
    assert _verified_pairs(members, sigs, 0.8, 64) == [(12, 10)]


def test_components_keep_the_lowest_id_and_name_the_strongest_reason():
    edges = np.array([[5, 3, KIND_NEAR], [9, 5, KIND_NEAR], [9, 3, KIND_CONTENT], [20, 7, KIND_URL]], dtype=np.uint64)
    removed, reasons, clusters = _components(edges)
    assert clusters == 2
    assert dict(zip(removed.tolist(), reasons.tolist())) == {5: KIND_NEAR, 9: KIND_CONTENT, 20: KIND_URL}


def test_partition_plan_covers_bands_slices_and_exact_keys():
    plan = PartitionPlan(bands=4, partitions_per_band=3)
    described = [plan.describe(p) for p in range(plan.count)]
    assert plan.count == 14
    assert described[:3] == [(0, KIND_NEAR, 0), (0, KIND_NEAR, 1), (0, KIND_NEAR, 2)]
    assert described[-2:] == [(4, KIND_URL, 0), (5, KIND_CONTENT, 0)]


def test_signatures_from_another_config_are_refused(tmp_path):
    store = LocalStore(tmp_path)
    write_minhash_config(store, MinHashConfig())
    check_minhash_config(store, MinHashConfig())
    with pytest.raises(InputError, match="another MinHash config"):
        check_minhash_config(store, MinHashConfig(num_perm=64))
    assert json.loads((tmp_path / "work" / "minhash_config.json").read_text())["num_perm"] == 128
