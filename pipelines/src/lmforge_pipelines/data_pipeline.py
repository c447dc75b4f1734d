"""The data pipeline: WET files → parallel data-prep workers → every global stage fanned out
over its own tasks (dedup, tokenize and shards split, cluster and tokenizer one task each) → the
report as an HTML artifact.

    fetch-wet ─► plan-workers ─► ParallelFor(prep-worker i of n)
      ─► plan-tasks ─► ParallelFor(dedup-task i of dedup_tasks) ─► cluster-duplicates ─► train-tokenizer
      ─► plan-tasks ─► ParallelFor(tokenize-task i of tokenize_tasks)
      ─► plan-tasks ─► ParallelFor(shards-task i of shard_tasks) ─► report-data ─► dataset (Dataset)
                                                                                   report (HTML)
                                                                                   metrics (Metrics)
    (each step after a ParallelFor takes its tasks' outputs fanned in, dsl.Collected)

Every step reads and writes one storage location, `output` (an s3:// prefix on a cluster, a
local directory with kfp.local): the WET files go to <output>/wet/, the prepared data (shards/,
tokenizer.json, manifest.json, lineage/, rejects/, report.*) to <output>. A rerun with the same
`output` resumes (finished inputs and tasks are skipped); one with other inputs or config into
the same `output` fails with a message saying so.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Dataset

from lmforge_pipelines.components import (
    cluster_duplicates,
    dedup_task,
    fetch_wet,
    plan_tasks,
    plan_workers,
    prep_worker,
    report_data,
    shards_task,
    tokenize_task,
    train_tokenizer,
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
    dedup_tasks: int = 8,
    tokenize_tasks: int = 8,
    shard_tasks: int = 8,
    processes_per_task: int = 1,
    dataprep_config: dict = {},  # noqa: B006 - KFP reads the default from the signature
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
        dedup_tasks: Parallel dedup tasks; the dedup partitions (LSH bands, URL, content) are split between them.
        tokenize_tasks: Parallel tokenize tasks; the inputs are split between them.
        shard_tasks: Parallel shard-writing tasks; the shard partitions are split between them.
        processes_per_task: Local processes inside each dedup, tokenize and shard-writing task.
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

    # The global stages read the config the workers recorded under `output`. Each step after a
    # ParallelFor takes its tasks' outputs fanned in (dsl.Collected), so it starts after all of them.
    plan = plan_tasks(stage="dedup", tasks=dedup_tasks, done=dsl.Collected(worker.output))
    plan.set_display_name("plan dedup tasks").set_caching_options(False)
    with dsl.ParallelFor(plan.output) as index:
        dedup = _on_cluster(dedup_task(output=output, task_index=index, num_tasks=dedup_tasks,
                                       processes=processes_per_task), "dedup task")
    cluster = _on_cluster(cluster_duplicates(output=output, done=dsl.Collected(dedup.output)), "cluster duplicates")
    tokenizer = _on_cluster(train_tokenizer(output=output).after(cluster), "train tokenizer")

    # After a single task: .after() (a list holding a task output is a placeholder inside a
    # constant in the IR, which not every runner resolves).
    plan = plan_tasks(stage="tokenize", tasks=tokenize_tasks, done=[]).after(tokenizer)
    plan.set_display_name("plan tokenize tasks").set_caching_options(False)
    with dsl.ParallelFor(plan.output) as index:
        tokenize = _on_cluster(tokenize_task(output=output, task_index=index, num_tasks=tokenize_tasks,
                                             processes=processes_per_task), "tokenize task")

    plan = plan_tasks(stage="shards", tasks=shard_tasks, done=dsl.Collected(tokenize.output))
    plan.set_display_name("plan shard tasks").set_caching_options(False)
    with dsl.ParallelFor(plan.output) as index:
        shard = _on_cluster(shards_task(output=output, task_index=index, num_tasks=shard_tasks,
                                        processes=processes_per_task), "shards task")

    final = _on_cluster(report_data(output=output, done=dsl.Collected(shard.output)), "manifest and report")
    return DataOutputs(final.outputs["dataset"], final.outputs["report"], final.outputs["Output"])
