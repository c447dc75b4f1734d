"""The pipeline a user composes: `pipeline` (ordered step ids) and `steps.<id>` (typed settings),
checked when the config loads, each error naming the step."""

from __future__ import annotations

import pytest

from lmforge.common.config import dump_config
from lmforge.common.errors import ConfigError
from lmforge.dataprep.config import DataprepConfig, load_dataprep_config
from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import chain
from lmforge.dataprep.step_registry import BUILTIN_STEPS, DEFAULT_PIPELINE, step_class
from lmforge.dataprep.steps.langid import LanguageFilter
from lmforge.dataprep.worker import build_filter_steps
from tests.dataprep.helpers import run_cli
from tests.dataprep.scoring_step import DistinctWordsFilter

OUTSIDE = "tests.dataprep.scoring_step:DistinctWordsFilter"


def load(*overrides: str) -> DataprepConfig:
    return load_dataprep_config(None, list(overrides))


def test_the_default_pipeline_is_fineweb_order_and_every_built_in_type_loads():
    steps = build_filter_steps(DataprepConfig())
    # the contamination step without eval sets would pass everything: left out
    assert [step.name for step in steps] == [s for s in DEFAULT_PIPELINE if s != "contamination"]
    for type_name in BUILTIN_STEPS:
        cls = step_class(type_name)
        assert cls.type_name == type_name and cls.Settings().enabled


def test_a_step_whose_settings_leave_it_nothing_to_do_is_left_out_whatever_its_id(tmp_path):
    """StepSettings.passes_everything: a contamination check without eval sets, under its built-in
    id or another; with eval sets it runs."""
    eval_set = tmp_path / "eval.jsonl"
    eval_set.write_text('{"text": "what is the capital of australia asked the quiz on the radio today"}\n')
    config = load("pipeline=[langid, contamination, decontaminate]", "steps.decontaminate.type=contamination")
    assert [step.name for step in build_filter_steps(config)] == ["langid"]
    config = load("pipeline=[langid, contamination, decontaminate]", "steps.decontaminate.type=contamination",
                  f"steps.decontaminate.eval_sets=[{eval_set}]")
    assert [step.name for step in build_filter_steps(config)] == ["langid", "decontaminate"]


def test_reordered_dropped_and_disabled_steps():
    config = load("pipeline=[gopher_quality, url_dedup, langid, pii]", "steps.pii.enabled=false")
    assert [step.name for step in build_filter_steps(config)] == ["gopher_quality", "url_dedup", "langid"]


def test_one_type_twice_under_two_ids_with_their_own_settings():
    config = load("pipeline=[langid, german]", "steps.german.type=langid", "steps.german.languages=[de]",
                  "steps.langid.languages=[en, de]")
    english_or_german, german = build_filter_steps(config)
    assert isinstance(german, LanguageFilter) and german.name == "german"
    assert english_or_german.languages == {"en", "de"} and german.languages == {"de"}
    # the run directory records the resolved config, and later stages load it again
    again = DataprepConfig.model_validate(dump_config(config))
    assert again.steps.german.type == "langid" and again.steps.german.languages == ["de"]


def test_a_step_from_outside_lmforge_by_module_and_class():
    config = load("pipeline=[url_dedup, distinct]", f"steps.distinct.type={OUTSIDE}", "steps.distinct.threshold=0.6")
    steps = build_filter_steps(config)
    assert isinstance(steps[1], DistinctWordsFilter) and steps[1].settings.threshold == 0.6
    docs = [Document(0, "https://a.example/1", "one two three four five"),
            Document(1, "https://a.example/2", "spam spam spam spam ham")]
    kept = list(chain(steps, docs))
    assert [doc.doc_id for doc in kept] == [0] and kept[0].metadata["scores"] == {"distinct_words": 1.0}
    assert steps[1].stats.dropped == {"repetitive": 1}
    assert sum(steps[1].stats.histograms["distinct_words"]["counts"]) == 2
    assert [e["doc_id"] for e in steps[1].stats.examples["removed"]] == [1]


@pytest.mark.parametrize(("overrides", "message"), [
    (["pipeline=[url_dedup, nosuch]"], "pipeline step 'nosuch' is not a built-in step; name its type in steps.nosuch"),
    (["pipeline=[x]", "steps.x.type=nosuch"], "unknown step type 'nosuch'"),
    (["pipeline=[x]", "steps.x.type=nosuch.module:Class"], "step type 'nosuch.module:Class' cannot be imported"),
    (["steps.langid.treshold=0.5"], "steps.langid.treshold: Extra inputs are not permitted"),
    (["steps.langid.threshold=2"], "steps.langid.threshold: Input should be less than or equal to 1"),
    (["pipeline=[q]", "steps.q.type=gopher_quality", "steps.q.min_doc_words=-1"],
     "steps.q (gopher_quality): min_doc_words: Input should be greater than or equal to 0"),
    (["steps.langid.type=pii"], "steps.langid: a built-in step's type cannot be changed"),
    (["pipeline=[langid, langid]"], "step ids appear more than once: langid"),
    (["quality.min_doc_words=10"], "`quality` is now `steps.gopher_quality`"),
    (["pipeline=[c]", "steps.c.type=classifier"], "steps.c.model_path: required (a fastText model"),
    (["pipeline=[perplexity]", "steps.perplexity.model_path=/nowhere/en.arpa"],
     "steps.perplexity.model_path: not found: /nowhere/en.arpa"),
])
def test_bad_steps_fail_at_load_naming_the_step(overrides, message):
    with pytest.raises(ConfigError) as caught:
        load(*overrides)
    assert message in str(caught.value)


def test_the_cli_refuses_a_bad_step_before_writing_anything(tmp_path, capsys):
    out = tmp_path / "out"
    wet = tmp_path / "in.warc.wet"
    wet.write_bytes(b"")
    assert run_cli("run", "--input", wet, "--output", out, "--set", "pipeline=[url_dedup, nosuch]") == 2
    assert "nosuch" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(("module_source", "error"), [
    (None, "ModuleNotFoundError: No module named 'user_step_module'"),
    ("import os\nraise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here (%s, line 2)"),
], ids=["missing", "raises"])
def test_a_step_module_that_cannot_be_imported_is_one_config_error_line(tmp_path, capsys, monkeypatch,
                                                                        module_source, error):
    if module_source is not None:
        (tmp_path / "user_step_module.py").write_text(module_source)
        error %= tmp_path / "user_step_module.py"
    monkeypatch.syspath_prepend(tmp_path)
    wet = tmp_path / "in.warc.wet"
    wet.write_bytes(b"")
    code = run_cli("run", "--input", wet, "--output", tmp_path / "out", "--set", "pipeline=[mine]",
                   "--set", "steps.mine.type=user_step_module:MyStep")
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        "lmforge-dataprep run: error: steps.mine: step type 'user_step_module:MyStep' cannot be imported: "
        f"importing user_step_module raised {error}"]
