"""C4 rules: lines are removed by the line rules (counted per rule) and pages dropped by the page
rules; a kept document's text is the kept lines, and the step's bytes out count the edited text."""

from __future__ import annotations

from collections import Counter

import pytest

from lmforge.common.errors import ConfigError
from lmforge.dataprep.config import load_dataprep_config
from lmforge.dataprep.document import Document
from lmforge.dataprep.steps.c4 import C4QualityFilter, C4QualitySettings

GOOD_LINES = [
    "The museum reopened last spring after a long renovation.",
    "Its new wing holds paintings that were kept in storage for decades.",
    "Visitors can now see the collection in natural light. The rooms face north.",
    "Guided tours start every hour, and tickets are sold at the door!",
    'The director said the building "finally does justice to the art."',
]
CLEAN = "\n".join(GOOD_LINES)  # 6 sentences

LINE_RULES = [
    ("no_terminal_punct", "Home | About us | Contact | Opening hours"),
    ("no_terminal_punct", "More details will follow soon..."),
    ("too_few_words", "Read more."),
    ("too_long_word", "See " + "x" * 1001 + " for details."),
    ("javascript", "Please enable JavaScript in your browser to see the map."),
    ("policy", "By using this site you agree to our Privacy Policy and Terms of Use."),
    ("policy", "This website uses cookies to improve your experience."),
]


def paper_c4() -> C4QualityFilter:
    """C4 as the paper ran it: the terminal-punctuation rule on (lmforge's default, FineWeb's, leaves it off)."""
    return C4QualityFilter(C4QualitySettings(filter_no_terminal_punct=True))


def test_the_default_keeps_lines_without_terminal_punctuation_as_fineweb_did():
    text = "\n".join(GOOD_LINES[:2] + ["Home | About us | Contact | Opening hours"] + GOOD_LINES[2:])
    kept = list(C4QualityFilter().run([Document(0, "u", text)]))
    assert [doc.text for doc in kept] == [text]


def test_paragraphs_and_indentation_stay_and_a_removal_leaves_one_paragraph_break():
    text = ("  " + GOOD_LINES[0] + "\n\n" + "\n".join(GOOD_LINES[1:3]) + "\n\nRead more.\n\n\n"
            + "\n".join(GOOD_LINES[3:]) + "\n")
    step = paper_c4()
    assert [doc.text for doc in step.run([Document(0, "u", text.replace("Read more.\n\n\n", ""))])] == [
        text.replace("Read more.\n\n\n", "")]  # nothing removed: the text exactly as it was
    kept = list(step.run([Document(1, "u", text)]))
    assert [doc.text for doc in kept] == [text.replace("Read more.\n\n\n", "").rstrip("\n")]


def test_a_clean_page_passes_unchanged():
    step = paper_c4()
    kept = list(step.run([Document(0, "u", CLEAN)]))
    assert [doc.text for doc in kept] == [CLEAN]
    assert step.stats.counters == Counter({"lines_kept": 5})
    assert step.stats.bytes_out == step.stats.bytes_in == len(CLEAN.encode())


@pytest.mark.parametrize(("rule", "line"), LINE_RULES)
def test_each_line_rule_removes_only_its_line(rule, line):
    step = paper_c4()
    lines = GOOD_LINES[:2] + [line] + GOOD_LINES[2:]
    kept = list(step.run([Document(0, "u", "\n".join(lines))]))
    assert [doc.text for doc in kept] == [CLEAN]
    assert step.stats.counters == Counter({f"lines_removed:{rule}": 1, "lines_kept": 5, "docs_edited": 1})


def test_removed_lines_are_counted_and_bytes_out_is_the_edited_text():
    text = "\n".join(GOOD_LINES[:1] + [line for _, line in LINE_RULES] + ["  ", *GOOD_LINES[1:]])
    step = paper_c4()
    kept = list(step.run([Document(0, "u", text)]))
    # the blank line stays a paragraph break (C4 joined the kept lines with "\n": lmforge keeps paragraphs)
    assert [doc.text for doc in kept] == [GOOD_LINES[0] + "\n\n" + "\n".join(GOOD_LINES[1:])]
    assert step.stats.counters == Counter({"lines_removed:no_terminal_punct": 2, "lines_removed:too_few_words": 1,
                                           "lines_removed:too_long_word": 1, "lines_removed:javascript": 1,
                                           "lines_removed:policy": 2, "lines_kept": 5, "docs_edited": 1})
    assert step.stats.bytes_in == len(text.encode())
    assert step.stats.bytes_out == len(kept[0].text.encode())


def test_citation_marks_are_removed_from_kept_lines():
    text = CLEAN.replace("decades.", "decades.[1]").replace("north.", "north.[citation needed]")
    kept = list(paper_c4().run([Document(0, "u", text)]))
    assert [doc.text for doc in kept] == [CLEAN]


@pytest.mark.parametrize(("reason", "line"), [
    ("lorem_ipsum", "Lorem ipsum dolor sit amet, consectetur adipiscing elit."),
    ("curly_bracket", "The function returns {'a': 1} when called."),
])
def test_page_rules_drop_the_page(reason, line):
    step = paper_c4()
    assert list(step.run([Document(0, "u", CLEAN + "\n" + line)])) == []
    assert step.stats.dropped == Counter({reason: 1})


def test_too_few_sentences_drops_the_page():
    step = paper_c4()
    four_sentences = "\n".join(GOOD_LINES[:2] + GOOD_LINES[3:])
    assert step.filter(Document(0, "u", four_sentences)) == (False, "too_few_sentences")
    assert step.filter(Document(0, "u", "Menu\nHome\nShop")) == (False, "too_few_sentences")
    assert C4QualityFilter(C4QualitySettings(min_num_sentences=4)).filter(
        Document(0, "u", four_sentences)) == (True, None)


def test_each_rule_can_be_turned_off():
    everything = "\n".join([*GOOD_LINES, *(line for _, line in LINE_RULES),
                            "Lorem ipsum dolor sit amet, consectetur adipiscing elit.", "Call f{x} now, please."])
    settings = C4QualitySettings(filter_no_terminal_punct=False, min_words_per_line=0, max_word_length=None,
                                 min_num_sentences=0, filter_javascript=False, filter_lorem_ipsum=False,
                                 filter_curly_bracket=False, filter_policy=False)
    step = C4QualityFilter(settings)
    kept = list(step.run([Document(0, "u", everything)]))
    assert [doc.text for doc in kept] == [everything]
    assert "docs_edited" not in step.stats.counters


def test_bad_settings_fail_at_load_naming_the_step():
    with pytest.raises(ConfigError, match=r"steps\.c4_quality.*min_words_per_line"):
        load_dataprep_config(None, ["steps.c4_quality.min_words_per_line=-1"])
    with pytest.raises(ConfigError, match=r"steps\.c4_quality.*no_such_rule"):
        load_dataprep_config(None, ["steps.c4_quality.no_such_rule=true"])
