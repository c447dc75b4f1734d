"""The evaluation launcher against real uploads (file:// store) and real jobs (a subprocess that
writes a result as `lmforge-train eval-checkpoint` does): at most max_concurrent at once, newest
first, overtaken packages skipped and counted, a failed job retried once, a restarted sidecar
ingesting what landed without launching anything again, SIGTERM's drain; and the Kubernetes
runner against a fake batch/v1 API (create, 409 = already launched, conditions, delete)."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lmforge.uploader.cli import eval_launcher, open_destination
from lmforge.uploader.config import UploaderConfig
from lmforge.uploader.eval_runners import FAILED, SUCCEEDED, EvalJob, KubernetesRunner, job_name
from lmforge.uploader.metrics import UploaderMetrics
from tests.uploader.helpers import fake_weights, in_process_uploader, wait_for

JOB = Path(__file__).with_name("eval_job.py")


class Setup:
    """A run directory with a weights uploader and a launcher whose jobs follow `plan`."""

    def __init__(self, tmp_path: Path, plan: dict, **evaluation):
        self.tmp, self.run_dir = tmp_path, tmp_path / "r1"
        self.weights_dir, self.store = self.run_dir / "weights", tmp_path / "store"
        self.plan = tmp_path / "plan.json"
        self.plan.write_text(json.dumps({str(k): v for k, v in plan.items()}))
        self.config = UploaderConfig.model_validate({"evaluation": {
            "enabled": True, "command": [sys.executable, str(JOB), "--plan", str(self.plan)], **evaluation}})
        self.uploader = in_process_uploader(self.weights_dir, f"file://{self.store}", kind="weights")
        self.launcher = self.new_launcher()

    def new_launcher(self):
        """A launcher as a (re)started sidecar builds it."""
        dest = open_destination(f"file://{self.store}", self.config.transfer)
        return eval_launcher(dest, self.weights_dir, self.config, UploaderMetrics(), None)

    def package(self, *steps: int, final: bool = False) -> None:
        for step in steps:
            fake_weights(self.weights_dir, step, final=final)
        assert self.uploader.run_once() == list(steps)

    def settle(self, launcher=None, timeout: float = 30) -> None:
        launcher = launcher or self.launcher

        def idle() -> bool:
            launcher.step()
            return launcher.idle()

        wait_for(idle, timeout, "the launcher to be idle")

    def runs(self) -> list[dict]:
        path = self.tmp / "runs.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def records(self) -> list[dict]:
        path = self.run_dir / "evals.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def samples(self, launcher=None) -> dict:
        return scraped((launcher or self.launcher).metrics.registry)

    def close(self) -> None:
        self.uploader.close()
        self.launcher.close()


@pytest.fixture
def setup(tmp_path):
    made = []

    def make(plan, **evaluation):
        made.append(Setup(tmp_path, plan, **evaluation))
        return made[-1]

    yield make
    for one in made:
        one.close()


def scraped(registry) -> dict[str, float]:
    """A scrape of `registry`: `name` or `name{label="value"}` → value."""
    text = generate_latest(registry).decode()
    return {s.name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())) + "}" if s.labels else ""):
            s.value for family in text_string_to_metric_families(text) for s in family.samples}


def most_at_once(runs: list[dict]) -> int:
    return max(sum(r["start"] <= s["start"] < r["end"] for r in runs) for s in runs)


def test_newest_first_within_the_limit_and_overtaken_packages_skipped(setup):
    s = setup({step: {"sleep": 0.5, "loss": 4.0 - step / 100} for step in (10, 20, 30, 40)}, max_concurrent=2)
    s.package(10, 20, 30)
    s.launcher.step()
    assert sorted(s.launcher.running) == [20, 30]  # the newest two; 10 is overtaken
    assert (s.store / "evals" / "step-00000010.skipped").exists()
    s.package(40, final=True)
    s.launcher.step()
    assert s.launcher.pending == [40] and sorted(s.launcher.running) == [20, 30]  # waits: no slot, not skipped
    s.settle()

    runs = s.runs()
    assert sorted(r["step"] for r in runs) == [20, 30, 40] and most_at_once(runs) <= 2
    records = {r["step"]: r for r in s.records()}
    assert sorted(records) == [10, 20, 30, 40]
    assert records[10] == {"kind": "checkpoint_eval", "step": 10, "timestamp": records[10]["timestamp"],
                           "skipped": True}
    for step in (20, 30, 40):
        record = records[step]
        assert record["tokens"] == step * 100 and record["skipped"] is False
        assert record["score"] == pytest.approx(4.0 - step / 100)  # heldout/loss: the mean over sources
        assert record["heldout"]["val"]["loss"] == record["score"] and record["tasks"] == {"tiny_mc": {"acc": 0.5}}
        assert record["package"] == f"file://{s.store}/weights/step-{step:08d}"
    assert records[40]["best_step"] == 40 and records[40]["regressed"] == []
    samples = s.samples()
    assert samples["lmforge_eval_skipped_checkpoints_total"] == 1
    assert samples['lmforge_eval_jobs_total{outcome="succeeded"}'] == 3
    assert samples['lmforge_eval_jobs_total{outcome="failed"}'] == 0
    assert samples["lmforge_eval_jobs_running"] == 0 and samples["lmforge_eval_promoted_step"] == 40


def test_a_failed_job_is_retried_once_then_recorded_failed(setup):
    s = setup({10: {"fail": 1}, 20: {"fail": 2}}, max_concurrent=2)
    s.package(10, 20)
    s.settle()
    codes = {}
    for run in s.runs():
        codes.setdefault(run["step"], []).append(run["code"])
    assert codes == {10: [1, 0], 20: [1, 1]}
    records = {r["step"]: r for r in s.records()}
    assert records[10]["skipped"] is False and "failed" not in records[10]
    assert records[20] == {"kind": "checkpoint_eval", "step": 20, "timestamp": records[20]["timestamp"],
                           "failed": True, "skipped": False}
    assert (s.store / "evals" / "step-00000020.failed").exists()
    samples = s.samples()
    assert samples['lmforge_eval_jobs_total{outcome="succeeded"}'] == 1
    assert samples['lmforge_eval_jobs_total{outcome="failed"}'] == 1
    assert (s.run_dir / "eval-logs" / "step-00000020-retry.log").exists()


def test_a_restarted_sidecar_ingests_what_landed_and_launches_nothing_again(setup):
    s = setup({10: {"sleep": 0.3, "loss": 3.0}, 20: {"sleep": 0.3, "loss": 2.0}}, max_concurrent=2)
    s.package(10, 20)
    s.launcher.step()
    assert sorted(s.launcher.running) == [10, 20]
    wait_for(lambda: len(s.runs()) == 2, what="both jobs to finish")  # the first sidecar died meanwhile

    restarted = s.new_launcher()
    restarted.step()
    assert restarted.idle() and len(s.runs()) == 2  # nothing launched again
    assert [(r["step"], r["score"], r["best_step"]) for r in s.records()] == [(10, 3.0, 10), (20, 2.0, 20)]
    assert restarted.metrics.eval_promoted_step.value == 20

    again = s.new_launcher()  # restarted once more: the records are read back, none is written twice
    again.step()
    assert len(s.records()) == 2 and len(s.runs()) == 2

    (s.run_dir / "evals.jsonl").unlink()  # a new run directory: the store's results are ingested again
    fresh = s.new_launcher()
    fresh.step()
    assert [r["step"] for r in s.records()] == [10, 20] and len(s.runs()) == 2


def test_sigterm_drains_running_jobs_and_launches_nothing_new(setup):
    s = setup({10: {"sleep": 0.4}, 20: {}}, max_concurrent=2)
    s.package(10)
    s.launcher.step()
    s.launcher.request_stop()
    s.package(20)
    s.launcher.step()
    assert sorted(s.launcher.running) == [10]
    s.launcher.drain(10, poll_seconds=0.05)
    assert [r["step"] for r in s.records()] == [10] and [r["step"] for r in s.runs()] == [10]



def test_a_record_cut_short_by_a_crash_does_not_swallow_the_next_one(setup):
    s = setup({10: {}, 20: {}}, max_concurrent=1)
    s.package(10)
    s.settle()
    with open(s.run_dir / "evals.jsonl", "a") as fh:
        fh.write('{"kind": "checkpoint_eval", "step": 2')  # the sidecar died mid-write
    again = s.new_launcher()
    s.package(20)
    s.settle(again)
    lines = (s.run_dir / "evals.jsonl").read_text().splitlines()
    assert len(lines) == 3 and lines[1].endswith('"step": 2')
    assert [json.loads(lines[i])["step"] for i in (0, 2)] == [10, 20]
    again.close()


def test_a_local_job_outlives_a_stop_signalled_to_the_sidecars_group_and_one_cut_short_is_left_to_the_next(setup):
    """A pod's SIGTERM (the demo's supervisor: the sidecar's process group) reaches the sidecar only: its
    job runs on within the drain. A job that ends while the sidecar stops is not a failed evaluation:
    nothing is recorded, and the next sidecar launches it again."""
    import os

    s = setup({10: {"sleep": 0.6}, 20: {"fail": 1}}, max_concurrent=2)
    s.package(10)
    s.launcher.step()
    ((_, handle),) = s.launcher.running.values()
    assert os.getpgid(s.launcher.runner._children[handle].pid) != os.getpgrp()  # a group signal misses it
    s.launcher.request_stop()
    s.launcher.drain(10, poll_seconds=0.05)
    assert [r["step"] for r in s.records()] == [10]
    s.package(20)
    s.launcher.stopping.clear()
    s.launcher.step()
    s.launcher.request_stop()
    wait_for(lambda: (s.launcher._poll(), not s.launcher.running)[1], 30, "the job to end")
    assert [r["step"] for r in s.records()] == [10] and not (s.store / "evals" / "step-00000020.failed").exists()
    again = s.new_launcher()
    s.settle(again)
    assert [r["step"] for r in s.records()] == [10, 20] and not s.records()[1].get("failed")
    again.close()


# -- the Kubernetes runner -------------------------------------------------------------------

TEMPLATE = {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "placeholder", "labels": {"app.kubernetes.io/name": "lmforge"}},
            "spec": {"backoffLimit": 0, "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "lmforge"}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "eval", "image": "lmforge/trainer",
                    "args": ["eval-checkpoint", "--data", "web=s3://b/data/web"]}]}}}}


class FakeJobsApi:
    """batch/v1 Jobs of one namespace: create (409 when the name exists), get, delete; checks the token."""

    def __init__(self):
        self.jobs: dict[str, dict] = {}
        self.requests: list[tuple[str, str]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self) -> str | None:
                api.requests.append((self.command, self.path))
                if self.headers.get("Authorization") != "Bearer t0ken":
                    self._reply(401, {"reason": "Unauthorized"})
                    return None
                prefix = "/apis/batch/v1/namespaces/evals/jobs"
                assert self.path.startswith(prefix), self.path
                return self.path[len(prefix) + 1:]

            def do_POST(self):
                if (self._route()) is None:
                    return
                job = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if job["metadata"]["name"] in api.jobs:
                    self._reply(409, {"reason": "AlreadyExists"})
                    return
                api.jobs[job["metadata"]["name"]] = job
                self._reply(201, job)

            def do_GET(self):
                name = self._route()
                if name is not None:
                    self._reply(200, api.jobs[name]) if name in api.jobs else self._reply(404, {})

            def do_DELETE(self):
                name = self._route()
                if name is not None:
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                    self._reply(200, api.jobs.pop(name)) if name in api.jobs else self._reply(404, {})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def finish(self, name: str, condition: str) -> None:
        self.jobs[name]["status"] = {"conditions": [{"type": condition, "status": "True"}]}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def jobs_api():
    api = FakeJobsApi()
    yield api
    api.close()


def test_kubernetes_runner_creates_follows_and_deletes_jobs(jobs_api, tmp_path):
    template = tmp_path / "job.json"
    template.write_text(json.dumps(TEMPLATE))
    runner = KubernetesRunner(template, "evals", api_url=jobs_api.url, token="t0ken")
    job = EvalJob("Run_7.long" * 8, 12, "s3://b/r/weights/step-00000012", "s3://b/r/evals/step-00000012.json")
    handle = runner.launch(job)
    assert handle == job.name and len(handle) <= 63 and handle.endswith("-eval-12")
    created = jobs_api.jobs[handle]
    assert created["metadata"]["namespace"] == "evals"
    assert created["metadata"]["labels"]["lmforge.io/step"] == "12"
    assert created["metadata"]["labels"]["app.kubernetes.io/name"] == "lmforge"  # the template's kept
    assert created["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "checkpoint-eval"
    assert created["spec"]["template"]["spec"]["containers"][0]["args"] == [
        "eval-checkpoint", "--data", "web=s3://b/data/web", "--package", job.package, "--step", "12",
        "--out", job.out]
    assert TEMPLATE["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "web=s3://b/data/web"

    assert runner.launch(job) == handle  # 409: launched before (a restarted sidecar follows it)
    assert [m for m, _ in jobs_api.requests].count("POST") == 2 and len(jobs_api.jobs) == 1
    assert runner.outcome(handle) is None
    jobs_api.finish(handle, "Complete")
    assert runner.outcome(handle) == SUCCEEDED
    retry = runner.launch(EvalJob(job.run, 12, job.package, job.out, attempt=2))
    assert retry == job_name(job.run, 12, 2) and retry.endswith("-eval-12-retry")
    jobs_api.finish(retry, "Failed")
    assert runner.outcome(retry) == FAILED
    runner.cancel(retry)
    assert retry not in jobs_api.jobs and runner.outcome(retry) == FAILED  # gone: counted as failed


def test_kubernetes_runner_under_the_launcher_is_idempotent_across_a_restart(jobs_api, tmp_path):
    template = tmp_path / "job.json"
    template.write_text(json.dumps(TEMPLATE))
    s = Setup(tmp_path, {})
    try:  # the runner as the chart's config builds it, but speaking to the fake API
        kube = KubernetesRunner(template, "evals", api_url=jobs_api.url, token="t0ken")
        s.launcher.runner = kube
        s.package(10)
        s.launcher.step()
        assert list(jobs_api.jobs) == ["r1-eval-10"]

        restarted = s.new_launcher()  # the sidecar restarted while the Job runs
        restarted.runner = kube
        restarted.step()
        assert list(jobs_api.jobs) == ["r1-eval-10"] and list(restarted.running) == [10]  # 409: followed
        result = {"step": 10, "tokens": 1000, "heldout": {"val": {"loss": 2.5, "perplexity": 12.18}}, "tasks": {}}
        (s.store / "evals").mkdir()
        (s.store / "evals" / "step-00000010.json").write_text(json.dumps(result))  # what the Job writes
        jobs_api.finish("r1-eval-10", "Complete")
        restarted.step()
        assert restarted.idle() and [(r["step"], r["score"]) for r in s.records()] == [(10, 2.5)]

        restarted.request_stop()  # SIGTERM: a Job outlives the pod, so the final package still gets one
        s.package(20, final=True)
        restarted.step()
        assert sorted(jobs_api.jobs) == ["r1-eval-10", "r1-eval-20"]
    finally:
        s.close()


def test_one_slot_evaluates_the_newest_package_each_time_it_frees(setup):
    """One slot, three packages arriving one by one while it is busy: each pass launches only when
    the slot frees, and then only the newest; nothing runs twice."""
    s = setup({step: {"sleep": 0.3} for step in (1, 2, 3)}, max_concurrent=1)
    s.package(1)
    s.launcher.step()
    s.package(2)
    s.launcher.step()
    s.package(3)
    started = time.monotonic()
    s.settle()
    assert time.monotonic() - started < 10
    assert [r["step"] for r in s.runs()] == [1, 3]
    assert {r["step"]: r.get("skipped") for r in s.records()} == {1: False, 2: True, 3: False}


def test_watch_uploads_evaluates_and_exits_once_the_final_package_is_evaluated(tmp_path):
    """The sidecar as the demo runs it: checkpoints and weights uploaded, every package evaluated
    by a subprocess job, and `--exit-when-done` waiting for the final package's evaluation."""
    from tests.uploader.helpers import fake_checkpoint, run_uploader, small_parts

    run, store, plan = tmp_path / "r1", tmp_path / "store", tmp_path / "plan.json"
    plan.write_text(json.dumps({"4": {"sleep": 0.3, "loss": 2.0}}))
    fake_checkpoint(run / "checkpoints", 4, sizes=(1000,), meta={"config": {"steps": 5}})
    fake_weights(run / "weights", 4, final=True)
    command = json.dumps([sys.executable, str(JOB), "--plan", str(plan)])
    done = run_uploader("watch", "--dir", str(run / "checkpoints"), "--weights-dir", str(run / "weights"),
                        "--dest", f"file://{store}", "--exit-when-done", *small_parts(),
                        "--set", "evaluation.enabled=true", "--set", f"evaluation.command={command}", timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    assert [(r["step"], r["score"], r["best_step"]) for r in records] == [(4, 2.0, 4)]
    assert json.loads((store / "evals" / "best.json").read_text())["step"] == 4
