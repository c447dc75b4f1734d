"""Score documents with a fastText classifier and keep or drop them by label probability.

Any fastText supervised model works: one `lmforge-dataprep train-classifier` wrote (DCLM's recipe,
classifier_training.py), DCLM's own OH-2.5+ELI5 model (`__label__hq`/`__label__cc`), a toxicity or
domain model. The text is prepared exactly as training prepared it (classifier_text.py). Each
chosen label's probability is recorded as the score `<step id>:<label>` (the docs Parquet `scores`
column, for later mixing, and the step's histograms in the report). A pipeline may hold several
instances, each under its own id:

    pipeline: [url_dedup, exact_dedup, langid, quality_classifier, toxicity_classifier, ...]
    steps:
      quality_classifier: {type: classifier, model_path: s3://models/quality.bin, keep_if: {hq: 0.5}}
      toxicity_classifier: {type: classifier, model_path: /models/toxic.bin, drop_if: {toxic: 0.8}}
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from lmforge.common.errors import ConfigError
from lmforge.common.s3 import S3Location
from lmforge.common.storage import open_store
from lmforge.common.store import scheme_of
from lmforge.dataprep.classifier_text import DEFAULT_MAX_CHARS, label_name, predict_probabilities
from lmforge.dataprep.document import Document
from lmforge.dataprep.step_base import BaseFilter
from lmforge.dataprep.step_registry import StepSettings, require_model


class ClassifierSettings(StepSettings):
    model_path: str | None = Field(
        None, description="the fastText model (.bin or .ftz): a local path or an s3:// URI, downloaded once per "
                          "process (required)")
    keep_if: dict[str, float] = Field(
        default_factory=dict, description="keep a document only when P(label) >= the minimum for every label named, "
                                          "e.g. {hq: 0.5}; DCLM keeps the top 10% by P(hq) of its crawl")
    drop_if: dict[str, float] = Field(
        default_factory=dict, description="drop a document when P(label) >= the minimum for any label named, "
                                          "e.g. {toxic: 0.8}; with neither rule the step only scores")
    record: list[str] | None = Field(
        None, description="labels whose probability is kept as a score; default: the labels of keep_if and "
                          "drop_if, or every label of the model when neither is set")
    score_prefix: str | None = Field(None, description="scores are named <prefix>:<label>; default: the step id")
    k: int = Field(-1, ge=-1, description="labels fastText returns per document (-1: all); a label outside "
                                          "the top k has probability 0")
    max_chars: int = Field(
        DEFAULT_MAX_CHARS, ge=1, description="characters of each document scored (from its start; the model "
                                             "should be trained with the same train-classifier --max-chars)")

    @field_validator("keep_if", "drop_if")
    @classmethod
    def _probabilities(cls, rules: dict[str, float]) -> dict[str, float]:
        outside = [label for label, minimum in rules.items() if not 0.0 <= minimum <= 1.0]
        if outside:
            raise ValueError(f"a label's minimum is a probability, 0 to 1: {', '.join(outside)}")
        return rules

    @field_validator("k")
    @classmethod
    def _k(cls, k: int) -> int:
        if k == 0:
            raise ValueError("k is -1 (every label) or at least 1")
        return k

    def check_in_pipeline(self, step_id: str) -> None:
        require_model(self.model_path, step_id, "a fastText model, `lmforge-dataprep train-classifier` trains one")


# model URI -> loaded model: one download and one load per process, whatever the number of steps
_MODELS: dict[str, object] = {}


def load_model(uri: str, step_id: str):
    model = _MODELS.get(uri)
    if model is None:
        import fasttext

        if scheme_of(uri) == "s3":
            loc = S3Location.parse(uri)
            parent, _, name = loc.key.rpartition("/")
            local = open_store(f"s3://{loc.bucket}/{parent}").local_path(name)  # a temp copy, removed at exit
        else:
            local = Path(uri)
            if not local.is_file():
                raise ConfigError(f"steps.{step_id}.model_path: fastText model not found: {uri}")
        try:
            model = fasttext.load_model(str(local))
        except ValueError as exc:  # not a fastText model file
            raise ConfigError(f"steps.{step_id}.model_path: cannot load {uri}: {exc}") from None
        _MODELS[uri] = model
    return model


class ClassifierFilter(BaseFilter):
    """Records P(label) of the chosen labels on every document it sees; drops by keep_if and drop_if."""

    type_name = "classifier"
    Settings = ClassifierSettings

    def __init__(self, settings: ClassifierSettings | None = None, name: str | None = None):
        super().__init__(name)
        self.settings = settings = settings or ClassifierSettings()
        if not settings.model_path:
            raise ConfigError(f"steps.{self.name}.model_path: a classifier step needs a fastText model")
        self.model = load_model(settings.model_path, self.name)
        model_labels = [label_name(label) for label in self.model.get_labels()]
        self.keep_if = {label_name(label): t for label, t in settings.keep_if.items()}
        self.drop_if = {label_name(label): t for label, t in settings.drop_if.items()}
        named = [*self.keep_if, *self.drop_if]
        record = [label_name(label) for label in settings.record] if settings.record is not None else None
        self.record = record if record is not None else list(dict.fromkeys(named)) or model_labels
        unknown = sorted((set(named) | set(self.record)) - set(model_labels))
        if unknown:
            raise ConfigError(f"steps.{self.name}: labels not in the model {settings.model_path}: "
                              f"{', '.join(unknown)} (its labels: {', '.join(model_labels)})")
        prefix = settings.score_prefix or self.name
        self.score_names = {label: f"{prefix}:{label}" for label in self.record}

    def filter(self, doc: Document) -> tuple[bool, str | None]:
        probabilities = predict_probabilities(self.model, doc.text, self.settings.max_chars, self.settings.k)
        for label, score_name in self.score_names.items():
            self.record_score(doc, score_name, probabilities.get(label, 0.0))
        for label, minimum in self.keep_if.items():
            if probabilities.get(label, 0.0) < minimum:
                return False, f"{label}_score_too_low"
        for label, minimum in self.drop_if.items():
            if probabilities.get(label, 0.0) >= minimum:
                return False, f"{label}_score_too_high"
        return True, None
