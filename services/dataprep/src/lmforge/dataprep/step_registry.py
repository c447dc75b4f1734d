"""The steps a data-prep pipeline can be composed of, and how a config names them.

A step type is a class with `type_name` and a `Settings` model (a `StepSettings`); the
config's `pipeline` lists step ids in order and `steps.<id>` holds each one's settings. A
built-in step's id is its type; any other id names its type in `steps.<id>.type`, which may
also be "package.module:Class" for a step that lives outside lmforge. Every step module keeps
its heavy imports (fastText, torch, KenLM) inside the step's constructor: the config imports
every built-in step's module to check its settings when it loads.
"""

from __future__ import annotations

import importlib
import traceback
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from lmforge.common.config import StrictModel
from lmforge.common.errors import ConfigError


class StepSettings(StrictModel):
    """Settings every step has; a step type's `Settings` adds its own fields."""

    enabled: bool = Field(True, description="false leaves the step out of the pipeline")
    type: str | None = Field(
        None, description="the step type of an id that is not a built-in step's (a built-in name or module:Class)")

    @property
    def passes_everything(self) -> bool:
        """True when these settings leave the step nothing to do (a contamination check without eval
        sets): the pipeline then leaves it out, as if disabled."""
        return False

    def check_in_pipeline(self, step_id: str) -> None:
        """What a step in the pipeline needs beyond valid settings (a model file): checked when the config
        loads, so a run that cannot start writes nothing; a ValueError says what is missing."""


# type name -> "module:Class". The order is the order of the configuration reference.
BUILTIN_STEPS: dict[str, str] = {
    "url_dedup": "lmforge.dataprep.steps.dedup:UrlDedupFilter",
    "exact_dedup": "lmforge.dataprep.steps.dedup:ExactDedupFilter",
    "langid": "lmforge.dataprep.steps.langid:LanguageFilter",
    "gopher_repetition": "lmforge.dataprep.steps.quality:GopherRepetitionFilter",
    "gopher_quality": "lmforge.dataprep.steps.quality:GopherQualityFilter",
    "pii": "lmforge.dataprep.steps.pii:PIIScrubber",
    "contamination": "lmforge.dataprep.steps.contamination:ContaminationFilter",
    "url_filter": "lmforge.dataprep.steps.url_filter:UrlFilter",
    "fineweb_quality": "lmforge.dataprep.steps.fineweb:FineWebQualityFilter",
    "c4_quality": "lmforge.dataprep.steps.c4:C4QualityFilter",
    "toxicity_words": "lmforge.dataprep.steps.toxicity:ToxicityWordsFilter",
    "perplexity": "lmforge.dataprep.steps.perplexity:PerplexityFilter",
    "classifier": "lmforge.dataprep.steps.classifier:ClassifierFilter",
}

# FineWeb's order (Penedo et al. 2024, section 3): URL filter, language, Gopher repetition and
# quality, C4's rules (without the terminal-punctuation one), FineWeb's own; then PII and the
# contamination check. The classifier, perplexity and toxicity steps need a model or a choice of
# lists, and are the user's to add.
DEFAULT_PIPELINE: tuple[str, ...] = (
    "url_dedup", "exact_dedup", "url_filter", "langid", "gopher_repetition", "gopher_quality", "c4_quality",
    "fineweb_quality", "pii", "contamination")


@cache
def step_class(type_name: str) -> type:
    """The class of a built-in step type or of a "module:Class" path. A module that cannot be
    imported, whatever it raised, is a ConfigError (which pydantic does not catch): the config
    stops loading with that one line."""
    spec = BUILTIN_STEPS.get(type_name, type_name)
    module_name, sep, class_name = spec.partition(":")
    if not sep:
        raise ValueError(f"unknown step type {type_name!r}; built-in types: {', '.join(BUILTIN_STEPS)} "
                          f"(or module:Class)")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a user's module may raise anything while it loads
        message = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line
        raise ConfigError(f"step type {type_name!r} cannot be imported: importing {module_name} raised "
                          f"{message}{_raised_at(exc)}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ConfigError(f"step type {type_name!r} cannot be imported: module {module_name} has no {class_name}")
    if not isinstance(getattr(cls, "Settings", None), type) or not issubclass(cls.Settings, StepSettings):
        raise ValueError(f"step type {type_name!r}: {spec} has no Settings (a StepSettings subclass)")
    return cls


def _raised_at(exc: BaseException) -> str:
    """` (file, line N)` of the innermost frame outside the import machinery, if any."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)[1:]  # [0]: step_class's own call
              if not f.filename.startswith("<") and Path(f.filename).parent.name != "importlib"]
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def settings_for(step_id: str, raw: Any) -> StepSettings:
    """Validate one step's settings (a mapping, or a model already); a ValueError names the step
    (pydantic reports it at `steps` and load_config turns it into a ConfigError), and so does the
    ConfigError of a step type that cannot be imported."""
    if isinstance(raw, StepSettings):
        raw = raw.model_dump(exclude_unset=True)
    raw = dict(raw or {})
    type_name = raw.get("type") or step_id
    if step_id in BUILTIN_STEPS and type_name != step_id:
        raise ValueError(f"steps.{step_id}: a built-in step's type cannot be changed (got type {type_name!r}); "
                          f"give the step another id")
    if step_id not in BUILTIN_STEPS and not raw.get("type"):
        raise ValueError(f"pipeline step {step_id!r} is not a built-in step; name its type in "
                          f"steps.{step_id}.type (built-in types: {', '.join(BUILTIN_STEPS)})")
    try:
        cls = step_class(type_name)
    except ConfigError as exc:
        raise ConfigError(f"steps.{step_id}: {exc}") from None
    try:
        return cls.Settings.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '<root>'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"steps.{step_id} ({type_name}): {problems}") from None


def require_model(path: str | None, step_id: str, what: str) -> None:
    """A model step's `model_path`: set, and a local file or folder that exists (s3:// is read when the step starts)."""
    if not path:
        raise ValueError(f"steps.{step_id}.model_path: required ({what})")
    if "://" not in path and not Path(path).exists():
        raise ValueError(f"steps.{step_id}.model_path: not found: {path}")


def build_step(step_id: str, settings: StepSettings):
    """An instance of the step `step_id`, named by its id (its stats, rejects and report rows)."""
    return step_class(settings.type or step_id)(settings, step_id)
