"""The observability story end to end, with real processes on loopback: Prometheus (Debian
package) scraping a running inference server, a tiny training run's rank-0 endpoint, the
uploader sidecar and a Pushgateway fed by a data-prep run and the canary, evaluating the
chart's own rules (rendered with a short window and `for: 0s`).

1. every PromQL expression of every dashboard panel returns data, and the dashboards page
   (the demo's) draws a chart with data for every panel;
2. the seed scenario: a good model and its canary baseline, then a worse model swapped in:
   the canary fails and LmforgeCanaryRegression fires in Prometheus;
3. an engine slowdown fires LmforgeInferenceTTFTHigh; removing it resolves the alert."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from tokenizers import Tokenizer

from lmforge.demo.dashboards import dashboard_queries, load_dashboards, query_panels, requires_of
from lmforge.demo.dashboards_page import write_page
from tests.canary.helpers import run_canary, write_eval_set
from tests.helm_chart import find, render
from tests.observability.page_charts import read_page, with_repeats
from tests.ports import free_port
from tests.processes import stop
from tests.prometheus_tools import alerts, query, running_prometheus, running_pushgateway, static_job, targets_up
from tests.serving import EOT, SENTENCES, perturbed_package, running_server, train_tiny_package, train_tokenizer
from tests.trace_index import build_test_index
from tests.trainer.helpers import random_output

pytestmark = pytest.mark.slow

RULE_VALUES = {"monitoring": {"rateWindow": "10s"},
               "alerts": {"forOverride": "0s", "inference": {"ttft": {"p95Seconds": 0.25}}}}
SMALL_MODEL = "model.overrides={n_layer: 1, n_head: 2, n_embd: 32, context_length: 32}"


EVAL_TASKS = Path(__file__).resolve().parents[1] / "fixtures" / "eval_tasks"  # a harness task, local files


def wait_until(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def plain_rule_file(path: Path) -> Path:
    """The chart's plain rule file (the rules ConfigMap) as this test renders it."""
    (configmap,) = find(render(RULE_VALUES), "ConfigMap", "lmforge-prometheus-rules")
    path.write_text(configmap["data"]["lmforge.rules.yaml"])
    return path


@contextlib.contextmanager
def background(command: list[str], log: Path, env: dict[str, str] | None = None):
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        try:
            yield process
        finally:
            stop(process, timeout=30)


class Inference:
    """The inference server on one fixed port, so Prometheus keeps scraping it across swaps."""

    def __init__(self, log: Path, trace_index: Path):
        self.port, self.log, self._stack = free_port(), log, contextlib.ExitStack()
        self.url = f"http://127.0.0.1:{self.port}"
        self.trace_index = trace_index  # every model served traces against it (the same tokenizer)

    def serve(self, package: Path, *settings: str) -> None:
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(running_server(package, f"trace.index={self.trace_index}", *settings,
                                                 port=self.port, log_path=self.log))

    def traffic(self, n: int, concurrency: int = 4) -> None:
        """n completions, and a trace of one sentence each fourth (the trace latency panel's data)."""
        import concurrent.futures

        def one(i):
            response = httpx.post(f"{self.url}/v1/completions", timeout=60,
                                  json={"prompt": "The sun rises", "max_tokens": 8, "temperature": 0.7, "seed": i})
            assert response.status_code == 200, response.text
            if i % 4 == 0:
                traced = httpx.post(f"{self.url}/v1/trace", timeout=60, json={"text": SENTENCES[i % len(SENTENCES)]})
                assert traced.status_code == 200, traced.text

        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(n)))

    def close(self) -> None:
        self._stack.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("observability")
    good = train_tiny_package(work / "models" / "good")
    worse = perturbed_package(good, work / "models" / "worse", scale=0.5)
    eval_set = write_eval_set(work / "canary.yaml")
    # what the models learned, indexed with their tokenizer: /v1/trace and the canary's memorization gauge
    tokenizer = Tokenizer.from_file(str(good / "tokenizer.json"))
    trace_index = build_test_index(work / "trace-index", [tokenizer.encode(s).ids for s in SENTENCES],
                                   vocab_size=tokenizer.get_vocab_size(), eos_token_id=tokenizer.token_to_id(EOT),
                                   tokenizer_json=good / "tokenizer.json")
    with contextlib.ExitStack() as stack:
        gateway = stack.enter_context(running_pushgateway(work / "pushgateway.log"))
        inference = Inference(work / "serve.log", trace_index)
        stack.callback(inference.close)
        inference.serve(good)

        # a real tokenizer: the evaluation jobs encode their harness task's text with it
        data = random_output(work / "data", tokenizer=train_tokenizer(work / "tokenizer.json"))
        trainer_port, uploader_port = free_port(), free_port()
        run_dir = work / "train"
        trainer = stack.enter_context(background(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
             "-m", "lmforge.trainer", f"data.sources=[{{path: {data}}}]", "data.seq_len=32", "data.batch_size=2",
             "parallel.mode=none", "steps=100000", "checkpoint.every=4", "log_every=2", "eval_every=4",
             "eval_batches=1", "checkpoint.weights_every=4", f"run_dir={run_dir}",
             f"metrics.port={trainer_port}", "metrics.peak_flops=1e10", SMALL_MODEL],
            work / "train.log", env={"LMFORGE_TRAINER_SLOW_DATA_SECONDS": "0.2"}))  # keeps a core free
        (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        # Each weights package gets the real evaluation job (the harness task in tests/fixtures), pushing
        # its scores; one at a time, newest first, so the stack keeps a core for the trainer.
        evaluation = work / "uploader.yaml"
        evaluation.write_text(yaml.safe_dump({"evaluation": {
            "enabled": True, "max_concurrent": 1, "runner": "subprocess", "promote": "propose", "run": "obs",
            "command": [sys.executable, "-m", "lmforge.trainer.cli", "eval-checkpoint", "--data", f"web={data}",
                        "--tasks", str(EVAL_TASKS), "--max-sequences", "4", "--run", "obs", "--pushgateway",
                        gateway]}}))
        stack.enter_context(background(
            [sys.executable, "-m", "lmforge.uploader", "watch", "--dir", str(run_dir / "checkpoints"),
             "--weights-dir", str(run_dir / "weights"), "--config", str(evaluation),
             "--dest", f"file://{work / 'store'}", "--set", f"metrics_port={uploader_port}", "--set",
             "poll_seconds=0.5"], work / "uploader.log"))

        sample = work / "sample.warc.wet.gz"
        subprocess.run([sys.executable, "-m", "lmforge.sample_data", "--output", str(sample), "--docs", "150",
                        "--seed", "3"], check=True, capture_output=True)
        prep = subprocess.run([sys.executable, "-m", "lmforge.dataprep", "run", "--input", str(sample), "--output",
                               str(work / "prep"), "--pushgateway", gateway, "--set", "tokenizer.vocab_size=600"],
                              capture_output=True, text=True)
        assert prep.returncode == 0, prep.stderr[-2000:]

        baseline = work / "baseline.json"
        made = run_canary("make-baseline", "--endpoint", inference.url, "--eval-set", str(eval_set),
                          "--output", str(baseline))
        assert made.code == 0, made
        passed = run_canary("--endpoint", inference.url, "--eval-set", str(eval_set), "--baseline", str(baseline),
                            "--pushgateway", gateway)
        assert passed.code == 0, passed

        scrape = [static_job("lmforge-inference", inference.url), static_job("lmforge-trainer",
                  f"http://127.0.0.1:{trainer_port}"), static_job("lmforge-uploader",
                  f"http://127.0.0.1:{uploader_port}"), static_job("pushgateway", gateway, honor_labels=True)]
        prometheus = stack.enter_context(running_prometheus(work, scrape, [plain_rule_file(work / "rules.yaml")]))
        inference.traffic(12)
        wait_until(lambda: trainer.poll() is None and all(targets_up(prometheus).values())
                   and len(targets_up(prometheus)) == 4, 120, "every target up")
        wait_until(lambda: query(prometheus, "lmforge_uploader_last_uploaded_step > 0"), 120,
                   "a checkpoint uploaded")
        wait_until(lambda: query(prometheus, "lmforge_train_val_loss"), 120, "a validation loss")  # absent until then
        wait_until(lambda: query(prometheus, "lmforge_eval_task_score") and query(prometheus,
                   "lmforge_eval_promoted_step"), 180, "a weights checkpoint evaluated and proposed")
        yield {"prometheus": prometheus, "inference": inference, "good": good, "worse": worse,
               "eval_set": eval_set, "baseline": baseline, "gateway": gateway, "trainer": trainer}


def firing(prometheus: str, name: str) -> list[dict]:
    return [a for a in alerts(prometheus) if a["labels"]["alertname"] == name and a["state"] == "firing"]


def test_every_dashboard_query_returns_data(stack):
    prometheus, inference = stack["prometheus"], stack["inference"]
    inference.traffic(8)  # fresh traffic inside every rate window
    time.sleep(3)
    empty = []
    for name, dashboard in load_dashboards().items():
        for title, expr, requires in dashboard_queries(dashboard, __rate_interval="10s", __interval="5s"):
            if requires == "gpu":
                continue  # no GPU here: those series are absent by design
            if not query(prometheus, expr):
                empty.append(f"{name} / {title}: {expr}")
    assert stack["trainer"].poll() is None, "the training run ended early"
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_the_dashboards_page_draws_every_panel_with_data(stack, tmp_path):
    """The demo's dashboards page (lmforge.demo.dashboards_page) from this Prometheus: one chart
    with data points per panel (a stat panel: its values), GPU-only panels excepted, legends from
    the panels' legendFormat."""
    stack["inference"].traffic(8)
    time.sleep(3)
    end = time.time()
    page = tmp_path / "dashboards.html"
    write_page(page, stack["prometheus"], end - 300, end, 2.0, __rate_interval="10s", __interval="5s")
    drawn, tags, attributes = read_page(page.read_text())
    panels = [(with_repeats(p["title"], task="lmforge_tiny_mc"), requires_of(p))
              for d in load_dashboards().values() for p in query_panels(d)]
    assert [(p.title, p.requires or None) for p in drawn] == panels
    for panel in drawn:
        if panel.requires == "gpu":
            assert panel.charts == 0, panel
        elif panel.stats:  # a stat panel: its values, as Grafana draws it, no chart
            assert panel.charts == 0 and not panel.no_data, panel
        else:
            assert panel.charts == 1 and panel.points > 0 and panel.paths and not panel.no_data, panel
    requests = next(p for p in drawn if p.title == "Requests by status")
    assert any(item.startswith("good 200 last ") and item.endswith(" req/s") for item in requests.legend)
    assert "script" not in tags and not {a for _, a in attributes} & {"src", "href"}


def test_a_worse_model_fails_the_canary_and_fires_the_regression_alert(stack):
    prometheus, inference = stack["prometheus"], stack["inference"]
    assert not firing(prometheus, "LmforgeCanaryRegression")
    inference.serve(stack["worse"])
    regressed = run_canary("--endpoint", inference.url, "--eval-set", str(stack["eval_set"]), "--baseline",
                           str(stack["baseline"]), "--pushgateway", stack["gateway"])
    assert regressed.code == 1, regressed
    fired = wait_until(lambda: firing(prometheus, "LmforgeCanaryRegression"), 30, "LmforgeCanaryRegression firing")
    assert fired[0]["labels"]["severity"] == "critical" and fired[0]["labels"]["model"] == "worse"


def test_an_engine_slowdown_fires_the_ttft_alert_and_recovery_resolves_it(stack):
    prometheus, inference = stack["prometheus"], stack["inference"]
    inference.serve(stack["good"], "engine.step_delay_seconds=0.3")
    assert not firing(prometheus, "LmforgeInferenceTTFTHigh")

    def slow_and_firing():
        inference.traffic(4)
        return firing(prometheus, "LmforgeInferenceTTFTHigh")

    fired = wait_until(slow_and_firing, 60, "LmforgeInferenceTTFTHigh firing", interval=0)
    assert fired[0]["labels"]["model_name"] == "good"
    inference.serve(stack["good"])  # the delay removed

    def fast_and_resolved():
        inference.traffic(8)
        # resolved by a low p95, not by the restarted server's series being briefly absent
        p95 = query(prometheus, 'lmforge:inference_ttft_seconds:p95{model_name="good"}')
        return p95 and float(p95[0]["value"][1]) < 0.25 and not [
            a for a in alerts(prometheus) if a["labels"]["alertname"] == "LmforgeInferenceTTFTHigh"]

    wait_until(fast_and_resolved, 60, "LmforgeInferenceTTFTHigh resolved with p95 under 0.25 s", interval=0)


def test_the_rule_file_is_the_one_prometheus_loaded(stack):
    rules = httpx.get(f"{stack['prometheus']}/api/v1/rules", timeout=10).json()["data"]["groups"]
    loaded = {r["name"] for g in rules for r in g["rules"] if r["type"] == "alerting"}
    rendered = yaml.safe_load(find(render(RULE_VALUES), "ConfigMap", "lmforge-prometheus-rules")[0]["data"]
                              ["lmforge.rules.yaml"])
    assert loaded == {r["alert"] for g in rendered["groups"] for r in g["rules"] if "alert" in r}
