"""The canary's eval-set file: held-out texts for perplexity, and prompt → expected-continuation
checks. YAML, or JSON (a file ending in .json; same structure):

    name: tiny-demo                  # optional; shown in the table, stored in the baseline
    held_out:                        # ≥ 1 text, each scored through POST /v1/completions (echo + logprobs)
      - id: fox                      # optional, unique; default "held_out[INDEX]"
        text: "The quick brown fox jumps over the lazy dog."
      - "A plain string is a text without an id."
    checks:                          # ≥ 1 greedy continuation through POST /v1/completions
      - id: fox                      # optional, unique; default "checks[INDEX]"
        prompt: "The quick brown"
        expected: " fox jumps over the lazy dog."
        max_tokens: 16               # optional (default: the config's default_max_tokens)
        stop: ["\\n"]                 # optional, at most 4 stop strings

The perplexity is pooled by token over all held-out texts: exp(−Σ logprob / Σ scored tokens),
where each text's first token is not scored. The score is the fraction of checks passed; a
check passes when the greedy output (temperature 0) starts with `expected`, both with
whitespace normalised (runs of whitespace → one space, ends stripped). Each text, and each
prompt plus its max_tokens, must fit the served model's context.

A file that cannot be used raises InputError (exit 3) naming the file and the bad entry, e.g.
`checks[2] (id 'fox'): expected: Field required`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lmforge.common.errors import InputError

MAX_STOPS = 4


def normalize_whitespace(text: str) -> str:
    return " ".join(text.split())


def continuation_passes(output: str, expected: str) -> bool:
    return normalize_whitespace(output).startswith(normalize_whitespace(expected))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HeldOutText(_Strict):
    id: str = Field("", description="default: held_out[INDEX]")
    text: str = Field(min_length=1)

    @field_validator("text")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value


class Check(_Strict):
    id: str = Field("", description="default: checks[INDEX]")
    prompt: str = Field(min_length=1)
    expected: str
    max_tokens: int | None = Field(None, ge=1)
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOPS)

    @field_validator("expected")
    @classmethod
    def _expected_not_blank(cls, value: str) -> str:
        if not normalize_whitespace(value):
            raise ValueError("must not be blank (a blank expectation passes anything)")
        return value

    @field_validator("stop")
    @classmethod
    def _stops_not_empty(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop strings must not be empty")
        return value


class EvalSet(_Strict):
    name: str = ""
    held_out: list[HeldOutText] = Field(min_length=1)
    checks: list[Check] = Field(min_length=1)

    @property
    def sha256(self) -> str:
        """A fingerprint of what is evaluated (not the name): a baseline is only comparable with
        a run of the same texts and checks."""
        body = self.model_dump(mode="json", exclude={"name"})
        return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _entry(data: Any, loc: tuple) -> str:
    """`checks[2] (id 'fox')` for an error at ('checks', 2, ...)."""
    if len(loc) < 2 or not isinstance(loc[1], int):
        return str(loc[0]) if loc else "<top level>"
    where = f"{loc[0]}[{loc[1]}]"
    try:
        item = data[loc[0]][loc[1]]
    except (KeyError, IndexError, TypeError):
        return where
    if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"]:
        where += f" (id {item['id']!r})"
    return where


def _describe(err: ValidationError, data: Any) -> list[str]:
    problems = []
    for item in err.errors():
        loc = item["loc"]
        field = ".".join(str(p) for p in loc[2:]) if len(loc) > 2 and isinstance(loc[1], int) else ""
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        problems.append(f"{_entry(data, loc)}: {field + ': ' if field else ''}{message}")
    return problems


def _normalise(data: Any) -> Any:
    """Plain strings in held_out are texts without an id."""
    if isinstance(data, dict) and isinstance(data.get("held_out"), list):
        data = {**data, "held_out": [{"text": t} if isinstance(t, str) else t for t in data["held_out"]]}
    return data


def parse_eval_set(data: Any, source: str = "eval set") -> EvalSet:
    if not isinstance(data, dict):
        raise InputError(f"{source}: must be a mapping with `held_out` and `checks` lists")
    data = _normalise(data)
    try:
        evalset = EvalSet.model_validate(data)
    except ValidationError as exc:
        lines = "\n  ".join(_describe(exc, data))
        raise InputError(f"{source}: invalid eval set:\n  {lines}") from exc
    held_out = [t if t.id else t.model_copy(update={"id": f"held_out[{i}]"}) for i, t in enumerate(evalset.held_out)]
    checks = [c if c.id else c.model_copy(update={"id": f"checks[{i}]"}) for i, c in enumerate(evalset.checks)]
    for kind, items in (("held_out", held_out), ("checks", checks)):
        seen: dict[str, int] = {}
        for index, item in enumerate(items):
            if item.id in seen:
                raise InputError(f"{source}: invalid eval set:\n  {kind}[{index}]: id {item.id!r} is already used "
                                 f"by {kind}[{seen[item.id]}]")
            seen[item.id] = index
    return evalset.model_copy(update={"held_out": held_out, "checks": checks})


def load_eval_set(path: str | Path) -> EvalSet:
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read eval set {path}: {exc}") from exc
    try:
        data = json.loads(raw) if path.suffix.lower() == ".json" else yaml.safe_load(raw)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from exc
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {exc}") from exc
    return parse_eval_set(data, str(path))
