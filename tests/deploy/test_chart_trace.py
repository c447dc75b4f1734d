"""The chart's trace pieces (issue 36): inference.trace (the server config's trace.* fields and the
trace-cache volume; with vLLM a `trace` container, the Service's `trace` port, the NetworkPolicy and
the ServiceMonitor), the data-prep trace-index Job (only with config trace_index.enabled, on a
/scratch volume), the LmforgeCanaryMemorization alert and the values schema. Every rendered object is
validated against Kubernetes' schema or its CRD; what a container runs is read back by the service's
own command line and config loader, and the trace service's app is built from the rendered config."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from fastapi.testclient import TestClient
from helm_python import HelmRenderError, HelmValuesError

from lmforge.dataprep.cli import CLI as DATAPREP
from lmforge.dataprep.config import TraceIndexConfig, load_dataprep_config
from lmforge.inference import trace_service
from lmforge.inference.cli import CLI as SERVE
from tests.deploy.chart_values import CPU_ONLY, CRD_KINDS, KUBE_VERSION, NAMESPACE, VALUE_SETS, container
from tests.helm_chart import crd_errors, find, render

INDEX = "s3://lmforge/datasets/cc-main-2024-22/trace-index"
TRACE = {"enabled": True, "index": INDEX, "cacheSize": "64Gi", "maxConcurrent": 3, "timeoutSeconds": 2.5,
         "maxTokens": 1024}
LMFORGE = {**CPU_ONLY, "inference": {**CPU_ONLY["inference"], "trace": TRACE}}
VLLM = VALUE_SETS["vllm"]
VLLM_TRACE = {**VLLM, "inference": {**VLLM["inference"], "trace": {**TRACE, "tracePort": 8101}}}
TRACE_INDEX_ON = {**CPU_ONLY, "dataprep": {**CPU_ONLY["dataprep"], "config": {
    **CPU_ONLY["dataprep"]["config"], "trace_index": {"enabled": True, "part_tokens": 5_000_000}}}}
STAGE_PREFIX = "lmforge-dataprep-cc-main-2024-22-"


def validate(objects: list[dict]) -> None:
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            assert crd_errors(obj) == [], obj["metadata"]["name"]
        else:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def inference_pod(objects: list[dict]) -> dict:
    (deployment,) = find(objects, "Deployment", "lmforge-inference")
    return deployment["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def lmforge_objects() -> list[dict]:
    return render(LMFORGE, namespace=NAMESPACE)


@pytest.fixture(scope="module")
def vllm_objects() -> list[dict]:
    return render(VLLM_TRACE, namespace=NAMESPACE)


# ------------------------------------------------------------------------------------ lmforge-serve


def test_lmforge_serve_gets_the_trace_config_and_the_cache_volume(lmforge_objects):
    validate(lmforge_objects)
    pod = inference_pod(lmforge_objects)
    server = container(pod, "inference")
    args = SERVE.parse_args(server["args"])
    config = SERVE.load_config(args)  # what lmforge-serve runs with
    assert config.trace.index == INDEX
    assert (config.trace.max_concurrent, config.trace.timeout_s, config.trace.max_tokens) == (3, 2.5, 1024)
    assert config.engine.max_running == 4  # inference.config still applies
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    assert mounts["trace-cache"] == config.trace.cache_dir
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["trace-cache"] == {"name": "trace-cache", "emptyDir": {"sizeLimit": "64Gi"}}
    # The index comes from the object store with the pod's S3 settings, as the model does.
    env = {e["name"]: e for e in server["env"]}
    assert env["AWS_ENDPOINT_URL"]["value"] == "http://minio.storage:9000"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == "lmforge-s3"
    # /v1/trace is on the API port: the Service and the NetworkPolicy are unchanged.
    (service,) = find(lmforge_objects, "Service", "lmforge-inference")
    assert [p["name"] for p in service["spec"]["ports"]] == ["http", "metrics"]


def test_trace_is_off_by_default():
    pod = inference_pod(render(CPU_ONLY, namespace=NAMESPACE))
    server = container(pod, "inference")
    assert SERVE.load_config(SERVE.parse_args(server["args"])).trace.index is None
    assert "trace-cache" not in {v["name"] for v in pod["volumes"]}
    assert not any(a.startswith("trace.") for a in server["args"])


@pytest.mark.parametrize(("inference", "message"), [
    ({"trace": {"enabled": True}}, "inference.trace.enabled needs inference.trace.index"),
    ({"config": {"trace": {"index": INDEX}}}, "inference.config.trace.index is set by the chart"),
    ({"config": {"trace": {"cache_dir": "/x"}}}, "inference.config.trace.cache_dir is set by the chart"),
])
def test_trace_settings_the_chart_owns_or_needs_fail_the_render(inference, message):
    with pytest.raises(HelmRenderError, match=message):
        render({"inference": inference})


# ----------------------------------------------------------------------------------------- vLLM


def test_vllm_gets_a_trace_container_on_its_own_port(vllm_objects, tmp_path):
    validate(vllm_objects)
    pod = inference_pod(vllm_objects)
    vllm, trace = container(pod, "inference"), container(pod, "trace")
    assert trace["image"] == "lmforge/inference:0.1.0" and trace["command"] == [
        "python", "-m", "lmforge.inference.trace_service"]
    args = trace_service.CLI.parse_args(trace["args"])
    config = trace_service.CLI.load_config(args)  # what the trace service runs with
    assert (config.host, config.port) == ("0.0.0.0", 8101)
    assert config.trace.index == INDEX and config.trace.max_concurrent == 3 and config.trace.timeout_s == 2.5
    assert config.model_name == "lmforge-hf"  # vLLM's --served-model-name: the same model_name label
    assert trace["ports"] == [{"name": "trace", "containerPort": 8101, "protocol": "TCP"}]
    for probe in ("readinessProbe", "livenessProbe"):
        assert trace[probe]["httpGet"] == {"path": "/healthz", "port": "trace"}
    # The same API keys file as vLLM's, from the same Secret; the cache only in the trace container.
    trace_mounts = {m["name"]: m for m in trace["volumeMounts"]}
    vllm_mounts = {m["name"]: m for m in vllm["volumeMounts"]}
    assert trace_mounts["api-keys"] == vllm_mounts["api-keys"]
    assert config.api_keys_file == trace_mounts["api-keys"]["mountPath"] + "/keys"
    assert trace_mounts["trace-cache"]["mountPath"] == config.trace.cache_dir and "trace-cache" not in vllm_mounts
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["trace-cache"]["emptyDir"] == {"sizeLimit": "64Gi"}
    assert trace["securityContext"]["readOnlyRootFilesystem"] is True
    assert {e["name"] for e in trace["env"]} >= {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}

    # The app the container serves, from that config (keys file and cache moved here): /healthz
    # answers while the index is not loaded, /v1/trace wants a key, /metrics has the trace series.
    keys = tmp_path / "keys"
    keys.write_text("sk-trace\n")
    local = config.model_copy(update={"api_keys_file": str(keys), "trace": config.trace.model_copy(
        update={"cache_dir": str(tmp_path / "cache")})})
    app, _ = trace_service.create_trace_app(local)
    with TestClient(app) as client:
        assert client.get(trace["readinessProbe"]["httpGet"]["path"]).status_code == 200
        assert client.post("/v1/trace", json={"text": "hello"}).status_code == 401
        loading = client.post("/v1/trace", json={"text": "hello"}, headers={"Authorization": "Bearer sk-trace"})
        assert loading.status_code == 503
        assert "lmforge_inference_trace_request_latency_seconds" in client.get("/metrics").text


def test_vllm_trace_is_reached_through_the_service_policy_and_monitor(vllm_objects):
    (service,) = find(vllm_objects, "Service", "lmforge-inference")
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["trace"] == {"name": "trace", "port": 8101, "targetPort": "trace", "protocol": "TCP"}
    assert ports["http"]["port"] == 8000  # completions stay on the API port
    (policy,) = find(vllm_objects, "NetworkPolicy", "lmforge-inference")
    api, scrape = policy["spec"]["ingress"]
    assert [p["port"] for p in api["ports"]] == [8000, 8101]  # the gateway and the canary reach /v1/trace
    assert [p["port"] for p in scrape["ports"]] == [8000, 8101]  # Prometheus reaches its /metrics
    (monitor,) = find(vllm_objects, "ServiceMonitor", "lmforge-inference")
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    assert endpoints["trace"]["path"] == "/metrics"
    assert {"targetLabel": "job", "replacement": "lmforge-inference"} in endpoints["trace"]["relabelings"]


def test_vllm_without_trace_is_unchanged():
    objects = render(VLLM, namespace=NAMESPACE)
    pod = inference_pod(objects)
    assert [c["name"] for c in pod["containers"]] == ["inference"]
    (service,) = find(objects, "Service", "lmforge-inference")
    assert "trace" not in {p["name"] for p in service["spec"]["ports"]}
    (monitor,) = find(objects, "ServiceMonitor", "lmforge-inference")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]


# ---------------------------------------------------------------------------------------- data prep


def stage_jobs(values: dict) -> dict[str, dict]:
    jobs = find(render(values, namespace=NAMESPACE), "Job")
    return {j["metadata"]["name"].removeprefix(STAGE_PREFIX): j for j in jobs}


def test_the_trace_index_job_renders_only_when_the_config_enables_it():
    assert "trace-index" not in stage_jobs(CPU_ONLY)
    off = {**CPU_ONLY, "dataprep": {**CPU_ONLY["dataprep"], "config": {"trace_index": {"enabled": False}}}}
    assert "trace-index" not in stage_jobs(off)

    objects = render(TRACE_INDEX_ON, namespace=NAMESPACE)
    validate(objects)
    jobs = {j["metadata"]["name"].removeprefix(STAGE_PREFIX): j for j in find(objects, "Job")}
    # The workers record the config the stages reuse: trace_index as set.
    workers = container(jobs["workers"]["spec"]["template"]["spec"], "dataprep")
    recorded = DATAPREP.load_config(DATAPREP.parse_args(workers["args"]))
    assert recorded.trace_index.enabled and recorded.trace_index.part_tokens == 5_000_000
    assert load_dataprep_config(None, []).trace_index.enabled is False

    job = jobs["trace-index"]
    weight = {name: int(j["metadata"]["annotations"]["helm.sh/hook-weight"]) for name, j in jobs.items()
              if name != "workers"}
    assert weight["shards"] < weight["trace-index"] < weight["report"]  # after the shards, before the report
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 8, 8)
    pod = spec["template"]["spec"]
    c = container(pod, "dataprep")
    args = DATAPREP.parse_args(c["args"])
    assert (args.command, args.output, args.num_workers, args.workers) == (
        "trace-index", "s3://lmforge/datasets/cc-main-2024-22", 8, 1)
    # The build's temporary files go to the scratch volume.
    env = {e["name"]: e.get("value") for e in c["env"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert env["TMPDIR"] == mounts["scratch"] == "/scratch"
    assert {v["name"]: v["emptyDir"]["sizeLimit"] for v in pod["volumes"]} == {"tmp": "10Gi", "scratch": "50Gi"}
    assert c["resources"]["limits"]["memory"] == "2Gi"
    # The other stages get no scratch volume.
    shards = container(jobs["shards"]["spec"]["template"]["spec"], "dataprep")
    assert "TMPDIR" not in {e["name"] for e in shards["env"]}


def test_the_trace_index_stage_takes_its_own_settings():
    values = {**TRACE_INDEX_ON, "dataprep": {**TRACE_INDEX_ON["dataprep"], "stages": {"trace-index": {
        "tasks": 4, "parallelism": 2, "scratch": "200Gi",
        "resources": {"requests": {"cpu": "2", "memory": "6Gi"}, "limits": {"cpu": "2", "memory": "8Gi"}}}}}}
    pod = stage_jobs(values)["trace-index"]["spec"]["template"]["spec"]
    assert {v["name"]: v["emptyDir"]["sizeLimit"] for v in pod["volumes"]}["scratch"] == "200Gi"
    assert container(pod, "dataprep")["resources"]["limits"] == {"cpu": "2", "memory": "8Gi"}
    too_parallel = {**values, "dataprep": {**values["dataprep"], "stages": {"trace-index": {"parallelism": 9}}}}
    with pytest.raises(HelmRenderError, match=r"dataprep.stages.trace-index.parallelism \(9\) must not exceed"):
        render(too_parallel)


def test_a_memory_limit_too_small_for_the_part_size_fails_the_render():
    """A task sorts parts of trace_index.part_tokens tokens: about 20 bytes each plus 256Mi, checked
    against the stage's memory limit with the config's part_tokens, or TraceIndexConfig's default."""
    default = TraceIndexConfig().part_tokens
    needed_mi = (20 * default + (256 << 20)) / (1 << 20)

    def with_limit(memory: str, **trace_index) -> dict:
        return {"dataprep": {"enabled": True, "config": {"trace_index": {"enabled": True, **trace_index}},
                             "stages": {"trace-index": {"resources": {"limits": {"cpu": "1", "memory": memory}}}}}}

    assert "trace-index" in stage_jobs(with_limit(f"{int(needed_mi) + 1}Mi"))
    with pytest.raises(HelmRenderError, match=r"limits.memory \(\d+Mi\) is below .*part_tokens 25000000"):
        render(with_limit(f"{int(needed_mi) - 1}Mi"))
    with pytest.raises(HelmRenderError, match=r"part_tokens 100000000"):
        render(with_limit("2Gi", part_tokens=100_000_000))
    assert "trace-index" in stage_jobs(with_limit("1Gi", part_tokens=10_000_000))
    assert "trace-index" not in stage_jobs({**with_limit("1Mi"), "dataprep": {
        **with_limit("1Mi")["dataprep"], "config": {}}})  # no index, no check


# ------------------------------------------------------------------------------- alert and schema


def memorization_alert(values: dict) -> dict | None:
    (configmap,) = find(render(values), "ConfigMap", "lmforge-prometheus-rules")
    groups = yaml.safe_load(configmap["data"]["lmforge.rules.yaml"])["groups"]
    found = [r for g in groups for r in g["rules"] if r.get("alert") == "LmforgeCanaryMemorization"]
    return found[0] if found else None


def test_the_memorization_alert_takes_its_threshold_from_values():
    default = memorization_alert({})
    assert default["expr"].startswith("lmforge_canary_memorized_token_ratio > 0.05\n")
    assert (default["for"], default["labels"]) == ("0m", {"severity": "warning", "service": "canary"})
    custom = memorization_alert({"alerts": {"canary": {"memorizedTokenRatio": 0.2, "staleHours": 50,
                                                       "memorization": {"for": "1h"}}}})
    assert custom["expr"].startswith("lmforge_canary_memorized_token_ratio > 0.2\n")
    assert "50 * 3600" in custom["expr"] and custom["for"] == "1h"
    assert memorization_alert({"alerts": {"canary": {"enabled": False}}}) is None


@pytest.mark.parametrize(("values", "field"), [
    ({"inference": {"trace": {"cacheSize": "lots"}}}, "/inference/trace/cacheSize"),
    ({"inference": {"trace": {"maxConcurrent": 0}}}, "/inference/trace/maxConcurrent"),
    ({"inference": {"trace": {"timeoutSeconds": 0}}}, "/inference/trace/timeoutSeconds"),
    ({"inference": {"trace": {"tracePort": 70000}}}, "/inference/trace/tracePort"),
    ({"inference": {"trace": {"cache": "20Gi"}}}, "'cache' not allowed"),
    ({"alerts": {"canary": {"memorizedTokenRatio": 1.5}}}, "/alerts/canary/memorizedTokenRatio"),
    ({"dataprep": {"stages": {"trace-index": {"scratch": "big"}}}}, "/dataprep/stages/trace-index/scratch"),
    ({"dataprep": {"config": {"trace_index": {"part_tokens": 10}}}}, "/dataprep/config/trace_index/part_tokens"),
    ({"inference": {"config": {"trace": {"max_count": 0}}}}, "/inference/config/trace/max_count"),
])
def test_the_schema_rejects_bad_trace_values(chart, values, field):
    with pytest.raises(HelmValuesError) as caught:
        chart.validate_schema(values)
    assert field in str(caught.value)


# ------------------------------------------------------------------------------------ the canary


@pytest.mark.parametrize(("values", "trace_url"), [
    (VLLM_TRACE, "http://lmforge-inference:8101/v1/trace"),  # vLLM: the trace service's port
    (LMFORGE, "http://lmforge-inference:8000/v1/trace"),  # lmforge-serve: its API port
    (VLLM, "http://lmforge-inference:8000/v1/trace"),  # no trace service: the endpoint answers 404 (not traced)
])
def test_the_canary_traces_through_the_server_that_answers_v1_trace(values, trace_url):
    from lmforge.canary.cli import CLI as CANARY
    from lmforge.canary.client import InferenceClient

    (cronjob,) = find(render(values, namespace=NAMESPACE), "CronJob", "lmforge-canary")
    (canary,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    args = CANARY.parse_args(canary["args"])
    config = CANARY.load_config(args)
    with InferenceClient(args.endpoint, config.http, model=config.model,
                         trace_endpoint=config.memorization.endpoint) as client:
        assert client.trace_url == trace_url
