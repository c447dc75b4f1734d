"""The data-prep stage graph, declared once: every stage, in order, and how its tasks are run.

Everything that runs data prep is built from this list or checked against it (a test fails when
one drifts): the local stage runs (stage_runs.STAGE_RUNS), the CLI's stage commands (cli.py), the KFP
data pipeline (pipelines/…/data_pipeline.py builds a step or a ParallelFor per stage), the Helm
chart's Jobs (helm/lmforge/dataprep-stages.json, written from here by `make docs`, which
templates/dataprep.yaml ranges over) and the plain-manifest example
(k8s/examples/dataprep-indexed-job.yaml).

A stage is one of:
- the workers (`inputs`): an Indexed Job over the inputs (the `run` command);
- indexed: an Indexed Job of `dataprep.stages.<name>.tasks` pods, each running its slice
  (stage_runs.worker_slice) of the stage's task list;
- single: one pod;
- rounds: an indexed stage run as one Indexed Job per round, up to `components.max_rounds`
  rounds; a round after the result stopped changing does nothing.

Stages run strictly one after another; each task skips work already marked done, so any stage
can be rerun.

This module imports nothing heavy: the KFP pipeline compiles from it without the data-prep
dependencies.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

WORKERS, INDEXED, SINGLE, ROUNDS = "workers", "indexed", "single", "rounds"


@dataclass(frozen=True)
class Stage:
    name: str  # the CLI command (`run` for the workers), the Job's role, the KFP step's name
    kind: str  # WORKERS, INDEXED, SINGLE or ROUNDS
    task: str  # what one task covers
    help: str  # the CLI help and the KFP step's display text

    @property
    def split(self) -> bool:
        """Whether its tasks are shared between the pods of an Indexed Job."""
        return self.kind != SINGLE


STAGES: tuple[Stage, ...] = (
    Stage("inputs", WORKERS, "one input",
          "read → filters → MinHash signatures and dedup keys of one slice of the inputs"),
    Stage("combine", INDEXED, "one input group × one range of dedup partitions",
          "gather one slice of the input groups' dedup keys into one object per group and partition range"),
    Stage("dedup", INDEXED, "one dedup partition (an LSH band, URL or content key range)",
          "find the duplicate edges of one slice of the dedup partitions"),
    Stage("components", ROUNDS, "one share of the duplicate graph's nodes, in one round",
          "one round of the duplicate clusters' connected components (all rounds without --round)"),
    Stage("tokenizer", SINGLE, "the whole run",
          "train the BPE tokenizer on a bounded sample (or load tokenizer.path)"),
    Stage("tokenize", INDEXED, "one input",
          "tokenize one slice of the inputs, less the duplicates"),
    Stage("shards", INDEXED, "one shard partition",
          "shuffle and write the shards of one slice of the shard partitions"),
    Stage("trace-index", INDEXED, "one index partition",
          "build the exact-match trace index (suffix array + lineage) of one slice of the index partitions, "
          "each trace_index.shard_partitions_per_index shard partitions (nothing unless trace_index.enabled)"),
    Stage("report", SINGLE, "the whole run",
          "write manifest.json (once every shard partition is written), report.json and report.html"),
)

BY_NAME = {stage.name: stage for stage in STAGES}
GLOBAL_STAGES = tuple(stage for stage in STAGES if stage.kind != WORKERS)  # after the workers
NAMES = tuple(stage.name for stage in STAGES)
DEFAULT_MAX_ROUNDS = 32  # config.ComponentsConfig.max_rounds's default (a test holds them equal)


def stage(name: str) -> Stage:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a data-prep stage ({', '.join(NAMES)})") from None


def chart_json() -> str:
    """The chart's copy of the global stages (helm/lmforge/dataprep-stages.json)."""
    payload = {"_generated_by": "make docs (lmforge.tooling.dataprep_stages)",
               "defaultMaxRounds": DEFAULT_MAX_ROUNDS,
               "stages": [asdict(s) for s in GLOBAL_STAGES]}
    return json.dumps(payload, indent=1) + "\n"
