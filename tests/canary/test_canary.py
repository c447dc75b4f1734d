"""The canary against real components: lmforge-serve with a tiny model that has learned its
sentences (and a perturbed, worse copy), and a real prometheus-pushgateway."""

from __future__ import annotations

import datetime as dt
import json
import math
import time

import httpx
import pytest

from lmforge.canary.evalset import load_eval_set
from tests.canary.helpers import eval_set_data, run_canary, write_eval_set
from tests.ports import free_port
from tests.prometheus_tools import pushed_groups, pushed_value
from tests.serving import SENTENCES, running_server

JOB = "lmforge-canary"


def test_make_baseline_records_sane_numbers(baseline, eval_set, good_server):
    path, result = baseline
    body = json.loads(path.read_text())
    assert body["kind"] == "lmforge-canary-baseline" and body["format_version"] == 1
    assert body["model"] == "canary-good" and body["endpoint"] == good_server
    assert body["eval_set"] == {"name": "canary-test", "sha256": load_eval_set(eval_set).sha256}
    recorded = dt.datetime.fromisoformat(body["recorded"])
    assert abs((dt.datetime.now(dt.UTC) - recorded).total_seconds()) < 600
    # The model has memorized its sentences: every check passes, perplexity is close to 1.
    assert body["score"] == 1.0 and body["checks_passed"] == body["checks_total"] == len(SENTENCES)
    assert all(c["passed"] for c in body["checks"])
    assert 1.0 < body["perplexity"] < 1.3
    texts = body["held_out"]
    assert [t["id"] for t in texts] == [f"s{i}" for i in range(len(SENTENCES))]
    assert body["tokens"] == sum(t["tokens"] for t in texts)
    pooled = math.exp(-sum(t["total_logprob"] for t in texts) / body["tokens"])
    assert body["perplexity"] == pytest.approx(pooled, rel=1e-9)
    # Per text, the numbers are the scoring route's.
    scored = httpx.post(f"{good_server}/v1/score", json={"text": SENTENCES[1]}, timeout=30).json()
    assert texts[1]["tokens"] == len(scored["tokens"]) - 1
    assert texts[1]["perplexity"] == pytest.approx(scored["perplexity"], rel=1e-6)
    assert "baseline written" in result.stderr
    assert result.event("baseline_written")["perplexity"] == pytest.approx(body["perplexity"])


def test_good_model_passes_and_pushes(baseline, eval_set, good_server, pushgateway):
    path, _ = baseline
    recorded = json.loads(path.read_text())
    before = time.time()
    result = run_canary("--endpoint", good_server, "--eval-set", str(eval_set), "--baseline", str(path),
                        "--pushgateway", pushgateway)
    assert result.code == 0, str(result)
    assert "RESULT: PASS" in result.stderr
    event = result.event("canary_result")
    assert event["verdict"] == "pass" and event["reasons"] == [] and event["pushed"] is True
    group = {"job": JOB, "model": "canary-good"}
    assert pushed_value(pushgateway, "lmforge_canary_passed", **group) == 1
    assert pushed_value(pushgateway, "lmforge_canary_score", **group) == 1
    assert pushed_value(pushgateway, "lmforge_canary_perplexity", **group) == pytest.approx(
        recorded["perplexity"], rel=1e-4)
    assert pushed_value(pushgateway, "lmforge_canary_baseline_perplexity", **group) == pytest.approx(
        recorded["perplexity"])
    assert pushed_value(pushgateway, "lmforge_canary_baseline_score", **group) == 1
    assert pushed_value(pushgateway, "lmforge_canary_baseline_present", **group) == 1
    assert before <= pushed_value(pushgateway, "lmforge_canary_last_run_timestamp_seconds", **group) <= time.time()


def test_worse_model_fails_and_pushes_the_regression(baseline, eval_set, worse_server, pushgateway):
    path, _ = baseline
    recorded = json.loads(path.read_text())
    result = run_canary("--endpoint", worse_server, "--eval-set", str(eval_set), "--baseline", str(path),
                        "--pushgateway", pushgateway)
    assert result.code == 1, str(result)
    table = result.stderr
    assert "RESULT: REGRESSION" in table
    assert "- perplexity" in table and "vs the baseline" in table
    assert "- score" in table and "newly failing" in table
    assert "(passed in the baseline)" in table
    event = result.event("canary_result")
    assert event["verdict"] == "regression" and event["passed"] is False and event["level"] == "error"
    assert any(r.startswith("perplexity") for r in event["reasons"])
    assert event["newly_failing"] and event["pushed"] is True
    group = {"job": JOB, "model": "canary-worse"}
    assert pushed_value(pushgateway, "lmforge_canary_passed", **group) == 0
    perplexity = pushed_value(pushgateway, "lmforge_canary_perplexity", **group)
    assert perplexity > recorded["perplexity"] * 1.1
    assert pushed_value(pushgateway, "lmforge_canary_score", **group) < 1
    assert pushed_value(pushgateway, "lmforge_canary_baseline_perplexity", **group) == pytest.approx(
        recorded["perplexity"])
    # Each model is its own group: the Pushgateway holds both verdicts.
    models = {g["labels"].get("model") for g in pushed_groups(pushgateway) if g["labels"].get("job") == JOB}
    assert {"canary-good", "canary-worse"} <= models


def test_without_a_baseline_the_run_passes_and_says_so(canary_dir, eval_set, worse_server, pushgateway):
    missing = canary_dir / "no-such-baseline.json"
    result = run_canary("run", "--endpoint", worse_server, "--eval-set", str(eval_set), "--baseline", str(missing),
                        "--pushgateway", pushgateway, "--set", "push.grouping.run=nobaseline")
    assert result.code == 0, str(result)
    assert "no baseline" in result.stderr and "RESULT: PASS" in result.stderr
    assert result.event("baseline_missing")["baseline"] == str(missing)
    group = {"job": JOB, "model": "canary-worse", "run": "nobaseline"}
    assert pushed_value(pushgateway, "lmforge_canary_passed", **group) == 1
    assert pushed_value(pushgateway, "lmforge_canary_baseline_present", **group) == 0
    assert pushed_value(pushgateway, "lmforge_canary_baseline_perplexity", **group) is None


def test_a_failed_push_does_not_hide_the_verdict(baseline, eval_set, good_server, worse_server):
    path, _ = baseline
    dead = f"http://127.0.0.1:{free_port()}"
    common = ("--eval-set", str(eval_set), "--baseline", str(path), "--pushgateway", dead,
              "--set", "push.attempts=1")
    regression = run_canary("--endpoint", worse_server, *common)
    assert regression.code == 1, str(regression)
    assert "NOT pushed" in regression.stderr and "RESULT: REGRESSION" in regression.stderr
    assert regression.event("push_failed")["pushgateway"] == dead
    # By default a passing run whose push failed still exits 0; with push.required it exits 4.
    assert run_canary("--endpoint", good_server, *common).code == 0
    required = run_canary("--endpoint", good_server, *common, "--set", "push.required=true")
    assert required.code == 4, str(required)
    assert "RESULT: PASS" in required.stderr


def test_api_key_from_a_file_or_the_environment(canary_dir, good_package, eval_set, baseline):
    path, _ = baseline
    keys = canary_dir / "api-keys"
    keys.write_text("# rotated monthly\nkey-one\nkey-two\n")
    key_file = canary_dir / "canary-api-key"
    key_file.write_text("key-two\n")
    with running_server(good_package, f"api_keys_file={keys}", "model_name=canary-auth") as url:
        args = ("--endpoint", url, "--eval-set", str(eval_set), "--baseline", str(path))
        refused = run_canary(*args)
        assert refused.code == 2, str(refused)
        assert "401" in refused.stderr and "--api-key-file" in refused.stderr
        from_file = run_canary(*args, "--api-key-file", str(key_file))
        assert from_file.code == 0, str(from_file)
        assert "RESULT: PASS" in from_file.stderr and "canary-auth" in from_file.stderr
        from_env = run_canary(*args, env={"LMFORGE_CANARY_API_KEY": "key-one"})
        assert from_env.code == 0, str(from_env)
        assert "key-one" not in from_env.stdout + from_env.stderr  # never logged


def test_baseline_on_s3(s3, canary_dir, eval_set, good_server):
    _, make_bucket = s3
    make_bucket("canary-baselines")
    uri = "s3://canary-baselines/prod/baseline.json"
    made = run_canary("make-baseline", "--endpoint", good_server, "--eval-set", str(eval_set), "--output", uri)
    assert made.code == 0, str(made)
    ran = run_canary("--endpoint", good_server, "--eval-set", str(eval_set), "--baseline", uri)
    assert ran.code == 0, str(ran)
    assert f"baseline: {uri}" in ran.stderr and "no baseline" not in ran.stderr


def test_unreachable_endpoint_exits_4(eval_set):
    url = f"http://127.0.0.1:{free_port()}"
    result = run_canary("--endpoint", url, "--eval-set", str(eval_set))
    assert result.code == 4, str(result)
    assert f"cannot reach {url}/v1/models after 2 attempt(s)" in result.stderr
    assert result.event("request_retry")["attempt"] == 1


def test_bad_eval_set_exits_3_naming_the_entry(canary_dir):
    data = eval_set_data()
    del data["checks"][1]["expected"]
    bad = write_eval_set(canary_dir / "bad-eval-set.yaml", data)
    result = run_canary("--endpoint", f"http://127.0.0.1:{free_port()}", "--eval-set", str(bad))
    assert result.code == 3, str(result)
    assert "checks[1] (id 's1'): expected: Field required" in result.stderr
    assert result.event("failed")["kind"] == "InputError"


def test_an_item_the_model_cannot_take_exits_3(canary_dir, good_server):
    data = eval_set_data()
    data["held_out"].append({"id": "too-long", "text": " ".join(SENTENCES)})
    result = run_canary("--endpoint", good_server, "--eval-set",
                        str(write_eval_set(canary_dir / "long-eval-set.yaml", data)))
    assert result.code == 3, str(result)
    assert "held_out 'too-long': the endpoint rejected it: HTTP 400" in result.stderr


def test_baseline_of_another_eval_set_exits_3(canary_dir, baseline):
    path, _ = baseline
    data = eval_set_data()
    data["checks"] = data["checks"][:-1]
    other = write_eval_set(canary_dir / "other-eval-set.yaml", data)
    result = run_canary("--endpoint", f"http://127.0.0.1:{free_port()}", "--eval-set", str(other),
                        "--baseline", str(path))
    assert result.code == 3, str(result)
    assert "different eval set" in result.stderr and "make-baseline" in result.stderr


def test_bad_config_exits_2(eval_set):
    result = run_canary("--endpoint", "http://127.0.0.1:9", "--eval-set", str(eval_set),
                        "--set", "tolerance.max_score_drop=2")
    assert result.code == 2, str(result)
    assert "tolerance.max_score_drop" in result.stderr


def test_scoring_through_completions_equals_the_score_endpoint(good_server):
    """The canary scores through /v1/completions (echo + logprobs: vLLM serves it too); on lmforge-serve
    that gives the logprobs POST /v1/score gives, so baselines recorded through /v1/score stay valid."""
    from lmforge.canary.client import InferenceClient
    from lmforge.canary.config import HttpSection

    client = InferenceClient(good_server, HttpSection())
    for text in SENTENCES[:3]:
        direct = httpx.post(f"{good_server}/v1/score", json={"text": text}, timeout=30).json()["token_logprobs"][1:]
        assert client.score(text, item="t") == pytest.approx(direct, abs=1e-4)


def test_server_without_a_trace_index_passes_and_says_not_traced(eval_set, good_server, pushgateway):
    """A real lmforge-serve serving no trace index answers 404 on /v1/trace."""
    result = run_canary("--endpoint", good_server, "--eval-set", str(eval_set), "--pushgateway", pushgateway,
                        "--set", "push.grouping.run=notrace")
    assert result.code == 0, str(result)
    assert ("memorization: not traced (check 's0': HTTP 404: this server traces nothing: it has no trace "
            "index") in result.stderr
    assert "RESULT: PASS" in result.stderr
    assert result.event("memorization_not_traced")["reason"].startswith("HTTP 404")
    group = {"job": "lmforge-canary", "model": "canary-good", "run": "notrace"}
    assert pushed_value(pushgateway, "lmforge_canary_passed", **group) == 1
    assert pushed_value(pushgateway, "lmforge_canary_memorized_token_ratio", **group) is None
    # Disabled: nothing is traced and the table says so.
    off = run_canary("--endpoint", good_server, "--eval-set", str(eval_set), "--set", "memorization.enabled=false")
    assert off.code == 0, str(off)
    assert "memorization: not measured" in off.stderr
    assert not [e for e in off.logs if e["event"].startswith("memorization")]
