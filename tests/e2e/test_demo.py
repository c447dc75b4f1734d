"""`make demo` scaled down (a smaller corpus, fewer steps), its steps run in-process as the demo
runs them, then each step's real outcome checked independently of the demo's own summary:

- the shards exist, match the manifest and decode back to text;
- the resumed run's losses continue the interrupted run's curve exactly, both attempts in the
  run's one metrics.jsonl, and the training report the summary links draws them;
- the checkpoint in S3 verifies (restored through the uploader, every file's sha256 checked);
- completions come back (with the demo key only), streamed too, from the model exported in
  Hugging Face format, which transformers loads with the same logits;
- the canary passes against the recorded baseline, and its result is in the Pushgateway;
- every dashboard panel's query returns data from Prometheus, and the page the summary links
  draws a chart with data for each.

And the demo as a command: interrupted, it stops everything it started and leaves no half-written
step; killed outright, `lmforge-demo stop` ends what it left running."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from lmforge.common.checkpoint_layout import committed_steps, step_dir
from lmforge.common.shards import open_shard, read_doc_ends
from lmforge.common.storage import sha256_file
from lmforge.demo.config import load_demo_config
from lmforge.demo.dashboards import dashboard_queries, load_dashboards, query_panels, requires_of
from lmforge.demo.platform import LocalPlatform
from lmforge.demo.prometheus import query
from lmforge.demo.stages.evaluation import REGRESSION_ALERT, TASK
from lmforge.demo.stages.storage import s3_env
from lmforge.trainer.metrics_file import by_attempt, read_records
from tests.canary.helpers import run_canary
from tests.observability.page_charts import read_page, with_repeats
from tests.prometheus_tools import pushed_value
from tests.shard_listing import local_shards

pytestmark = pytest.mark.slow

SCALED = ["data.docs_per_file=600", "data.vocab_size=1024", "data.shard_tokens=50000", "data.val_fraction=0.05",
          "train.steps=30", "train.checkpoint_every=10", "train.interrupt_at=24", "train.eval_every=15",
          "train.seq_len=64", "train.batch_size=4", "train.weights_every=10",
          "serve.canary_texts=4", "serve.max_tokens=12", "serve.port=0",
          "observe.prometheus_port=0", "observe.pushgateway_port=0", "observe.scrape_interval=1s",
          "observe.rate_window=10s"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("demo")
    config = load_demo_config(overrides=[f"workdir={workdir}", "hold=false", *SCALED])
    printed = io.StringIO()
    platform = LocalPlatform(config, stream=printed)
    try:
        platform.run()
        yield platform, printed.getvalue()
    finally:
        platform.close()


def test_it_prints_each_step_and_a_summary(demo):
    platform, printed = demo
    for number in range(1, 8):
        assert f"[{number}/7] " in printed
    assert "curl -s http://127.0.0.1:" in printed and "Bearer lmforge-demo-key" in printed
    assert json.loads((platform.workdir / "summary.json").read_text()) == json.loads(json.dumps(platform.summary))
    assert not (platform.workdir / ".staging").exists()


def test_shards_exist_and_decode(demo):
    platform, _ = demo
    data = platform.workdir / "data"
    manifest = json.loads((data / "manifest.json").read_text())
    tokenizer = Tokenizer.from_file(str(data / "tokenizer.json"))
    assert set(manifest["splits"]) == {"train", "val"}
    for shard in local_shards(data):
        path = data / shard["path"]
        assert sha256_file(path) == shard["sha256"]
        header, tokens = open_shard(path)
        assert header.token_count == shard["tokens"] > 0
        ends = read_doc_ends(path)
        first = tokenizer.decode([int(t) for t in tokens[:ends[0]]])
        assert len(first.split()) >= 10, first  # a document, not noise
    assert (data / "report.html").stat().st_size > 0
    report = json.loads((data / "report.json").read_text())
    assert report["inputs"]["records"] == 2 * 600 and 0 < report["totals"]["kept_docs"] < 1200
    # true after the step moved its output into place: a real wall time, no staging path
    assert report["totals"]["wall_seconds"] > 0
    assert ".staging" not in (data / "report.json").read_text() + (data / "report.html").read_text()


def test_a_training_passage_traces_back_to_its_documents_url(demo):
    """Data prep → trace index → the served model → /v1/trace names the passage's document, as its lineage
    (its WET record's URL) records it; the completion's trace rides on the choice; the summary shows both."""
    platform, printed = demo
    data = platform.workdir / "data"
    index = json.loads((data / "trace-index" / "index.json").read_text())
    train = [s for s in local_shards(data) if s["split"] == "train"]
    assert index["tokens"] == sum(s["tokens"] - s["documents"] for s in train)  # every train token, EOTs dropped
    assert index["documents"] == sum(s["documents"] for s in train)
    trace = platform.summary["serve"]["trace"]
    assert trace["found"] and trace["longest"] >= 32 and trace["count"] >= 1
    assert trace["url"].startswith("http")
    url, key = platform.summary["serve"]["url"], platform.summary["serve"]["api_key"]
    traced = httpx.post(f"{url}/v1/trace", json={"text": trace["text"], "max_documents": 50},
                        headers={"Authorization": f"Bearer {key}"}, timeout=60).json()
    assert trace["url"] in {d["url"] for s in traced["spans"] for d in s["documents"]}
    assert httpx.post(f"{url}/v1/trace", json={"text": trace["text"]}, timeout=60).status_code == 401
    assert f"its own document ({trace['url']}) named" in printed


def test_the_resumed_loss_continues_the_interrupted_curve(demo):
    platform, printed = demo
    train = platform.workdir / "train"
    # attempt 1's checkpoints went with its pod; evaluation/: the sidecar's evaluation config and task
    assert sorted(p.name for p in train.iterdir()) == ["evaluation", "run"]
    records = read_records(train / "run" / "metrics.jsonl")
    attempts = by_attempt(records)
    assert sorted(attempts) == [1, 2]
    before = {r["step"]: r["loss"] for r in attempts[1]}
    after = {r["step"]: r["loss"] for r in attempts[2]}
    assert max(before) == 23  # killed on reaching step 24 (0-based)
    resumed_from = min(after) - 1
    assert resumed_from in (9, 19), "the resumed run starts after a checkpoint the uploader had uploaded"
    starts = [(r["attempt"], r["resumed_from"]) for r in records if r["kind"] == "start"]
    assert starts == [(1, None), (2, resumed_from)]
    assert max(after) == 29
    overlap = [s for s in after if s in before]
    assert overlap == list(range(resumed_from + 1, 24))
    assert [after[s] for s in overlap] == [before[s] for s in overlap]  # exactly, not approximately
    assert after[29] < before[0]
    assert platform.summary["train"]["killed_by"] == "SIGKILL"
    assert "attempt 1 killed by SIGKILL at step 24" in printed


def test_the_summary_links_the_training_report(demo):
    platform, printed = demo
    report = Path(platform.summary["where"]["training_report"])
    assert report == platform.workdir / "train" / "run" / "report.html" and str(report) in printed
    text = report.read_text()
    resumed_from = platform.summary["train"]["restored_step"]
    for chart in ("loss", "lr", "grad_norm", "tokens_per_second"):
        assert f'<svg class="chart" data-chart="{chart}"' in text, chart
    assert '<p class="nodata" data-chart="mfu">n/a' in text  # CPU: no MFU
    assert f'class="marker resume" data-step="{resumed_from}" data-attempt="2"' in text
    for step in platform.summary["train"]["uploaded_steps"]:
        assert f'class="marker checkpoint" data-step="{step}"' in text
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
    assert ".staging" not in text


def test_the_checkpoint_in_s3_verifies(demo, tmp_path, monkeypatch):
    from lmforge.uploader.cli import main as uploader

    platform, _ = demo
    train = platform.summary["train"]
    for name, value in s3_env(train["s3_endpoint"]).items():
        monkeypatch.setenv(name, value)
    assert train["uploaded_steps"][-1] == 29
    assert uploader(["restore", "--src", train["destination"], "--dir", str(tmp_path), "--step", "29"]) == 0
    restored, local = step_dir(tmp_path, 29), step_dir(platform.workdir / "train" / "run" / "checkpoints", 29)
    assert committed_steps(tmp_path) == [29]
    files = sorted(p.relative_to(local) for p in local.rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(restored) for p in restored.rglob("*") if p.is_file())
    assert all(sha256_file(local / f) == sha256_file(restored / f) for f in files)


def test_each_weights_checkpoint_is_evaluated_and_the_best_promoted_not_the_zeroed_one(demo):
    """Weights packages at steps 9, 19 (attempt 1) and 29 (attempt 2, the last, zeroed on purpose): each
    evaluated by its job or counted skipped; the zeroed one regressed, fired the alert in the demo's
    Prometheus and was passed over; the model pointer names the best package, a verified copy."""
    from lmforge.model.package import fetch_package, verify_package
    from lmforge.model.pointer import read_pointer

    platform, printed = demo
    evaluation = platform.summary["train"]["evaluation"]
    assert sorted(evaluation["evaluated"] + evaluation["skipped"]) == [9, 19, 29] and evaluation["failed"] == []
    assert 29 in evaluation["evaluated"] and evaluation["zeroed_step"] == 29 and evaluation["zeroed_regressed"]
    zeroed = evaluation["scores"][29]["heldout"]["demo"]["loss"]
    assert zeroed == pytest.approx(math.log(1024), abs=1e-3)  # all-zero weights: uniform over the vocabulary
    assert set(evaluation["scores"][29]["tasks"]) == {TASK}
    best = evaluation["best_step"]
    assert best in (9, 19) and evaluation["scores"][best]["heldout"]["demo"]["loss"] < zeroed - 0.5
    assert evaluation["alert"] == REGRESSION_ALERT and f"{REGRESSION_ALERT} fired" in printed
    storage = s3_env(platform.summary["train"]["s3_endpoint"])
    with pytest.MonkeyPatch.context() as env:
        for name, value in storage.items():
            env.setenv(name, value)
        pointer = read_pointer("s3://lmforge-demo/models/current")
        assert pointer.model == evaluation["promoted_to"] and pointer.model.endswith(f"demo-step-{best}")
        verify_package(fetch_package(pointer.model), require_checksums=True)
    report = Path(platform.summary["train"]["report"]).read_text()
    assert 'id="eval_heldout"' in report and f"eval_{TASK}_acc" in report


def test_completions_come_back_with_the_demo_key_only(demo):
    platform, _ = demo
    url, key = platform.summary["serve"]["url"], platform.config.serve.api_key
    body = {"prompt": "The history of the city", "max_tokens": 8}
    answer = httpx.post(f"{url}/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert answer.status_code == 200 and answer.json()["choices"][0]["text"]
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 401
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True},
                      headers={"Authorization": f"Bearer {key}"}, timeout=30) as streamed:
        lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) > 2
    assert [c["streamed"] for c in platform.summary["serve"]["completions"]] == [False, False, True]


def test_the_served_model_is_a_hugging_face_directory_transformers_loads(demo):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmforge.model.package import load_package

    platform, _ = demo
    model_dir = platform.workdir / "model"
    ours, meta = load_package(model_dir, require_checksums=True)
    assert meta["format"] == "hf"
    hf, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir).eval(), AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("The history of the city", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours(ids)[0], atol=1e-4, rtol=0)


def test_the_canary_passes_and_its_result_is_pushed(demo):
    platform, _ = demo
    canary, serve = platform.summary["canary"], platform.summary["serve"]
    again = run_canary("run", "--endpoint", serve["url"], "--eval-set", canary["eval_set"], "--baseline",
                       canary["baseline"], "--api-key-file", str(platform.workdir / "serve" / "api-keys"))
    assert again.code == 0, again
    assert canary["passed"] is True
    gateway = platform.monitoring.pushgateway
    assert pushed_value(gateway, "lmforge_canary_passed", job="lmforge-canary", model="lmforge-demo") == 1


def test_every_dashboard_query_returns_data(demo):
    platform, _ = demo
    dashboards = platform.summary["dashboards"]
    asked = [f"{name} / {with_repeats(title, task=TASK)}" for name, d in load_dashboards().items()
             for title, _, requires in dashboard_queries(d) if requires != "gpu"]
    assert dashboards["empty"] == []
    assert sorted(dashboards["with_data"]) == sorted(asked)
    prometheus = platform.monitoring.prometheus
    assert query(prometheus, 'max_over_time(lmforge_train_step[10m]) >= 9')
    assert query(prometheus, 'max_over_time(lmforge_uploader_last_uploaded_step[10m]) >= 9')


def test_the_summary_links_a_page_drawing_every_dashboard_panel(demo):
    platform, printed = demo
    page = Path(platform.summary["where"]["dashboards"])
    assert page == platform.workdir / "observe" / "dashboards.html" and str(page) in printed
    drawn, _, _ = read_page(page.read_text())
    panels = [with_repeats(p["title"], task=TASK) for d in load_dashboards().values() for p in query_panels(d)
              if requires_of(p) != "gpu"]
    assert [p.title for p in drawn if p.requires != "gpu"] == panels
    assert [p.title for p in drawn if p.requires != "gpu" and not (p.charts == 1 and p.points > 0 or p.stats)] == []


# -- the demo as a command ---------------------------------------------------------------------------


def _as_a_terminal_starts_it() -> None:
    """Ctrl-C's disposition as a shell gives a foreground job: a test run started as a background
    job of a non-interactive shell (`make test &`) ignores SIGINT, and its children inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_demo(workdir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lmforge.demo", "run", "--set", f"workdir={workdir}", *[
        a for pair in SCALED for a in ("--set", pair)]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_as_a_terminal_starts_it)


def _wait_for_training(workdir: Path, demo: subprocess.Popen) -> list[int]:
    """Once attempt 1 is training: the process ids the demo recorded."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert demo.poll() is None, demo.stdout.read()
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            state = json.loads((workdir / "processes.json").read_text())
            if any(p["name"] == "train-attempt-1" for p in state["processes"]):
                return [p["pid"] for p in state["processes"]]
        time.sleep(0.2)
    raise AssertionError("training never started")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"


def test_an_interrupted_demo_stops_everything_and_leaves_no_half_written_step(tmp_path):
    demo = _start_demo(tmp_path)
    pids = _wait_for_training(tmp_path, demo)
    demo.send_signal(signal.SIGINT)
    output, _ = demo.communicate(timeout=60)
    assert demo.returncode == 130, output
    assert "interrupted" in output
    time.sleep(0.5)
    assert [pid for pid in pids if _alive(pid)] == []
    assert not (tmp_path / "processes.json").exists()
    assert not (tmp_path / ".staging").exists()
    assert (tmp_path / "data" / "manifest.json").exists()  # the finished step stays
    assert not (tmp_path / "train").exists() and not (tmp_path / "model").exists()


def test_demo_stop_ends_what_a_killed_demo_left_running(tmp_path):
    demo = _start_demo(tmp_path)
    pids = _wait_for_training(tmp_path, demo)
    demo.kill()
    demo.communicate(timeout=30)
    assert any(_alive(pid) for pid in pids)  # orphans: the servers and the training run
    stopped = subprocess.run([sys.executable, "-m", "lmforge.demo", "stop", "--workdir", str(tmp_path)],
                             capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.startswith("stopped: ") and "prometheus" in stopped.stdout
    time.sleep(0.5)
    assert [pid for pid in pids if _alive(pid)] == []
    assert not (tmp_path / ".staging").exists()


def test_a_bad_setting_is_refused_before_anything_starts(tmp_path):
    done = subprocess.run([sys.executable, "-m", "lmforge.demo", "run", "--set", f"workdir={tmp_path / 'w'}",
                           "--set", "train.interrupt_at=500"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "interrupt_at (500) must be after the first checkpoint" in done.stderr
    assert not (tmp_path / "w").exists()
