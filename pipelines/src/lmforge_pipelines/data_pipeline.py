"""The data pipeline: WET files → parallel data-prep workers → every global stage of
lmforge.dataprep.stages in its order (a split stage a ParallelFor over its tasks, a rounds stage
one ParallelFor per round, a single stage one step) → the report as an HTML artifact.

    fetch-wet ─► plan-workers ─► ParallelFor(prep-worker i of workers)
      ─► for each global stage (combine, dedup, components × rounds, tokenizer, tokenize, shards):
           split:  plan-tasks ─► ParallelFor(stage-task i of stage_tasks[stage])
           single: single-stage
      ─► report-data ─► dataset (Dataset), report (HTML), metrics (Metrics)
    (each step after a ParallelFor takes its tasks' outputs fanned in, dsl.Collected)

The steps come from the stage list, so a stage added there appears here (and in the chart and
the CLI) at once; tests/pipelines/test_compile.py checks the compiled graph against it. A round
after the components stopped changing only marks its tasks done.

Every step reads and writes one storage location, `output` (an s3:// prefix on a cluster, a
local directory with kfp.local): the WET files go to <output>/wet/, the prepared data (shards/,
tokenizer.json, manifest.json, lineage/, rejects/, report.*) to <output>. A rerun with the same
`output` resumes (finished inputs and tasks are skipped); one with other inputs or config into
the same `output` fails with a message saying so. Compiling it needs the `data` extra
(lmforge.dataprep.stages, which imports nothing heavy).
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Dataset

from lmforge.dataprep.stages import DEFAULT_MAX_ROUNDS, GLOBAL_STAGES, ROUNDS, SINGLE
from lmforge_pipelines.components import (
    fetch_wet,
    plan_tasks,
    plan_workers,
    prep_worker,
    report_data,
    single_stage,
    stage_task,
)

# What the steps ask of the cluster (kfp.local ignores these). A global-stage task stays under
# 1.5 GB RSS whatever the input size (as the chart's dataprep.stages).
WORKER_CPU, WORKER_MEMORY = "1", "4Gi"
TASK_CPU, TASK_MEMORY = "1", "2Gi"


def _on_cluster(task: dsl.PipelineTask, name: str) -> dsl.PipelineTask:
    task.set_display_name(name).set_caching_options(False)
    return task.set_cpu_request(TASK_CPU).set_memory_request(TASK_MEMORY).set_memory_limit(TASK_MEMORY)


class DataOutputs(NamedTuple):
    dataset: Dataset  # the prepared data (a pointer: manifest.json, metadata uri)
    report: HTML  # report.html, shown in the run's visualizations
    data: str  # the data location, the train pipeline's `data`


def split_stage_tasks(tasks: int) -> dict[str, int]:
    """`tasks` tasks for every split global stage (the pipeline's stage_tasks)."""
    return {stage.name: tasks for stage in GLOBAL_STAGES if stage.split}


DEFAULT_STAGE_TASKS = split_stage_tasks(8)  # the chart's dataprep.stages.<name>.tasks defaults


def build_data_pipeline(rounds: int = DEFAULT_MAX_ROUNDS):
    """The pipeline, with `rounds` rounds of the components stage (components.max_rounds: a KFP
    graph is fixed when compiled)."""

    @dsl.pipeline(
        name="lmforge-data",
        description="Common Crawl WET files → filtered, deduplicated, tokenized training shards, with a report.",
    )
    def data_pipeline(
        crawl: str = "sample",
        shards: int = 2,
        languages: str = "en",
        workers: int = 2,
        output: str = "s3://lmforge/datasets/sample",
        base_url: str = "https://data.commoncrawl.org",
        input_kind: str = "wet",
        processes_per_worker: int = 1,
        stage_tasks: dict = DEFAULT_STAGE_TASKS,  # noqa: B006 - KFP reads the default from the signature
        processes_per_task: int = 1,
        dataprep_config: dict = {},  # noqa: B006
    ) -> DataOutputs:
        """Prepare training data from Common Crawl.

        Args:
            crawl: Common Crawl crawl id (e.g. CC-MAIN-2024-22), or "sample": the WET files placed
                under <output>/wet/ beforehand (`lmforge-sample-data --output <output>/wet --files N`).
            shards: Number of WET files (the crawl's first N, or the first N placed ones).
            languages: Languages to keep, comma-separated fastText codes (e.g. "en" or "en,de").
            workers: Parallel data-prep workers; the WET files are split between them.
            output: Where the prepared data goes (s3://BUCKET/PREFIX; a local directory with kfp.local).
            base_url: Common Crawl mirror: https://data.commoncrawl.org or s3://commoncrawl.
            input_kind: "wet" (the crawl's text) or "warc" (its HTML responses; the workers extract the main text).
            processes_per_worker: Local processes inside each worker.
            stage_tasks: Parallel tasks of each split global stage (combine, dedup, components, tokenize, shards),
                each taking a slice of the stage's work; a stage left out gets 1.
            processes_per_task: Local processes inside each task of a split stage.
            dataprep_config: More data-prep config as nested keys, e.g. {"tokenizer": {"vocab_size": 32768}}.
        """
        fetch = fetch_wet(crawl=crawl, shards=shards, base_url=base_url, output=output, input_kind=input_kind)
        fetch.set_display_name("fetch WET files").set_caching_options(False)
        plan = plan_workers(inputs=fetch.output, workers=workers)
        plan.set_display_name("plan workers").set_caching_options(False)
        # Inside each loop only the item and pipeline parameters are used: the workers read the input
        # list from <output>/wet/inputs.json (a task output passed into a ParallelFor would be the
        # loop item under kfp.local 2.17, and a long list is a large Argo parameter on a cluster).
        with dsl.ParallelFor(plan.output) as index:
            worker = prep_worker(output=output, worker_index=index, num_workers=workers, languages=languages,
                                 dataprep_config=dataprep_config, processes=processes_per_worker)
            worker.set_display_name("data-prep worker").set_caching_options(False)
            worker.set_cpu_request(WORKER_CPU).set_memory_request(WORKER_MEMORY).set_memory_limit(WORKER_MEMORY)

        # The global stages read the config the workers recorded under `output`. A step after a
        # ParallelFor takes its tasks' outputs fanned in (dsl.Collected), so it starts after all of
        # them; one after a single step waits with .after() (a list holding a task output is a
        # placeholder inside a constant in the IR, which not every runner resolves).
        last, fanned_in = worker, True
        for stage in GLOBAL_STAGES:
            if stage.name == "report":
                break
            if stage.kind == SINGLE:
                step = single_stage(stage=stage.name, output=output,
                                    done=dsl.Collected(last.output) if fanned_in else [])
                last, fanned_in = _on_cluster(step if fanned_in else step.after(last), stage.name), False
                continue
            for round_ in range(rounds if stage.kind == ROUNDS else 1):
                plan = plan_tasks(stage=stage.name, stage_tasks=stage_tasks, output=output, round=round_,
                                  done=dsl.Collected(last.output) if fanned_in else [])
                plan = plan if fanned_in else plan.after(last)
                plan.set_display_name(f"plan {stage.name} tasks").set_caching_options(False)
                with dsl.ParallelFor(plan.output) as index:
                    task = stage_task(stage=stage.name, output=output, task_index=index, stage_tasks=stage_tasks,
                                      processes=processes_per_task, round=round_)
                    last, fanned_in = _on_cluster(task, f"{stage.name} task"), True

        final = _on_cluster(report_data(output=output, done=dsl.Collected(last.output)), "manifest and report")
        return DataOutputs(final.outputs["dataset"], final.outputs["report"], final.outputs["Output"])

    return data_pipeline


data_pipeline = build_data_pipeline()
