"""End to end: `lmforge-dataprep run` with a pipeline that includes url_filter, fineweb_quality,
c4_quality and toxicity_words (`--set pipeline=[...]`), on a small generated input with a
document planted for each step: the planted documents are rejected by the right step for the
right reason, and the report shows each step's stats."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import lineage_rows, run_cli
from tests.dataprep.wet_records import wet_record

SMALL = ["--set", "tokenizer.vocab_size=600", "--set", "shards.val_fraction=0"]
PIPELINE = "[url_dedup,exact_dedup,url_filter,langid,fineweb_quality,c4_quality,toxicity_words,gopher_quality]"

PROSE = "\n".join([
    "The river that runs through the old town was once the main road for traders and travellers.",
    "Boats carried wool, grain and timber downstream to the port, and brought back salt and wine.",
    "When the railway arrived, the river trade declined, and many of the warehouses were left empty.",
    "Today those buildings have been restored, and they hold shops, studios and a small museum.",
    "The museum tells the story of the boatmen and their families, who lived beside the water.",
    "On summer evenings people walk along the towpath and watch the light fade over the meadows.",
])
TOXIC = "\n".join(f"Watch free sex videos and more sex clips with the hottest sex stars, number {i}." for i in range(8))
PLANTED = {
    # url: (text, stage, reason)
    "https://shop.blocked-adult.example/offers": (PROSE, "url_filter", "blocked_domain"),
    "https://gallery.xxx/river": (PROSE.replace("river", "stream"), "url_filter", "adult_tld"),
    "https://lists.example/menu": ("\n".join(f"Extraordinarily{w} incomprehensibilities." for w in
                                             ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")),
                                   "fineweb_quality", "list_ratio"),
    "https://templates.example/draft": (PROSE.replace("small museum.", "small museum. Lorem ipsum dolor sit amet."),
                                        "c4_quality", "lorem_ipsum"),
    "https://videos.example/watch": (TOXIC, "toxicity_words", "toxic_word_rate"),
}
EDITED_URL = "https://news.example/river"
EDITED_TEXT = PROSE.replace("\nToday", "\nPlease enable JavaScript to view the comments on this page.\nToday")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("rules")
    ut1 = base / "blacklists" / "adult"
    ut1.mkdir(parents=True)
    (ut1 / "domains").write_text("blocked-adult.example\n")
    generated = base / "generated.warc.wet"
    write_sample_wet(generated, 120, 21)
    planted = base / "planted.warc.wet"
    records = [wet_record(url, text.encode()) for url, (text, _, _) in PLANTED.items()]
    records.append(wet_record(EDITED_URL, EDITED_TEXT.encode()))
    planted.write_bytes(b"".join(records))
    out = base / "out"
    code = run_cli("run", "--input", generated, planted, "--output", out, "--workers", 1, *SMALL,
                   "--set", f"pipeline={PIPELINE}", "--set", f"steps.url_filter.blocklist_dirs=[{base / 'blacklists'}]")
    assert code == 0
    return out


def test_planted_documents_are_rejected_by_their_step(run):
    rejected = {}
    for path in (run / "rejects").glob("*.parquet"):
        for row in pq.read_table(path, columns=["url", "stage", "reason"]).to_pylist():
            rejected[row["url"]] = (row["stage"], row["reason"])
    for url, (_, stage, reason) in PLANTED.items():
        assert rejected.get(url) == (stage, reason), url
    kept_urls = {row["url"] for row in lineage_rows(run)}
    assert EDITED_URL in kept_urls and not set(PLANTED) & kept_urls


def test_the_report_shows_each_new_steps_stats(run):
    report = json.loads((run / "report.json").read_text())
    stages = {stage["name"]: stage for stage in report["stages"]}
    order = ["read", "url_dedup", "exact_dedup", "url_filter", "langid", "fineweb_quality", "c4_quality",
             "toxicity_words", "gopher_quality"]
    assert [stage["name"] for stage in report["stages"]][: len(order)] == order
    for before, after in zip(order, order[1:]):
        assert stages[before]["docs_out"] == stages[after]["docs_in"], (before, after)
        assert stages[before]["text_bytes_out"] == stages[after]["text_bytes_in"], (before, after)
    for stage in stages.values():
        assert stage["docs_in"] - stage["docs_out"] == sum(stage["dropped"].values()), stage["name"]
    assert stages["url_filter"]["counters"]["list:adult"] == 1
    assert stages["url_filter"]["counters"]["list:adult_tlds"] == 1
    c4 = stages["c4_quality"]
    assert c4["counters"]["lines_removed:javascript"] >= 1 and c4["counters"]["docs_edited"] >= 1
    # c4_quality edits the text it keeps: its bytes out are the edited text the next step reads
    assert c4["text_bytes_out"] == stages["toxicity_words"]["text_bytes_in"]
    histogram_total = 0
    for path in (run / "work" / "stats").glob("input-*.json"):
        steps = {step["name"]: step for step in json.loads(path.read_text())["steps"]}
        histogram_total += sum(steps["toxicity_words"]["histograms"]["toxicity_word_rate"]["counts"])
    assert histogram_total == stages["toxicity_words"]["docs_in"]
    scores = [row["scores"] for path in (run / "work" / "docs").glob("*.parquet")
              for row in pq.read_table(path, columns=["scores"]).to_pylist()]
    assert scores and all(dict(score).get("toxicity_word_rate") is not None for score in scores)
    html = (run / "report.html").read_text()
    assert all(name in html for name in ("url_filter", "fineweb_quality", "c4_quality", "toxicity_words"))
