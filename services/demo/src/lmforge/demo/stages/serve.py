"""Step 5: the model package exported from the final checkpoint (in Hugging Face format: the same
directory loads in transformers, lm-evaluation-harness and vLLM), the inference server on it with
the demo API key, a few completions (the last one streamed), and the canary: its eval set drawn
from the validation split, a baseline recorded, then a run against the baseline that pushes its
result to the Pushgateway."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from lmforge.demo.config import ServeSection
from lmforge.demo.processes import StepFailed, Supervisor, wait_http_ok
from lmforge.demo.scripts import script

MODEL_NAME = "lmforge-demo"
TTFT = "lmforge_inference_time_to_first_token_seconds"
TPOT = "lmforge_inference_time_per_output_token_seconds"


@dataclass
class Completion:
    prompt: str
    text: str
    streamed: bool
    seconds: float


@dataclass
class CanaryOutcome:
    passed: bool
    perplexity: float
    score: float
    baseline: Path
    eval_set: Path


def export_package(supervisor: Supervisor, checkpoint: Path, output: Path) -> None:
    supervisor.run("export", [script("lmforge-train"), "export", "--checkpoint", str(checkpoint),
                              "--output", str(output), "--format", "hf"])


def start_server(supervisor: Supervisor, serve: ServeSection, package: Path, port: int, out: Path,
                 trace_index: Path | None = None) -> str:
    """lmforge-serve on 127.0.0.1:`port`, ready; returns its URL. The API key goes to OUT/api-keys. With
    `trace_index` (data prep's trace-index/), /v1/trace answers from it."""
    keys = out / "api-keys"
    keys.write_text(serve.api_key + "\n")
    keys.chmod(0o600)
    process = supervisor.start("inference", [script("lmforge-serve"), "--model", str(package), "--host", "127.0.0.1",
                                             "--port", str(port), "--set", f"api_keys_file={keys}",
                                             "--set", f"model_name={MODEL_NAME}",
                                             *(["--set", f"trace.index={trace_index}"] if trace_index else [])])
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(f"{url}/readyz", process, "the inference server", timeout=120, interval=0.2)
    return url


def complete(url: str, api_key: str, prompt: str, max_tokens: int, stream: bool) -> Completion:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8, "top_p": 0.95,
            "seed": 7, "stream": stream}
    headers = {"Authorization": f"Bearer {api_key}"}
    started = time.monotonic()
    if not stream:
        response = httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=120)
        _check(response)
        return Completion(prompt, response.json()["choices"][0]["text"], False, time.monotonic() - started)
    pieces = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=headers, timeout=120) as response:
        _check(response)
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                pieces.append(json.loads(line[len("data: "):])["choices"][0]["text"])
    return Completion(prompt, "".join(pieces), True, time.monotonic() - started)


def _check(response: httpx.Response) -> None:
    if response.status_code != 200:
        response.read()
        raise StepFailed(f"the inference server answered {response.status_code}: {response.text[:500]}")


def write_eval_set(data_dir: Path, path: Path, texts: int) -> Path:
    """Held-out texts (the first validation documents, cut to ~300 characters) and, for each, a
    check: its first eight words → the next two."""
    documents = validation_documents(data_dir, texts)
    held_out, checks = [], []
    for index, document in enumerate(documents):
        words = document.split()
        held_out.append({"id": f"val{index}", "text": _clip(document, 300)})
        if len(words) >= 10:
            checks.append({"id": f"val{index}", "prompt": " ".join(words[:8]), "expected": " " + " ".join(words[8:10]),
                           "max_tokens": 8})
    if not held_out or not checks:
        raise StepFailed(f"the validation split of {data_dir} has too few documents for the canary")
    evalset = {"name": "demo-validation", "held_out": held_out, "checks": checks}
    path.write_text(yaml.safe_dump(evalset, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0]


def validation_documents(data_dir: Path, count: int) -> list[str]:
    """The first `count` documents of the validation shards, decoded."""
    from tokenizers import Tokenizer

    from lmforge.common.shard_index import MANIFEST, parse_manifest, read_split_index
    from lmforge.common.shards import open_shard, read_doc_ends

    manifest = parse_manifest((data_dir / MANIFEST).read_bytes(), str(data_dir / MANIFEST))
    tokenizer = Tokenizer.from_file(str(data_dir / "tokenizer.json"))
    documents: list[str] = []
    for shard in read_split_index(manifest, "val", lambda rel: (data_dir / rel).read_bytes(), str(data_dir)):
        _, tokens = open_shard(data_dir / shard.path)
        start = 0
        for end in read_doc_ends(data_dir / shard.path):
            text = tokenizer.decode([int(t) for t in tokens[start:end]]).strip()
            start = int(end)
            if text:
                documents.append(text)
            if len(documents) == count:
                return documents
    return documents


def run_canary(supervisor: Supervisor, url: str, keys: Path, eval_set: Path, out: Path,
               pushgateway: str) -> CanaryOutcome:
    baseline = out / "canary-baseline.json"
    common = ["--endpoint", url, "--eval-set", str(eval_set), "--api-key-file", str(keys)]
    supervisor.run("canary-baseline", [script("lmforge-canary"), "make-baseline", *common, "--output", str(baseline)])
    code = supervisor.run("canary", [script("lmforge-canary"), "run", *common, "--baseline", str(baseline),
                                     "--pushgateway", pushgateway], expect_failure=True)
    result = _last_event(supervisor.log_path("canary"), "canary_result")
    if code not in (0, 1) or result is None:
        raise StepFailed(f"the canary exited with {code}\n{supervisor.tail('canary')}")
    return CanaryOutcome(result["passed"], result["perplexity"], result["score"], baseline, eval_set)


def _last_event(log: Path, event: str) -> dict | None:
    found = None
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == event:
                found = record
    return found


def latency_means(url: str) -> dict[str, float]:
    """Mean TTFT and TPOT in ms over every request the server has answered (its histograms)."""
    from prometheus_client.parser import text_string_to_metric_families

    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name in (f"{TTFT}_sum", f"{TTFT}_count", f"{TPOT}_sum", f"{TPOT}_count"):
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return {name: 1000 * sums.get(f"{metric}_sum", 0.0) / max(sums.get(f"{metric}_count", 0.0), 1)
            for name, metric in (("ttft_ms", TTFT), ("tpot_ms", TPOT))}
