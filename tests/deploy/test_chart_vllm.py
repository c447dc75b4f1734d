"""The chart with inference.backend vllm (value set "vllm"): the inference Deployment runs vLLM's
OpenAI server (pinned by digest) on the Hugging Face format package an init container fetches,
with the platform's API keys Secret, probes, security context, NetworkPolicy, HPA and metrics; it
is marked for the rollout, which restarts it, and it names the model pointer, never a package, so
that `helm upgrade` keeps the rolled-out model. Schema validation of every object is in
test_chart_render.py (parametrized over the value sets); the recording rules in
tests/observability/test_vllm_rules.py; the rollout's restart in tests/pipelines/test_rollout_vllm.py."""

from __future__ import annotations

import os
import re
import stat
import subprocess

import pytest
import yaml
from helm_python import Chart, HelmRenderError

from lmforge.inference.fetch_model import CLI as FETCH
from lmforge_pipelines import vllm_pods
from tests.deploy.chart_values import VALUE_SETS, container, rendered
from tests.helm_chart import CHART, find, render

VLLM = VALUE_SETS["vllm"]
KEYS = "/var/run/secrets/lmforge/api-keys/keys"


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    return list(rendered("vllm"))


@pytest.fixture(scope="module")
def pod(objects) -> dict:
    (deployment,) = find(objects, "Deployment", "lmforge-inference")
    return deployment["spec"]["template"]


def option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_vllm_serves_the_fetched_package_with_the_values(pod):
    spec = pod["spec"]
    fetch, server = container(spec, "fetch-model"), container(spec, "inference")
    # The init container runs the real fetch CLI on the pointer, into the shared emptyDir.
    assert fetch["image"] == "lmforge/inference:0.1.0"
    assert fetch["command"] == ["python", "-m", "lmforge.inference.fetch_model"]
    args = FETCH.parse_args(fetch["args"])
    assert args.model == VLLM["inference"]["model"]
    mount = {m["name"]: m["mountPath"] for m in fetch["volumeMounts"]}["model"]
    assert args.output.startswith(mount + "/")
    served = {m["name"]: m for m in server["volumeMounts"]}["model"]
    assert served["mountPath"] == mount and served["readOnly"] is True
    assert {v["name"]: v for v in spec["volumes"]}["model"]["emptyDir"]["sizeLimit"] == "20Gi"
    # vLLM's server, pinned by tag and digest (docs/vllm.md, "The image"), on that directory, with the values' settings.
    assert server["image"] == ("vllm/vllm-openai:v0.31.0@sha256:"
                               "c1c9f6fd5c109ba7f0546a59f5b2f15fb87f64c77782e90a27b648b42a8e67c3")
    assert re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+@sha256:[0-9a-f]{64}", server["image"])
    assert server["command"][:2] == ["/bin/sh", "-c"] and server["command"][2].rstrip().endswith('exec vllm serve "$@"')
    served_args = server["args"]
    assert served_args[0] == args.output
    assert option(served_args, "--served-model-name") == "lmforge-hf"
    assert option(served_args, "--host") == "0.0.0.0" and option(served_args, "--port") == "8000"
    assert option(served_args, "--dtype") == "bfloat16" and option(served_args, "--max-model-len") == "4096"
    assert option(served_args, "--gpu-memory-utilization") == "0.85"
    assert option(served_args, "--tensor-parallel-size") == "2"
    assert "--disable-fastapi-docs" in served_args  # inference.apiDocs false
    assert served_args[-3:] == ["--enable-prefix-caching", "--max-num-seqs", "64"]
    assert server["resources"]["limits"]["nvidia.com/gpu"] == "2" == server["resources"]["requests"]["nvidia.com/gpu"]
    assert {p["name"]: p["containerPort"] for p in server["ports"]} == {"http": 8000}
    # lmforge-serve's flags are not passed to vLLM.
    assert "--set" not in served_args and "lmforge-serve" not in str(server)


def test_probes_read_vllms_health_endpoint(pod):
    server = container(pod["spec"], "inference")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    assert server["startupProbe"]["failureThreshold"] * server["startupProbe"]["periodSeconds"] >= 600


def test_non_root_with_writable_home_and_caches_on_emptydirs(pod):
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == 10001
    assert spec["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in (container(spec, "fetch-model"), container(spec, "inference")):
        context = c["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        for mount in c["volumeMounts"]:
            assert "emptyDir" in volumes[mount["name"]] or "secret" in volumes[mount["name"]], mount
    server = container(spec, "inference")
    env = {e["name"]: e["value"] for e in server["env"]}
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    assert mounts[env["HOME"]] == "cache"
    for name in ("XDG_CACHE_HOME", "HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        assert env[name].startswith(env["HOME"] + "/"), name
    assert env["HF_HUB_OFFLINE"] == "1"
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


def _run_entrypoint(server: dict, keys_file, tmp_path) -> subprocess.CompletedProcess:
    """The container's shell entrypoint, as written, with the keys file at `keys_file` and a
    `vllm` on PATH that prints its key and arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "vllm"
    fake.write_text('#!/bin/sh\nprintf "key=[%s]\\n" "$VLLM_API_KEY"\nprintf "arg=%s\\n" "$@"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    shell, flag, script, name = server["command"]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("VLLM_API_KEY", None)
    return subprocess.run([shell, flag, script.replace(KEYS, str(keys_file)), name, *server["args"]],
                          capture_output=True, text=True, timeout=30, env=env)


def test_the_api_keys_secret_gives_vllm_its_first_key(pod, tmp_path):
    spec = pod["spec"]
    server = container(spec, "inference")
    mount = {m["name"]: m for m in server["volumeMounts"]}["api-keys"]
    assert f"{mount['mountPath']}/keys" == KEYS and mount["readOnly"] is True
    secret = {v["name"]: v for v in spec["volumes"]}["api-keys"]["secret"]
    assert secret == {"secretName": "lmforge-api-keys", "items": [{"key": "api-keys", "path": "keys"}]}
    assert KEYS in server["command"][2] and "--api-key" not in server["args"]  # never in argv

    keys = tmp_path / "keys"
    keys.write_text("# rotated 2026-11\n\n  sk-first  \nsk-second\n")
    result = _run_entrypoint(server, keys, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "key=[sk-first]"  # the canary's key: the first non-comment line
    assert [line.removeprefix("arg=") for line in lines[1:]] == ["serve", *server["args"]]

    keys.write_text("# no key yet\n\n")
    empty = _run_entrypoint(server, keys, tmp_path)
    assert empty.returncode == 2 and "no API key" in empty.stderr and "arg=" not in empty.stdout


def test_the_canary_calls_the_vllm_service(objects):
    """The canary scores and completes through /v1/completions, which vLLM serves: unchanged."""
    (cronjob,) = find(objects, "CronJob", "lmforge-canary")
    canary = container(cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"], "canary")
    (service,) = find(objects, "Service", "lmforge-inference")
    port = service["spec"]["ports"][0]["port"]
    assert option(canary["args"], "--endpoint") == f"http://lmforge-inference:{port}"
    assert find(render({**VLLM, "canary": {"enabled": False}}), "CronJob") == []


def test_without_a_secret_vllm_starts_without_a_key(tmp_path):
    values = {**VLLM, "inference": {**VLLM["inference"], "apiKeys": {"secretName": ""}}}
    (deployment,) = find(render(values), "Deployment", "lmforge-inference")
    server = container(deployment["spec"]["template"]["spec"], "inference")
    assert "VLLM_API_KEY" not in server["command"][2]
    assert "api-keys" not in {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}


def test_network_policy_hpa_service_and_monitor_reach_the_vllm_pod(objects, pod):
    labels = pod["metadata"]["labels"]
    (policy,) = find(objects, "NetworkPolicy", "lmforge-inference")
    assert all(labels[k] == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    api, scrape = policy["spec"]["ingress"]
    assert [p["port"] for p in api["ports"]] == [8000] == [p["port"] for p in scrape["ports"]]
    (hpa,) = find(objects, "HorizontalPodAutoscaler", "lmforge-inference")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "lmforge-inference"}
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "lmforge_inference_requests_waiting"
    (service,) = find(objects, "Service", "lmforge-inference")
    assert all(labels[k] == v for k, v in service["spec"]["selector"].items())
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["http"]["targetPort"] == "http" and ports["metrics"]["targetPort"] == "http"
    (monitor,) = find(objects, "ServiceMonitor", "lmforge-inference")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert {"targetLabel": "job", "replacement": "lmforge-inference"} in endpoint["relabelings"]


@pytest.mark.parametrize(("inference", "message"), [
    ({"config": {"engine": {"max_running": 8}}}, "with inference.backend vllm set inference.vllm.extraArgs"),
    ({"gpus": 0}, "inference.backend vllm needs inference.gpus >= 1"),
    ({"gpus": 1}, "inference.vllm.tensorParallelSize (2) exceeds inference.gpus (1)"),
])
def test_settings_vllm_cannot_honour_fail_the_render(inference, message):
    with pytest.raises(HelmRenderError) as caught:
        render({**VLLM, "inference": {**VLLM["inference"], **inference}})
    assert message in str(caught.value)


def test_the_lmforge_backend_is_unchanged_by_default():
    (deployment,) = find(render(), "Deployment", "lmforge-inference")
    spec = deployment["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    assert container(spec, "inference")["command"] == ["lmforge-serve"]


def render_upgrade(values: dict) -> list[dict]:
    """What `helm upgrade` (revision 2) renders with `values`."""
    manifests = Chart.load(CHART).render(values, name="lmforge", namespace="ml", revision=2, is_upgrade=True)
    return [o for path, text in manifests.items() if not path.endswith("NOTES.txt") for o in yaml.safe_load_all(text)
            if o]


def test_the_deployment_is_marked_vllm_for_the_rollout(objects):
    (deployment,) = find(objects, "Deployment", "lmforge-inference")
    assert deployment["metadata"]["annotations"] == {"lmforge.io/inference-backend": "vllm"}
    assert vllm_pods.is_vllm(deployment)
    assert vllm_pods.served_model_name(deployment, "inference") == "lmforge-hf"
    assert vllm_pods.api_key_secret(deployment) == ("lmforge-api-keys", "api-keys")
    (lmforge_serve,) = find(render(), "Deployment", "lmforge-inference")
    assert not vllm_pods.is_vllm(lmforge_serve)  # followed in place, never restarted by a rollout
    # The mark is on the Deployment, not its pod template: adding it restarts no pod.
    assert "lmforge.io/inference-backend" not in str(deployment["spec"]["template"])


def test_helm_upgrade_after_a_rollout_keeps_the_rolled_out_model():
    """The rollout moves the pointer and restarts the pods (the pod template's restartedAt); the
    chart names the pointer and renders no restartedAt, so a `helm upgrade` with the same values
    renders the same pod template (no restart; Helm's three-way merge keeps the live restartedAt,
    a field the chart never rendered), and any pod it does start fetches what the pointer names."""
    pointer = VLLM["inference"]["model"]
    install = find(render(VLLM, namespace="ml"), "Deployment", "lmforge-inference")[0]["spec"]["template"]
    upgrade = find(render_upgrade(VLLM), "Deployment", "lmforge-inference")[0]["spec"]["template"]
    assert upgrade == install
    fetch = container(install["spec"], "fetch-model")
    assert FETCH.parse_args(fetch["args"]).model == pointer and pointer.endswith("/models/current")
    assert vllm_pods.RESTARTED_AT not in str(install)
    # No package anywhere in the pod: vLLM serves the fetched directory under the pointer's served name.
    server = container(install["spec"], "inference")
    assert server["args"][0] == FETCH.parse_args(fetch["args"]).output
    assert not any("s3://" in arg for arg in server["args"])
    # An upgrade that changes the pods (more memory for vLLM) still names only the pointer.
    changed = {**VLLM, "inference": {**VLLM["inference"], "vllm": {**VLLM["inference"]["vllm"],
                                                                    "gpuMemoryUtilization": 0.8}}}
    changed_pod = find(render_upgrade(changed), "Deployment", "lmforge-inference")[0]["spec"]["template"]
    assert changed_pod != install
    assert FETCH.parse_args(container(changed_pod["spec"], "fetch-model")["args"]).model == pointer
