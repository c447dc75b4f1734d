"""The Grafana dashboards the chart ships: ConfigMaps the Grafana sidecar picks up, JSON that uses
the datasource variable and sets units, panels covering what the issue lists, and PromQL that
names only metrics the services really expose or the chart's rules record, and that parses."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import kubernetes_validate
import pytest
import yaml

from lmforge.demo.dashboards import (
    DASHBOARDS,
    MACROS,
    dashboard_queries,
    load_dashboards,
    metric_names,
    panels,
    query_panels,
    substitute,
    variables_of,
)
from tests.helm_chart import find, render

NAMES = ("canary", "dataprep", "inference", "training")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# The recording rules the dashboards may use (the chart's rules render them; see also
# test_recorded_names_are_recorded_by_the_chart).
RECORDED = {
    "lmforge:inference_requests:rate", "lmforge:inference_errors_5xx:ratio",
    "lmforge:inference_ttft_seconds:p50", "lmforge:inference_ttft_seconds:p95", "lmforge:inference_ttft_seconds:p99",
    "lmforge:inference_tpot_seconds:p50", "lmforge:inference_tpot_seconds:p95",
    "lmforge:inference_latency_seconds:p50", "lmforge:inference_latency_seconds:p95",
    "lmforge:inference_queue_time_seconds:p95",
    "lmforge:inference_generation_tokens:rate", "lmforge:inference_prompt_tokens:rate",
    "lmforge:inference_preemptions:rate", "lmforge:inference_prefix_cache_hits:ratio",
    "lmforge:dataprep_documents:sum", "lmforge:dataprep_drop:ratio", "lmforge:dataprep_dropped_by_reason:ratio",
    "lmforge:train_loss:avg_30m",
}
# What each dashboard must show (the issue's list): every group of names must appear together
# in one panel's expressions.
COVERAGE = {
    "inference": [
        ("lmforge:inference_requests:rate", "status"),
        ("lmforge:inference_ttft_seconds:p50", "lmforge:inference_ttft_seconds:p95",
         "lmforge:inference_ttft_seconds:p99"),
        ("lmforge:inference_tpot_seconds:p50", "lmforge:inference_tpot_seconds:p95"),
        ("lmforge:inference_latency_seconds:p50", "lmforge:inference_latency_seconds:p95"),
        ("lmforge:inference_queue_time_seconds:p95",),
        ("lmforge_inference_requests_running", "lmforge_inference_requests_waiting"),
        ("lmforge_inference_kv_cache_usage_ratio",),
        ("lmforge:inference_generation_tokens:rate", "lmforge:inference_prompt_tokens:rate"),
        ("lmforge:inference_prefix_cache_hits:ratio",),
        ("lmforge:inference_preemptions:rate",),
        ("lmforge:inference_errors_5xx:ratio",),
        ("lmforge_inference_gpu_utilization_ratio",),
        ("lmforge_inference_gpu_memory_used_bytes",),
        ("histogram_quantile(0.99", "lmforge_inference_trace_request_latency_seconds_bucket"),
    ],
    "training": [
        ("lmforge_train_loss", "lmforge_train_val_loss"),
        ("lmforge_train_tokens_per_second",),
        ("lmforge_train_mfu_ratio",),
        ("lmforge_train_grad_norm",),
        ("lmforge_train_learning_rate",),
        ("lmforge_train_step_seconds", "lmforge_train_data_wait_seconds"),
        ("lmforge_train_peak_memory_bytes", "rank"),
        ("lmforge_uploader_lag_seconds",),
        ("lmforge_train_last_checkpoint_step", "lmforge_uploader_last_uploaded_step"),
        ("lmforge_eval_task_score", "lmforge_eval_task_best_score", 'task=~"$task"'),
        ("lmforge_eval_heldout_loss", "lmforge_eval_heldout_best_loss"),
        ("lmforge_eval_jobs_running", "lmforge_eval_jobs_total", "lmforge_eval_skipped_checkpoints_total"),
        ("lmforge_eval_promoted_step", "lmforge_eval_checkpoint_step"),
    ],
    "dataprep": [
        ("lmforge:dataprep_documents:sum", "rate("),
        ("lmforge:dataprep_drop:ratio",),
        ("lmforge:dataprep_dropped_by_reason:ratio",),
    ],
    "canary": [
        ("lmforge_canary_score", "lmforge_canary_baseline_score"),
        ("lmforge_canary_passed",),
        ("lmforge_canary_memorized_token_ratio",),
    ],
}
# Histogram and counter series as Prometheus exposes them, by the collected family's type.
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created"), "gauge": ("",), "info": ("_info",),
            "stateset": ("",), "unknown": ("",), "gaugehistogram": ("_bucket", "_gcount", "_gsum")}


@pytest.fixture(scope="module")
def dashboards() -> dict[str, dict]:
    return load_dashboards()


def exprs_of(dashboard: dict) -> list[str]:
    """Every PromQL text of a dashboard: panel targets and query variables."""
    texts = [t["expr"] for p in query_panels(dashboard) for t in p.get("targets", [])]
    texts += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return texts


def walk(node, key: str):
    """Every value of `key` anywhere in a JSON document."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from walk(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item, key)


# ---------------------------------------------------------------------------------------- the chart


def dashboard_maps(objects: list[dict]) -> list[dict]:
    return [o for o in find(objects, "ConfigMap") if "-dashboard-" in o["metadata"]["name"]]


def test_each_dashboard_ships_as_a_configmap_for_the_grafana_sidecar():
    maps = {m["metadata"]["name"]: m for m in dashboard_maps(render())}
    assert sorted(maps) == [f"lmforge-dashboard-{name}" for name in NAMES]
    for name in NAMES:
        cm = maps[f"lmforge-dashboard-{name}"]
        kubernetes_validate.validate(cm, "1.30.0", strict=True)
        labels = cm["metadata"]["labels"]
        assert labels["grafana_dashboard"] == "1"
        assert labels["app.kubernetes.io/component"] == "dashboards"
        assert labels["app.kubernetes.io/instance"] == "lmforge"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "lmforge"}
        assert cm["metadata"]["namespace"] == "ml"
        assert list(cm["data"]) == [f"{name}.json"]
        text = cm["data"][f"{name}.json"]
        assert text == (DASHBOARDS / f"{name}.json").read_text()
        assert json.loads(text)["uid"] == f"lmforge-{name}"


def test_dashboard_labels_folder_and_switch_come_from_values():
    values = {"monitoring": {"dashboards": {"labels": {"grafana_dashboard": "yes", "team": "ml-infra"},
                                            "folder": "Pretraining"}}}
    maps = dashboard_maps(render(values, release="prod"))
    assert sorted(m["metadata"]["name"] for m in maps) == [f"prod-dashboard-{name}" for name in NAMES]
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "yes"
        assert cm["metadata"]["labels"]["team"] == "ml-infra"
        assert cm["metadata"]["annotations"]["grafana_folder"] == "Pretraining"
    assert dashboard_maps(render({"monitoring": {"dashboards": {"enabled": False}}})) == []


# ---------------------------------------------------------------------------------------- the JSON


def test_dashboards_have_fixed_identity_and_a_sound_layout(dashboards):
    assert sorted(dashboards) == list(NAMES)
    for name, dashboard in dashboards.items():
        assert dashboard["uid"] == f"lmforge-{name}"
        assert dashboard["title"].startswith("lmforge / ")
        assert dashboard["tags"] == ["lmforge"]
        assert dashboard["schemaVersion"] >= 39
        assert "id" not in dashboard or dashboard["id"] is None  # Grafana assigns it
        ids = [p["id"] for p in panels(dashboard)]
        assert len(ids) == len(set(ids)), f"{name}: panel ids collide"
        cells = set()
        for panel in panels(dashboard):
            g = panel["gridPos"]
            assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, (name, panel["title"])
            area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not area & cells, f"{name}: panel {panel['title']!r} overlaps another"
            cells |= area


def test_the_datasource_is_a_variable_and_no_uid_is_hard_coded(dashboards):
    for name, dashboard in dashboards.items():
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        ds = variables["datasource"]
        assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
        for variable in variables.values():
            if variable["type"] == "query":
                assert variable["datasource"] == DATASOURCE, (name, variable["name"])
                assert variable["definition"].startswith("label_values("), (name, variable["name"])
                assert variable["includeAll"] and variable["allValue"] == ".*", (name, variable["name"])
        for panel in query_panels(dashboard):
            assert panel["datasource"] == DATASOURCE, (name, panel["title"])
            assert panel["targets"], (name, panel["title"])
            for target in panel["targets"]:
                assert target["datasource"] == DATASOURCE, (name, panel["title"])
        assert set(walk(dashboard, "uid")) <= {"${datasource}", dashboard["uid"]}, name
        assert not any(isinstance(d, str) for d in walk(dashboard, "datasource")), name  # legacy name refs


def test_every_panel_has_a_unit_a_title_and_legends(dashboards):
    for name, dashboard in dashboards.items():
        for panel in query_panels(dashboard):
            where = (name, panel["title"])
            assert panel["title"] and panel.get("description"), where
            assert panel["fieldConfig"]["defaults"].get("unit"), where
            if panel["type"] == "timeseries":
                assert panel["options"]["legend"]["showLegend"], where
            for target in panel["targets"]:
                assert target.get("legendFormat"), where


def test_dashboards_cover_what_the_issue_lists(dashboards):
    for name, groups in COVERAGE.items():
        texts = ["\n".join(t["expr"] for t in p["targets"]) for p in query_panels(dashboards[name])]
        for group in groups:
            assert any(all(word in text for word in group) for text in texts), f"{name}: no panel shows {group}"


def test_the_task_score_panel_repeats_once_per_task(dashboards):
    """Grafana draws the panel once per value of $task (all values by default): one panel per task."""
    training = dashboards["training"]
    variables = {v["name"]: v for v in training["templating"]["list"]}
    assert variables["task"]["definition"] == 'label_values(lmforge_eval_task_score{run=~"$run"}, task)'
    (repeated,) = [p for p in query_panels(training) if p.get("repeat")]
    assert (repeated["repeat"], repeated["title"]) == ("task", "Task score: $task")
    rows = [p["title"] for p in panels(training) if p["type"] == "row"]
    assert rows[-1] == "Checkpoint evaluations"


def test_the_dashboards_page_draws_a_repeated_panel_once_per_value(tmp_path):
    """The demo's page (lmforge.demo.dashboards_page) draws the task panel once per task as Grafana
    does, each copy asked for its own task only (a value with a regex metacharacter escaped), from a
    real Prometheus whose recording rules make the series."""
    import time

    from lmforge.demo.dashboards_page import fetch
    from tests.prometheus_tools import query, running_prometheus

    def series(name: str, task: str, value: float) -> dict:
        expr = f'label_replace(label_replace(vector({value}), "task", "{task}", "", ""), "run", "r1", "", "")'
        return {"record": name, "expr": f'label_replace({expr}, "metric", "acc", "", "")'}

    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "evals", "rules": [
        series("lmforge_eval_task_score", "tiny_mc", 0.25), series("lmforge_eval_task_best_score", "tiny_mc", 1.0),
        series("lmforge_eval_task_score", "arc.easy", 0.5), series("lmforge_eval_task_score", "arcXeasy", 0.75),
    ]}]}))
    with running_prometheus(tmp_path, [], [rules]) as url:
        deadline = time.monotonic() + 30
        while len(query(url, "lmforge_eval_task_score")) < 3:
            assert time.monotonic() < deadline, "the recording rules never evaluated"
            time.sleep(0.2)
        now = time.time()
        (training,) = [d for d in fetch(url, now - 60, now + 1, 1) if d.name == "training"]
    drawn = {p.title: p for p in training.panels if p.title.startswith("Task score")}
    assert sorted(drawn) == ["Task score: arc.easy", "Task score: arcXeasy", "Task score: tiny_mc"]
    assert [s.legend for s in drawn["Task score: tiny_mc"].series] == ["r1 acc", "r1 acc best"]
    assert {s.finite()[-1][1] for s in drawn["Task score: tiny_mc"].series} == {0.25, 1.0}
    assert [s.legend for s in drawn["Task score: arc.easy"].series] == ["r1 acc"]  # not arcXeasy's
    assert 'task=~"arc\\\\.easy"' in drawn["Task score: arc.easy"].targets[0].expr


# ---------------------------------------------------------------------------------------- the PromQL


def exposed(registry) -> set[str]:
    """The series names a registry exposes: its samples now, plus, by type, those of labelled
    families that have no child yet."""
    names = set()
    for family in registry.collect():
        names |= {s.name for s in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES[family.type]}
    return names


@pytest.fixture(scope="module")
def service_metric_names() -> set[str]:
    """What the services really expose, from their own registries."""
    from lmforge.canary.memorization import Memorization
    from lmforge.canary.metrics import build_registry
    from lmforge.dataprep.metrics import DataprepMetrics
    from lmforge.inference.metrics import NvmlCollector, ServeMetrics
    from lmforge.inference.stats import EngineStats
    from lmforge.trainer import checkpoint_eval
    from lmforge.trainer.metrics import TrainMetrics
    from lmforge.uploader.metrics import UploaderMetrics

    serve = ServeMetrics("tiny", "cpu", lambda: (0, 0), EngineStats)
    serve.set_model_info("v1", 10)
    # The GPU collector registers only where NVML finds a GPU; its families (no samples without
    # one) still name what it exposes.
    gpu = NvmlCollector("tiny")
    if not gpu.available:
        gpu._handles = []
    gpu_names = {family.name for family in gpu.collect()}
    traced = Memorization(traced=True, min_span_tokens=32, tokens=100, ratio=0.1, spans=1)  # the ratio's gauges
    canary = build_registry(SimpleNamespace(score=0.9, perplexity=12.0, seconds=3.0, memorization=traced),
                            SimpleNamespace(passed=True),
                            SimpleNamespace(score=0.9, perplexity=12.5), now=0)
    registries = [serve.registry, TrainMetrics().registry, UploaderMetrics().registry,
                  DataprepMetrics().registry, canary, checkpoint_eval.build_registry()]
    return set().union(gpu_names, *(exposed(r) for r in registries))


@pytest.fixture(scope="module")
def chart_recorded_names() -> set[str]:
    """The `record:` names of the chart's rule file, when the chart renders one."""
    maps = find(render(), "ConfigMap", "lmforge-prometheus-rules")
    if not maps:
        return set()
    rules = yaml.safe_load(maps[0]["data"]["lmforge.rules.yaml"])
    return {rule["record"] for group in rules["groups"] for rule in group["rules"] if "record" in rule}


def test_the_exposed_name_list_is_real(service_metric_names):
    # A guard on the fixture: it must see histograms, counters by their _total name and GPU gauges.
    assert {"lmforge_inference_time_to_first_token_seconds_bucket", "lmforge_inference_requests_total",
            "lmforge_inference_gpu_utilization_ratio", "lmforge_train_step_seconds",
            "lmforge_dataprep_dropped_documents_total", "lmforge_canary_baseline_score",
            "lmforge_uploader_upload_seconds_bucket"} <= service_metric_names
    assert "lmforge_inference_requests" not in service_metric_names


def test_the_design_document_names_every_exposed_metric(service_metric_names):
    design = (Path(__file__).resolve().parents[2] / "docs" / "design.md").read_text()
    families = {re.sub(r"_(bucket|sum|count|created)$", "", name) for name in service_metric_names}
    assert sorted(name for name in families if name not in design) == []


def test_every_metric_in_every_expression_is_exposed_or_recorded(dashboards, service_metric_names,
                                                                 chart_recorded_names):
    known = service_metric_names | RECORDED | chart_recorded_names
    for name, dashboard in dashboards.items():
        for text in exprs_of(dashboard):
            unknown = metric_names(text) - known
            assert not unknown, f"{name}: {sorted(unknown)} in {text!r}"


def test_recorded_names_are_recorded_by_the_chart(dashboards, chart_recorded_names):
    assert chart_recorded_names, "the chart renders no recording rules (ConfigMap lmforge-prometheus-rules)"
    used = {n for d in dashboards.values() for text in exprs_of(d) for n in metric_names(text) if ":" in n}
    assert used <= chart_recorded_names, sorted(used - chart_recorded_names)


def test_counters_are_rated_by_their_total_name(dashboards):
    # rate()/increase() of a counter without _total matches nothing (ANCHORS: what to avoid, 4).
    call = re.compile(r"\b(?:rate|irate|increase)\(\s*([A-Za-z_:][\w:]*)")
    for name, dashboard in dashboards.items():
        for text in exprs_of(dashboard):
            for metric in call.findall(text):
                assert ":" in metric or metric.endswith(("_total", "_bucket", "_count", "_sum")), (name, text)


def test_variables_are_defined_and_used_only_as_regex_matchers(dashboards):
    for name, dashboard in dashboards.items():
        defined = {v["name"] for v in dashboard["templating"]["list"]}
        for text in exprs_of(dashboard):
            variables = variables_of(text)
            assert variables <= defined | set(MACROS), (name, text)
            assert "datasource" not in variables, (name, text)
            for variable in variables - set(MACROS):
                uses = re.findall(r'(.{3})\$\{?' + variable + r'\b', text)
                assert uses and all(use == '=~"' for use in uses), f"{name}: ${variable} not in =~\"…\": {text!r}"


def test_only_gpu_panels_may_be_skipped(dashboards):
    for name, dashboard in dashboards.items():
        for panel in query_panels(dashboard):
            requires = panel.get("lmforge", {}).get("requires")
            # GPU series, and MFU (absent where the device's peak FLOP/s is unknown, as on CPU)
            gpu = any("_gpu_" in n or n == "lmforge_train_mfu_ratio"
                      for t in panel["targets"] for n in metric_names(t["expr"]))
            assert requires == ("gpu" if gpu else None), (name, panel["title"])


def test_dashboard_queries_are_ready_for_prometheus(dashboards):
    queries = dashboard_queries(dashboards["inference"])
    assert len(queries) == sum(len(p["targets"]) for p in query_panels(dashboards["inference"]))
    assert all("$" not in expr for _, expr, _ in queries)
    gpu = [title for title, _, requires in queries if requires == "gpu"]
    assert sorted(set(gpu)) == ["GPU memory used", "GPU utilization"]
    (ttft,) = [e for t, e, _ in queries if t == "TTFT p95"]
    assert ttft == 'max(lmforge:inference_ttft_seconds:p95{model_name=~".*"})'
    assert substitute('rate(x{a=~"$a", b=~"${b}", c=~"${c:regex}"}[$__rate_interval])') == \
        'rate(x{a=~".*", b=~".*", c=~".*"}[30s])'
    assert substitute("increase(x[$__range])", __range="1h") == "increase(x[1h])"
    assert {e for _, e, _ in dashboard_queries(dashboards["training"], __rate_interval="1m")} >= \
        {'histogram_quantile(0.95, sum by (le) (rate(lmforge_uploader_upload_seconds_bucket{namespace=~".*"}[1m])))'}


def promtool() -> str:
    found = "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else shutil.which("promtool")
    if not found:
        pytest.fail("promtool not found (install the Debian package prometheus: `make setup`)")
    return found


def test_every_expression_parses_as_promql(dashboards, tmp_path):
    # promtool parses each expression as the body of a recording rule: syntax and types checked
    # by Prometheus's own parser, after the same substitution the end-to-end test makes.
    rules = [{"record": f"dashboard:{name}:{i}", "expr": expr}
             for name, dashboard in dashboards.items()
             for i, (_, expr, _) in enumerate(dashboard_queries(dashboard))]
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
