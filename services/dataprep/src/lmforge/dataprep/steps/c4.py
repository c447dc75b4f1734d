"""C4's cleaning rules (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a
Unified Text-to-Text Transformer", section 2.2; the reference code is TensorFlow Datasets'
c4_utils.clean_page, which datatrove's C4QualityFilter follows).

C4 removes lines and drops pages: each line (stripped) goes through the line rules in the
reference order; a kept line that contains "lorem ipsum" or a curly bracket drops the whole
page (as in the reference code, lines already removed by an earlier rule are not looked at);
the page is dropped when the kept lines hold fewer than `min_num_sentences` sentences. Where C4
joined the kept lines with "\\n", lmforge removes the lines from the text and keeps the rest as it
was: blank lines stay as paragraph breaks (runs of them made by a removal become one), and a
page none of whose lines was removed or changed keeps its text exactly.

Sentences are counted with a simple regex, not NLTK's punkt as the reference does: a sentence
ends at a run of '.', '!' or '?' (closing quotes and brackets allowed after it) followed by
whitespace or the end of the line; a kept line counts at least one.
"""

from __future__ import annotations

import re

from pydantic import Field

from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import BaseFilter
from lmforge.dataprep.step_registry import StepSettings

POLICY_SUBSTRINGS = ["terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies",
                     "use cookies"]
_END_PUNCTUATION = (".", "?", "!", '"', "'")
_ELLIPSIS = "..."
_BLANK_RUNS = re.compile(r"\n{3,}")
_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]", re.IGNORECASE)
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)")


class C4QualitySettings(StepSettings):
    filter_no_terminal_punct: bool = Field(
        False, description="remove lines not ending in terminal punctuation (. ? ! \" ') or ending in an ellipsis. "
                           "C4 (paper section 2.2, TFDS c4_utils) did; FineWeb (Penedo et al. 2024, section 3.3) "
                           "kept C4's other rules and left this one off, as lmforge's default does: it deletes "
                           "most lines that are not sentences (headings, lists, code, table rows)")
    min_words_per_line: int = Field(
        3, ge=0, description="remove lines with fewer words (whitespace-separated); 0 turns it off "
                             "(source: C4 paper section 2.2: at least 3 words)")
    max_word_length: int | None = Field(
        1000, ge=1, description="remove lines holding a word longer than this; null turns it off "
                                "(source: TFDS c4_utils, not in the paper's list)")
    min_num_sentences: int = Field(
        5, ge=0, description="drop pages whose kept lines hold fewer sentences (regex splitter); 0 turns it off "
                             "(source: C4 paper section 2.2: fewer than 5 sentences)")
    remove_citations: bool = Field(
        True, description="delete Wikipedia-style citation marks ([1], [edit], [citation needed]) from lines "
                          "(source: TFDS c4_utils, datatrove C4QualityFilter default)")
    filter_javascript: bool = Field(
        True, description="remove lines containing 'javascript' (source: C4 paper section 2.2)")
    filter_lorem_ipsum: bool = Field(
        True, description="drop pages containing 'lorem ipsum' (source: C4 paper section 2.2)")
    filter_curly_bracket: bool = Field(
        True, description="drop pages containing '{' (source: C4 paper section 2.2)")
    filter_policy: bool = Field(
        True, description="remove lines containing any of policy_substrings (source: TFDS c4_utils)")
    policy_substrings: list[str] = Field(
        default_factory=lambda: list(POLICY_SUBSTRINGS),
        description="lowercase phrases that mark cookie and policy notices (source: TFDS c4_utils)")


class C4QualityFilter(BaseFilter):
    """Removes lines and drops pages by C4's rules (see the module's doc for the order).

    Lines removed count in stats.counters as `lines_removed:<rule>` (`too_long_word`,
    `no_terminal_punct`, `too_few_words`, `javascript`, `policy`), kept ones as `lines_kept`,
    and `docs_edited` counts kept documents whose text changed. Page drops: `lorem_ipsum`,
    `curly_bracket`, `too_few_sentences` (also when no line is left).
    """

    type_name = "c4_quality"
    Settings = C4QualitySettings

    def __init__(self, settings: C4QualitySettings | None = None, name: str | None = None) -> None:
        super().__init__(name)
        self.settings = settings or C4QualitySettings()
        phrases = [re.escape(p.lower()) for p in self.settings.policy_substrings]
        self._policy = re.compile("|".join(phrases)) if phrases else None

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        cfg = self.settings
        counters = self.stats.counters
        removed = dict.fromkeys(("too_long_word", "no_terminal_punct", "too_few_words", "javascript", "policy"), 0)
        lines: list[str] = []  # the text's lines as they stay; "" is a paragraph break
        n_kept = 0
        cited = False  # a kept line lost a citation mark
        num_sentences = 0
        page_reason = None
        for raw in doc.text.splitlines():
            line = raw.strip()
            if not line:
                lines.append("")
                continue
            # a line no longer than max_word_length cannot hold a longer word: most lines skip the split
            if (cfg.max_word_length is not None and len(line) > cfg.max_word_length
                    and max(map(len, line.split())) > cfg.max_word_length):
                removed["too_long_word"] += 1
                continue
            original = line  # words are counted before citation marks go, as in the reference code
            if cfg.remove_citations and "[" in line:
                line = _CITATION.sub("", line)
            if cfg.filter_no_terminal_punct and (not line.endswith(_END_PUNCTUATION) or line.endswith(_ELLIPSIS)):
                removed["no_terminal_punct"] += 1
                continue
            need = cfg.min_words_per_line
            if need and len(original.split(None, need - 1)) < need:
                removed["too_few_words"] += 1
                continue
            lower = line.lower()
            if cfg.filter_lorem_ipsum and "lorem ipsum" in lower:
                page_reason = "lorem_ipsum"
                break
            if cfg.filter_javascript and "javascript" in lower:
                removed["javascript"] += 1
                continue
            if cfg.filter_curly_bracket and "{" in line:
                page_reason = "curly_bracket"
                break
            if cfg.filter_policy and self._policy is not None and self._policy.search(lower):
                removed["policy"] += 1
                continue
            num_sentences += len(_SENTENCE_END.findall(line)) or 1
            n_kept += 1
            cited = cited or line != original
            lines.append(raw if line == original else line)
        for rule, count in removed.items():
            if count:
                counters[f"lines_removed:{rule}"] += count
        if page_reason:
            return False, page_reason
        counters["lines_kept"] += n_kept
        if not n_kept or num_sentences < cfg.min_num_sentences:
            return False, "too_few_sentences"
        if any(removed.values()) or cited:
            # blank lines where removed ones stood would pile up: one paragraph break
            doc.text = _BLANK_RUNS.sub("\n\n", "\n".join(lines)).strip("\n")
            counters["docs_edited"] += 1
        return True, None
