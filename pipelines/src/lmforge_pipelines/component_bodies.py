"""What each pipeline step does, as plain functions (the KFP components in components.py are thin
wrappers around these, so the logic is importable and testable without KFP).

Steps call the lmforge CLIs (`lmforge-dataprep`, `lmforge-train`, `lmforge-uploader`) as
subprocesses, exactly as a user would, and share data through a storage location (an s3://
prefix on a cluster, a local directory with kfp.local): never through KFP artifacts, which are
not shared between the parallel workers of a ParallelFor.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from lmforge_pipelines.launcher import TrainingJob, TrainingResult, make_launcher

SAMPLE_CRAWL = "sample"  # crawl="sample": WET files placed under <output>/wet/ beforehand, not downloaded
WET_DIR = "wet"  # the inputs, under the data-prep output
WET_SUFFIX = ".warc.wet.gz"
INPUTS_FILE = "inputs.json"  # <output>/wet/inputs.json: the run's input URIs, in order


class StepError(RuntimeError):
    pass


# ----------------------------------------------------------------------------- helpers

def cli(name: str) -> str:
    """A console script of this environment (beside the running interpreter), else from PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise StepError(f"{name} not found beside {sys.executable} or on PATH (is the lmforge service installed?)")
    return found


def call(command: list[str], *, what: str) -> None:
    """Run a CLI with its output going to this step's log; fail the step naming the command."""
    print("+ " + " ".join(command), flush=True)
    result = subprocess.run(command, check=False)
    if result.returncode != 0:
        raise StepError(f"{what} failed (exit status {result.returncode}): {' '.join(command)}")


def flatten(values: Mapping[str, Any] | None, prefix: str = "") -> list[str]:
    """{"tokenizer": {"vocab_size": 512}} → ["tokenizer.vocab_size=512"]: the services' key=value
    overrides, each value JSON (which their YAML parser reads back with its type). Dotted keys
    ({"tokenizer.vocab_size": 512}) work too. Empty maps are values (e.g. model.overrides={})."""
    pairs = []
    for key, value in (values or {}).items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            pairs.extend(flatten(value, path))
        else:
            pairs.append(f"{path}={json.dumps(_integral(value))}")
    return pairs


def _integral(value: Any) -> Any:
    """Whole floats back to ints: KFP hands dict parameters over as protobuf Structs, whose
    numbers are doubles (512 arrives as 512.0, which an int config field would refuse)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _integral(v) for k, v in value.items()}
    return value


def parse_languages(languages: str | Iterable[str]) -> list[str]:
    """"en, de" or ["en", "de"] → ["en", "de"] (fastText language codes)."""
    items = languages.split(",") if isinstance(languages, str) else list(languages)
    codes = [str(code).strip().lower() for code in items if str(code).strip()]
    if not codes:
        raise StepError("languages: give at least one language code, e.g. en or en,de")
    for code in codes:
        if not re.fullmatch(r"[a-z]{2,3}", code):
            raise StepError(f"languages: {code!r} is not a language code like en or de")
    return codes


def _store_is_local(uri: str) -> bool:
    from lmforge.common.store import scheme_of

    return scheme_of(uri) in ("", "file")


def _local(uri: str) -> Path:
    from lmforge.common.store import local_path_of

    return local_path_of(uri)


def _publish_dir(local_dir: Path, dest: str, *, last: str | None = None) -> None:
    """Copy the files of `local_dir` under the s3:// prefix `dest`, `last` (a name) at the end."""
    from lmforge.common.storage import open_store

    store = open_store(dest)
    files = sorted(p for p in local_dir.rglob("*") if p.is_file())
    files.sort(key=lambda p: p.name == last)
    for path in files:
        with store.open_write(path.relative_to(local_dir).as_posix()) as out, open(path, "rb") as src:
            shutil.copyfileobj(src, out, 1 << 20)


# ----------------------------------------------------------------------------- data pipeline

def fetch_inputs(*, crawl: str, shards: int, output: str, base_url: str = "https://data.commoncrawl.org",
                 kind: str = "wet") -> list[str]:
    """The input files of the run, under <output>/wet/ (shared storage), as URIs; their list is
    recorded in <output>/wet/inputs.json for the workers.

    A crawl id (CC-MAIN-YYYY-WW) downloads the crawl's first `shards` files of `kind` there (WET
    text, or WARC with the HTML the workers extract the main text of)
    (`lmforge-dataprep fetch`, resumable: files already in place are kept, so a retried step
    does not start over). crawl="sample" takes the first `shards` WET files placed there
    beforehand, in name order: synthetic ones from `lmforge-sample-data --files N`, which no
    image carries."""
    from lmforge.common.storage import open_store

    if shards < 1:
        raise StepError(f"shards must be at least 1, got {shards}")
    dest = f"{output.rstrip('/')}/{WET_DIR}"
    store = open_store(dest)
    if crawl == SAMPLE_CRAWL:
        names = _placed_inputs(store, dest, shards)
    else:
        names = _download(store, dest, crawl, shards, base_url, kind)
    uris = [str(_local(dest) / name) if _store_is_local(dest) else f"{dest}/{name}" for name in names]
    store.write_bytes(INPUTS_FILE, json.dumps(uris, indent=1).encode())
    return uris


def _placed_inputs(store, dest: str, shards: int) -> list[str]:
    names = [name for name in store.list() if "/" not in name and name.endswith(WET_SUFFIX)][:shards]
    if len(names) < shards:
        raise StepError(f'crawl "{SAMPLE_CRAWL}" reads {shards} WET file(s) placed in {dest} beforehand, and it holds '
                        f"{len(names)}: write them there with `lmforge-sample-data --output {dest} --files {shards}` "
                        "(on a machine with the lmforge-sample-data package: no image carries it)")
    return names


def _download(store, dest: str, crawl: str, shards: int, base_url: str, kind: str) -> list[str]:
    """The crawl's first `shards` files of `kind`, in its listing's order, put in `store`."""
    local = _store_is_local(dest)
    present = set() if local else set(store.list())  # already in the object store: not again
    staging = _local(dest) if local else Path(tempfile.mkdtemp(prefix="lmforge-wet-"))
    staging.mkdir(parents=True, exist_ok=True)
    try:
        call([cli("lmforge-dataprep"), "fetch", "--crawl", crawl, "--shards", str(shards), "--output", str(staging),
              "--base-url", base_url, "--kind", kind], what="fetch")
        # The files the crawl's listing names first, in its order (fetch saved the listing).
        names = [PurePosixPath(path).name for path in _read_listing(staging / f"{kind}.paths.gz")[:shards]]
        missing = [n for n in names if n not in present and not (staging / n).is_file()]
        if missing:
            raise StepError(f"{kind.upper()} files missing in {staging} after the download: {missing}")
        if not local:
            for name in names:
                if name not in present:
                    with store.open_write(name) as out, open(staging / name, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
    finally:
        if not local:
            shutil.rmtree(staging, ignore_errors=True)
    return names


def _read_listing(path: Path) -> list[str]:
    import gzip

    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def read_inputs(output: str) -> list[str]:
    """The input list fetch_inputs recorded under <output>/wet/."""
    from lmforge.common.storage import open_store

    store = open_store(f"{output.rstrip('/')}/{WET_DIR}")
    if not store.exists(INPUTS_FILE):
        raise StepError(f"{store.join(INPUTS_FILE)} not found: the fetch step writes it")
    return json.loads(store.read_text(INPUTS_FILE))


def plan_workers(workers: int) -> list[int]:
    if workers < 1:
        raise StepError(f"workers must be at least 1, got {workers}")
    return list(range(workers))


def dataprep_overrides(languages: str, dataprep_config: Mapping[str, Any] | None) -> list[str]:
    """The --set overrides every data-prep step of a run passes: they must be identical, since
    the workers record the config and check it against each other."""
    pairs = [f"steps.langid.languages={json.dumps(parse_languages(languages))}", *flatten(dataprep_config)]
    return [arg for pair in pairs for arg in ("--set", pair)]


def prep_worker(*, output: str, worker_index: int, num_workers: int, languages: str,
                dataprep_config: Mapping[str, Any] | None = None, processes: int = 1) -> str:
    """One worker's share of the per-input stage (parse → … → MinHash signatures), written under
    `output`; finished inputs are skipped on a retry. The inputs are the list the fetch step
    recorded in <output>/wet/inputs.json (every worker must pass the same list)."""
    if not 0 <= worker_index < num_workers:
        raise StepError(f"worker_index {worker_index} is not in [0, {num_workers})")
    inputs = read_inputs(output)
    call([cli("lmforge-dataprep"), "run", "--input", *inputs, "--output", output, "--worker-index", str(worker_index),
          "--num-workers", str(num_workers), "--workers", str(max(1, processes)),
          *dataprep_overrides(languages, dataprep_config)], what=f"data-prep worker {worker_index}")
    return f"worker {worker_index}/{num_workers} done"


def _global_stage(name: str):
    """The data-prep stage `name` (lmforge.dataprep.stages: imported here, in the data image, so
    the train image's steps never need the data-prep package)."""
    from lmforge.dataprep.stages import GLOBAL_STAGES

    found = next((stage for stage in GLOBAL_STAGES if stage.name == name), None)
    if found is None or name == "report":
        raise StepError(f"{name!r} is not a global data-prep stage "
                        f"({', '.join(s.name for s in GLOBAL_STAGES if s.name != 'report')}; report: the report step)")
    return found


def stage_task_count(stage: str, stage_tasks: Mapping[str, Any]) -> int:
    """The number of tasks `stage_tasks` gives a split stage (1 when it names none)."""
    count = stage_tasks.get(stage, 1)
    if isinstance(count, bool) or not isinstance(_integral(count), int) or int(count) < 1:
        raise StepError(f"stage_tasks[{stage!r}] must be a whole number ≥ 1, got {count!r}")
    return int(count)


def plan_tasks(stage: str, stage_tasks: Mapping[str, Any], *, output: str, round: int = 0) -> list[int]:
    """Task indices 0..stage_tasks[stage]-1 of a split stage (a ParallelFor's items). Every round
    of the components gets its tasks: one after they settled only marks itself done (an empty
    ParallelFor would leave the step after it nothing to collect)."""
    if not _global_stage(stage).split:
        raise StepError(f"{stage!r} is one task, not a split stage")
    unknown = sorted(set(stage_tasks) - {s.name for s in _split_stages()})
    if unknown:
        raise StepError(f"stage_tasks names no split stage: {', '.join(unknown)}")
    return list(range(stage_task_count(stage, stage_tasks)))


def _split_stages():
    from lmforge.dataprep.stages import GLOBAL_STAGES

    return [stage for stage in GLOBAL_STAGES if stage.split]


def stage_task(*, stage: str, output: str, task_index: int | None = None, num_tasks: int = 1,
               processes: int = 1, round: int | None = None) -> str:
    """One task of a global stage over the workers' output: task `task_index` of `num_tasks` of a
    split stage (of round `round` for the components), or the one task of a single stage. Tasks
    already marked done are skipped, so a retry redoes only what was left unfinished."""
    found = _global_stage(stage)
    command = [cli("lmforge-dataprep"), stage, "--output", output]
    what = f"data-prep {stage}"
    if found.split:
        if task_index is None or not 0 <= task_index < num_tasks:
            raise StepError(f"{stage} task_index {task_index} is not in [0, {num_tasks})")
        command += ["--worker-index", str(task_index), "--num-workers", str(num_tasks),
                    "--workers", str(max(1, processes))]
        what += f" task {task_index}"
        if round is not None and found.kind == "rounds":
            command += ["--round", str(round)]
            what += f" (round {round})"
    call(command, what=what)
    return f"{what} done"


def report(*, output: str) -> dict[str, Any]:
    """The last stage: manifest.json (from the shard partitions' entries), report.json and
    report.html. Returns {"report_html", "manifest", "report"} read back from `output`."""
    from lmforge.common.storage import open_store

    call([cli("lmforge-dataprep"), "report", "--output", output], what="data-prep report")
    store = open_store(output)
    return {"report_html": store.read_text("report.html"), "manifest": json.loads(store.read_text("manifest.json")),
            "report": json.loads(store.read_text("report.json"))}


# ----------------------------------------------------------------------------- train pipeline

def run_name(name: str, job_id: str) -> str:
    """The run name: the one given, else run-<pipeline job id>; letters, digits, dashes."""
    raw = name.strip() or f"run-{job_id}"
    clean = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")[:40].rstrip("-")
    if not clean:
        raise StepError(f"run name {name!r}: use letters, digits and dashes")
    return clean


def trainer_overrides(*, data: str, model_preset: str, steps: int, parallel_mode: str,
                      train_config: Mapping[str, Any] | None = None) -> list[str]:
    """The trainer's key=value overrides for a run; `train_config` (nested or dotted keys, any
    TrainConfig field) comes last and wins."""
    if steps < 1:
        raise StepError(f"steps must be at least 1, got {steps}")
    owned = {"run_dir", "data.cache_dir", "metrics.port", "device", "checkpoint.purge_requires_upload"}
    extra = flatten(train_config)
    clash = sorted(p.split("=", 1)[0] for p in extra if p.split("=", 1)[0] in owned)
    if clash:
        raise StepError(f"train_config sets {clash}: the launcher sets these")
    return [f"model.preset={model_preset}", f"steps={steps}", f"parallel.mode={parallel_mode}",
            f"data.sources={json.dumps([{'path': data}])}", *extra]


def train(*, run: str, data: str, model_preset: str, steps: int, nodes: int, gpus_per_node: int,
          parallel_mode: str, train_config: Mapping[str, Any] | None, launcher: str, checkpoint_store: str,
          timeout_hours: float, namespace: str = "lmforge", release: str = "lmforge",
          chart_values: Mapping[str, Any] | None = None) -> TrainingResult:
    """Launch the run (a PyTorchJob or TrainJob rendered from the chart of `release` with its
    `chart_values`, or local torchrun), wait for it, return where its final checkpoint is.
    gpus_per_node=0 trains on CPU with one process per node."""
    if nodes < 1 or gpus_per_node < 0:
        raise StepError(f"nodes must be ≥ 1 and gpus_per_node ≥ 0 (got {nodes} × {gpus_per_node})")
    if timeout_hours <= 0:
        raise StepError(f"timeout_hours must be positive, got {timeout_hours}")
    if parallel_mode == "none" and nodes * max(gpus_per_node, 1) > 1:
        raise StepError(f"parallel_mode none trains one process; {nodes} × {gpus_per_node} needs ddp, fsdp or hsdp")
    job = TrainingJob(run=run, checkpoint_store=checkpoint_store, nodes=nodes,
                      nproc_per_node=max(gpus_per_node, 1), gpus_per_process=1 if gpus_per_node else 0,
                      overrides=trainer_overrides(data=data, model_preset=model_preset, steps=steps,
                                                  parallel_mode=parallel_mode, train_config=train_config))
    kwargs = {} if launcher == "local" else {"namespace": namespace, "release": release,
                                              "values": _integral(dict(chart_values or {}))}
    return make_launcher(launcher, **kwargs).run(job, timeout_s=timeout_hours * 3600)


def export_model(*, run_uri: str, step: int, models_store: str, version: str) -> str:
    """The checkpoint of `step` → the serving package at <models_store>/<version>; returns its URI.
    A run in the object store is restored first (`lmforge-uploader restore`, verified against its
    MANIFEST.json); the package's config.json is published last."""
    from lmforge.common.checkpoint_layout import step_dir

    work = Path(tempfile.mkdtemp(prefix="lmforge-export-"))
    try:
        if _store_is_local(run_uri):
            checkpoint = step_dir(_local(run_uri) / "checkpoints", step)
        else:
            call([cli("lmforge-uploader"), "restore", "--src", run_uri, "--dir", str(work / "checkpoints"),
                  "--step", str(step)], what="checkpoint restore")
            checkpoint = step_dir(work / "checkpoints", step)
        dest = f"{models_store.rstrip('/')}/{version}"
        target = _local(dest) if _store_is_local(dest) else work / "package"
        call([cli("lmforge-train"), "export", "--checkpoint", str(checkpoint), "--output", str(target)],
             what="export")
        if not _store_is_local(dest):
            _publish_dir(target, dest, last="config.json")
        return str(target) if _store_is_local(dest) else dest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def export_run_model(*, run: str, run_uri: str, step: int, models_store: str) -> tuple[str, int]:
    """The run's serving package at <models_store>/<run>-step<N> and its step N: the best evaluated
    checkpoint's when the run had evaluation branches (<run_uri>/evals/best.json: the package its
    promotion copied, else a verified copy of its weights package), else the checkpoint of `step`
    (the final one) exported."""
    from lmforge_pipelines.evaluated_model import copy_package, evals_best, weights_package

    best = evals_best(run_uri)
    if best is None:
        return export_model(run_uri=run_uri, step=step, models_store=models_store, version=f"{run}-step{step}"), step
    chosen = best["step"]
    print(f"{run_uri}/evals/best.json: step {chosen} scored best ({best.get('score')}); the final step is {step}",
          flush=True)
    if best.get("promoted_to"):
        return str(best["promoted_to"]), chosen
    source = best.get("package") or weights_package(run_uri, chosen)
    return copy_package(source, f"{models_store.rstrip('/')}/{run}-step{chosen}"), chosen


def evaluate(*, model_uri: str, data: str, max_sequences: int = 256, batch_size: int = 8,
             seq_len: int = 0) -> dict[str, float]:
    """Held-out evaluation of the exported package: mean next-token cross-entropy over the first
    `max_sequences` windows of seq_len + 1 tokens of the data's val shards (the same windows every
    time, so runs compare). seq_len 0 = the model's context length. The same held-out loss as the
    checkpoint evaluation job's (lmforge.trainer.checkpoint_eval: val_source, heldout_loss)."""
    from lmforge.model.package import fetch_package, load_package
    from lmforge.trainer.checkpoint_eval import heldout_loss, val_source

    work = Path(tempfile.mkdtemp(prefix="lmforge-eval-"))
    try:
        model, meta = load_package(fetch_package(model_uri, work / "model"))
        length = min(seq_len or model.config.context_length, model.config.context_length)
        source = val_source(data, work / "data", length)
        if source.tokenizer_sha256 != meta["tokenizer_sha256"]:
            raise StepError(f"{data} was tokenized with another tokenizer than the model {model_uri} was trained with")
        result = heldout_loss(model, source, max_sequences, batch_size)
        if not math.isfinite(result.loss):
            raise StepError(f"val loss of {model_uri} is not finite ({result.loss})")
        return {"val_loss": result.loss, "val_perplexity": result.perplexity, "val_tokens": float(result.tokens),
                "val_sequences": float(result.sequences), "step": float(meta.get("step", -1))}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def rollout(*, model_uri: str, model_pointer: str, namespace: str, deployment: str, launcher: str,
            val_loss: float, max_val_loss: float = 0.0, canary_cronjob: str = "",
            rollback_on_canary_failure: bool = True, timeout_s: float = 1800.0, set_by: str = "lmforge-train") -> str:
    """Point `model_pointer` at the new package (verified first), wait until every ready replica
    of the inference Deployment serves it, then run a Job from `canary_cronjob` ("" = none); a
    failed canary points it back (rollback_on_canary_failure) and fails the step. Refuses a model
    whose val loss exceeds max_val_loss (0: no gate). With the local launcher there is no
    Deployment: only the pointer is written."""
    if max_val_loss > 0 and val_loss > max_val_loss:
        raise StepError(f"val loss {val_loss:.4f} > max_val_loss {max_val_loss}: not rolling out {model_uri}")
    from lmforge_pipelines.rollout import Cluster, RolloutFailed, roll_out

    log = lambda line: print(line, flush=True)  # noqa: E731
    try:
        if launcher == "local":
            roll_out(model_pointer, model_uri, set_by=set_by, log=log)
            message = (f"local run: {model_pointer} names {model_uri}; no inference Deployment to wait for "
                       f"(`lmforge-serve --model {model_pointer}` serves and follows it)")
            print(message, flush=True)
            return message
        cluster = Cluster(namespace, deployment, log=log)
        canary = None
        if canary_cronjob:
            def canary():
                return cluster.run_canary(canary_cronjob, package=model_uri, timeout_s=timeout_s)
        roll_out(model_pointer, model_uri, set_by=set_by, replicas=cluster.replica_urls, canary=canary,
                 rollback_on_canary_failure=rollback_on_canary_failure, timeout_s=timeout_s, log=log)
    except RolloutFailed as exc:
        raise StepError(str(exc)) from exc
    return (f"{model_pointer} names {model_uri}, served by every replica of {namespace}/{deployment}"
            + (f"; the canary ({canary_cronjob}) passed" if canary_cronjob else ""))


def install_sigterm_handler() -> None:
    """Turn SIGTERM (a stopped pipeline run) into SystemExit, so a launcher can clean up."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

