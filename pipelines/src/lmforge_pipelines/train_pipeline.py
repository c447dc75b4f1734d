"""The train pipeline: launch the training run and wait → export the model package → evaluate
it on the held-out val shards → optionally roll the inference service to it (the model pointer
its replicas follow, then the canary; rollout.py).

    train (PyTorchJob | TrainJob | local torchrun) ─► export ─► evaluate ─► [rollout == True] rollout
                                                       model (Model)  metrics (Metrics)

launcher "pytorchjob" (Kubeflow Training Operator v1) or "trainjob" (Kubeflow Trainer v2) renders
the run's training job from the lmforge chart's own templates (the release's `chart_values` plus
the run's settings: the same pod as `helm install` with training.enabled, with the restore init
container and the checkpoint uploader sidecar) and submits it, so the pipeline step needs the
chart's pipeline-runner identity; checkpoints go to <checkpoint_store>/<run>/. launcher "local"
(kfp.local, tests) runs torchrun here with nodes × gpus_per_node processes and keeps the
checkpoints in the local directory <checkpoint_store>/<run>/.

Evaluation branches: with training.evaluation enabled in `chart_values` (and in the release, which
holds its task files and the Role the sidecar creates Jobs with), the run's trainer writes weights
packages on that cadence and its uploader sidecar evaluates each in a Job of its own while training
goes on. The export step then publishes the best evaluated one (<run>/evals/best.json,
evaluated_model.py) rather than the final checkpoint; without that file it exports the final
checkpoint. The evaluation and the rollout (with its canary gate) that follow are the same either way.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Model

from lmforge_pipelines.components import evaluate_model, export_model, rollout_model, train_model
from lmforge_pipelines.images import IMAGE_REGISTRY, IMAGE_TAG

STEP_CPU, STEP_MEMORY = "1", "4Gi"
EXPORT_MEMORY = "16Gi"


class TrainOutputs(NamedTuple):
    model: Model  # where the package is (metadata uri, run, step)
    metrics: Metrics  # the held-out evaluation
    model_uri: str
    val_loss: float


@dsl.pipeline(
    name="lmforge-train",
    description="Pretrain a GPT on prepared data (PyTorchJob or TrainJob), export, evaluate, optionally deploy.",
)
def train_pipeline(
    data: str = "s3://lmforge/datasets/sample",
    model_preset: str = "tiny",
    steps: int = 1000,
    nodes: int = 1,
    gpus_per_node: int = 1,
    parallel_mode: str = "fsdp",
    train_config: dict = {},  # noqa: B006 - KFP reads the default from the signature
    run_name: str = "",
    launcher: str = "pytorchjob",
    namespace: str = "lmforge",
    release: str = "lmforge",
    chart_values: dict = {"image": {"registry": IMAGE_REGISTRY, "tag": IMAGE_TAG}},  # noqa: B006
    checkpoint_store: str = "s3://lmforge/runs",
    models_store: str = "s3://lmforge/models",
    timeout_hours: float = 72.0,
    eval_sequences: int = 512,
    rollout: bool = False,
    model_pointer: str = "s3://lmforge/models/current",
    deployment: str = "lmforge-inference",
    canary_cronjob: str = "lmforge-canary",
    rollback_on_canary_failure: bool = True,
    max_val_loss: float = 0.0,
    rollout_timeout_minutes: float = 30.0,
) -> TrainOutputs:
    """Train, export, evaluate and (optionally) deploy a model.

    Args:
        data: Prepared data location (the data pipeline's output), s3://… or a local directory.
        model_preset: Model preset (`lmforge-train presets` lists them): tiny, 124m … 1.3b, llama-debug …
            llama-70b, moe-debug, moe-8x1b.
        steps: Optimizer steps.
        nodes: Pods (nodes) of the training job (PyTorchJob: a Master and nodes-1 Workers).
        gpus_per_node: GPUs per node, one training process each; 0 trains on CPU (one process per node).
        parallel_mode: Data parallelism: fsdp, hsdp, ddp, or none (a single process).
        train_config: More trainer config as nested keys, e.g. {"data": {"seq_len": 1024}, "optim": {"lr": 6e-4}}.
        run_name: Run name (checkpoints under checkpoint_store/run, the model version); "" = run-<pipeline run id>.
        launcher: pytorchjob (Kubeflow Training Operator v1), trainjob (Kubeflow Trainer v2) or local
            (torchrun where the step runs).
        namespace: Namespace of the training job and of the inference Deployment (the lmforge release's).
        release: The lmforge Helm release: its ServiceAccount, labels and names.
        chart_values: The release's lmforge chart values the training job is rendered with (image, s3,
            training.checkpoints, training.scheduling, training.evaluation, resources…; not training.run,
            nodes or config, which come from the other parameters). With training.evaluation enabled the
            best evaluated checkpoint is exported instead of the final one.
        checkpoint_store: Object-store prefix of runs (the uploader sidecar's destination).
        models_store: Where exported model packages go (<models_store>/<run>-step<N>; N: the final step, or
            the best evaluated one).
        timeout_hours: The training run fails (and its training job is deleted) after this long.
        eval_sequences: Held-out val sequences the evaluation averages over.
        rollout: Roll the inference service to the new model: point model_pointer at it, wait until every
            replica serves it, run the canary.
        model_pointer: The model pointer the inference replicas follow (the chart's inference.model).
        deployment: The inference Deployment's name (the chart's <release>-inference), whose ready replicas
            must all report the new model.
        canary_cronjob: The canary CronJob (the chart's <release>-canary) a Job is run from once the new
            model serves; "" = no canary.
        rollback_on_canary_failure: When the canary fails, point model_pointer back at the previous model.
        max_val_loss: Refuse to roll out a model whose val loss is above this (0: no gate).
        rollout_timeout_minutes: How long the replicas may take to serve the new model (and the canary to run).
    """
    train = train_model(run_name=run_name, job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, data=data,
                        model_preset=model_preset, steps=steps, nodes=nodes, gpus_per_node=gpus_per_node,
                        parallel_mode=parallel_mode, train_config=train_config, launcher=launcher,
                        checkpoint_store=checkpoint_store, namespace=namespace, release=release,
                        chart_values=chart_values, timeout_hours=timeout_hours)
    train.set_display_name("train").set_caching_options(False)
    export = export_model(run=train.outputs["run"], run_uri=train.outputs["run_uri"], step=train.outputs["step"],
                          models_store=models_store)
    export.set_display_name("export model package").set_caching_options(False)
    export.set_cpu_request(STEP_CPU).set_memory_request(EXPORT_MEMORY)
    evaluation = evaluate_model(model_uri=export.outputs["Output"], data=data, max_sequences=eval_sequences,
                                seq_len=0)
    evaluation.set_display_name("evaluate").set_caching_options(False)
    evaluation.set_cpu_request(STEP_CPU).set_memory_request(EXPORT_MEMORY)
    with dsl.If(rollout == True, "rollout"):  # noqa: E712 - a pipeline condition, not a Python comparison
        roll = rollout_model(model_uri=export.outputs["Output"], val_loss=evaluation.outputs["Output"],
                             max_val_loss=max_val_loss, launcher=launcher, model_pointer=model_pointer,
                             namespace=namespace, deployment=deployment, canary_cronjob=canary_cronjob,
                             rollback_on_canary_failure=rollback_on_canary_failure,
                             timeout_minutes=rollout_timeout_minutes, job_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        roll.set_display_name("roll out inference").set_caching_options(False)
    return TrainOutputs(export.outputs["model"], evaluation.outputs["metrics"], export.outputs["Output"],
                        evaluation.outputs["Output"])
