"""The text a fastText classifier sees, at training time and at scoring time alike.

DCLM's quality classifier (Li et al. 2024, DataComp-LM; its `classify_fasttext_hq_prob`) scores
`" ".join(text.strip().splitlines())`: the whole document on one line, case kept. fastText reads
one example per line, so a line break inside a document would split it (and the predictor refuses
one). `train-classifier` writes its training lines with this function and the `classifier` step
scores with it: a model never sees text prepared differently from what it was trained on.
"""

from __future__ import annotations

LABEL_PREFIX = "__label__"
# fastText's predict time grows with the text; the first characters of a document say enough
# about its kind (bench/classifier_step.py measures the cost per length)
DEFAULT_MAX_CHARS = 10_000


def classifier_text(text: str, max_chars: int | None = DEFAULT_MAX_CHARS) -> str:
    """`text` as one line: its first `max_chars` characters (None: all), stripped, lines joined by spaces."""
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars]
    return " ".join(text.strip().splitlines())


def label_name(label: str) -> str:
    """A label without fastText's `__label__` prefix (a user may write either)."""
    return label.removeprefix(LABEL_PREFIX)


def predict_probabilities(model, text: str, max_chars: int | None = DEFAULT_MAX_CHARS, k: int = -1
                          ) -> dict[str, float]:
    """P(label) of a fastText model's `k` most probable labels (-1: all) for one document, its text
    prepared by `classifier_text`; as training measures a model and the classifier step scores."""
    labels, probabilities = model.predict(classifier_text(text, max_chars), k=k, threshold=0.0)
    # softmax in float32 can come out a hair above 1
    return {label_name(label): min(float(p), 1.0) for label, p in zip(labels, probabilities)}
