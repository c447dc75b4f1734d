"""Optional experiment tracking (MLflow, Weights & Biases) for the training loop's rank 0.

    trackers = open_trackers(config.tracking, config.model_dump(mode="json"), run_dir)
    trackers.log(step, {"loss": 2.31, "lr": 1e-3})
    trackers.close("FINISHED")  # or "FAILED"

With no backend enabled this is a no-op that imports nothing. mlflow and wandb are imported only
when enabled (extra `lmforge-trainer[tracking]`). A restarted run (same run_dir) continues the same
MLflow run and W&B run: their ids are kept in RUN_DIR/tracking.json.
"""

from __future__ import annotations

import importlib
import json
import math
import numbers
import os
import secrets
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlparse

from lmforge.common.atomic_files import atomic_write_bytes
from lmforge.common.errors import ConfigError
from lmforge.common.logging import get_logger

if TYPE_CHECKING:
    from lmforge.trainer.config import TrackingSection

STATE_FILE = "tracking.json"
Status = Literal["FINISHED", "FAILED", "KILLED"]

# MLflow's limits (mlflow.utils.validation); longer values are truncated, longer keys skipped.
MLFLOW_MAX_PARAM_KEY = 250
MLFLOW_MAX_PARAM_VALUE = 6000
MLFLOW_MAX_PARAMS_PER_BATCH = 100


class _Backend(Protocol):
    name: str

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self, status: Status) -> None: ...


class Trackers:
    """The enabled backends. log() and close() never raise: a tracking outage must not stop training."""

    def __init__(self, backends: list[_Backend] | None = None):
        self._backends = list(backends or [])
        self._log = get_logger("trainer")

    @property
    def enabled(self) -> bool:
        return bool(self._backends)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self._backends:
            return
        numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, numbers.Real) and math.isfinite(v)}
        if not numeric:
            return
        for backend in self._backends:
            try:
                backend.log(step, numeric)
            except Exception as exc:
                self._log.warning("tracking_log_failed", backend=backend.name, step=step, error=repr(exc))

    def close(self, status: Status = "FINISHED") -> None:
        backends, self._backends = self._backends, []
        for backend in backends:
            try:
                backend.close(status)
            except Exception as exc:
                self._log.warning("tracking_close_failed", backend=backend.name, error=repr(exc))


def open_trackers(section: TrackingSection, config: dict[str, Any], run_dir: Path) -> Trackers:
    """Start (or, for a restarted run_dir, continue) a run in each enabled backend, recording `config`."""
    if not section.mlflow_tracking_uri and not section.wandb_project:
        return Trackers()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_name = section.run_name or run_dir.resolve().name
    state = _load_state(run_dir)
    backends: list[_Backend] = []
    try:
        if section.mlflow_tracking_uri:
            backends.append(_MLflow(section, config, run_name, state))
        if section.wandb_project:
            backends.append(_WandB(section, config, run_name, run_dir, state))
    except BaseException:
        Trackers(backends).close("FAILED")
        raise
    finally:
        if state:  # also when one backend failed: a run already started is continued next time
            _save_state(run_dir, state)
    get_logger("trainer").info("tracking_started", backends=[b.name for b in backends], run_name=run_name)
    return Trackers(backends)


def flatten_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config → {"optim.lr": "0.001", "data.sources.0.path": "…"} for MLflow params.

    Lists of scalars stay one JSON value; lists holding dicts or lists are indexed like dicts.
    """
    params: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            params.update(flatten_params(value, name + "."))
        elif isinstance(value, list | tuple) and any(isinstance(v, dict | list | tuple) for v in value):
            params.update(flatten_params({str(i): v for i, v in enumerate(value)}, name + "."))
        elif len(name) <= MLFLOW_MAX_PARAM_KEY:
            text = value if isinstance(value, str) else json.dumps(value)
            params[name] = text[:MLFLOW_MAX_PARAM_VALUE]
    return params


def _import(module: str, field: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise _missing(exc.name or module, field) from exc


def _missing(module: str, field: str) -> ConfigError:
    return ConfigError(
        f"tracking.{field} is set but the package {module!r} is not installed; "
        "install the tracking extra: pip install 'lmforge-trainer[tracking]'"
    )


def _load_state(run_dir: Path) -> dict[str, Any]:
    try:
        state = json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _save_state(run_dir: Path, state: dict[str, Any]) -> None:
    atomic_write_bytes(run_dir / STATE_FILE, json.dumps(state, indent=1, sort_keys=True).encode())


class _MLflow:
    name = "mlflow"

    def __init__(self, section: TrackingSection, config: dict[str, Any], run_name: str, state: dict[str, Any]):
        uri, field = section.mlflow_tracking_uri, "mlflow_tracking_uri"
        _import("mlflow", field)
        from mlflow.entities import Metric
        from mlflow.exceptions import MlflowException

        if urlparse(uri).scheme in ("", "file"):
            # MLflow 3 keeps its file store behind an opt-in; asking for a file:// URI is that opt-in.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._metric = Metric
        try:
            self._client, self._run_id = _mlflow_run(section, state.get("mlflow") or {}, run_name)
            _mlflow_params(self._client, self._run_id, flatten_params(config))
        except ImportError as exc:  # e.g. a sqlite:// store without sqlalchemy
            raise _missing(exc.name or "mlflow", field) from exc
        except (MlflowException, OSError) as exc:
            raise ConfigError(f"tracking.{field}={uri}: MLflow could not start a run: {exc}") from exc
        state["mlflow"] = {"tracking_uri": uri, "experiment": section.mlflow_experiment, "run_id": self._run_id}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        batch = [self._metric(key, value, now, step) for key, value in metrics.items()]
        # Asynchronous so that a slow or unreachable server never stalls a training step;
        # set_terminated() in close() waits for the queue to drain.
        self._client.log_batch(self._run_id, metrics=batch, synchronous=False)

    def close(self, status: Status) -> None:
        self._client.set_terminated(self._run_id, status=status)


def _mlflow_run(section: TrackingSection, prior: dict[str, Any], run_name: str) -> tuple[Any, str]:
    """A client and the run to log to: the stored one when it is in this store and experiment, else a new one."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=section.mlflow_tracking_uri)
    same_store = prior.get("tracking_uri") == section.mlflow_tracking_uri
    if same_store and prior.get("experiment") == section.mlflow_experiment and prior.get("run_id"):
        try:
            run = client.get_run(prior["run_id"])
        except MlflowException:  # the store was reset: start afresh
            run = None
        if run is not None and run.info.lifecycle_stage == "active":
            client.update_run(run.info.run_id, status="RUNNING")
            return client, run.info.run_id
    experiment = client.get_experiment_by_name(section.mlflow_experiment)
    if experiment is None:
        experiment_id = client.create_experiment(section.mlflow_experiment)
    else:
        experiment_id = experiment.experiment_id
    return client, client.create_run(experiment_id, run_name=run_name).info.run_id


def _mlflow_params(client: Any, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param

    # Params are immutable in MLflow: a resumed run keeps the values it started with and gains new keys.
    logged = client.get_run(run_id).data.params
    changed = sorted(k for k, v in params.items() if k in logged and logged[k] != v)
    if changed:
        get_logger("trainer").warning("mlflow_params_kept_on_resume", keys=changed)
    new = [Param(k, v) for k, v in params.items() if k not in logged]
    for i in range(0, len(new), MLFLOW_MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=new[i : i + MLFLOW_MAX_PARAMS_PER_BATCH])


class _WandB:
    name = "wandb"

    def __init__(
        self,
        section: TrackingSection,
        config: dict[str, Any],
        run_name: str,
        run_dir: Path,
        state: dict[str, Any],
    ):
        wandb = _import("wandb", "wandb_project")
        run_id = (state.get("wandb") or {}).get("id") or secrets.token_hex(8)
        # W&B's service writes its own logs under its cache dir (~/.cache/wandb): keep them with the run.
        os.environ.setdefault("WANDB_CACHE_DIR", str(run_dir / "wandb" / "cache"))
        # console off / silent: stdout stays JSON lines only.
        settings = wandb.Settings(mode=section.wandb_mode, console="off", silent=True)
        # The process-wide settings decide whether W&B sends its own usage telemetry; init(mode="offline")
        # alone does not stop it from calling home.
        try:
            wandb.setup(settings=settings)
            self._run = wandb.init(
                project=section.wandb_project,
                name=run_name,
                id=run_id,
                resume="allow",
                dir=str(run_dir),
                config=config,
                settings=settings,
            )
        except (wandb.Error, OSError) as exc:
            raise ConfigError(f"tracking.wandb_project: W&B could not start a run: {exc}") from exc
        state["wandb"] = {"id": run_id}

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def close(self, status: Status) -> None:
        self._run.finish(exit_code=0 if status == "FINISHED" else 1)
