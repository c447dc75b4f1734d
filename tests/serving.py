"""A tiny model that has really learned something, and a real inference server around it.

`train_tiny_package` trains, in about ten seconds on one core, a byte-level BPE tokenizer and
a 2-layer GPT on a fixed set of sentences until it has memorized them, and writes the serving
package exactly as `lmforge-train export` does. Greedy decoding of a sentence's start then
gives its end: the canary's expected continuations and a low perplexity on the corpus.
`running_server` starts `lmforge-serve` in a subprocess on a loopback port.

The training is deterministic (fixed seeds), so a session trains each (steps, seed) once and
every call gets its own copy of that package: the inference, canary, rollout, image, operator and
observability tests all start from the same tiny model."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from lmforge.model.config import GPTConfig
from lmforge.model.package import load_package, write_package
from lmforge.model.transformer import GPT
from tests.ports import free_port
from tests.processes import stop, wait_http_ok
from tests.tiny_text import EOT, SENTENCES, train_tokenizer  # noqa: F401 - re-exported to the tests

CONFIG = dict(n_layer=2, n_head=4, n_embd=64, context_length=96)


_TRAINED: dict[tuple[int, int], Path] = {}  # (steps, seed) → the package this process trained


def train_tiny_package(output: Path, steps: int = 300, seed: int = 0) -> Path:
    """Train until the sentences are memorized (fewer `steps`: a worse model); writes the package
    to `output` (a copy of this process's one training of those steps and seed)."""
    if (steps, seed) not in _TRAINED:
        cache = Path(tempfile.mkdtemp(prefix="lmforge-tiny-package-"))
        atexit.register(shutil.rmtree, cache, ignore_errors=True)
        _TRAINED[steps, seed] = _train_tiny_package(cache / "tiny", steps, seed)
    output.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(_TRAINED[steps, seed], output)
    return output


def _train_tiny_package(output: Path, steps: int, seed: int) -> Path:
    from tokenizers import Tokenizer

    output.parent.mkdir(parents=True, exist_ok=True)
    tokenizer_path = train_tokenizer(output.parent / f"{output.name}-tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    eot = tokenizer.token_to_id(EOT)
    stream: list[int] = []
    for sentence in SENTENCES:
        stream += tokenizer.encode(sentence).ids + [eot]
    torch.manual_seed(seed)
    config = GPTConfig.preset("tiny", vocab_size=tokenizer.get_vocab_size(), **CONFIG)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    data = torch.tensor(stream * 8)
    seq_len, batch = 48, 16
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=generator)
        x = torch.stack([data[s: s + seq_len] for s in starts])
        y = torch.stack([data[s + 1: s + seq_len + 1] for s in starts])
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return write_package(model.eval(), tokenizer_path, output, step=steps)


def perturbed_package(source: Path, output: Path, scale: float, seed: int = 0) -> Path:
    """A copy of the package with Gaussian noise of `scale`×(each tensor's std) in its weights."""
    model, meta = load_package(source)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.std() * scale)
    return write_package(model, source / "tokenizer.json", output, step=meta["step"])


@contextlib.contextmanager
def running_server(package: Path | str, *settings: str, env: dict[str, str] | None = None,
                   log_path: Path | None = None, timeout: float = 60, port: int | None = None) -> Iterator[str]:
    """`lmforge-serve` on a loopback port (a free one unless given), ready; yields its base URL."""
    port = port or free_port()
    command = [sys.executable, "-m", "lmforge.inference", "--model", str(package), "--host", "127.0.0.1",
               "--port", str(port), *[arg for s in settings for arg in ("--set", s)]]
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, timeout)
        yield url
    finally:
        stop(process)
        if log_path:
            log.close()


def wait_ready(url: str, process: subprocess.Popen | None = None, timeout: float = 60) -> None:
    wait_http_ok(f"{url}/readyz", process, "lmforge-serve", timeout)


@contextlib.contextmanager
def in_process_server(service) -> Iterator[str]:
    """The app of an InferenceService on uvicorn in a thread (for tests that inspect the
    service's objects, e.g. its in-memory span exporter); yields the base URL."""
    import threading

    import uvicorn

    from lmforge.inference.api import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, timeout=30)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        service.stop()


def upload_package(client, bucket: str, prefix: str, package: Path) -> str:
    """Copy a package directory to s3://bucket/prefix (config.json last, as the export step
    publishes it); returns the URI."""
    for name in sorted((p.name for p in package.iterdir()), key=lambda name: name == "config.json"):
        client.upload_file(str(package / name), bucket, f"{prefix}/{name}")
    return f"s3://{bucket}/{prefix}"


def corrupted_copy(source: Path, output: Path) -> Path:
    """The package with one byte of its last weight flipped: same size, and a sha256 that no
    longer matches its config.json (safetensors would still load it)."""
    import shutil

    shutil.copytree(source, output)
    data = bytearray((output / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (output / "model.safetensors").write_bytes(bytes(data))
    return output
