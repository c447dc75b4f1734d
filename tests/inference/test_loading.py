"""Loading the model package: from a directory or s3://, readiness only once it is loaded,
and a clear error with a non-zero exit for anything that is not a valid package."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import httpx
from starlette.testclient import TestClient

from lmforge.inference.api import create_app
from lmforge.inference.config import ServeConfig
from lmforge.inference.service import InferenceService
from tests.ports import free_port
from tests.serving import running_server


def test_serves_a_package_from_s3(s3, tiny_package):
    endpoint, make_bucket = s3
    client = make_bucket("models")
    for path in tiny_package.iterdir():
        client.upload_file(str(path), "models", f"run-7/models/v3/{path.name}")
    with running_server("s3://models/run-7/models/v3") as url:
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "v3"
        body = httpx.post(f"{url}/v1/completions", json={"prompt": "Bees make", "max_tokens": 30,
                                                         "temperature": 0}).json()
        assert body["choices"][0]["text"] == " honey from the nectar of flowers."


def test_not_ready_until_the_model_is_loaded(tiny_package):
    service = InferenceService(ServeConfig(model=str(tiny_package)))
    with TestClient(create_app(service)) as client:
        assert client.get("/healthz").status_code == 200
        loading = client.get("/readyz")
        assert loading.status_code == 503 and loading.json()["reason"] == "model loading"
        early = client.post("/v1/completions", json={"prompt": "Bees", "max_tokens": 2})
        assert early.status_code == 503 and early.headers["retry-after"] == "5"
        service.load()
        ready = client.get("/readyz").json()
        assert ready.items() >= {"status": "ready", "model": "tiny-v1", "package": str(tiny_package)}.items()
        assert ready["engine_pid"] != os.getpid()  # the engine runs in a process of its own
        assert client.post("/v1/completions", json={"prompt": "Bees", "max_tokens": 2}).status_code == 200
    service.stop()


def serve_exit(model: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lmforge.inference", "--model", model, "--host", "127.0.0.1",
                           "--port", str(free_port())], capture_output=True, text=True, timeout=60)


def test_bad_packages_exit_non_zero_with_a_clear_error(tiny_package, tmp_path):
    missing = serve_exit(str(tmp_path / "nowhere"))
    assert missing.returncode == 3 and "not a model package (model.safetensors missing)" in missing.stderr
    tampered = tmp_path / "tampered"
    shutil.copytree(tiny_package, tampered)
    with open(tampered / "tokenizer.json", "a") as f:
        f.write("\n")  # any change at all: not the tokenizer the model was trained with
    mismatch = serve_exit(str(tampered))
    assert mismatch.returncode == 3 and "tokenizer.json does not match" in mismatch.stderr
    assert "Traceback" not in mismatch.stderr
