"""The perplexity step: an n-gram model trained here (train-ngram → ARPA → KenLM) scores
in-domain text under shuffled text, the band keeps and drops with reasons, the histogram is in
the step's stats, the docs Parquet keeps the score; the lmforge backend scores as the model does."""

from __future__ import annotations

import json
import math
import random
import sys

import kenlm
import pyarrow.parquet as pq
import pytest

from lmforge.common.errors import ConfigError
from lmforge.dataprep import perplexity_scorers
from lmforge.dataprep.ccnet_text import normalize_line
from lmforge.dataprep.document import Document
from lmforge.dataprep.ngram_lm import BOS, EOS, UNK, discounts, estimate
from lmforge.dataprep.steps.perplexity import PERPLEXITY_EDGES, PerplexityFilter, PerplexitySettings, bucket_of
from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import run_cli
from tests.dataprep.wet_records import wet_record

SUBJECTS = ["the cat", "a young dog", "my neighbour", "the old farmer", "our teacher", "the baker", "a small child"]
VERBS = ["likes", "watches", "feeds", "paints", "visits", "finds", "carries"]
OBJECTS = ["the garden", "a red apple", "the quiet river", "fresh bread", "the blue boat", "an old map"]
TAILS = ["in the morning.", "every day.", "after lunch.", "near the house.", "with great care."]


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(part) for part in (SUBJECTS, VERBS, OBJECTS, TAILS)).capitalize()


def prose(rng: random.Random, lines: int = 6) -> str:
    return "\n".join(sentence(rng) for _ in range(lines))


def shuffled(text: str, rng: random.Random) -> str:
    words = text.split()
    rng.shuffle(words)
    return " ".join(words)


@pytest.fixture(scope="module")
def arpa(tmp_path_factory) -> str:
    """A trigram model trained with the CLI on generated in-domain JSONL."""
    tmp = tmp_path_factory.mktemp("ngram")
    rng = random.Random(0)
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": prose(rng)}) + "\n" for _ in range(300)))
    out = tmp / "model.arpa"
    assert run_cli("train-ngram", "--input", corpus, "--output", out, "--order", 3) == 0
    return str(out)


def step(model_path: str, name: str = "perplexity", **settings) -> PerplexityFilter:
    return PerplexityFilter(PerplexitySettings(model_path=model_path, **settings), name)


def test_kenlm_loads_the_estimate_and_agrees_with_the_direct_computation():
    rng = random.Random(1)
    sentences = [normalize_line(sentence(rng)).split() for _ in range(60)] + [[], ["the", "cat"]]
    model = estimate(sentences, order=3)
    vocab = sorted({w for s in sentences for w in s}) + [EOS, UNK]
    for history in [(), (BOS,), (BOS, "the"), ("the", "cat"), ("zzz", "the"), ("likes",)]:
        assert sum(10 ** model.logprob(w, history) for w in vocab) == pytest.approx(1.0, abs=1e-9)

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        lm = kenlm.Model(str(model.write_arpa(Path(tmp) / "m.arpa")))
    state, out = kenlm.State(), kenlm.State()
    lm.BeginSentenceWrite(state)
    assert sum(10 ** lm.BaseScore(state, w, out) for w in vocab) == pytest.approx(1.0, abs=1e-5)
    for text in ["the cat likes the garden every day.", "garden zzz the every cat qqq likes", ""]:
        words, history, log10 = text.split(), (BOS,), 0.0
        for word in [*words, EOS]:
            word = word if word in vocab else UNK
            log10 += model.logprob(word, history)
            history += (word,)
        assert lm.perplexity(text) == pytest.approx(10 ** (-log10 / (len(words) + 1)), rel=1e-3)


def test_discounts_follow_chen_and_goodman():
    counts = [1] * 40 + [2] * 20 + [3] * 10 + [4] * 5
    y = 40 / (40 + 2 * 20)
    assert discounts(counts) == pytest.approx((1 - 2 * y * 20 / 40, 2 - 3 * y * 10 / 20, 3 - 4 * y * 5 / 10))
    assert discounts([1, 1, 2]) == (0.5, 1.0, 1.5)  # too few counts: the fallback


def test_ccnet_normalization():
    expected = 'gruße aus munchen: 0000 "cafe"  -  ca va?'
    assert normalize_line("  Grüße aus MÜNCHEN: 2024 «Café» — Ça va？\x07 ") == expected


def test_in_domain_text_scores_lower_than_shuffled_or_garbage(arpa):
    rng = random.Random(7)
    scorer = step(arpa).scorer
    texts = [prose(rng) for _ in range(10)]
    in_domain = scorer.perplexities(texts)
    shuffled_ppl = scorer.perplexities([shuffled(t, rng) for t in texts])
    garbage = scorer.perplexity("xq7 zzkv plorb 9931 wug fnord blatt qqq")
    assert max(in_domain) < min(shuffled_ppl)
    assert max(shuffled_ppl) < garbage
    assert max(in_domain) < 15 and min(shuffled_ppl) > 30


def _docs(rng: random.Random) -> list[Document]:
    texts = [prose(rng) for _ in range(6)] + [shuffled(prose(rng), rng) for _ in range(6)]
    return [Document(text=t, doc_id=i, url=f"https://x.example/{i}") for i, t in enumerate(texts)]


def test_band_keeps_and_drops_with_reasons_and_histogram(arpa):
    docs = _docs(random.Random(3))
    ppl = step(arpa).scorer.perplexities([d.text for d in docs])
    low, high = sorted(ppl)[1], sorted(ppl)[-2]
    band = step(arpa, min_perplexity=low, max_perplexity=high)
    kept = list(band.run(docs))
    assert band.stats.dropped == {"perplexity_too_low": 1, "perplexity_too_high": 1}
    assert [d.doc_id for d in kept] == [d.doc_id for d, p in zip(docs, ppl) if low <= p <= high]
    assert [d.metadata["scores"]["perplexity"] for d in docs] == pytest.approx(ppl)
    histogram = band.stats.histograms["perplexity"]
    assert histogram["edges"] == list(PERPLEXITY_EDGES) and sum(histogram["counts"]) == len(docs)

    cutoffs = (sorted(ppl)[4], sorted(ppl)[8])
    buckets = step(arpa, name="ppl_ccnet", bucket_cutoffs=cutoffs, keep_buckets=["head", "middle"], batch_size=5)
    kept = list(buckets.run(docs))
    expected = [bucket_of(p, cutoffs) for p in ppl]
    assert [d.metadata["ppl_ccnet_bucket"] for d in docs] == expected
    assert buckets.stats.dropped == {"bucket_tail": expected.count("tail")} and expected.count("tail") == 4
    assert len(kept) == 8 and "ppl_ccnet" in docs[0].metadata["scores"]


def test_train_ngram_reads_text_and_parquet_alike_and_names_a_missing_input(tmp_path, capsys):
    import pyarrow as pa

    rng = random.Random(2)
    texts = [prose(rng) for _ in range(20)]
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("\n".join(texts[:10]))
    (tmp_path / "corpus" / "notes.md").write_text("not an input")
    pq.write_table(pa.table({"text": texts[10:]}), tmp_path / "docs.parquet")
    pq.write_table(pa.table({"text": texts[:10]}), tmp_path / "first.parquet")
    (tmp_path / "b.txt").write_text("\n".join(texts[10:]))
    assert run_cli("train-ngram", "--input", tmp_path / "corpus", tmp_path / "docs.parquet",
                   "--output", tmp_path / "one.arpa") == 0
    assert run_cli("train-ngram", "--input", tmp_path / "first.parquet", tmp_path / "b.txt",
                   "--output", tmp_path / "two.arpa") == 0
    assert (tmp_path / "one.arpa").read_text() == (tmp_path / "two.arpa").read_text()
    capsys.readouterr()
    assert run_cli("train-ngram", "--input", tmp_path / "nope.jsonl", "--output", tmp_path / "x.arpa") == 3
    assert capsys.readouterr().err.endswith(f"error: not found: {tmp_path / 'nope.jsonl'}\n")


def test_config_errors(arpa, tmp_path):
    with pytest.raises(ConfigError, match=r"^steps\.perplexity\.model_path: KenLM model not found: "):
        step(str(tmp_path / "missing.arpa"))
    with pytest.raises(ConfigError, match=r"^steps\.perplexity\.model_path: required"):
        PerplexityFilter(PerplexitySettings())
    with pytest.raises(ValueError, match="keep_buckets needs bucket_cutoffs"):
        PerplexitySettings(model_path=arpa, keep_buckets=["head"])


def test_missing_library_is_a_one_line_config_error(arpa, monkeypatch):
    monkeypatch.setattr(perplexity_scorers, "_loaded", {})  # no model loaded before
    monkeypatch.setitem(sys.modules, "kenlm", None)
    with pytest.raises(ConfigError, match=r"package 'kenlm' \(pip install 'lmforge-dataprep\[kenlm\]'\)"):
        step(arpa)
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ConfigError, match=r"pip install 'lmforge-dataprep\[model\]'"):
        step(arpa, backend="lmforge")


def test_missing_library_stops_the_config_load(arpa, monkeypatch):
    """An image without the backend's package refuses the config before anything is written."""
    from lmforge.dataprep.config import load_dataprep_config
    from lmforge.dataprep.steps import perplexity

    real = perplexity.importlib.util.find_spec
    monkeypatch.setattr(perplexity.importlib.util, "find_spec", lambda name: None if name == "kenlm" else real(name))
    with pytest.raises(ConfigError, match=r"steps\.perplexity: the kenlm backend needs the Python package 'kenlm'"):
        load_dataprep_config(None, ["pipeline=[perplexity]", f"steps.perplexity.model_path={arpa}"])


SMALL = ["--set", "tokenizer.vocab_size=600", "--set", "shards.val_fraction=0", "--workers", "1"]


def test_cli_run_with_a_missing_model_exits_2_naming_the_step(tmp_path, capsys):
    wet = tmp_path / "in.warc.wet"
    write_sample_wet(wet, 20, 1)
    missing = tmp_path / "nope.arpa"
    code = run_cli("run", "--input", wet, "--output", tmp_path / "out", *SMALL,
                   "--set", "pipeline=[url_dedup,perplexity]", "--set", f"steps.perplexity.model_path={missing}")
    err = capsys.readouterr().err
    assert code == 2
    assert err == ("lmforge-dataprep run: error: invalid configuration "
                   f"(argument steps.perplexity.model_path={missing}):\n"
                   f"  steps.perplexity.model_path: not found: {missing}\n")
    assert not (tmp_path / "out").exists()  # refused when the config loads: nothing written


def test_cli_run_end_to_end_keeps_scores_in_the_docs_parquet(arpa, tmp_path):
    rng = random.Random(11)
    texts = [prose(rng, 12) for _ in range(8)]
    texts += [shuffled(t, rng) for t in texts[:4]]
    wet = tmp_path / "in.warc.wet"
    wet.write_bytes(b"".join(wet_record(f"https://p.example/{i}", t.encode()) for i, t in enumerate(texts)))
    out = tmp_path / "out"
    assert run_cli("run", "--input", wet, "--output", out, *SMALL,
                   "--set", "pipeline=[url_dedup,exact_dedup,perplexity]",
                   "--set", f"steps.perplexity.model_path={arpa}",
                   "--set", "steps.perplexity.max_perplexity=30") == 0
    rows = pq.read_table(out / "work" / "docs" / "000000.parquet", columns=["url", "scores"]).to_pylist()
    assert sorted(row["url"] for row in rows) == [f"https://p.example/{i}" for i in range(8)]
    assert all(0 < dict(row["scores"])["perplexity"] <= 30 for row in rows)
    rejects = pq.read_table(out / "rejects" / "filter-000000.parquet").to_pylist()
    assert sorted((r["stage"], r["reason"], r["url"]) for r in rejects) == sorted(
        ("perplexity", "perplexity_too_high", f"https://p.example/{i}") for i in range(8, 12))
    stats = json.loads((out / "work" / "stats" / "input-000000.json").read_text())
    (perplexity,) = [s for s in stats["steps"] if s["name"] == "perplexity"]
    assert sum(perplexity["histograms"]["perplexity"]["counts"]) == perplexity["docs_in"] == 12


# -- the lmforge backend ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """An untrained (seeded) tiny GPT and a small BPE tokenizer as an exported package: perplexity
    is checked against the model itself, so it need not have learned anything."""
    import torch

    from lmforge.model.config import GPTConfig
    from lmforge.model.package import write_package
    from lmforge.model.transformer import GPT
    from tests.serving import CONFIG, train_tokenizer

    tmp = tmp_path_factory.mktemp("package")
    tokenizer = train_tokenizer(tmp / "tokenizer.json")
    from tokenizers import Tokenizer

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", vocab_size=Tokenizer.from_file(str(tokenizer)).get_vocab_size(), **CONFIG))
    return write_package(model.eval(), tokenizer, tmp / "pkg", step=0)


def _direct_perplexity(package, text: str, max_tokens: int) -> float:
    import torch
    from tokenizers import Tokenizer

    from lmforge.model.package import load_package

    model, _ = load_package(package)
    tokenizer = Tokenizer.from_file(str(package / "tokenizer.json"))
    eot = tokenizer.token_to_id("<|endoftext|>")
    ids = torch.tensor([[eot, *tokenizer.encode(text, add_special_tokens=False).ids, eot][: max_tokens + 1]])
    with torch.no_grad():
        logits, _ = model(ids)
    logprobs = torch.log_softmax(logits[0, :-1].double(), dim=-1).gather(1, ids[0, 1:, None])
    return math.exp(-logprobs.mean().item())


def test_lmforge_backend_is_the_models_own_perplexity_batched_or_not(package):
    rng = random.Random(5)
    texts = [sentence(rng), prose(rng, 3), "Bees make honey.", prose(rng, 8), "x"]
    one_by_one = step(str(package), backend="lmforge", batch_size=1, max_tokens=40, device="cpu")
    batched = step(str(package), name="ppl_lm", backend="lmforge", batch_size=3, max_tokens=40, device="cpu")
    docs = [Document(text=t, doc_id=i, url="") for i, t in enumerate(texts)]
    assert len(list(batched.run(docs))) == len(docs)
    single = one_by_one.scorer.perplexities(texts)
    for doc, alone in zip(docs, single):
        assert doc.metadata["scores"]["ppl_lm"] == pytest.approx(alone, rel=1e-5)
        assert alone == pytest.approx(_direct_perplexity(package, doc.text, 40), rel=1e-4)
    assert sum(batched.stats.histograms["ppl_lm"]["counts"]) == len(docs)


def test_lmforge_backend_missing_package_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^steps\.perplexity\.model_path: model package directory not found"):
        step(str(tmp_path / "nothing"), backend="lmforge")
