"""`lmforge-train eval-checkpoint`: the evaluation job of one weights checkpoint (a model package
the trainer wrote to RUN_DIR/weights/step-N and the uploader published). One run:

1. fetch the package (s3:// is downloaded) and verify it, checksums required;
2. held-out loss and perplexity per data source: mean next-token cross-entropy over the first
   `max_sequences` windows of context_length + 1 tokens of the source's val split, the same
   windows every time (`heldout_loss`, which the pipelines' `evaluate` step shares);
3. the lm-evaluation-harness tasks of `--tasks DIR` (YAML + data files; `TaskManager(include_path=DIR,
   include_defaults=False)`, run with DIR as the working directory, so a task's `data_files` may be
   relative to it; nothing is downloaded) with `LmforgeLM`, the package's model in process;
4. the result JSON, written atomically to `--out` (a file path, file:// or s3:// URI of
   `<dest>/evals/step-NNNNNNNN.json`):
   {"step", "tokens", "package", "heldout": {source: {"loss", "perplexity"}}, "tasks": {task: {metric: value}},
    "seconds", "versions"}; tokens come from the package's meta.json (None when it has none);
5. with `--pushgateway`: the gauges of `build_registry` under job `lmforge-checkpoint-eval` and grouping key
   {run}. The best-so-far series are computed from the results in the same evals/ folder whose step is
   at most this one's (this result included), so they do not depend on the order in which jobs finish;
   when a result of a later step is already there, nothing is pushed (the group shows the later one).
   A push that fails is logged (`push_failed`) and does not fail the job: the result in the store is the
   record the uploader ingests, and a retried job would only redo the evaluation.

Exit codes: 0 done; 2 bad flags or an unsupported task (generation); 3 bad input (no package, a package that
fails verification, a data source of another tokenizer, no tasks in DIR); 4 a store (or disk) failure;
70 internal error (a bug; the traceback is logged).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Gauge

from lmforge.common.errors import CLI_ERRORS, ConfigError, InputError, LmforgeError
from lmforge.common.logging import get_logger
from lmforge.common.metrics import new_registry

PUSH_JOB = "lmforge-checkpoint-eval"
EXIT_INTERNAL = 70
RESULT_PREFIX = "step-"
log = get_logger("trainer")


class PushError(LmforgeError):
    """The Pushgateway did not take the metrics."""

    exit_code = 4


# ------------------------------------------------------------------ held-out loss


@dataclass(frozen=True)
class HeldOut:
    loss: float  # mean next-token cross-entropy, nats
    tokens: int
    sequences: int

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50.0))


def heldout_loss(model, source, max_sequences: int, batch_size: int = 8) -> HeldOut:
    """Mean next-token cross-entropy of `model` over the first `max_sequences` windows of `source`
    (a lmforge.trainer.data.ShardSource: each window seq_len + 1 tokens), in batches."""
    import numpy as np
    import torch

    device = next(model.parameters()).device
    count = min(max_sequences, source.num_sequences)
    total, tokens = 0.0, 0
    with torch.no_grad():
        for start in range(0, count, batch_size):
            rows = [source.sequence(i) for i in range(start, min(start + batch_size, count))]
            batch = torch.from_numpy(np.stack(rows)).to(device)
            _, loss = model(batch[:, :-1], batch[:, 1:])
            n = batch.shape[0] * source.seq_len
            total += float(loss) * n
            tokens += n
    return HeldOut(total / tokens if tokens else float("nan"), tokens, count)


def val_source(data: str, cache: Path, seq_len: int, name: str = ""):
    """The val split of the data-prep output `data` (a path, file:// or s3:// URI; only the manifest,
    the split index and its shards are downloaded into `cache`) as a ShardSource of `seq_len`."""
    from lmforge.common.s3_store import S3Store
    from lmforge.common.shard_index import MANIFEST, parse_manifest, read_split_index
    from lmforge.common.store import local_path_of, scheme_of
    from lmforge.trainer.data import ShardSource

    if scheme_of(data) == "s3":
        store = S3Store(data, cache)
        manifest = parse_manifest(store.local_path(MANIFEST).read_bytes(), store.join(MANIFEST))
        for entry in read_split_index(manifest, "val", lambda rel: store.local_path(rel).read_bytes(), data):
            store.local_path(entry.path)
        root = cache
    else:
        root = local_path_of(data)
    return ShardSource(root, "val", seq_len, name=name)


# ------------------------------------------------------------------ harness tasks


@contextlib.contextmanager
def _working_directory(folder: Path) -> Iterator[None]:
    """`folder` as the working directory meanwhile (a task's relative data_files)."""
    previous = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def harness_environment() -> None:
    """What the harness (datasets, transformers) reads from the environment when imported: offline,
    and its caches under the temp folder unless HF_HOME is set (the job's root filesystem is read-only;
    /tmp is writable). Call before importing lm_eval."""
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[name] = "1"
    os.environ.setdefault("HF_HOME", str(Path(tempfile.gettempdir()) / "lmforge-eval-hf"))


def task_names(task_manager) -> list[str]:
    return sorted(task_manager.all_subtasks)


def metric_name(key: str) -> str | None:
    """lm_eval's result key "acc,none" → "acc" ("acc,FILTER" → "acc,FILTER"); None for the
    stderr and alias entries."""
    if "," not in key:
        return None
    metric, filt = key.split(",", 1)
    if metric.endswith("_stderr"):
        return None
    return metric if filt == "none" else key


def task_folder(uri: str, scratch: Path) -> Path:
    """A local folder holding the tasks at `uri`: a path or file:// as it is; an s3:// prefix (a
    task directory kept in object storage) downloaded to `scratch`, every object under it."""
    from lmforge.common.storage import open_store
    from lmforge.common.store import local_path_of, scheme_of

    if scheme_of(uri) != "s3":
        return local_path_of(uri)
    store = open_store(uri.rstrip("/") + "/")
    try:
        names = store.list("")
        if not names:
            raise InputError(f"--tasks {uri}: nothing stored under it")
        for rel in names:
            (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
            store.download(rel, scratch / rel)
    finally:
        store.close()
    return scratch


def run_tasks(lm, tasks_dir: str | Path, *, log_samples: bool = False) -> tuple[dict[str, dict[str, float]], dict]:
    """Every task in `tasks_dir` on `lm`: ({task: {metric: value}}, lm_eval's whole results dict)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    folder = Path(tasks_dir).resolve()
    if not folder.is_dir():
        raise InputError(f"--tasks {tasks_dir}: no such directory")
    manager = TaskManager(include_path=str(folder), include_defaults=False)
    names = task_names(manager)
    if not names:
        raise InputError(f"--tasks {tasks_dir}: no lm-evaluation-harness task YAML in it")
    with _working_directory(folder):
        results = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=manager, bootstrap_iters=0,
                                          log_samples=log_samples, verbosity="WARNING")
    scores = {}
    for task in names:
        values = results["results"].get(task, {})
        scores[task] = {metric: float(value) for key, value in values.items()
                        if (metric := metric_name(key)) is not None and isinstance(value, int | float)}
    return scores, results


# ------------------------------------------------------------------ the job


@dataclass(frozen=True)
class EvalRequest:
    package: str
    step: int
    out: str
    data: dict[str, str]
    tasks: str | None = None
    max_sequences: int = 64
    device: str = "cpu"
    batch_size: int = 8


def parse_data(items: list[str]) -> dict[str, str]:
    """--data NAME=URI (or a bare URI: named after its last path component) → {name: uri}."""
    data: dict[str, str] = {}
    for item in items:
        name, sep, uri = item.partition("=")
        if not sep or "://" in name or "/" in name:
            uri = item
            name = uri.rstrip("/").rsplit("/", 1)[-1]
        if not name or not uri:
            raise ConfigError(f"--data {item!r}: give NAME=URI")
        if name in data:
            raise ConfigError(f"--data: the name {name!r} is given twice")
        data[name] = uri
    return data


def package_meta(uri: str) -> dict:
    """The weights package's meta.json (step, tokens, run, …), {} for a package without one (an export)."""
    from lmforge.common.storage import open_store

    store = open_store(uri)
    try:
        raw = store.get_bytes("meta.json")
    finally:
        store.close()
    if raw is None:
        return {}
    try:
        meta = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{uri}/meta.json: not JSON ({exc})") from exc
    return meta if isinstance(meta, dict) else {}


def evaluate_checkpoint(request: EvalRequest) -> dict:
    """Steps 1-3 of the module docstring: the result dict (not written)."""
    from lmforge.model.package import TOKENIZER, fetch_package, load_package
    from lmforge.trainer.lm_eval_backend import LmforgeLM

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="lmforge-checkpoint-eval-"))
    try:
        path = fetch_package(request.package, work / "package")
        if not path.is_dir():
            raise InputError(f"--package {request.package}: no such package")
        model, meta = load_package(path, request.device, require_checksums=True)
        extra = package_meta(request.package)
        heldout = {}
        for name, uri in request.data.items():
            source = val_source(uri, work / "data" / name, model.config.context_length, name)
            if source.tokenizer_sha256 != meta["tokenizer_sha256"]:
                raise InputError(f"--data {name}={uri} was tokenized with another tokenizer than {request.package}")
            result = heldout_loss(model, source, request.max_sequences, request.batch_size)
            heldout[name] = {"loss": result.loss, "perplexity": result.perplexity}
            log.info("heldout_evaluated", source=name, loss=result.loss, sequences=result.sequences)
        tasks = {}
        if request.tasks:
            harness_environment()
            lm = LmforgeLM(model, path / TOKENIZER, device=request.device, batch_size=request.batch_size)
            tasks, _ = run_tasks(lm, task_folder(request.tasks, work / "tasks"))
            log.info("tasks_evaluated", tasks=tasks)
        return {"step": request.step, "tokens": extra.get("tokens"), "package": request.package,
                "heldout": heldout, "tasks": tasks, "seconds": round(time.monotonic() - started, 3),
                "versions": _versions()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("lmforge-trainer", "lm_eval", "torch"):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


# ------------------------------------------------------------------ the store


def split_uri(out: str) -> tuple[str, str]:
    """`<prefix>/evals/step-N.json` → ("<prefix>/evals", "step-N.json")."""
    folder, sep, name = out.rstrip("/").rpartition("/")
    if not sep or not name.endswith(".json"):
        raise ConfigError(f"--out {out}: give the result's path or URI, ending in .json")
    return folder or "/", name


def write_result(out: str, result: dict) -> None:
    """The result JSON at `out`, all or nothing (a local rename or one PUT)."""
    from lmforge.common.storage import open_store

    folder, name = split_uri(out)
    store = open_store(folder)
    try:
        store.write_bytes(name, (json.dumps(result, indent=1) + "\n").encode())
    finally:
        store.close()


def stored_results(out: str) -> list[dict]:
    """Every result in the folder of `out` (files step-*.json, this one included once written)."""
    from lmforge.common.storage import open_store

    folder, _ = split_uri(out)
    store = open_store(folder)
    results = []
    try:
        for rel in store.list():
            if "/" in rel or not (rel.startswith(RESULT_PREFIX) and rel.endswith(".json")):
                continue
            raw = store.get_bytes(rel)
            try:
                result = json.loads(raw) if raw is not None else None
            except (UnicodeDecodeError, json.JSONDecodeError):
                log.warning("result_unreadable", result=store.join(rel))
                continue
            if isinstance(result, dict) and isinstance(result.get("step"), int):
                results.append(result)
    finally:
        store.close()
    return results


@dataclass(frozen=True)
class Best:
    """The best-so-far values over results of a step at most `step`: max per task metric, min loss per source."""

    task_scores: dict[tuple[str, str], float]
    heldout_losses: dict[str, float]
    newer_exists: bool


def best_so_far(result: dict, stored: list[dict]) -> Best:
    step = result["step"]
    eligible = [r for r in stored if r["step"] <= step and r["step"] != step] + [result]
    scores: dict[tuple[str, str], float] = {}
    losses: dict[str, float] = {}
    for r in eligible:
        for task, metrics in (r.get("tasks") or {}).items():
            for metric, value in metrics.items():
                if _finite(value):
                    scores[task, metric] = max(scores.get((task, metric), value), value)
        for source, values in (r.get("heldout") or {}).items():
            value = values.get("loss")
            if _finite(value):
                losses[source] = min(losses.get(source, value), value)
    return Best(scores, losses, any(r["step"] > step for r in stored))


def _finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


# ------------------------------------------------------------------ metrics


def build_registry(result: dict | None = None, best: Best | None = None):
    """The job's gauges (docs/design.md names), in a fresh registry; without arguments, the families only
    (what tests/observability lists). The run label comes from the push's grouping key."""
    registry = new_registry()
    score = Gauge("lmforge_eval_task_score", "A checkpoint's lm-evaluation-harness score",
                  ["task", "metric"], registry=registry)
    best_score = Gauge("lmforge_eval_task_best_score", "The best score of any checkpoint up to this one's step",
                       ["task", "metric"], registry=registry)
    loss = Gauge("lmforge_eval_heldout_loss", "A checkpoint's held-out loss (nats per token)", ["source"],
                 registry=registry)
    best_loss = Gauge("lmforge_eval_heldout_best_loss", "The lowest held-out loss of any checkpoint up to this "
                      "one's step", ["source"], registry=registry)
    step = Gauge("lmforge_eval_checkpoint_step", "The step of the evaluated checkpoint", registry=registry)
    tokens = Gauge("lmforge_eval_checkpoint_tokens", "Training tokens consumed by the evaluated checkpoint",
                   registry=registry)
    if result is None:
        return registry
    step.set(result["step"])
    if result.get("tokens") is not None:
        tokens.set(result["tokens"])
    else:  # a package without meta.json (an export): no series rather than a made-up 0
        registry.unregister(tokens)
    for task, metrics in result.get("tasks", {}).items():
        for metric, value in metrics.items():
            score.labels(task, metric).set(value)
    for source, values in result.get("heldout", {}).items():
        loss.labels(source).set(values["loss"])
    if best is not None:
        for (task, metric), value in best.task_scores.items():
            best_score.labels(task, metric).set(value)
        for source, value in best.heldout_losses.items():
            best_loss.labels(source).set(value)
    return registry


def push(gateway: str, registry, run: str, attempts: int = 3, timeout: float = 10.0) -> None:
    """PUT the registry to the Pushgateway (job lmforge-checkpoint-eval, group {run}), retrying. Raises PushError."""
    from prometheus_client import push_to_gateway

    from lmforge.common.retry import RetryPolicy, describe

    retry = RetryPolicy(attempts, 0.5, 5.0, log=log, event="push_retry")
    try:
        retry.call(f"push to {gateway}", lambda: push_to_gateway(
            gateway.rstrip("/"), job=PUSH_JOB, registry=registry, grouping_key={"run": run}, timeout=timeout),
            pushgateway=gateway)
    except Exception as exc:
        raise PushError(f"cannot push to the Pushgateway {gateway}: {describe(exc)}") from exc


def run(request: EvalRequest, *, pushgateway: str | None = None, run_name: str | None = None) -> dict:
    """The whole job: evaluate, write the result, push. Returns the result."""
    if not request.data and not request.tasks:
        raise ConfigError("give at least one --data source or --tasks DIR: nothing to evaluate")
    split_uri(request.out)  # a bad --out fails before the evaluation
    result = evaluate_checkpoint(request)
    write_result(request.out, result)
    log.info("checkpoint_evaluated", step=request.step, out=request.out, heldout=result["heldout"],
             tasks=result["tasks"], seconds=result["seconds"])
    if pushgateway:
        best = best_so_far(result, stored_results(request.out))
        if best.newer_exists:
            log.info("push_skipped", reason="a later step's result is already there", step=request.step)
        else:
            run_name = run_name or _run_of(request.out)
            try:
                push(pushgateway, build_registry(result, best), run_name)
                log.info("metrics_pushed", pushgateway=pushgateway, job=PUSH_JOB, run=run_name)
            except PushError as exc:
                log.error("push_failed", pushgateway=pushgateway, error=str(exc))
    return result


def _run_of(out: str) -> str:
    """The run's name when --run is not given: the folder above evals/ (`<dest>/evals/step-N.json`)."""
    parts = [p for p in split_uri(out)[0].split("/") if p]
    return parts[-2] if len(parts) >= 2 else "unknown"


def add_arguments(parser) -> None:
    parser.add_argument("--package", required=True, help="the model package: a path, file:// or s3:// URI")
    parser.add_argument("--step", required=True, type=int, help="the checkpoint's step (the result's `step`)")
    parser.add_argument("--out", required=True, help="where the result JSON goes: <dest>/evals/step-NNNNNNNN.json")
    parser.add_argument("--data", action="append", default=[], metavar="NAME=URI",
                        help="a data-prep output whose val split is held out (repeatable)")
    parser.add_argument("--tasks", metavar="DIR", help="lm-evaluation-harness task YAMLs (and their data files): "
                        "a folder, or an s3:// prefix downloaded first")
    parser.add_argument("--max-sequences", type=int, default=64,
                        help="held-out windows per source (the first N of the val split)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--pushgateway", help="push the lmforge_eval_* gauges there")
    parser.add_argument("--run", help="the run's name: the push's grouping key (default: the folder above evals/)")
    parser.add_argument("--endpoint-url", help="an S3-compatible endpoint (default: AWS_ENDPOINT_URL)")


def main_from_args(args) -> int:
    """The CLI handler's body: exit 70 for what is not an lmforge error (CLI_ERRORS propagate to ServiceCli)."""
    if args.max_sequences < 1 or args.batch_size < 1:
        raise ConfigError("--max-sequences and --batch-size must be at least 1")
    if args.endpoint_url:
        os.environ["AWS_ENDPOINT_URL"] = args.endpoint_url  # what lmforge.common.s3's clients read
    request = EvalRequest(package=args.package, step=args.step, out=args.out, data=parse_data(args.data),
                      tasks=args.tasks, max_sequences=args.max_sequences, device=args.device,
                      batch_size=args.batch_size)
    try:
        run(request, pushgateway=args.pushgateway, run_name=args.run)
    except CLI_ERRORS:
        raise
    except Exception:
        log.error("internal_error", exc_info=True, step=args.step, package=args.package)
        return EXIT_INTERNAL
    return 0
