"""The training report (RUN_DIR/report.html): drawn from a two-attempt metrics.jsonl, it charts
loss, val loss, lr, grad norm, tokens/s and MFU per attempt, marks every committed checkpoint and
the resume point, says "n/a" for MFU on CPU, and is self-contained; `lmforge-train report` draws
it from a run directory. A run of several stages also draws its schedule over consumed tokens
(stage starts marked, a line per source) and its per-source val losses; a file written before
stage records existed draws as before."""

from __future__ import annotations

import json
import re
import threading
from html.parser import HTMLParser
from pathlib import Path

from lmforge.trainer.cli import main as train_cli
from lmforge.trainer.metrics_file import MetricsFile, read_records
from lmforge.trainer.report_html import ReportRefresher, render_report, write_report
from lmforge.trainer.schedule import Stage, TrainingPlan

CHARTS = ["loss", "lr", "grad_norm", "tokens_per_second", "mfu"]


class Page(HTMLParser):
    """The charts (data-chart → drawn points), their series, markers and no-data notes."""

    def __init__(self, text: str):
        super().__init__()
        self.charts: dict[str, int] = {}
        self.series: dict[str, list[str]] = {}
        self.markers: dict[str, list[tuple[str, dict]]] = {}
        self.nodata: dict[str, str] = {}
        self.titles: list[str] = []
        self.urls: list[str] = []
        self._chart = self._nodata = None
        self._in_title = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.urls += [v for k, v in attrs.items() if k in ("src", "href") and v]
        if tag == "svg" and "data-chart" in attrs:
            self._chart = attrs["data-chart"]
            self.charts[self._chart] = int(attrs["data-points"])
            self.series[self._chart], self.markers[self._chart] = [], []
        elif tag == "g" and self._chart and attrs.get("class") == "series":
            self.series[self._chart].append(attrs["data-points"])
        elif tag == "g" and self._chart and attrs.get("class", "").startswith("marker "):
            self.markers[self._chart].append((attrs["class"].split()[1], attrs))
        elif tag == "p" and attrs.get("class") == "nodata":
            self._nodata = attrs.get("data-chart")
        elif tag == "title":
            self._in_title = True

    def handle_endtag(self, tag):
        if tag == "svg":
            self._chart = None
        elif tag == "p":
            self._nodata = None
        elif tag == "title":
            self._in_title = False

    def handle_data(self, data):
        if self._nodata:
            self.nodata[self._nodata] = self.nodata.get(self._nodata, "") + data
        if self._in_title:
            self.titles.append(data)


def step_record(step: int, loss: float, mfu: float | None) -> dict:
    return {"kind": "step", "step": step, "timestamp": 1.7e9 + step, "loss": loss, "grad_norm": 1.0 / (step + 1),
            "lr": 1e-3 * min(1.0, (step + 1) / 3), "tokens_per_second": 5000.0 + step, "mfu": mfu}


def write_run(run_dir, mfu: float | None = None, title_text: str = "run") -> None:
    """Attempt 1: steps 0–11, checkpoints 4 and 9, killed; attempt 2 resumes from 9 to step 19."""
    path = run_dir / "metrics.jsonl"
    first = MetricsFile(path)
    first.write({"kind": "start", "timestamp": 1.7e9, "resumed_from": None, "first_step": 0, "steps": 20,
                 "world_size": 2})
    for step in range(12):
        first.write(step_record(step, 6.0 - 0.2 * step, mfu))
        if step in (4, 9):
            first.write({"kind": "eval", "step": step, "val_loss": 6.1 - 0.2 * step})
            first.write({"kind": "checkpoint", "step": step, "timestamp": 1.7e9 + step})
    first.close()  # killed: no end record
    second = MetricsFile(path)
    second.write({"kind": "start", "timestamp": 1.7e9 + 100, "resumed_from": 9, "first_step": 10, "steps": 20,
                  "world_size": 2})
    for step in range(10, 20):
        second.write(step_record(step, 6.0 - 0.2 * step, mfu))
        if step in (14, 19):
            second.write({"kind": "eval", "step": step, "val_loss": 6.1 - 0.2 * step})
            second.write({"kind": "checkpoint", "step": step, "timestamp": 1.7e9 + 100 + step})
    second.write({"kind": "end", "timestamp": 1.7e9 + 130, "status": "finished"})
    second.close()


SOURCES = ["web", "code"]
SCHEDULE_CHARTS = {"schedule_batch", "schedule_seq_len", "schedule_mixture", "schedule_lr"}


def scheduled_plan() -> TrainingPlan:
    """Four stages over 8 steps: a batch ramp 32 → 64 tokens, seq_len 8 → 16 (with its RoPE θ and
    document masking), then an anneal on `code`; they start at steps 0, 2, 4, 6 (tokens 0, 64, 192, 320)."""

    def stage(index, name, start_tokens, seq_len, sequences, batch_size, mixture, rope_theta=None) -> Stage:
        return Stage(index=index, name=name, start_tokens=start_tokens, seq_len=seq_len, sequences=sequences,
                     batch_size=batch_size, mixture=mixture, rope_theta=rope_theta, rope_scaling=None,
                     document_masking=rope_theta is not None)

    return TrainingPlan(
        [
            stage(0, "short", 0, 8, 4, 2, (3.0, 1.0)),
            stage(1, "ramp", 64, 8, 8, 2, (3.0, 1.0)),
            stage(2, "long", 192, 16, 4, 1, (3.0, 1.0), rope_theta=1e6),
            stage(3, "anneal", 320, 16, 4, 1, (0.0, 1.0), rope_theta=1e6),
        ],
        steps=8,
    )


def write_scheduled_run(run_dir) -> None:
    """The records the trainer writes for scheduled_plan(): attempt 1 runs steps 0–5 (checkpoint 3,
    killed), attempt 2 resumes from 3 and records its stage again at step 4; evaluations at 3 and 7."""
    plan, path = scheduled_plan(), run_dir / "metrics.jsonl"

    def attempt(steps: range, resumed_from: int | None) -> None:
        file = MetricsFile(path)
        file.write({"kind": "start", "timestamp": 1.7e9, "resumed_from": resumed_from, "first_step": steps[0],
                    "steps": plan.steps, "world_size": 1})
        for step in steps:
            stage = plan.stage(step)
            if step == steps[0] or step == stage.first_step:
                file.write({"kind": "stage", "step": step, **stage.describe(SOURCES),
                            "micro_batches": plan.micro_batches(step)})
            file.write({**step_record(step, 6.0 - 0.2 * step, None), "stage": stage.index, "seq_len": stage.seq_len,
                        "global_batch_tokens": stage.global_batch_tokens, "tokens": plan.tokens_after(step)})
            if step in (3, 7):
                file.write({"kind": "eval", "step": step, "val_loss": 5.0 - 0.1 * step, "seq_len": stage.seq_len,
                            "val_loss_by_source": {"web": 4.8 - 0.1 * step, "code": 5.5 - 0.1 * step}})
            if step == 3:
                file.write({"kind": "checkpoint", "step": step, "timestamp": 1.7e9 + step})
        file.close()

    attempt(range(0, 6), None)
    attempt(range(4, 8), 3)


def schedule_rows(text: str) -> list[list[str]]:
    table = re.search(r'<section id="schedule">.*?<tbody>(.*?)</tbody>', text, re.S).group(1)
    return [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table)]


def test_a_scheduled_run_draws_its_stages_over_tokens_and_its_per_source_val_losses(tmp_path):
    write_scheduled_run(tmp_path)
    text = write_report(tmp_path).read_text()
    page = Page(text)
    assert SCHEDULE_CHARTS | {"val_loss_by_source"} <= set(page.charts)
    for name in SCHEDULE_CHARTS:  # each stage's start marked once (stage 2's second record is the resume's)
        stages = [(a["data-stage"], int(a["data-tokens"])) for kind, a in page.markers[name] if kind == "stage"]
        assert stages == [("0", 0), ("1", 64), ("2", 192), ("3", 320)], name
    assert "stage 3 (anneal) from 320 tokens consumed, step 6" in page.titles
    # global batch and seq_len: one step function (two points a stage); the mixture: one per source
    assert page.series["schedule_batch"] == page.series["schedule_seq_len"] == ["8"]
    assert page.series["schedule_mixture"] == ["8", "8"] and {"web", "code"} <= set(page.titles)
    assert page.series["schedule_lr"] == ["6", "4"]  # per attempt, as over steps
    # web, code, then the mixture's val loss: one evaluation per attempt
    assert page.series["val_loss_by_source"] == ["2", "2", "2"]
    assert {"val loss, web", "val loss, code", "val loss, the mixture"} <= set(page.titles)
    assert schedule_rows(text) == [
        ["0", "short", "0", "0", "8", "32 (4 sequences)", "2", "web 75%, code 25%", "the model&#39;s",
         "the model&#39;s", "off"],
        ["1", "ramp", "2", "64", "8", "64 (8 sequences)", "4", "web 75%, code 25%", "the model&#39;s",
         "the model&#39;s", "off"],
        ["2", "long", "4", "192", "16", "64 (4 sequences)", "4", "web 75%, code 25%", "1,000,000",
         "the model&#39;s", "on"],
        ["3", "anneal", "6", "320", "16", "64 (4 sequences)", "4", "web 0%, code 100%", "1,000,000",
         "the model&#39;s", "on"],
    ]


def test_a_run_without_stage_records_or_of_one_stage_draws_no_schedule(tmp_path):
    write_run(tmp_path)  # written before stage records and token counts existed
    old = write_report(tmp_path).read_text()
    assert 'id="schedule"' not in old and set(Page(old).charts) == {"loss", "lr", "grad_norm", "tokens_per_second"}
    one_stage = scheduled_plan().stages[0].describe(SOURCES)  # a run without a schedule records its one stage
    plain = render_report([*read_records(tmp_path / "metrics.jsonl"), {"kind": "stage", "step": 0, **one_stage}])
    assert 'id="schedule"' not in plain and not SCHEDULE_CHARTS & set(Page(plain).charts)


def test_every_chart_with_each_attempt_checkpoints_and_the_resume_marked(tmp_path):
    write_run(tmp_path)
    page = Page(write_report(tmp_path).read_text())
    assert set(page.charts) == {"loss", "lr", "grad_norm", "tokens_per_second"}
    # train loss of attempts 1 and 2 (12 + 10 steps), val loss of each (2 + 2 evaluations)
    assert page.charts["loss"] == 26 and page.series["loss"] == ["12", "10", "2", "2"]
    for name in ("lr", "grad_norm", "tokens_per_second"):
        assert page.series[name] == ["12", "10"], name
        checkpoints = [int(a["data-step"]) for kind, a in page.markers[name] if kind == "checkpoint"]
        resumes = [(int(a["data-step"]), a["data-attempt"]) for kind, a in page.markers[name] if kind == "resume"]
        assert checkpoints == [4, 9, 14, 19] and resumes == [(9, "2")], name
    assert "n/a" in page.nodata["mfu"]  # CPU: no peak FLOP/s, no MFU
    assert "attempt 2 resumed from the checkpoint of step 9" in page.titles


def test_mfu_is_drawn_when_the_device_has_a_peak(tmp_path):
    write_run(tmp_path, mfu=0.41)
    page = Page(write_report(tmp_path).read_text())
    assert page.charts["mfu"] == 22 and "mfu" not in page.nodata


def test_the_page_is_self_contained_and_escaped(tmp_path):
    run_dir = tmp_path / "<b>run"
    run_dir.mkdir()
    write_run(run_dir)
    (run_dir / "config.json").write_text(json.dumps({"model": {"preset": "<script>x()</script>"},
                                                     "tracking": {"mlflow_tracking_uri": "https://mlflow.example"}}))
    text = write_report(run_dir).read_text()
    page = Page(text)
    assert page.urls == []
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//|@import|url\(""", text, re.I)
    assert "<script" not in text and "&lt;script&gt;" in text and "mlflow.example" not in text
    assert "<b>run" not in text and "&lt;b&gt;run" in text


def test_an_empty_run_still_renders(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    page = Page(write_report(tmp_path).read_text())
    assert page.charts == {} and set(page.nodata) == set(CHARTS)


def test_the_cli_draws_a_run_directory_and_refuses_one_without_metrics(tmp_path, capfd):
    write_run(tmp_path / "run")
    assert train_cli(["report", "--run-dir", str(tmp_path / "run"), "--output", str(tmp_path / "r.html")]) == 0
    assert set(Page((tmp_path / "r.html").read_text()).charts) == {"loss", "lr", "grad_norm", "tokens_per_second"}
    assert train_cli(["report", "--run-dir", str(tmp_path / "nothing")]) == 3
    assert "has no metrics.jsonl" in capfd.readouterr().err


def test_long_runs_are_thinned_to_a_bounded_page(tmp_path):
    points = 5000
    file = MetricsFile(tmp_path / "metrics.jsonl")
    for step in range(points):
        file.write(step_record(step, 5.0, None))
    file.close()
    text = write_report(tmp_path).read_text()
    assert Page(text).charts["loss"] == points  # counted, not all drawn
    assert len(text) < 400_000


def test_the_refresher_draws_off_the_training_loop_and_folds_requests():
    """request() returns while a draw is still running (the loop never waits for the page);
    requests made meanwhile become one more draw; close() waits and draws the final page."""
    release, started, draws, errors = threading.Event(), threading.Event(), [], []

    def draw(run_dir):
        draws.append(run_dir)
        started.set()
        assert release.wait(10)
        if len(draws) == 2:
            raise OSError("disk full")

    refresher = ReportRefresher(Path("run"), errors.append, draw=draw)
    refresher.request()
    assert started.wait(10) and not release.is_set()  # the first draw blocks; request() came back
    for _ in range(5):
        refresher.request()  # folded into one more draw
    release.set()
    refresher.close()
    assert len(draws) == 3  # the first, one for the five folded requests, the final one
    assert [str(e) for e in errors] == ["disk full"]  # reported, never raised into training


def test_the_settings_line_names_the_parallel_mode_or_the_mesh_axes():
    def settings(parallel: dict) -> str:
        return re.search(r"parallel [^,]*,", render_report([], config={"parallel": parallel})).group()

    assert settings({"mode": "hsdp", "replicate_degree": 2}) == "parallel hsdp,"
    mesh = {"mode": None, "dp_replicate": 2, "dp_shard": -1, "tp": 1}
    assert settings(mesh) == "parallel dp_replicate=2 dp_shard=-1,"
    assert settings({"mode": None, "dp_replicate": 1, "dp_shard": 1}) == "parallel none,"


# ---------------------------------------------------------------- checkpoint evaluations (evals.jsonl)

LN_V = 6.238  # ln(512): the held-out loss of a zeroed (uniform) model


def evaluated(step: int, acc: float, acc_norm: float, web: float, code: float, *, promoted: bool, best_step: int,
              regressed: tuple[str, ...] = ()) -> dict:
    """A `checkpoint_eval` record as the uploader's launcher appends it (metrics_file documents it)."""
    return {"kind": "checkpoint_eval", "step": step, "tokens": 1000 * (step + 1), "timestamp": 1.7e9 + 200 + step,
            "package": f"s3://b/run/weights/step-{step:08d}",
            "heldout": {"web": {"loss": web, "perplexity": 2.718 ** web},
                        "code": {"loss": code, "perplexity": 2.718 ** code}},
            "tasks": {"tiny_mc": {"acc": acc, "acc_norm": acc_norm}}, "score": (web + code) / 2,
            "best_step": best_step, "promoted": promoted, "skipped": False, "regressed": list(regressed)}


def write_evals(run_dir: Path) -> None:
    """Steps 4 and 9 evaluated (each a new best, promoted), 12 skipped, 14 zeroed (every score
    regressed), 16's job failed, 19 good again (promoted). Written as the launcher writes them."""
    records = [
        evaluated(4, 0.5, 0.4, 4.0, 4.5, promoted=True, best_step=4),
        evaluated(9, 1.0, 0.6, 3.0, 3.5, promoted=True, best_step=9),
        {"kind": "checkpoint_eval", "step": 12, "timestamp": 1.7e9 + 212, "skipped": True},
        evaluated(14, 0.25, 0.25, LN_V, LN_V, promoted=False, best_step=9,
                  regressed=("tiny_mc/acc", "tiny_mc/acc_norm", "heldout/web", "heldout/code")),
        {"kind": "checkpoint_eval", "step": 16, "timestamp": 1.7e9 + 216, "failed": True, "skipped": False},
        evaluated(19, 0.95, 0.65, 2.9, 3.4, promoted=True, best_step=19),
    ]
    (run_dir / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def stats(text: str) -> dict[str, str]:
    """The header's figures: label → value."""
    return {k: v for v, k in re.findall(r'<div class="v">(.*?)</div><div class="k">(.*?)</div>', text)}


def test_checkpoint_evaluations_are_drawn_over_tokens_with_the_promoted_and_regressed_checkpoints(tmp_path):
    write_run(tmp_path)
    write_evals(tmp_path)
    text = write_report(tmp_path).read_text()
    page = Page(text)
    evals = {"eval_tiny_mc_acc", "eval_tiny_mc_acc_norm", "eval_heldout"}
    assert evals <= set(page.charts)
    # per task metric: the score of the 4 evaluated checkpoints, the best so far (a step line: one
    # more point at each new best), the regressed checkpoint's own point
    assert page.series["eval_tiny_mc_acc"] == ["4", "5", "1"]  # new bests at steps 9
    assert page.series["eval_tiny_mc_acc_norm"] == ["4", "6", "1"]  # and 9, 19
    assert page.series["eval_heldout"] == ["4", "4"]  # web, code
    for name in evals:
        marks = {kind: [int(a["data-step"]) for k, a in page.markers[name] if k == kind] for kind in
                 ("promoted", "regressed")}
        assert marks == {"promoted": [19], "regressed": [14]}, name
    assert "step 19 promoted (the best)" in page.titles
    assert "step 14 regressed (tiny_mc/acc, tiny_mc/acc_norm, heldout/web, heldout/code)" in page.titles
    assert {"held-out loss, web", "held-out loss, code", "best so far", "regressed score"} <= set(page.titles)
    counts = {"checkpoints evaluated": "4", "checkpoints skipped / failed": "1 / 1",
              "best checkpoint step (score)": "19 (3.15)", "promoted checkpoint step": "19"}
    assert stats(text).items() >= counts.items()
    # the over-steps charts are unchanged by it
    assert page.series["loss"] == ["12", "10", "2", "2"]


def test_the_best_so_far_line_holds_the_maximum(tmp_path):
    from lmforge.trainer.report_html import _best_so_far

    assert _best_so_far([(1, 0.5), (2, 1.0), (3, 0.25), (4, 0.95)], max) == [(1, 0.5), (2, 0.5), (2, 1.0), (3, 1.0),
                                                                             (4, 1.0)]
    assert _best_so_far([(1, 3.0), (2, 6.2), (3, 2.5)], min) == [(1, 3.0), (2, 3.0), (3, 3.0), (3, 2.5)]


def test_a_missing_or_half_written_evals_file_does_not_break_the_report(tmp_path):
    write_run(tmp_path)
    page = Page(write_report(tmp_path).read_text())  # no evals.jsonl: no evaluation charts, no counts
    assert not any(name.startswith("eval_") for name in page.charts)
    assert "checkpoints evaluated" not in stats(write_report(tmp_path).read_text())
    write_evals(tmp_path)
    whole = (tmp_path / "evals.jsonl").read_text()
    cut = json.dumps(evaluated(24, 0.9, 0.6, 2.8, 3.3, promoted=True, best_step=24))[:57]
    (tmp_path / "evals.jsonl").write_text(whole + cut)  # the launcher killed mid-line
    text = write_report(tmp_path).read_text()
    page = Page(text)
    assert page.series["eval_tiny_mc_acc"] == ["4", "5", "1"]
    assert stats(text)["promoted checkpoint step"] == "19"
    (tmp_path / "evals.jsonl").write_text(cut)  # only a cut line: nothing to draw, still a page
    page = Page(write_report(tmp_path).read_text())
    assert not any(name.startswith("eval_") for name in page.charts) and "loss" in page.charts
