"""The Prometheus rules the chart ships (templates/_rules.tpl): one rule file rendered as a
PrometheusRule and as a plain rule file in a ConfigMap, checked and unit-tested by promtool.

The promtool unit tests live in promtool/*.test.yaml and read `lmforge.rules.yaml` beside
them: the tests here render the chart with default values (so every `for:` is the real one),
write that file into a temporary directory with only the summary and description annotations
kept (promtool compares annotations exactly; the runbook text is checked here instead), copy the
test files next to it and run `promtool test rules`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.helm_chart import crd_errors, find, render

PROMTOOL_TESTS = Path(__file__).parent / "promtool"
TEST_FILES = sorted(PROMTOOL_TESTS.glob("*.test.yaml"))
RULES_CONFIGMAP = "lmforge-prometheus-rules"
RULES_KEY = "lmforge.rules.yaml"
UNIT_TEST_ANNOTATIONS = ("summary", "description")
SEVERITIES = {"critical", "warning", "info"}
SERVICES = {"inference", "canary", "training", "dataprep"}
# Series Prometheus and the Pushgateway add themselves (the rules read nothing else that is not ours).
NOT_OURS = {"up", "push_time_seconds"}

# The recording rules the dashboards read: renaming one breaks them.
RECORDING_CONTRACT = {
    "lmforge:inference_requests:rate",
    "lmforge:inference_errors_5xx:ratio",
    "lmforge:inference_ttft_seconds:p50",
    "lmforge:inference_ttft_seconds:p95",
    "lmforge:inference_ttft_seconds:p99",
    "lmforge:inference_tpot_seconds:p50",
    "lmforge:inference_tpot_seconds:p95",
    "lmforge:inference_latency_seconds:p50",
    "lmforge:inference_latency_seconds:p95",
    "lmforge:inference_queue_time_seconds:p95",
    "lmforge:inference_generation_tokens:rate",
    "lmforge:inference_prompt_tokens:rate",
    "lmforge:inference_preemptions:rate",
    "lmforge:inference_prefix_cache_hits:ratio",
    "lmforge:dataprep_documents:sum",
    "lmforge:dataprep_drop:ratio",
    "lmforge:dataprep_dropped_by_reason:ratio",
    "lmforge:train_loss:avg_30m",
}


def promtool() -> str:
    found = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if not found:
        pytest.fail("promtool not found: install the Debian package prometheus (`make setup`)")
    return found


def rule_groups(objects: list[dict]) -> list[dict]:
    """The groups of the plain rule file in the ConfigMap."""
    (configmap,) = find(objects, "ConfigMap", RULES_CONFIGMAP)
    return yaml.safe_load(configmap["data"][RULES_KEY])["groups"]


def all_rules(groups: list[dict]) -> list[dict]:
    return [rule for group in groups for rule in group["rules"]]


def alerts(groups: list[dict]) -> list[dict]:
    return [rule for rule in all_rules(groups) if "alert" in rule]


def run_promtool_tests(groups: list[dict], directory: Path, files: list[Path]) -> subprocess.CompletedProcess:
    """`promtool test rules` on `files` against `groups`, written as lmforge.rules.yaml in `directory`."""
    unit = []
    for group in groups:
        rules = []
        for rule in group["rules"]:
            if "annotations" in rule:
                rule = {**rule, "annotations": {k: v for k, v in rule["annotations"].items()
                                                if k in UNIT_TEST_ANNOTATIONS}}
            rules.append(rule)
        unit.append({**group, "rules": rules})
    (directory / RULES_KEY).write_text(yaml.safe_dump({"groups": unit}, sort_keys=False))
    for file in files:
        shutil.copy(file, directory / file.name)
    return subprocess.run([promtool(), "test", "rules", *(file.name for file in files)], cwd=directory,
                          capture_output=True, text=True, timeout=300)


def exposed_series() -> dict[str, str]:
    """Every series name the services expose (counters with `_total`, histograms' `_bucket`,
    `_sum`, `_count`) → its metric type, read from the services' own registries."""
    from lmforge.canary.memorization import Memorization
    from lmforge.canary.metrics import build_registry
    from lmforge.dataprep.metrics import DataprepMetrics
    from lmforge.inference.metrics import ServeMetrics
    from lmforge.inference.stats import EngineStats
    from lmforge.trainer import checkpoint_eval
    from lmforge.trainer.metrics import TrainMetrics
    from lmforge.uploader.metrics import UploaderMetrics

    traced = Memorization(traced=True, min_span_tokens=32, tokens=100, ratio=0.1, spans=1)  # the ratio's gauges
    registries = [
        UploaderMetrics().registry, DataprepMetrics().registry, TrainMetrics().registry,
        ServeMetrics("m", "cpu", lambda: (0, 0), EngineStats).registry,
        build_registry(SimpleNamespace(score=1.0, perplexity=2.0, seconds=3.0, memorization=traced),
                       SimpleNamespace(passed=True), None),
        checkpoint_eval.build_registry(),  # the eval job's Pushgateway series
    ]
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    return {family.name + suffix: family.type for registry in registries for family in registry.collect()
            for suffix in suffixes[family.type]}


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return render()


@pytest.fixture(scope="module")
def groups(objects) -> list[dict]:
    return rule_groups(objects)


def test_rule_file_passes_promtool_check(groups, tmp_path):
    path = tmp_path / RULES_KEY
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(all_rules(groups))} rules found" in result.stdout


@pytest.mark.parametrize("test_file", TEST_FILES, ids=[f.name for f in TEST_FILES])
def test_promtool_unit_tests(groups, tmp_path, test_file):
    result = run_promtool_tests(groups, tmp_path, [test_file])
    assert result.returncode == 0, result.stdout + result.stderr


def test_unit_tests_pin_every_for_duration(tmp_path):
    """With every `for:` set to 0s, the unit tests of each alert with a real `for:` fail: they
    assert that the alert is still pending before its duration has passed."""
    groups = rule_groups(render({"alerts": {"forOverride": "0s"}}))
    defaults = {rule["alert"]: rule["for"] for rule in alerts(rule_groups(render()))}
    waiting = {name for name, duration in defaults.items() if duration not in ("0s", "0m")}
    assert len(waiting) >= 10
    result = run_promtool_tests(groups, tmp_path, TEST_FILES)
    assert result.returncode != 0
    failed = set(re.findall(r"alertname: (\w+), time:", result.stdout + result.stderr))
    assert waiting <= failed, f"not pinned by a test: {waiting - failed}"


def test_every_alert_has_a_firing_and_a_quiet_case(groups):
    fires, quiet = set(), set()
    for file in TEST_FILES:
        for test in yaml.safe_load(file.read_text())["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {rule["alert"] for rule in alerts(groups)}
    assert names - fires == set(), "alerts no unit test fires"
    assert names - quiet == set(), "alerts no unit test keeps quiet"
    assert (fires | quiet) - names == set(), "unit tests of alerts that do not exist"


def test_every_alert_is_labelled_and_documented(groups):
    rules = alerts(groups)
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)) and len(names) >= 18
    for rule in rules:
        name = rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert rule["labels"]["service"] in SERVICES, name
        assert re.fullmatch(r"\d+[smhd]", rule["for"]), name
        annotations = rule["annotations"]
        for key in ("summary", "description", "runbook"):
            assert len(annotations.get(key, "").strip()) > 20, (name, key)
        assert "runbook_url" not in annotations, "no runbook_url without monitoring.runbookBaseUrl"
    assert {rule["labels"]["service"] for rule in rules} == SERVICES


def test_runbook_urls_point_at_the_operations_guide():
    base = "https://github.com/acme/lmforge/blob/main"
    groups = rule_groups(render({"monitoring": {"runbookBaseUrl": base + "/"}}))
    for rule in alerts(groups):
        assert rule["annotations"]["runbook_url"] == f"{base}/docs/operations.md#{rule['alert'].lower()}"


def test_recording_rules_keep_their_contract_names(groups):
    recorded = [rule["record"] for rule in all_rules(groups) if "record" in rule]
    assert set(recorded) >= RECORDING_CONTRACT, RECORDING_CONTRACT - set(recorded)
    assert len(recorded) == len(set(recorded))
    assert "[5m]" in next(r["expr"] for r in all_rules(groups) if r.get("record") == "lmforge:inference_requests:rate")
    fast = rule_groups(render({"monitoring": {"rateWindow": "20s"}}))
    windows = {w for rule in all_rules(fast) if rule.get("record", "").startswith("lmforge:inference_")
               for w in re.findall(r"\[(\w+)\]", rule["expr"])}
    assert windows == {"20s"}


def test_rules_read_only_series_the_services_expose(groups):
    """Every lmforge_* series a rule reads exists under that exact name: counters with `_total`,
    histograms through `_bucket`; rate()/increase() only on counters and buckets."""
    exposed = exposed_series()
    for rule in all_rules(groups):
        name = rule.get("alert") or rule["record"]
        expr = rule["expr"]
        for series in set(re.findall(r"\blmforge_[a-z0-9_]+", expr)):
            assert series in exposed, f"{name} reads {series}, which no service exposes"
        for function, series in re.findall(r"\b(rate|irate|increase)\(\s*([a-zA-Z_:][\w:]*)", expr):
            assert series.endswith(("_total", "_bucket")), f"{name}: {function}() of {series}"
        for series in set(re.findall(r"(?<![\w:])([a-z_][a-z0-9_]*)(?=\s*[{\[])", expr)) - NOT_OURS:
            assert series.startswith("lmforge_"), (name, series)


def test_no_fleet_sizes_in_alerts(groups):
    """No alert compares a count of replicas or pods with a number (ANCHORS: avoid 4)."""
    for rule in alerts(groups):
        assert not re.search(r"\bcount\s*(by|without|\()", rule["expr"]), rule["alert"]
        assert not re.search(r"sum[^\n]*\bup\b[^\n]*\)\s*[<>=!]=?\s*[1-9]", rule["expr"]), rule["alert"]


def test_for_override_changes_every_for():
    default = alerts(rule_groups(render()))
    drill = alerts(rule_groups(render({"alerts": {"forOverride": "0s"}})))
    assert [rule["alert"] for rule in drill] == [rule["alert"] for rule in default]
    assert {rule["for"] for rule in drill} == {"0s"}
    assert {rule["for"] for rule in default} != {"0s"}


def test_thresholds_come_from_values():
    groups = rule_groups(render({"alerts": {
        "inference": {"ttft": {"p95Seconds": 7, "for": "3m"}},
        "canary": {"staleHours": 50},
        "training": {"mfu": {"floor": 0.33}, "evalScoreDrop": 0.2, "evalLossRise": 1.5},
    }}))
    by_name = {rule["alert"]: rule for rule in alerts(groups)}
    assert by_name["LmforgeInferenceTTFTHigh"]["expr"].endswith("> 7")
    assert by_name["LmforgeInferenceTTFTHigh"]["for"] == "3m"
    assert "50 * 3600" in by_name["LmforgeCanaryStale"]["expr"]
    assert "50 * 3600" in by_name["LmforgeCanaryRegression"]["expr"]
    assert "< 0.33" in by_name["LmforgeTrainingMFULow"]["expr"]
    assert by_name["LmforgeEvalTaskRegression"]["expr"].endswith("> 0.2")
    assert by_name["LmforgeEvalHeldOutRegression"]["expr"].endswith("> 1.5")


def test_alert_groups_can_be_turned_off_per_service():
    groups = rule_groups(render({"alerts": {"dataprep": {"enabled": False}, "canary": {"enabled": False}}}))
    assert {rule["labels"]["service"] for rule in alerts(groups)} == {"inference", "training"}
    assert {rule["record"] for rule in all_rules(groups) if "record" in rule} >= RECORDING_CONTRACT


def test_prometheus_rule_holds_the_same_groups(objects, groups):
    (rule,) = find(objects, "PrometheusRule")
    assert rule["spec"]["groups"] == groups
    assert crd_errors(rule) == []
    assert rule["metadata"]["namespace"] == "ml"
    assert rule["metadata"]["labels"]["app.kubernetes.io/component"] == "monitoring"


def test_prometheus_rule_takes_the_monitoring_labels_and_both_can_be_turned_off():
    objects = render({"monitoring": {"additionalLabels": {"release": "kube-prometheus-stack"}}})
    (rule,) = find(objects, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    off = render({"monitoring": {"prometheusRule": {"enabled": False}, "rulesConfigMap": {"enabled": False}}})
    assert find(off, "PrometheusRule") == [] and find(off, "ConfigMap", RULES_CONFIGMAP) == []
