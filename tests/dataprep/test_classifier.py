"""fastText classifiers: `train-classifier` on generated positives and negatives, then the
`classifier` step scoring documents in a pipeline run.

Positives are the generator's explanatory prose; negatives its spam: keyword lists, symbol lines,
bullet lists of offers, and teaser pages (prose headlines cut off with "..." between "click
here" lines: the same sentences as the prose, which makes the task more than a vocabulary
lookup). The generator's too-short and repeated-sentence spam are left out: a bag of n-grams
cannot tell them from prose. Training runs on one thread with a fixed seed (the same model every
time); DCLM's epochs and learning rate are for 400k documents, a few hundred need more passes.
"""

from __future__ import annotations

import contextlib
import io
import json

import fasttext
import pyarrow.parquet as pq
import pytest
from warcio.archiveiterator import ArchiveIterator

from lmforge.dataprep.classifier_text import classifier_text, predict_probabilities
from lmforge.dataprep.document import Document
from lmforge.dataprep.steps.classifier import ClassifierFilter, ClassifierSettings
from lmforge.sample_data.wet import write_sample_wet
from tests.dataprep.helpers import run_cli

NEGATIVE_SPAM = ("keyword_list", "symbol_lines", "bullet_list", "ellipsis_lines")
SMALL_MODEL = ["--threads", 1, "--seed", 0, "--dim", 32, "--bucket", 100_000, "--epoch", 80, "--lr", 0.2]


def _texts(path) -> dict[str, str]:
    with open(path, "rb") as fh:
        return {r.rec_headers.get_header("WARC-Target-URI"): r.content_stream().read().decode("utf-8")
                for r in ArchiveIterator(fh) if r.rec_type == "conversion"}


def _write_jsonl(path, texts: list[str], field: str = "text"):
    path.write_text("".join(json.dumps({field: text}) + "\n" for text in texts))
    return path


@pytest.fixture(scope="module")
def examples(tmp_path_factory):
    base = tmp_path_factory.mktemp("examples")
    summary = write_sample_wet(base / "crawl.warc.wet", 5000, 23)
    texts = _texts(base / "crawl.warc.wet")
    prose = [texts[r.url] for r in summary.records if r.kind == "prose"]
    spam = [texts[r.url] for r in summary.records if r.kind == "spam" and r.detail in NEGATIVE_SPAM]
    return _write_jsonl(base / "prose.jsonl", prose, "body"), _write_jsonl(base / "spam.jsonl", spam, "body")


@pytest.fixture(scope="module")
def trained(examples, tmp_path_factory):
    prose, spam = examples
    model = tmp_path_factory.mktemp("model") / "quality.bin"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = run_cli("train-classifier", "--label", f"hq={prose}", "--label", f"cc={spam}",
                       "--text-field", "body", "--output", model, "--holdout-fraction", 0.2,
                       "--quantize", "--quantize-cutoff", 5000, *SMALL_MODEL)
    assert code == 0
    return model, json.loads(model.with_suffix(".report.json").read_text()), printed.getvalue()


def test_classifier_separates_the_held_out_set(trained):
    model_path, report, printed = trained
    by_label = {m["label"]: m for m in report["heldout"]["labels"]}
    assert set(by_label) == {"hq", "cc"}
    for metrics in by_label.values():
        assert metrics["precision"] >= 0.9 and metrics["recall"] >= 0.9, by_label
        assert f"{metrics['label']}" in printed and f"{metrics['precision']:.4f}" in printed
    # the held-out split is the seeded 20% of each label; the training part was downsampled to balance
    assert by_label["hq"]["support"] == round(report["examples"]["hq"] * 0.2)
    assert report["train_examples"]["hq"] == report["train_examples"]["cc"] < report["examples"]["hq"]

    # recomputed here from the model's own predictions on the held-out file
    model = fasttext.load_model(str(model_path))
    rows = [json.loads(line) for line in model_path.with_suffix(".heldout.jsonl").read_text().splitlines()]
    pairs = []
    for row in rows:
        labels, _ = model.predict(classifier_text(row["text"]), k=1)
        pairs.append((row["label"], labels[0].removeprefix("__label__")))
    for label, metrics in by_label.items():
        true_positives = sum(1 for truth, guess in pairs if truth == guess == label)
        precision = true_positives / sum(1 for _, guess in pairs if guess == label)
        recall = true_positives / sum(1 for truth, _ in pairs if truth == label)
        assert (round(precision, 4), round(recall, 4)) == (metrics["precision"], metrics["recall"])
        assert precision >= 0.9 and recall >= 0.9


def test_quantized_model_is_written_and_measured(trained):
    model_path, report, _ = trained
    quantized = model_path.with_suffix(".ftz")
    assert report["quantized"]["model"] == str(quantized)
    assert quantized.stat().st_size < model_path.stat().st_size / 4
    for metrics in report["quantized"]["labels"]:
        assert metrics["precision"] >= 0.9 and metrics["recall"] >= 0.9


@pytest.fixture(scope="module")
def scored_run(trained, tmp_path_factory):
    """A run with two classifier instances (one model): quality keeps P(hq) >= 0.5, spam drops P(cc) >= 0.9."""
    model_path, _, _ = trained
    base = tmp_path_factory.mktemp("scored")
    summary = write_sample_wet(base / "in.warc.wet.gz", 300, 29)
    out = base / "out"
    steps = ["--set", "pipeline=[url_dedup,exact_dedup,langid,quality_classifier,spam_classifier]",
             "--set", "steps.quality_classifier.type=classifier",
             "--set", f"steps.quality_classifier.model_path={model_path}",
             "--set", "steps.quality_classifier.keep_if={hq: 0.5}",
             "--set", "steps.spam_classifier.type=classifier",
             "--set", f"steps.spam_classifier.model_path={model_path}",
             "--set", "steps.spam_classifier.drop_if={__label__cc: 0.9}"]
    assert run_cli("run", "--input", base / "in.warc.wet.gz", "--output", out, "--workers", 1,
                   "--set", "tokenizer.vocab_size=600", *steps) == 0
    return summary, out


def _docs(out) -> list[dict]:
    paths = sorted((out / "work" / "docs").glob("*.parquet"))
    return [row for path in paths for row in pq.read_table(path).to_pylist()]


def test_pipeline_keeps_the_classifier_probabilities_as_scores(trained, scored_run):
    model = fasttext.load_model(str(trained[0]))
    summary, out = scored_run
    docs = _docs(out)
    assert docs
    for doc in docs:
        scores = dict(doc["scores"])
        assert set(scores) == {"quality_classifier:hq", "spam_classifier:cc"}
        expected = predict_probabilities(model, doc["text"])
        assert scores["quality_classifier:hq"] == pytest.approx(expected["hq"], abs=1e-6) and expected["hq"] >= 0.5
        assert scores["spam_classifier:cc"] == pytest.approx(expected["cc"], abs=1e-6) and expected["cc"] < 0.9

    kinds = {r.url: r.kind for r in summary.records}
    kept_kinds = [kinds[doc["url"]] for doc in docs]
    prose_in = sum(1 for r in summary.records if r.kind == "prose")
    assert kept_kinds.count("prose") >= 0.9 * prose_in  # dedup and langid keep the generated prose
    rejects = [row for path in (out / "rejects").glob("filter-*.parquet") for row in pq.read_table(path).to_pylist()]
    dropped = [row for row in rejects if row["stage"] == "quality_classifier"]
    assert dropped and {row["reason"] for row in dropped} == {"hq_score_too_low"}
    assert sum(1 for row in dropped if kinds[row["url"]] == "spam") >= 0.5 * len(dropped)


def test_scores_reach_the_step_stats_and_report(scored_run):
    _, out = scored_run
    stats = json.loads((out / "work" / "stats" / "input-000000.json").read_text())
    steps = {step["name"]: step for step in stats["steps"]}
    for step_id, score in (("quality_classifier", "quality_classifier:hq"), ("spam_classifier", "spam_classifier:cc")):
        histogram = steps[step_id]["histograms"][score]
        assert len(histogram["edges"]) == 21 and sum(histogram["counts"]) == steps[step_id]["docs_in"] > 0
    quality = steps["quality_classifier"]["histograms"]["quality_classifier:hq"]["counts"]
    assert sum(quality[:10]) == steps["quality_classifier"]["dropped"]["hq_score_too_low"]  # P < 0.5: dropped
    report = {stage["name"]: stage for stage in json.loads((out / "report.json").read_text())["stages"]}
    assert report["quality_classifier"]["dropped"] == steps["quality_classifier"]["dropped"]
    assert report["spam_classifier"]["docs_in"] == report["quality_classifier"]["docs_out"]


def test_examples_from_a_dataprep_output_and_s3(scored_run, examples, s3, tmp_path):
    """Positives read from a run's docs Parquet files, negatives from s3://; the model written to
    s3:// and scored from there."""
    _, out = scored_run
    _, spam = examples
    client = s3[1]("lmf-models")
    client.upload_file(str(spam), "lmf-models", "examples/spam.jsonl")
    code = run_cli("train-classifier", "--positive", out, "--negative", "s3://lmf-models/examples/spam.jsonl",
                   "--text-field", "body", "--output", "s3://lmf-models/quality/model.bin", *SMALL_MODEL)
    assert code == 0
    report = json.loads(client.get_object(Bucket="lmf-models", Key="quality/model.report.json")["Body"].read())
    assert report["examples"]["hq"] == len(_docs(out))
    step = ClassifierFilter(ClassifierSettings(model_path="s3://lmf-models/quality/model.bin", keep_if={"hq": 0.5}),
                            "s3_classifier")
    keep, _ = step.filter(Document(1, "https://example.org/", _docs(out)[0]["text"]))
    assert keep


@pytest.mark.parametrize("case, code, message", [
    ("missing", 3, "not found: "),
    ("one_label", 2, "at least two labels"),
    ("too_few", 3, "label 'cc' has 3 examples; at least 10"),
    ("not_json", 3, "spam.jsonl:2: not a JSON object"),
    ("no_field", 3, "no text field 'text'"),
    ("bad_option", 2, "--holdout-fraction"),
])
def test_bad_training_input_is_one_line_and_keeps_the_old_model(case, code, message, tmp_path, capsys):
    prose = tmp_path / "prose.jsonl"
    prose.write_text('{"text": "a"}\n' * 20)
    spam = tmp_path / "spam.jsonl"
    spam.write_text({"not_json": '{"text": "a"}\n{oops\n', "no_field": '{"body": "a"}\n',
                     "too_few": '{"text": "a"}\n' * 3}.get(case, '{"text": "a"}\n' * 20))
    model = tmp_path / "model.bin"
    model.write_bytes(b"the previous model")
    args = {"missing": ["--positive", prose, "--negative", tmp_path / "nothing.jsonl"],
            "one_label": ["--positive", prose]}.get(case, ["--positive", prose, "--negative", spam])
    extra = ["--holdout-fraction", 1.5] if case == "bad_option" else []
    assert run_cli("train-classifier", *args, "--output", model, *extra) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert model.read_bytes() == b"the previous model"


@pytest.mark.parametrize("settings, message", [
    ("steps.c.model_path=/nowhere/model.bin", "steps.c.model_path: not found: /nowhere/model.bin"),
    ("steps.c.keep_if={toxic: 0.5}", "labels not in the model"),
    ("steps.c.enabled=true", "steps.c.model_path: required (a fastText model"),
])
def test_bad_classifier_step_settings_exit_2(settings, message, trained, tmp_path, capsys):
    source = tmp_path / "in.warc.wet"
    write_sample_wet(source, 20, 3)
    overrides = ["--set", "pipeline=[c]", "--set", "steps.c.type=classifier", "--set", settings]
    if "model_path" not in settings:
        overrides += [] if "enabled" in settings else ["--set", f"steps.c.model_path={trained[0]}"]
    assert run_cli("run", "--input", source, "--output", tmp_path / "out", "--workers", 1, *overrides) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and len(err) <= 2, err  # one line, or the config's heading and its line
    if "model_path" in message:  # refused when the config loads: nothing written
        assert not (tmp_path / "out").exists()
