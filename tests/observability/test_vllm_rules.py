"""The rules that map vLLM's metrics onto lmforge's (inference.backend vllm, templates/_rules.tpl
group lmforge.inference.vllm): rendered only with that backend, accepted by `promtool check
rules`, and proven by promtool unit tests with synthetic vLLM series (promtool/vllm/)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.chart_values import VALUE_SETS
from tests.helm_chart import render
from tests.observability.test_rules import (
    RECORDING_CONTRACT,
    RULES_KEY,
    all_rules,
    exposed_series,
    promtool,
    rule_groups,
    run_promtool_tests,
)

VLLM_TESTS = sorted((Path(__file__).parent / "promtool" / "vllm").glob("*.test.yaml"))
GROUP = "lmforge.inference.vllm"
# vLLM's series the mapping reads, as vLLM's Prometheus logger names them (vllm/v1/metrics/
# loggers.py; https://docs.vllm.ai/en/stable/usage/metrics/), and the API server's HTTP counter.
VLLM_SERIES = {
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_per_output_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket", "vllm:request_prefill_time_seconds_bucket",
    "vllm:request_decode_time_seconds_bucket", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc", "vllm:request_success_total", "http_requests_total",
    "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total",
}


@pytest.fixture(scope="module")
def groups() -> list[dict]:
    return rule_groups(render(VALUE_SETS["vllm"]))


def test_the_mapping_is_rendered_only_with_backend_vllm(groups):
    assert GROUP not in {group["name"] for group in rule_groups(render())}
    names = [group["name"] for group in groups]
    # Before the recording rules that read what it records.
    assert names.index(GROUP) < names.index("lmforge.inference.recording")
    recorded = [rule["record"] for rule in all_rules(groups) if "record" in rule]
    assert len(recorded) == len(set(recorded)) and set(recorded) >= RECORDING_CONTRACT


def test_the_mapping_records_series_lmforge_serve_exposes_from_vllm_series(groups):
    (group,) = [g for g in groups if g["name"] == GROUP]
    exposed = exposed_series()
    for rule in group["rules"]:
        assert rule["record"] in exposed, f"{rule['record']} is no lmforge-serve series"
        read = set(re.findall(r"\bvllm:[a-z0-9_]+|\bhttp_[a-z0-9_]+|\blmforge_[a-z0-9_]+", rule["expr"]))
        assert read and read <= VLLM_SERIES, (rule["record"], read - VLLM_SERIES)
    # Every series the dashboards' inference panels and the inference alerts read from the server,
    # but the GPU ones (vLLM has none: a DCGM exporter's), is mapped.
    wanted = {"lmforge_inference_requests_waiting", "lmforge_inference_requests_running",
              "lmforge_inference_kv_cache_usage_ratio", "lmforge_inference_model_info",
              "lmforge_inference_requests_total", "lmforge_inference_finished_requests_total",
              "lmforge_inference_time_to_first_token_seconds_bucket",
              "lmforge_inference_time_per_output_token_seconds_bucket",
              "lmforge_inference_request_latency_seconds_bucket", "lmforge_inference_queue_time_seconds_bucket",
              "lmforge_inference_prefill_time_seconds_bucket", "lmforge_inference_decode_time_seconds_bucket",
              "lmforge_inference_prompt_tokens_total", "lmforge_inference_generation_tokens_total",
              "lmforge_inference_preemptions_total", "lmforge_inference_prefix_cache_queries_total",
              "lmforge_inference_prefix_cache_hits_total"}
    assert {rule["record"] for rule in group["rules"]} == wanted


def test_rule_file_with_vllm_passes_promtool_check(groups, tmp_path):
    path = tmp_path / RULES_KEY
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", VLLM_TESTS, ids=[f.name for f in VLLM_TESTS])
def test_promtool_unit_tests_with_synthetic_vllm_series(groups, tmp_path, test_file):
    result = run_promtool_tests(groups, tmp_path, [test_file])
    assert result.returncode == 0, result.stdout + result.stderr
