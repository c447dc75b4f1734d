"""FineWeb quality rules: a clean document passes every rule; each document built to break one
rule is dropped by that rule only (it passes with that rule off), and each threshold is a setting."""

from __future__ import annotations

from collections import Counter

import pytest

from lmforge.common.errors import ConfigError
from lmforge.dataprep.config import load_dataprep_config
from lmforge.dataprep.document import Document
from lmforge.dataprep.steps.fineweb import FineWebQualityFilter, FineWebQualitySettings

PROSE_LINES = [
    "The old harbour town grew around a narrow inlet where fishing boats could shelter from storms.",
    "Its market opened at dawn, and traders from the valley brought cheese, wool and apples to sell.",
    "Most houses were built of grey stone, with small windows facing away from the prevailing wind.",
    "In the nineteenth century a railway reached the town, and summer visitors began to arrive.",
    "Today the harbour is quieter, but the market still opens early on Saturday mornings!",
    "Visitors often ask why the church tower leans; nobody in the town seems to know the answer?",
]
CLEAN = "\n".join(PROSE_LINES)

NO_PUNCT = "\n".join(line.rstrip(".!?") + " and more of the same" for line in PROSE_LINES)
SHORT_LINES = "\n".join(PROSE_LINES[:3] + [f"Item number {word} is here." for word in
                                           ("one", "two", "three", "four", "five", "six", "seven")])
DUPLICATED = "\n".join(PROSE_LINES + [PROSE_LINES[0]])
LIST_LIKE = "\n".join(f"Extraordinarily{word} incomprehensibilities." for word in
                      ("alpha", "beta", "gamma", "delta", "epsilon", "zeta"))

CASES = [
    ("line_punct_ratio", NO_PUNCT, "line_punct_thr"),
    ("short_line_ratio", SHORT_LINES, "short_line_thr"),
    ("char_dup_ratio", DUPLICATED, "char_duplicates_ratio"),
    ("list_ratio", LIST_LIKE, "new_line_ratio"),
]


def test_clean_prose_passes_every_rule():
    assert FineWebQualityFilter().filter(Document(0, "u", CLEAN)) == (True, None)
    assert FineWebQualityFilter().filter(Document(0, "u", "\n\n" + CLEAN.replace("\n", "\n\n"))) == (True, None)


@pytest.mark.parametrize(("reason", "text", "setting"), CASES)
def test_each_rule_drops_the_document_built_for_it(reason, text, setting):
    assert FineWebQualityFilter().filter(Document(0, "u", text)) == (False, reason)
    rule_off = FineWebQualityFilter(FineWebQualitySettings(**{setting: None}))
    assert rule_off.filter(Document(0, "u", text)) == (True, None)


def test_reasons_are_counted_per_rule():
    step = FineWebQualityFilter()
    docs = [Document(i, "u", text) for i, text in enumerate([CLEAN, " \n\n", *(text for _, text, _ in CASES)])]
    kept = list(step.run(docs))
    assert [doc.text for doc in kept] == [CLEAN]
    assert step.stats.dropped == Counter({"empty": 1, **{reason: 1 for reason, _, _ in CASES}})


def test_thresholds_come_from_the_settings():
    # 1 of 7 lines repeated: 95 of ~660 characters
    assert FineWebQualityFilter(FineWebQualitySettings(char_duplicates_ratio=0.2)).filter(
        Document(0, "u", DUPLICATED)) == (True, None)
    # every line ends without punctuation: ratio 0, kept when zero is excluded
    assert FineWebQualityFilter(FineWebQualitySettings(line_punct_exclude_zero=True)).filter(
        Document(0, "u", NO_PUNCT)) == (True, None)
    # 7 of 10 lines short; not short when the limit is 20 characters
    assert FineWebQualityFilter(FineWebQualitySettings(short_line_length=20)).filter(
        Document(0, "u", SHORT_LINES)) == (True, None)
    # a line ending in '。' counts when it is a terminal punctuation mark
    japanese = "\n".join(["港町は嵐から船を守る狭い入り江のまわりに育った。"] * 1 + ["市場は夜明けに開いた。"])
    japanese_step = FineWebQualityFilter(FineWebQualitySettings(
        terminal_punctuation=["。"], short_line_thr=None, new_line_ratio=None))
    assert japanese_step.filter(Document(0, "u", japanese)) == (True, None)
    assert FineWebQualityFilter(FineWebQualitySettings(short_line_thr=None, new_line_ratio=None)).filter(
        Document(0, "u", japanese)) == (False, "line_punct_ratio")


def test_bad_settings_fail_at_load_naming_the_step():
    with pytest.raises(ConfigError, match=r"steps\.fineweb_quality.*line_punct_thr"):
        load_dataprep_config(None, ["steps.fineweb_quality.line_punct_thr=1.5"])
    with pytest.raises(ConfigError, match=r"steps\.fineweb_quality.*short_line_length"):
        load_dataprep_config(None, ["steps.fineweb_quality.short_line_length=-1"])
    config = load_dataprep_config(None, ["pipeline=[fineweb_quality]", "steps.fineweb_quality.new_line_ratio=null"])
    assert config.step_settings("fineweb_quality").new_line_ratio is None
