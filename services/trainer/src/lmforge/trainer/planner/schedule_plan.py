"""`lmforge-train plan --schedule FILE`: a plan for each stage of a training schedule, and the run's totals.

The file is the trainer's own `schedule:` (lmforge.trainer.config.StageSection, lmforge.trainer.schedule):
either a trainer config holding `schedule:` (and optionally `steps`, `data.seq_len`, `data.sources`), or
just the list of stages. The stages are resolved by the trainer's own code: a TrainConfig is built with
them (each stage's `batch_size` set to 1, since the planner chooses it) and lmforge.trainer.schedule's
resolve_stages fills the inherited fields and refuses what the trainer would refuse (the first stage not
at 0, starts out of order, a batch that is not whole sequences, lengths that do not divide the longest,
a mixture naming no source when the file lists data.sources). TrainingPlan then places the stages over
the steps exactly as the trainer does: a stage starts at the first step that begins at or past its
start_tokens, so a stage's span is a whole number of its steps.

The run's length is `--tokens` (it wins), else the file's `steps`; the last stage runs until then.

Each stage is searched as a plan of its own (lmforge.trainer.planner.search, the same model, cluster,
pins and assumptions) for its sequence length and its global batch in sequences; its recommended
layout gives the stage's memory, step time and, over the stage's steps, its days, GPU-hours and cost.
A stage whose sequences only fit with context parallelism, or a smaller micro-batch, gets that layout.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from lmforge.common.config import format_validation_error, yaml_document
from lmforge.common.errors import ConfigError
from lmforge.trainer.planner.request import build_request
from lmforge.trainer.planner.search import Candidate, PlanRequest, search
from lmforge.trainer.schedule import Stage, TrainingPlan, resolve_stages

NEVER = 2**62  # steps for placing the stages before the run's length is known


@dataclass(frozen=True)
class ScheduleFile:
    stages: list[dict[str, Any]]  # as written (StageSection fields)
    steps: int | None
    data_seq_len: int | None
    sources: list[dict[str, Any]] | None


@dataclass(frozen=True)
class StagePlan:
    stage: Stage  # placed: first_step, tokens_before
    steps: int
    request: PlanRequest
    candidates: list[Candidate]
    evaluated: int

    @property
    def best(self) -> Candidate | None:
        return next((c for c in self.candidates if c.fits), None)

    @property
    def tokens(self) -> int:
        return self.steps * self.stage.global_batch_tokens


@dataclass(frozen=True)
class SchedulePlan:
    stages: list[StagePlan]
    written: list[dict[str, Any]]  # each stage as the file wrote it
    steps: int
    tokens: int
    model: dict[str, Any]  # preset and overrides, as the trainer's model section
    data_seq_len: int  # data.seq_len the stages were resolved with (document masking's default follows it)

    @property
    def fits(self) -> bool:
        return all(stage.best is not None for stage in self.stages)


def read_schedule_file(path: str) -> ScheduleFile:
    """The file's stages (and steps, data.seq_len, data.sources when it is a trainer config); one-line errors."""
    data = yaml_document(path, "--schedule: file")
    if isinstance(data, dict):
        if not data.get("schedule"):
            raise ConfigError(f"--schedule: {path} holds a mapping without a `schedule:` list of stages")
        data_section = data.get("data") or {}
        if not isinstance(data_section, dict):
            raise ConfigError(f"--schedule: {path}: data is not a mapping")
        steps = data.get("steps")
        if steps is not None and (not isinstance(steps, int) or steps < 1):
            raise ConfigError(f"--schedule: {path}: steps must be a whole number of steps, got {steps!r}")
        stages, seq_len, sources = data["schedule"], data_section.get("seq_len"), data_section.get("sources")
    else:
        stages, steps, seq_len, sources = data, None, None, None
    if not isinstance(stages, list) or not stages or not all(isinstance(s, dict) for s in stages):
        raise ConfigError(f"--schedule: {path} must hold a list of stages (mappings), or a trainer config whose "
                          "`schedule:` is one")
    return ScheduleFile(stages, steps, seq_len, sources)


def data_seq_len(schedule: ScheduleFile, default: int | None) -> int:
    """data.seq_len for the stages: the file's, else the first stage's, else --seq-len."""
    seq_len = schedule.data_seq_len or schedule.stages[0].get("seq_len") or default
    if not seq_len:
        raise ConfigError("--schedule: schedule[0].seq_len: the first stage needs one (or data.seq_len, --seq-len)")
    return seq_len


def resolve(schedule: ScheduleFile, model: dict[str, Any], seq_len: int) -> list[Stage]:
    """The stages as the trainer resolves them (inherited fields filled), unplaced, for data.seq_len
    `seq_len`; ConfigError as the trainer's, on one line."""
    names = sorted({name for stage in schedule.stages for name in (stage.get("mixture") or {})})
    sources = schedule.sources or [{"path": name} for name in names or ["data"]]
    try:
        from lmforge.trainer.config import TrainConfig

        config = TrainConfig(
            model=model,
            data={"sources": sources, "seq_len": seq_len, "batch_size": 1},
            schedule=[{**stage, "batch_size": 1} for stage in schedule.stages],
        )
    except ValidationError as exc:
        problems = format_validation_error(exc, "--schedule").splitlines()[1:]
        raise ConfigError("--schedule: " + "; ".join(line.strip() for line in problems)) from exc
    try:
        return resolve_stages(config)
    except ConfigError as exc:
        raise ConfigError(f"--schedule: {exc}") from exc


def place(stages: list[Stage], tokens: float | None, steps: int | None) -> TrainingPlan:
    """The stages over the run's steps as the trainer places them; the run ends at the first step boundary
    at or past `tokens` (else after the file's `steps`)."""
    if tokens is not None:
        last = TrainingPlan(stages, NEVER).stages[-1]
        if tokens <= last.tokens_before:
            raise ConfigError(f"--tokens: {tokens:.4g} tokens end before the last stage {last.name!r} starts "
                              f"({last.tokens_before:.4g} tokens)")
        steps = last.first_step + math.ceil((tokens - last.tokens_before) / last.global_batch_tokens)
    elif steps is None:
        raise ConfigError("--schedule: give --tokens (the run's length), or `steps` in the file")
    try:
        return TrainingPlan(stages, steps)
    except ConfigError as exc:
        raise ConfigError(f"--schedule: {exc}") from exc


def plan_schedule(args: argparse.Namespace) -> SchedulePlan:
    """Every stage's search, over the one model and cluster the arguments name."""
    schedule = read_schedule_file(args.schedule)
    seq_len = data_seq_len(schedule, args.seq_len)
    lengths = [s.get("seq_len") for s in schedule.stages] + [seq_len]
    longest = max((n for n in lengths if isinstance(n, int)), default=0)  # a bad one is refused by resolve
    # the base request: the model (its context stretched to the longest stage, as a single plan does), cluster,
    # pins and assumptions; each stage replaces its sequence length, batch and tokens
    base_args = argparse.Namespace(**{**vars(args), "seq_len": longest or None, "tokens": args.tokens or 1.0})
    base, model = build_request(base_args)
    stages = resolve(schedule, model, seq_len)
    placed = place(stages, args.tokens, schedule.steps)
    plans = []
    for index, stage in enumerate(placed.stages):
        end = placed.stages[index + 1].first_step if index + 1 < len(placed.stages) else placed.steps
        steps = end - stage.first_step
        request = replace(base, seq_len=stage.seq_len, global_batch=stage.sequences,
                          tokens=steps * stage.global_batch_tokens)
        try:
            candidates, evaluated = search(request)
        except ConfigError as exc:
            raise ConfigError(f"stage {stage.name!r}: {exc}") from exc
        plans.append(StagePlan(stage, steps, request, candidates, evaluated))
    return SchedulePlan(plans, schedule.stages, placed.steps, placed.total_tokens, model, seq_len)
