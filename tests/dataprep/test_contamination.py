"""Eval-set decontamination: a shared 13-gram drops a document, 12 shared words do not;
hits are counted per eval set; malformed eval files are reported with file and line."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from lmforge.common.errors import InputError
from lmforge.dataprep.document import Document
from lmforge.dataprep.steps.contamination import ContaminationConfig, ContaminationFilter, NgramHasher, normalized_words

QUESTION = (
    "A train leaves the station at nine in the morning and travels north at sixty miles per hour "
    "until it reaches the coast"
)
ARTICLE = (
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules in the "
    "chloroplasts of plant cells"
)
SHORT_ANSWER = "the capital of australia is canberra"  # 6 words: one 6-gram of its own

BACKGROUND = (
    "Local volunteers spent the weekend repairing the footpath along the river, replacing broken "
    "boards and clearing the undergrowth that had spread over the summer."
)


def write_jsonl(path: Path, records: list[object]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


@pytest.fixture
def eval_sets(tmp_path: Path) -> list[str]:
    return [
        write_jsonl(tmp_path / "arith.jsonl", [{"text": QUESTION}, {"text": "What is two plus two?"}]),
        write_jsonl(tmp_path / "science.jsonl", [{"text": ARTICLE}, {"text": SHORT_ANSWER}]),
    ]


def contamination(paths: list[str], **config) -> ContaminationFilter:
    return ContaminationFilter(ContaminationConfig(eval_sets=paths, **config))


def verdict(step: ContaminationFilter, text: str) -> tuple[bool, str | None]:
    return step.filter(Document(0, "https://example.com/", text))


def window(text: str, start: int, length: int) -> str:
    return " ".join(text.split()[start : start + length])


def test_a_shared_13_gram_drops_the_document(eval_sets):
    step = contamination(eval_sets)
    leaked = f"{BACKGROUND} {window(QUESTION, 3, 13)} {BACKGROUND}"
    assert verdict(step, leaked) == (False, "contaminated")


def test_twelve_shared_words_are_not_enough(eval_sets):
    step = contamination(eval_sets)
    for start in range(0, len(QUESTION.split()) - 12):
        assert verdict(step, f"{BACKGROUND} {window(QUESTION, start, 12)} {BACKGROUND}") == (True, None)


def test_matching_ignores_case_and_punctuation(eval_sets):
    step = contamination(eval_sets)
    shouted = "PHOTOSYNTHESIS, converts LIGHT energy -- into chemical energy (stored) in glucose... molecules! In THE"
    assert len(normalized_words(shouted)) == 13
    assert verdict(step, f"{BACKGROUND} {shouted} {BACKGROUND}") == (False, "contaminated")


def test_short_eval_texts_are_skipped_by_default(eval_sets):
    step = contamination(eval_sets)
    assert step.stats.counters["short_eval_texts_skipped"] == 2
    assert verdict(step, "Everyone knows that The Capital of Australia is Canberra, not Sydney.") == (True, None)


def test_an_eval_text_shorter_than_n_counts_as_a_whole(eval_sets):
    step = contamination(eval_sets, min_eval_words=3)
    assert verdict(step, "Everyone knows that The Capital of Australia is Canberra, not Sydney.") == (
        False,
        "contaminated",
    )
    assert verdict(step, "The capital of Australia is a planned city.") == (True, None)
    assert verdict(step, "What is two plus two? Four, of course.") == (False, "contaminated")


def test_clean_documents_are_kept(eval_sets):
    step = contamination(eval_sets)
    assert verdict(step, BACKGROUND) == (True, None)
    assert verdict(step, "") == (True, None)
    assert verdict(step, "!!! ... ---") == (True, None)


def test_hits_are_counted_per_eval_set(eval_sets):
    step = contamination(eval_sets, min_eval_words=3)
    texts = [
        f"{BACKGROUND} {QUESTION}",  # arith
        f"{ARTICLE} {BACKGROUND}",  # science
        f"{QUESTION} and also {ARTICLE}",  # both
        BACKGROUND,  # clean
        f"Quiz: {SHORT_ANSWER}.",  # science (short text)
    ]
    kept = list(step.run(Document(i, "", text) for i, text in enumerate(texts)))
    assert [doc.doc_id for doc in kept] == [3]
    assert step.stats.dropped == Counter({"contaminated": 4})
    assert step.stats.counters == Counter({"eval:arith": 2, "eval:science": 3})


def test_no_eval_sets_keeps_everything():
    step = contamination([])
    assert verdict(step, QUESTION) == (True, None)
    assert list(step.run([Document(0, "", ARTICLE)]))[0].text == ARTICLE


def test_text_field_and_ngram_size_come_from_the_config(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": QUESTION, "text": "unrelated words only"}])
    step = contamination([path], text_field="question", ngram=5)
    assert verdict(step, f"{BACKGROUND} {window(QUESTION, 10, 5)}") == (False, "contaminated")
    assert verdict(step, f"{BACKGROUND} {window(QUESTION, 10, 4)}") == (True, None)


def test_blank_lines_and_gzip_files_are_read(tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_text(f'\n{json.dumps({"text": QUESTION})}\n\n', encoding="utf-8")
    packed = tmp_path / "packed.jsonl.gz"
    packed.write_bytes(gzip.compress(json.dumps({"text": ARTICLE}).encode()))
    step = contamination([str(plain), str(packed)])
    assert [s.name for s in step.eval_sets] == ["plain", "packed"]
    assert verdict(step, QUESTION) == (False, "contaminated")
    assert verdict(step, ARTICLE) == (False, "contaminated")


@pytest.mark.parametrize(
    ("second_line", "complaint"),
    [
        ("{not json", "not valid JSON"),
        ('{"question": "no text field here"}', "no string field 'text'"),
        ('{"text": 42}', "no string field 'text'"),
        ('["text"]', "no string field 'text'"),
    ],
)
def test_malformed_lines_raise_input_error_with_file_and_line(tmp_path, second_line, complaint):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps({"text": QUESTION}) + "\n" + second_line + "\n", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        contamination([str(path)])
    message = str(caught.value)
    assert str(path) in message and "line 2" in message and complaint in message


def test_missing_eval_set_is_an_input_error(tmp_path):
    missing = str(tmp_path / "absent.jsonl")
    with pytest.raises(ValueError, match="eval set not found"):  # when the config loads
        ContaminationConfig(eval_sets=[missing])
    with pytest.raises(InputError):  # and should it vanish before the step starts
        ContaminationFilter(ContaminationConfig.model_construct(eval_sets=[missing]))


def test_normalization():
    assert normalized_words("Don't STOP—believing… (1999) e-mail_x") == ["dont", "stopbelieving", "1999", "email_x"]
    assert normalized_words("Café  NAÏVE\u00a0über") == ["café", "naïve", "über"]


def test_ngram_hashes_are_the_same_in_every_process():
    """Workers are separate processes: the hashes must not depend on Python's hash seed."""
    words = normalized_words(QUESTION)
    here = NgramHasher.ngram_hashes(NgramHasher().word_hashes(words), 13).tolist()
    code = (
        "import json, sys\n"
        "from lmforge.dataprep.steps.contamination import NgramHasher, normalized_words\n"
        "words = normalized_words(sys.argv[1])\n"
        "print(json.dumps(NgramHasher.ngram_hashes(NgramHasher().word_hashes(words), 13).tolist()))\n"
    )
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        result = subprocess.run(
            [sys.executable, "-c", code, QUESTION], env=env, capture_output=True, text=True, check=True
        )
        assert json.loads(result.stdout) == here
    assert len(here) == len(words) - 12 and len(set(here)) == len(here)
