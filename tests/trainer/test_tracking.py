"""Experiment tracking with the real MLflow and W&B clients on local stores (no server, no network):
what open_trackers records is read back with each tool's own reader."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lmforge.common.errors import ConfigError
from lmforge.trainer.config import TrackingSection, TrainConfig
from lmforge.trainer.tracking import MLFLOW_MAX_PARAM_VALUE, flatten_params, open_trackers

CONFIG = TrainConfig(data={"sources": [{"path": "/data/cc"}]}, model={"overrides": {"n_layer": 2}}).model_dump(
    mode="json"
)
STEPS = [(1, 3.5, 0.001), (2, 3.0, 0.002), (3, 2.5, 0.003)]


@pytest.fixture(autouse=True)
def restore_environ(monkeypatch):
    """open_trackers sets a few MLFLOW_/WANDB_ defaults in os.environ; keep them out of other tests."""
    saved = dict(os.environ)
    for name in ("MLFLOW_ALLOW_FILE_STORE", "MLFLOW_TRACKING_URI", "WANDB_CACHE_DIR", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_flatten_params():
    params = flatten_params(
        {"a": {"b": 1, "c": [0.9, 0.95], "d": [{"path": "x"}], "e": {}, "f": None, "g": True, "h": "s" * 7000}}
    )
    assert params == {
        "a.b": "1",
        "a.c": "[0.9, 0.95]",
        "a.d.0.path": "x",
        "a.e": "{}",
        "a.f": "null",
        "a.g": "true",
        "a.h": "s" * MLFLOW_MAX_PARAM_VALUE,
    }


def history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


@pytest.mark.parametrize("store", ["file", "sqlite"])
def test_mlflow_run_params_metrics_status_and_resume(tmp_path, store):
    from mlflow.tracking import MlflowClient

    uri = f"file://{tmp_path / 'mlruns'}" if store == "file" else f"sqlite:///{tmp_path / 'mlflow.db'}"
    section = TrackingSection(mlflow_tracking_uri=uri, mlflow_experiment="pretrain")
    run_dir = tmp_path / "run-7"
    # more than one 100-param batch, and a value over MLflow's length limit
    config = {**CONFIG, "extra": {f"k{i}": i for i in range(120)}, "notes": "n" * 7000}

    trackers = open_trackers(section, config, run_dir)
    for step, loss, lr in STEPS:
        trackers.log(step, {"loss": loss, "lr": lr, "name": "x", "nan": float("nan"), "inf": float("inf")})
    trackers.close("FINISHED")
    trackers.close("FINISHED")  # a second close is a no-op

    client = MlflowClient(uri)
    run_id = json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "run-7"
    assert client.get_experiment(run.info.experiment_id).name == "pretrain"
    params = run.data.params
    assert params["model.overrides.n_layer"] == "2"
    assert params["data.sources.0.path"] == "/data/cc"
    assert params["optim.betas"] == "[0.9, 0.95]"
    assert params["extra.k119"] == "119"
    assert params["notes"] == "n" * MLFLOW_MAX_PARAM_VALUE
    assert params == flatten_params(config)
    assert set(run.data.metrics) == {"loss", "lr"}
    assert history(client, run_id, "loss") == [(s, v) for s, v, _ in STEPS]
    assert history(client, run_id, "lr") == [(s, v) for s, _, v in STEPS]

    # A restart in the same run_dir continues the same run; params already logged keep their first value.
    resumed = open_trackers(section, {**config, "steps": 5000, "new_key": "v"}, run_dir)
    assert client.get_run(run_id).info.status == "RUNNING"
    resumed.log(4, {"loss": 2.0})
    resumed.close("FAILED")

    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert (run.data.params["steps"], run.data.params["new_key"]) == ("100", "v")
    assert history(client, run_id, "loss") == [(s, v) for s, v, _ in STEPS] + [(4, 2.0)]
    assert [r.info.run_id for r in client.search_runs([run.info.experiment_id])] == [run_id]


def test_mlflow_new_run_when_the_store_changes(tmp_path):
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    first, second = (f"file://{tmp_path / name}" for name in ("a", "b"))
    open_trackers(TrackingSection(mlflow_tracking_uri=first), CONFIG, run_dir).close()
    open_trackers(TrackingSection(mlflow_tracking_uri=second), CONFIG, run_dir).close()
    state = json.loads((run_dir / "tracking.json").read_text())["mlflow"]
    assert state["tracking_uri"] == second
    assert MlflowClient(second).get_run(state["run_id"]).info.status == "FINISHED"


# Runs open_trackers with W&B offline in a fresh interpreter, so that W&B's process-wide state and its
# service process start from scratch, and records any attempt to reach the network from Python.
WANDB_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path

    # os.write raises no audit event of its own, and this catches what runs at exit too
    network_log = os.open(sys.argv[4], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    def audit(event, args):
        if event in ("socket.getaddrinfo", "socket.gethostbyname") or (
            event == "socket.connect" and not isinstance(args[1], (str, bytes))
        ):
            os.write(network_log, f"{event} {args!r}\\n".encode())
    sys.addaudithook(audit)

    from lmforge.trainer.config import TrackingSection
    from lmforge.trainer.tracking import open_trackers

    run_dir, config, steps = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
    section = TrackingSection(wandb_project="lmforge-test", wandb_mode="offline", run_name="tiny-run")
    trackers = open_trackers(section, config, run_dir)
    for step, loss, lr in steps:
        trackers.log(step, {"loss": loss, "lr": lr, "name": "x", "nan": float("nan")})
    trackers.close("FINISHED")
    resumed = open_trackers(section, config, run_dir)
    resumed.log(4, {"loss": 2.0})
    resumed.close("FAILED")
    """
)


def wandb_records(path: Path):
    """The protobuf records of a .wandb transaction log (LevelDB log format: 32 KiB blocks of
    checksum/length/type-framed chunks after a 7-byte ':W&B' header)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # too little room left for a header: the block is padded
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def read_offline_run(path: Path) -> dict:
    history, run, exit_code = [], None, None
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(
                {".".join(item.nested_key or [item.key]): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "run":
            run = record.run
        elif kind == "exit":
            exit_code = record.exit.exit_code
    return {"history": history, "run": run, "exit_code": exit_code}


def test_wandb_offline_run_history_config_and_resume(tmp_path):
    home, cwd, run_dir = tmp_path / "home", tmp_path / "cwd", tmp_path / "runs" / "r1"
    network = tmp_path / "network.log"
    home.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "XDG_"))}
    env.update(HOME=str(home), WANDB_DISABLE_GIT="true", WANDB_DISABLE_CODE="true")
    done = subprocess.run(
        [sys.executable, "-c", WANDB_SCRIPT, str(run_dir), json.dumps(CONFIG), json.dumps(STEPS), str(network)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert network.read_text() == ""  # offline: no DNS lookups, no TCP/UDP connections
    assert not any(home.iterdir()) and not any(cwd.iterdir())  # nothing written outside run_dir

    run_id = json.loads((run_dir / "tracking.json").read_text())["wandb"]["id"]
    # The restart reuses the id: two offline runs with it (W&B adds "-1" when both start in the same second).
    run_files = [d / f"run-{run_id}.wandb" for d in (run_dir / "wandb").glob(f"offline-run-*-{run_id}*")]
    run, resumed = sorted(map(read_offline_run, run_files), key=lambda r: r["history"][0]["_step"])
    assert [(h["_step"], h["loss"], h["lr"]) for h in run["history"]] == [tuple(s) for s in STEPS]
    assert all("name" not in h and "nan" not in h for h in run["history"])
    assert run["exit_code"] == 0
    assert (run["run"].run_id, run["run"].project, run["run"].display_name) == (run_id, "lmforge-test", "tiny-run")
    config = {item.key: json.loads(item.value_json) for item in run["run"].config.update}
    assert config["model"]["overrides"] == {"n_layer": 2}
    assert config["optim"]["lr"] == CONFIG["optim"]["lr"]

    assert [(h["_step"], h["loss"]) for h in resumed["history"]] == [(4, 2.0)]
    assert resumed["exit_code"] == 1


def test_nothing_enabled_is_a_no_op_that_imports_nothing(tmp_path):
    run_dir = tmp_path / "run"
    script = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from lmforge.trainer.config import TrackingSection
        from lmforge.trainer.tracking import open_trackers

        trackers = open_trackers(TrackingSection(), {"a": 1}, Path(sys.argv[1]))
        trackers.log(1, {"loss": 1.0})
        trackers.close("FINISHED")
        imported = sorted(m for m in sys.modules if m.split(".")[0] in ("mlflow", "wandb"))
        print(json.dumps({"enabled": trackers.enabled, "imported": imported}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script, str(run_dir)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"enabled": False, "imported": []}
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("module", "section"),
    [
        ("mlflow", TrackingSection(mlflow_tracking_uri="sqlite:///unused.db")),
        ("wandb", TrackingSection(wandb_project="p", wandb_mode="offline")),
    ],
)
def test_missing_package_is_a_config_error(tmp_path, monkeypatch, module, section):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail as if not installed
    with pytest.raises(ConfigError, match=r"lmforge-trainer\[tracking\]") as caught:
        open_trackers(section, CONFIG, tmp_path / "run")
    assert module in str(caught.value)
    assert not (tmp_path / "run" / "tracking.json").exists()


def test_unreachable_mlflow_server_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    section = TrackingSection(mlflow_tracking_uri="http://127.0.0.1:9")  # discard port: connection refused
    with pytest.raises(ConfigError, match=r"tracking.mlflow_tracking_uri=http://127.0.0.1:9: MLflow could not"):
        open_trackers(section, CONFIG, tmp_path / "run")


def test_a_backend_that_fails_to_open_ends_the_runs_already_started(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setitem(sys.modules, "wandb", None)
    uri, run_dir = f"file://{tmp_path / 'mlruns'}", tmp_path / "run"
    with pytest.raises(ConfigError, match="wandb"):
        open_trackers(TrackingSection(mlflow_tracking_uri=uri, wandb_project="p"), CONFIG, run_dir)
    run_id = json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"]
    assert MlflowClient(uri).get_run(run_id).info.status == "FAILED"


def test_a_training_run_reports_every_step_and_evaluation_to_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    from lmforge.trainer.train import train
    from tests.trainer.helpers import random_output, read_metrics

    data = random_output(tmp_path / "data", train_tokens=20000)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    config = TrainConfig.model_validate({
        "data": {"sources": [{"path": str(data)}], "seq_len": 16, "batch_size": 4},
        "model": {"overrides": {"n_layer": 1, "n_embd": 32, "n_head": 2, "context_length": 16}},
        "steps": 6, "eval_every": 3, "eval_batches": 1, "run_dir": str(run_dir),
        "tracking": {"mlflow_tracking_uri": uri}})
    train(config)
    client = MlflowClient(tracking_uri=uri)
    run_id = json.loads((run_dir / "tracking.json").read_text())["mlflow"]["run_id"]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params["model.overrides.n_layer"] == "1"
    assert history(client, run_id, "loss") == [(r["step"], r["loss"]) for r in read_metrics(run_dir)]
    assert history(client, run_id, "val_loss") == [(r["step"], r["val_loss"]) for r in read_metrics(run_dir, "eval")]
