"""The run's recipe over consumed tokens: stages of global batch, sequence length, data mixture,
RoPE and document masking (config `schedule`), laid out over the steps.

A stage holds from its `start_tokens` on: it starts at the first step that begins with at least
that many tokens consumed, and every step of it consumes exactly its `global_batch_tokens`. So
which stage a step is in, the tokens consumed before it and its global batch in sequences are a
pure function of the config and the step: the same on every rank, after a restart and on another
world size. Only how a step's sequences are cut into micro-batches depends on the layout:
`micro_batches(step)` = the step's sequences / (data-parallel ranks × sequences per rank per
micro-batch). A stage whose batch does not divide so on the run's layout is one planned for
another: the run refuses to start in it, and a run that reaches it stops there (after checkpointing
the step before, exit 8) to be resumed on the stage's layout (`lmforge-train plan --schedule`).

- **Batch-size ramp**: stages with growing `global_batch_tokens` (Llama 3's 4M → 8M → 16M). The
  per-device micro-batch stays, only the number of micro-batches grows. The learning rate is a
  function of consumed tokens, not steps (lmforge.trainer.optim.learning_rate): warmup, cosine and
  WSD's decay are placed in tokens, and the LR is not rescaled with the batch (as Llama 3 and
  OLMo 2 ramp the batch at the schedule's LR).
- **Sequence-length curriculum**: stages with growing `seq_len`, the same token stream packed into
  longer sequences (the sampler reads the longest stage's sequences and cuts them into the
  stage's; lmforge.trainer.sampling), each with its RoPE base and scaling. `document_masking`
  (attention within a document) defaults to on for a stage longer than data.seq_len.
- **Data-mixture stages**: `mixture` weights by source name, e.g. a final anneal on chosen
  sources while WSD's decay runs.

Without `schedule` the plan is one stage of data.seq_len with grad_accum micro-batches of
data.batch_size sequences per rank: the run as it always was.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import reduce

from lmforge.common.errors import ConfigError
from lmforge.model.config import RopeScaling
from lmforge.trainer.config import TrainConfig


@dataclass(frozen=True)
class Stage:
    """One stage, resolved: every setting known, placed over the steps."""

    index: int
    name: str
    start_tokens: int  # as configured
    seq_len: int
    sequences: int  # the global batch in sequences (each step)
    batch_size: int  # sequences per rank per micro-batch
    mixture: tuple[float, ...]  # weight per source (config order), not normalised
    rope_theta: float | None  # None: the model's own
    rope_scaling: RopeScaling | None  # None: the model's own
    document_masking: bool
    mesh: tuple[tuple[str, int], ...] = ()  # the degrees it is planned for; () any
    first_step: int = 0
    tokens_before: int = 0  # consumed before first_step
    sequences_before: int = 0  # drawn before first_step (sequences of their own stage's length)

    @property
    def global_batch_tokens(self) -> int:
        return self.sequences * self.seq_len

    def describe(self, source_names: list[str]) -> dict:
        total = sum(self.mixture)
        return {"stage": self.index, "name": self.name, "first_step": self.first_step,
                "start_tokens": self.tokens_before, "seq_len": self.seq_len,
                "global_batch_tokens": self.global_batch_tokens, "global_batch_sequences": self.sequences,
                "batch_size": self.batch_size, "rope_theta": self.rope_theta,
                "rope_scaling": self.rope_scaling.model_dump() if self.rope_scaling else None,
                "document_masking": self.document_masking,
                "mixture": {name: w / total for name, w in zip(source_names, self.mixture, strict=True)}}


def source_names(config: TrainConfig) -> list[str]:
    """The sources' names, as the metrics and schedule.mixture name them (the last part of their paths)."""
    return [s.path.rstrip("/").rsplit("/", 1)[-1] for s in config.data.sources]


def resolve_stages(config: TrainConfig, dp_size: int = 1, pipeline_microbatches: int = 1) -> list[Stage]:
    """The configured stages with every unset field inherited (ConfigError naming the stage when one
    is invalid); without a schedule, the one stage of the unscheduled run on dp_size ranks."""
    data, model = config.data, config.model.build() if not config.model.init_from else None
    names = source_names(config)
    base_mixture = tuple(float(s.weight) for s in data.sources)
    theta = scaling = None  # the model's
    if not config.schedule:
        per_rank = data.batch_size * pipeline_microbatches
        return [Stage(0, "stage-0", 0, data.seq_len, per_rank * config.grad_accum * dp_size, data.batch_size,
                      base_mixture, theta, scaling, data.document_masking)]
    if config.grad_accum != 1:
        raise ConfigError("grad_accum: a schedule derives the micro-batches from its global_batch_tokens; "
                          "leave grad_accum at 1")
    stages: list[Stage] = []
    previous = None
    for index, section in enumerate(config.schedule):
        where = f"schedule[{index}]"
        if index == 0 and section.start_tokens != 0:
            raise ConfigError(f"{where}.start_tokens: the first stage starts at 0, not {section.start_tokens}")
        if previous is not None and section.start_tokens <= previous.start_tokens:
            raise ConfigError(f"{where}.start_tokens: {section.start_tokens} is not after the previous stage's "
                              f"{previous.start_tokens}")
        seq_len = section.seq_len or (previous.seq_len if previous else data.seq_len)
        batch_tokens = section.global_batch_tokens or (previous.global_batch_tokens if previous else None)
        if batch_tokens is None:
            raise ConfigError(f"{where}.global_batch_tokens: the first stage needs one")
        if batch_tokens % seq_len:
            raise ConfigError(f"{where}.global_batch_tokens: {batch_tokens} is not a whole number of "
                              f"sequences of {seq_len} tokens")
        if section.batch_size is not None:
            batch_size = section.batch_size
        elif (data.batch_size * data.seq_len) % seq_len == 0 and data.batch_size * data.seq_len >= seq_len:
            batch_size = data.batch_size * data.seq_len // seq_len
        else:
            raise ConfigError(f"{where}.batch_size: data.batch_size x data.seq_len = {data.batch_size * data.seq_len} "
                              f"tokens is not a whole number of {seq_len}-token sequences; set the stage's batch_size")
        mixture = base_mixture if previous is None else previous.mixture
        if section.mixture is not None:
            unknown = sorted(set(section.mixture) - set(names))
            if unknown:
                raise ConfigError(f"{where}.mixture: no source named {', '.join(unknown)} (sources: "
                                  f"{', '.join(names)})")
            if any(w < 0 for w in section.mixture.values()) or sum(section.mixture.values()) <= 0:
                raise ConfigError(f"{where}.mixture: weights must be non-negative and not all zero")
            mixture = tuple(float(section.mixture.get(name, 0.0)) for name in names)
        masking = section.document_masking
        if masking is None:
            masking = True if seq_len > data.seq_len else data.document_masking
        stage = Stage(
            index, section.name or f"stage-{index}", section.start_tokens, seq_len, batch_tokens // seq_len,
            batch_size, mixture,
            section.rope_theta or (previous.rope_theta if previous else theta),
            section.rope_scaling or (previous.rope_scaling if previous else scaling),
            masking,
            tuple(sorted(section.mesh.items())) if section.mesh is not None else (previous.mesh if previous else ()))
        stages.append(stage)
        previous = stage
    _check_lengths(stages)
    if model is not None and max(s.seq_len for s in stages) > model.context_length:
        raise ConfigError(f"schedule: a {max(s.seq_len for s in stages)}-token stage exceeds the model's "
                          f"context_length {model.context_length} (model.overrides.context_length)")
    return stages


def _check_lengths(stages: list[Stage]) -> None:
    shortest, longest = min(s.seq_len for s in stages), max(s.seq_len for s in stages)
    for stage in stages:
        if longest % stage.seq_len or stage.seq_len % shortest:
            raise ConfigError(f"schedule[{stage.index}].seq_len: {stage.seq_len} must divide the longest stage's "
                              f"{longest} and be a multiple of the shortest's {shortest} (sequences are cut from "
                              "the longest)")


class TrainingPlan:
    """The stages placed over config.steps steps for a layout of dp_size data-parallel ranks whose
    batches hold pipeline_microbatches × batch_size sequences per micro-batch."""

    def __init__(self, stages: list[Stage], steps: int, dp_size: int = 1, pipeline_microbatches: int = 1,
                 mesh: dict[str, int] | None = None):
        self.steps, self.dp_size, self.pipeline_microbatches = steps, dp_size, pipeline_microbatches
        self.mesh = mesh  # the run's degrees (MeshLayout.axes()); None: not checked
        placed: list[Stage] = []
        step = tokens = sequences = 0
        for stage in stages:
            if placed:
                last = placed[-1]
                run = max(0, math.ceil((stage.start_tokens - last.tokens_before) / last.global_batch_tokens))
                if run == 0:
                    raise ConfigError(f"schedule[{stage.index}].start_tokens: stage {last.name!r} would run no step")
                step, tokens = last.first_step + run, last.tokens_before + run * last.global_batch_tokens
                sequences = last.sequences_before + run * last.sequences
            if step >= steps:
                raise ConfigError(f"schedule[{stage.index}].start_tokens: {stage.start_tokens} tokens is not reached "
                                  f"in the run's {steps} steps")
            placed.append(Stage(**{**stage.__dict__, "first_step": step, "tokens_before": tokens,
                                   "sequences_before": sequences}))
        self.stages = placed
        self._firsts = [s.first_step for s in placed]
        # batch index i (the prefetcher's, the sampler's) = micro-batches before its step + its micro-batch
        self._micro_before = []
        micro = 0
        for index, stage in enumerate(placed):
            self._micro_before.append(micro)
            end = placed[index + 1].first_step if index + 1 < len(placed) else steps
            micro += (end - stage.first_step) * self._micro_batches(stage)

    @classmethod
    def of(cls, config: TrainConfig, dp_size: int = 1, pipeline_microbatches: int = 1,
           mesh: dict[str, int] | None = None) -> TrainingPlan:
        return cls(resolve_stages(config, dp_size, pipeline_microbatches), config.steps, dp_size,
                   pipeline_microbatches, mesh)

    @classmethod
    def uniform(cls, steps: int, tokens_per_step: int = 1) -> TrainingPlan:
        """A plan of one global batch of tokens_per_step one-token sequences: the schedules over plain steps."""
        return cls([Stage(0, "stage-0", 0, 1, tokens_per_step, tokens_per_step, (1.0,), None, None, False)], steps)

    def _micro_batches(self, stage: Stage) -> int:
        return max(1, stage.sequences // (self.dp_size * stage.batch_size * self.pipeline_microbatches))

    def layout_problem(self, stage: Stage) -> str | None:
        """Why this layout does not run the stage, or None: the stage is planned for another mesh, or its global
        batch does not split into this layout's micro-batches. Such a stage is reached by stopping before its
        first step and resuming on its layout."""
        other = {axis: degree for axis, degree in stage.mesh if self.mesh is not None and self.mesh[axis] != degree}
        if other:
            planned = ", ".join(f"{axis} {degree}" for axis, degree in stage.mesh)
            running = ", ".join(f"{axis} {self.mesh[axis]}" for axis in other)
            return f"schedule[{stage.index}] ({stage.name}) is planned for {planned}; this run has {running}"
        unit = self.dp_size * stage.batch_size * self.pipeline_microbatches
        if stage.sequences % unit == 0:
            return None
        return (f"schedule[{stage.index}] ({stage.name}): a global batch of {stage.sequences} sequences does not "
                f"split into micro-batches of {stage.batch_size} x {self.pipeline_microbatches} (pipeline) sequences "
                f"on {self.dp_size} data-parallel ranks")

    def stage(self, step: int) -> Stage:
        return self.stages[bisect.bisect_right(self._firsts, step) - 1]

    def micro_batches(self, step: int) -> int:
        """Micro-batches per rank of the step (grad_accum's role)."""
        return self._micro_batches(self.stage(step))

    def per_rank(self, step: int) -> int:
        """Sequences one rank reads per micro-batch (a pipeline's batch holds its micro-batches' sequences)."""
        return self.stage(step).batch_size * self.pipeline_microbatches

    def tokens_before(self, step: int) -> int:
        stage = self.stage(step)
        return stage.tokens_before + (step - stage.first_step) * stage.global_batch_tokens

    def sequences_before(self, step: int) -> int:
        stage = self.stage(step)
        return stage.sequences_before + (step - stage.first_step) * stage.sequences

    @property
    def total_tokens(self) -> int:
        return self.tokens_before(self.steps - 1) + self.stage(self.steps - 1).global_batch_tokens

    def tokens_after(self, step: int) -> int:
        return self.total_tokens if step >= self.steps - 1 else self.tokens_before(step + 1)

    def batch_index(self, step: int, micro: int = 0) -> int:
        stage = self.stage(step)
        return self._micro_before[stage.index] + (step - stage.first_step) * self._micro_batches(stage) + micro

    def locate(self, index: int) -> tuple[int, int]:
        """(step, micro-batch) of batch index `index` (the inverse of batch_index)."""
        at = bisect.bisect_right(self._micro_before, index) - 1
        stage = self.stages[at]
        step, micro = divmod(index - self._micro_before[at], self._micro_batches(stage))
        return stage.first_step + step, micro

    @property
    def seq_lens(self) -> tuple[int, int]:
        """(shortest, longest) stage sequence length."""
        return min(s.seq_len for s in self.stages), max(s.seq_len for s in self.stages)

    def stream_divisor(self) -> int:
        """The gcd of every stage's global batch in sequences: a stream count dividing it fits every step."""
        return reduce(math.gcd, (s.sequences for s in self.stages))
