"""The data pipeline: WET files → parallel data-prep workers → global near-dup, tokenizer and
shards → the report as an HTML artifact.

    fetch-wet ─► plan-workers ─► ParallelFor(prep-worker i of n) ─► finalize-data ─► dataset (Dataset)
                                           └── dsl.Collected ──────────┘             report (HTML)
                                                                                     metrics (Metrics)

Every step reads and writes one storage location, `output` (an s3:// prefix on a cluster, a
local directory with kfp.local): the WET files go to <output>/wet/, the prepared data (shards/,
tokenizer.json, manifest.json, lineage/, rejects/, report.*) to <output>. A rerun with the same
`output` resumes (finished inputs are skipped); one with other inputs or config into the same
`output` fails with a message saying so.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Dataset

from lmforge_pipelines.components import fetch_wet, finalize_data, plan_workers, prep_worker

# What the steps ask of the cluster (kfp.local ignores these).
WORKER_CPU, WORKER_MEMORY = "1", "4Gi"
FINALIZE_CPU, FINALIZE_MEMORY = "4", "16Gi"


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
    processes_per_worker: int = 1,
    finalize_processes: int = 4,
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
        processes_per_worker: Local processes inside each worker.
        finalize_processes: Local processes of the global stages.
        dataprep_config: More data-prep config as nested keys, e.g. {"tokenizer": {"vocab_size": 32768}}.
    """
    fetch = fetch_wet(crawl=crawl, shards=shards, base_url=base_url, output=output)
    fetch.set_display_name("fetch WET files").set_caching_options(False)
    plan = plan_workers(inputs=fetch.output, workers=workers)
    plan.set_display_name("plan workers").set_caching_options(False)
    # Inside the loop only the item and pipeline parameters are used: the workers read the input
    # list from <output>/wet/inputs.json (a task output passed into a ParallelFor would be the
    # loop item under kfp.local 2.17, and a long list is a large Argo parameter on a cluster).
    with dsl.ParallelFor(plan.output) as index:
        worker = prep_worker(output=output, worker_index=index, num_workers=workers, languages=languages,
                             dataprep_config=dataprep_config, processes=processes_per_worker)
        worker.set_display_name("data-prep worker").set_caching_options(False)
        worker.set_cpu_request(WORKER_CPU).set_memory_request(WORKER_MEMORY).set_memory_limit(WORKER_MEMORY)
    final = finalize_data(output=output, workers_done=dsl.Collected(worker.output), processes=finalize_processes)
    final.set_display_name("dedup, tokenize, shard, report").set_caching_options(False)
    final.set_cpu_request(FINALIZE_CPU).set_memory_request(FINALIZE_MEMORY).set_memory_limit(FINALIZE_MEMORY)
    return DataOutputs(final.outputs["dataset"], final.outputs["report"], final.outputs["Output"])
