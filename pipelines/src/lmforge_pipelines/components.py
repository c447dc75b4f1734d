"""The pipelines' steps as KFP lightweight Python components.

Each body only imports `lmforge_pipelines.component_bodies` and calls one function: KFP ships the function's
source (not this module) to the step's container, where the image provides the rest (see
images.py). With kfp.local's SubprocessRunner(use_venv=False) the same bodies run in this Python
environment. `install_kfp_package=False`: the images carry kfp (a runtime `pip install` would need
network access from every step and a writable root filesystem).

No `from __future__ import annotations` here: KFP reads the real annotations.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Dataset, Metrics, Model, Output

from lmforge_pipelines.images import DATAPREP_IMAGE, TRAINER_IMAGE


@dsl.component(base_image=DATAPREP_IMAGE, install_kfp_package=False)
def fetch_wet(crawl: str, shards: int, base_url: str, output: str, input_kind: str = "wet") -> list[str]:
    """The run's input files under <output>/wet/: the crawl's first `shards` WET (or, input_kind
    "warc", WARC) files, downloaded resumably, or (crawl "sample") the first `shards` placed there beforehand."""
    from lmforge_pipelines import component_bodies as bodies

    return bodies.fetch_inputs(crawl=crawl, shards=shards, output=output, base_url=base_url, kind=input_kind)


@dsl.component(base_image=DATAPREP_IMAGE, install_kfp_package=False)
def plan_workers(inputs: list[str], workers: int) -> list[int]:
    """Worker indices 0..workers-1 (the ParallelFor items), once the inputs are in place."""
    from lmforge_pipelines import component_bodies as bodies

    print(f"{len(inputs)} inputs, {workers} workers")
    return bodies.plan_workers(workers)


@dsl.component(base_image=DATAPREP_IMAGE, install_kfp_package=False)
def prep_worker(output: str, worker_index: int, num_workers: int, languages: str, dataprep_config: dict,
                processes: int) -> str:
    """One data-prep worker: its share of the inputs (<output>/wet/inputs.json, which the fetch
    step wrote) through parse → filters → MinHash signatures."""
    from lmforge_pipelines import component_bodies as bodies

    return bodies.prep_worker(output=output, worker_index=worker_index, num_workers=num_workers, languages=languages,
                             dataprep_config=dataprep_config, processes=processes)


@dsl.component(base_image=DATAPREP_IMAGE, install_kfp_package=False)
def plan_tasks(stage: str, stage_tasks: dict, output: str, round: int, done: list[str]) -> list[int]:
    """Task indices 0..n-1 of a split stage (the ParallelFor items; n from `stage_tasks`), once the
    stage before it is done (`done`: its tasks' outputs, fanned in)."""
    from lmforge_pipelines import component_bodies as bodies

    print(f"{stage} (round {round}): after {done}")
    return bodies.plan_tasks(stage, stage_tasks, output=output, round=round)


@dsl.component(base_image=DATAPREP_IMAGE, install_kfp_package=False)
def stage_task(stage: str, output: str, task_index: int, stage_tasks: dict, processes: int, round: int) -> str:
    """Task `task_index` of a split data-prep stage (lmforge.dataprep.stages; stage_tasks[stage]
    tasks in all): its slice of the stage's work."""
    from lmforge_pipelines import component_bodies as bodies

    return bodies.stage_task(stage=stage, output=output, task_index=task_index,
                            num_tasks=bodies.stage_task_count(stage, stage_tasks), processes=processes, round=round)


@dsl.component(base_image=DATAPREP_IMAGE, install_kfp_package=False)
def single_stage(stage: str, output: str, done: list[str]) -> str:
    """A data-prep stage that is one task (lmforge.dataprep.stages), once the stage before it is done."""
    from lmforge_pipelines import component_bodies as bodies

    print(f"{stage}: after {done}")
    return bodies.stage_task(stage=stage, output=output)


@dsl.component(base_image=DATAPREP_IMAGE, install_kfp_package=False)
def report_data(output: str, done: list[str], dataset: Output[Dataset], report: Output[HTML],
                metrics: Output[Metrics]) -> str:
    """The manifest and the report once every shard task is done. `dataset` points at the
    prepared data (its file is manifest.json; the data stays at `output`), `report` is
    report.html for the UI's visualization. Returns the data location for the train pipeline."""
    import json

    from lmforge_pipelines import component_bodies as bodies

    print(f"{len(done)} shard tasks done: {done}")
    result = bodies.report(output=output)
    with open(report.path, "w", encoding="utf-8") as f:
        f.write(result["report_html"])
    with open(dataset.path, "w", encoding="utf-8") as f:
        json.dump(result["manifest"], f, indent=1)
    totals = result["report"]["totals"]
    dataset.metadata.update({"uri": output, "tokenizer_sha256": result["manifest"]["tokenizer"]["sha256"],
                             "vocab_size": totals["vocab_size"], "train_tokens": totals["train_tokens"],
                             "val_tokens": totals["val_tokens"]})
    for name in ("kept_docs", "output_tokens", "train_tokens", "val_tokens", "train_shards", "val_shards",
                 "vocab_size"):
        metrics.log_metric(name, float(totals[name]))
    metrics.log_metric("input_records", float(result["report"]["inputs"]["records"]))
    return output


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def train_model(run_name: str, job_id: str, data: str, model_preset: str, steps: int, nodes: int,
                gpus_per_node: int, parallel_mode: str, train_config: dict, launcher: str, checkpoint_store: str,
                namespace: str, release: str, chart_values: dict,
                timeout_hours: float) -> NamedTuple("Outputs", [("run", str), ("run_uri", str), ("step", int)]):
    """Launch the training run (a PyTorchJob or TrainJob rendered from the lmforge chart, or
    torchrun with launcher "local"), wait for it, and fail with the tail of the trainer's log
    when it fails."""
    from collections import namedtuple

    from lmforge_pipelines import component_bodies as s

    s.install_sigterm_handler()  # a stopped pipeline run deletes its training job
    run = s.run_name(run_name, job_id)
    result = s.train(run=run, data=data, model_preset=model_preset, steps=steps, nodes=nodes,
                     gpus_per_node=gpus_per_node, parallel_mode=parallel_mode, train_config=train_config,
                     launcher=launcher, checkpoint_store=checkpoint_store, timeout_hours=timeout_hours,
                     namespace=namespace, release=release, chart_values=chart_values)
    return namedtuple("Outputs", ["run", "run_uri", "step"])(run, result.run_uri, result.step)


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def export_model(run: str, run_uri: str, step: int, models_store: str, model: Output[Model]) -> str:
    """The serving package at <models_store>/<run>-step<N>: the best evaluated checkpoint's when the
    run had evaluation branches (<run_uri>/evals/best.json), else the final checkpoint (`step`)
    exported; `model` records where it is and its step (the package itself is not copied into the
    pipeline root)."""
    import json

    from lmforge_pipelines import component_bodies as bodies

    uri, step = bodies.export_run_model(run=run, run_uri=run_uri, step=step, models_store=models_store)
    model.metadata.update({"uri": uri, "run": run, "step": step})
    with open(model.path, "w", encoding="utf-8") as f:
        json.dump({"uri": uri, "run": run, "step": step}, f)
    return uri


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def evaluate_model(model_uri: str, data: str, max_sequences: int, seq_len: int, metrics: Output[Metrics]) -> float:
    """Held-out val loss of the exported package on the data's val shards."""
    from lmforge_pipelines import component_bodies as bodies

    result = bodies.evaluate(model_uri=model_uri, data=data, max_sequences=max_sequences, seq_len=seq_len)
    for name, value in result.items():
        metrics.log_metric(name, value)
    print(f"evaluation of {model_uri}: {result}")
    return result["val_loss"]


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def rollout_model(model_uri: str, val_loss: float, max_val_loss: float, launcher: str, model_pointer: str,
                  namespace: str, deployment: str, canary_cronjob: str, rollback_on_canary_failure: bool,
                  timeout_minutes: float, job_id: str) -> str:
    """Point the inference service's model pointer at the new package (refused above max_val_loss
    when > 0), wait until every replica serves it, run the canary; roll back if it fails."""
    from lmforge_pipelines import component_bodies as bodies

    return bodies.rollout(model_uri=model_uri, model_pointer=model_pointer, namespace=namespace,
                         deployment=deployment, launcher=launcher, val_loss=val_loss, max_val_loss=max_val_loss,
                         canary_cronjob=canary_cronjob, rollback_on_canary_failure=rollback_on_canary_failure,
                         timeout_s=timeout_minutes * 60, set_by=f"lmforge-train pipeline run {job_id}")
