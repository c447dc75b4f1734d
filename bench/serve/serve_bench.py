#!/usr/bin/env python3
"""`make bench-serve`: `lmforge-serve` under load from C concurrent streaming clients
(bench/serve/loadgen.py): generated tokens/s, TTFT and time per output token, client side,
with the server's own histograms alongside.

--suite cpu (default): the `tiny` preset (4 layers, d=128, context 256, vocabulary 8192) on
CPU. Two servers of the same package and config, side by side in one run, differing only in
engine.max_running: 1 (the batch-size-1 baseline: one sequence decodes at a time, the others
queue) and 16 (continuous batching). Each is driven by 16 clients with the same requests
(same prompts, max_tokens, sampling seeds); rounds alternate the order (ABBA). Target:
continuous batching >= 4x the baseline's tokens/s. Each server gets OMP_NUM_THREADS=1: the
server is bound by one Python thread (the GIL) and the load generator needs the other vCPU;
2 intra-op threads measured slower and far noisier on the 2-vCPU VM.

--suite gpu (one CUDA device; without one it stops at once, saying so): the `350m` preset, then
`llama-1b` (with the package's 8192-token vocabulary, not Llama 3's 128,256: the output head is
smaller, the layers are the 1B's), device=cuda (the server runs bf16), engine.max_running=64, at
1, 16 and 64 clients; one server at a time. While each measurement runs, GPU 0's utilization is
sampled (gpu_busy.py: NVML every 0.1 s), so "GPU busy >= 80% at 64 clients" can be read off the
table (mean %, and the share of samples at or above 80%).

Server CPU is that of the server's whole process tree (process_cpu.py: an engine-core process and
more API processes count; children that exited too).

The model package is built first: a byte-level BPE tokenizer (8192 tokens) trained on
`lmforge-sample-data` text, and random weights. Random weights would end a
sequence at `<|endoftext|>` about once per 9,000 tokens; so that every request generates
exactly max_tokens (the equivalent of vLLM's ignore_eos), all embedding rows (tied with the
output head) get a shared direction d, 4x a row's own norm, and the end-of-text row is -d:
its probability drops to ~1e-11 (tiny) and ~1e-17 (350m) per token while the other tokens
keep a near-uniform distribution, so the compute per token is unchanged. The bench checks
that every request ended with finish_reason "length" after max_tokens tokens, that both
servers generated the same number of tokens for the same requests, and that the server's
generation_tokens_total counted what the clients did.

Results: bench/out/serve.json (suite gpu: bench/out/serve-gpu.json; rows and table keyed by preset)
and a Markdown table. `--preset` takes one or more presets (space- or comma-separated).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline_tree import launcher_command, sources_env  # noqa: E402
from gpu_busy import BUSY_PCT, GpuBusy  # noqa: E402
from loadgen import LoadConfig, format_summary, percentile, run_load  # noqa: E402
from process_cpu import process_tree, start_time, tree_cpu_seconds  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EOT = "<|endoftext|>"
SUITES = {
    "cpu": {"presets": ["tiny"], "device": "cpu", "context_length": 256, "max_running": [1, 16], "clients": [16],
            "requests": 64, "max_tokens": 64, "prompt_tokens": (16, 128), "rounds": 4, "threads": 1},
    "gpu": {"presets": ["350m", "llama-1b"], "device": "cuda", "context_length": 1024, "max_running": [64],
            "clients": [1, 16, 64], "requests": None, "max_tokens": 128, "prompt_tokens": (16, 512), "rounds": 2,
            "threads": None},
}
PROMPTS = 48  # distinct prompts in the mix


# -- the model package ---------------------------------------------------------------------------

def sample_texts(work: Path, docs: int, seed: int) -> list[str]:
    from warcio.archiveiterator import ArchiveIterator

    from lmforge.sample_data.wet import write_sample_wet

    path = work / f"sample-{docs}-{seed}.warc.wet.gz"
    if not path.exists():
        write_sample_wet(path, docs, seed)
    texts = []
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh):
            if record.rec_type == "conversion":
                texts.append(record.content_stream().read().decode("utf-8"))
    return texts


def build_package(work: Path, preset: str, context_length: int, seed: int = 0,
                  docs: int = 3000) -> tuple[Path, list[str]]:
    """(package dir, the texts prompts are cut from: `docs` sample documents, also the tokenizer's
    training text)."""
    import torch
    from tokenizers import Tokenizer

    from lmforge.dataprep.config import TokenizerConfig
    from lmforge.dataprep.tokenize import new_bpe_tokenizer
    from lmforge.model.config import GPTConfig
    from lmforge.model.package import write_package
    from lmforge.model.transformer import GPT

    texts = sample_texts(work, docs, 11)
    tokenizer, trainer = new_bpe_tokenizer(TokenizerConfig(vocab_size=8192, eot_token=EOT))
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer_path = work / "tokenizer.json"
    tokenizer.save(str(tokenizer_path))
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    eos = tokenizer.token_to_id(EOT)
    torch.manual_seed(seed)
    config = GPTConfig.preset(preset, vocab_size=tokenizer.get_vocab_size(), context_length=context_length)
    model = GPT(config).eval()
    with torch.no_grad():  # see the module docstring: EOS never wins, every request runs to max_tokens
        generator = torch.Generator().manual_seed(seed + 1)
        direction = torch.randn(config.n_embd, generator=generator)
        direction -= direction.mean()  # LayerNorm removes the mean; this survives it
        direction *= 4 * model.wte.weight.norm(dim=1).mean() / direction.norm()  # 4x a row's own norm
        model.wte.weight += direction
        model.wte.weight[eos] = -direction
    package = write_package(model, tokenizer_path, work / f"model-{preset}-ctx{context_length}", step=0)
    return package, texts


def prompt_mix(texts: list[str], tokenizer_path: Path, count: int, lengths: tuple[int, int],
               seed: int = 0) -> tuple[list[str], list[int]]:
    """`count` prompts: openings of sample documents cut at seeded random token lengths."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    rng = random.Random(seed)
    low, high = lengths
    prompts, sizes = [], []
    candidates = [t for t in texts if len(t) > 8 * high]
    for text in rng.sample(candidates, count):
        ids = tokenizer.encode(text, add_special_tokens=False).ids[: rng.randint(low, high)]
        prompt = tokenizer.decode(ids)
        prompts.append(prompt)
        sizes.append(len(tokenizer.encode(prompt, add_special_tokens=False).ids))
    return prompts, sizes


# -- servers -------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m lmforge.inference` (what `lmforge-serve` runs): from the venv's (the working
    tree's) sources, or from `sources` alone (another revision's, baseline_tree.py)."""

    def __init__(self, package: Path, device: str, max_running: int, max_waiting: int, threads: int | None,
                 log_path: Path, sources: list[str] | None = None, extra_settings: list[str] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.settings = [f"engine.max_running={max_running}", f"engine.max_waiting={max_waiting}",
                         f"device={device}", "max_tokens_limit=1024", *extra_settings]
        args = ["--model", str(package), "--host", "127.0.0.1", "--port", str(self.port),
                *[a for s in self.settings for a in ("--set", s)]]
        env = dict(os.environ)
        if sources:
            command = launcher_command("lmforge.inference", *args)
            env.update(sources_env(sources))
        else:
            command = [sys.executable, "-m", "lmforge.inference", *args]
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._children: dict[int, int | None] | None = None  # set by terminate()
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"lmforge-serve exited with {self.process.returncode}; see {self.log.name}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise SystemExit(f"{self.url} not ready within {timeout}s")

    def metrics(self) -> dict:
        """{(name, labels without model_name): value} of the server's histograms and counters."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        values = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name"))
                values[(sample.name, labels)] = sample.value
        return values

    def cpu_seconds(self) -> float:
        """User + system CPU time so far of the server and every process it started (an engine-core
        process, more API processes), all threads, exited children included (process_cpu.py)."""
        return tree_cpu_seconds(self.process.pid)

    def processes(self) -> int:
        """Live processes in the server's tree (the server itself included)."""
        return len(process_tree(self.process.pid))

    def terminate(self) -> None:
        """Ask the server to stop (SIGTERM), noting the processes it started; stop() waits for it."""
        if self._children is None:
            self._children = {pid: start_time(pid) for pid in process_tree(self.process.pid)
                              if pid != self.process.pid}
            self.process.terminate()

    def stop(self) -> None:
        """Stop the server; then any process it started that outlived it by 5 s (the server's
        own shutdown should have ended it: a warning says it did not)."""
        self.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        deadline = time.monotonic() + 5
        while (left := [p for p, t in self._children.items() if t is not None and start_time(p) == t]) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:  # the same pid and start time: the very process the server started
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                print(f"warning: pid {pid}, started by the server {self.process.pid}, outlived it by 5 s; killed",
                      file=sys.stderr)
        self.log.close()


def stop_servers(servers) -> None:
    """Stop every server, all at once (each takes seconds to shut down)."""
    for server in servers:
        server.terminate()
    for server in servers:
        server.stop()


P = "lmforge_inference_"


def histogram_delta(before: dict, after: dict, name: str) -> dict:
    """count, mean, and p50/p95 interpolated within buckets (PromQL's histogram_quantile)."""
    buckets = sorted((float(dict(labels)["le"]), value - before.get((n, labels), 0.0))
                     for (n, labels), value in after.items() if n == name + "_bucket")
    count = after.get((name + "_count", ()), 0.0) - before.get((name + "_count", ()), 0.0)
    total = after.get((name + "_sum", ()), 0.0) - before.get((name + "_sum", ()), 0.0)

    def quantile(q: float) -> float | None:
        if count <= 0:
            return None
        rank, lower, below = q * count, 0.0, 0.0
        for bound, cumulative in buckets:
            if cumulative >= rank:
                if bound == float("inf"):
                    return lower
                return lower + (bound - lower) * (rank - below) / max(cumulative - below, 1e-12)
            lower, below = bound, cumulative
        return lower

    return {"count": int(count), "mean": total / count if count else None, "p50": quantile(0.5),
            "p95": quantile(0.95)}


def server_side(before: dict, after: dict) -> dict:
    counter = lambda name: after.get((P + name, ()), 0.0) - before.get((P + name, ()), 0.0)  # noqa: E731
    return {"generation_tokens": int(counter("generation_tokens_total")),
            "prompt_tokens": int(counter("prompt_tokens_total")),
            "ttft_s": histogram_delta(before, after, P + "time_to_first_token_seconds"),
            "tpot_s": histogram_delta(before, after, P + "time_per_output_token_seconds"),
            "queue_s": histogram_delta(before, after, P + "queue_time_seconds")}


# -- the benchmark -------------------------------------------------------------------------------

def measure(server: Server, config: LoadConfig, gpu: bool = False) -> dict:
    """One load run, with the server's CPU (its process tree) and, with `gpu`, how busy GPU 0 was."""
    before = server.metrics()
    server_cpu, client_cpu = server.cpu_seconds(), time.process_time()
    with GpuBusy() if gpu else contextlib.nullcontext() as busy:
        result = asyncio.run(run_load(config))
    server_cpu, client_cpu = server.cpu_seconds() - server_cpu, time.process_time() - client_cpu
    after = server.metrics()
    result["server"] = server_side(before, after)
    wall = result["summary"]["wall_s"]  # CPU in cores busy over the run (2 = both vCPUs)
    result["server"]["cpu_cores"] = server_cpu / wall
    if busy is not None:
        result["server"]["gpu_busy"] = busy.summary()
    result["summary"]["client_cpu_cores"] = client_cpu / wall
    return result


def machine() -> dict:
    cpu = ""
    with contextlib.suppress(OSError):
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    import torch

    info = {"platform": platform.platform(), "cpus": os.cpu_count(), "cpu": cpu, "torch": torch.__version__,
            "python": platform.python_version()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict]:
    """The command line; the suite's settings with its overrides."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), default="cpu")
    parser.add_argument("--preset", nargs="+", help="model preset(s), one after the other, space- or "
                                                    "comma-separated (default: the suite's)")
    parser.add_argument("--device", help="server device (default: the suite's)")
    parser.add_argument("--max-running", type=int, nargs="+", help="engine.max_running of each server")
    parser.add_argument("--clients", type=int, nargs="+", help="concurrent clients (each count is one measurement)")
    parser.add_argument("--requests", type=int, help="requests per measurement (default cpu: 64; gpu: 4x clients, "
                                                     "at least 16)")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of each server (cpu default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="result JSON (default bench/out/serve.json; gpu: serve-gpu.json)")
    args = parser.parse_args(argv)
    suite = dict(SUITES[args.suite])
    if args.preset:
        args.presets = [p for value in args.preset for p in value.split(",") if p]
    for key in ("presets", "device", "max_running", "clients", "requests", "max_tokens", "rounds", "threads"):
        if getattr(args, key, None) is not None:
            suite[key] = getattr(args, key)
    return args, suite


def require_cuda(device: str) -> None:
    """One clear line, before anything is built, where the suite wants a GPU this machine lacks."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"device {device}: no CUDA device here (torch {torch.__version__}, "
                         "torch.cuda.is_available() is False); `--suite gpu` needs one (`make bench-gpu` on a GPU "
                         "machine); `--device cpu --preset tiny` checks its code paths on CPU")


def main(argv: list[str] | None = None) -> None:
    args, suite = parse_args(argv)
    require_cuda(suite["device"])
    name = "serve.json" if args.suite == "cpu" else f"serve-{args.suite}.json"
    out = Path(args.out or REPO / "bench" / "out" / name)
    work = REPO / "bench" / "out" / "serve"
    work.mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    load_before = os.getloadavg()
    rows: list[dict] = []
    prompt_tokens: dict[str, list[int]] = {}
    server_settings: dict[str, list[str]] = {}

    def write_report(complete: bool) -> dict:
        """The JSON report of the rows so far (rewritten after each, so a run cut short by a time
        limit keeps what it measured; `complete` false until the last)."""
        report = aggregate(rows, suite)
        report.update(suite=args.suite, settings={k: v for k, v in suite.items()}, machine=machine(),
                      date=time.strftime("%Y-%m-%d"), prompt_tokens=prompt_tokens, loadavg_before=load_before,
                      loadavg_after=os.getloadavg(), complete=complete,
                      rounds=[{k: v for k, v in r.items() if k != "requests"} for r in rows],
                      request_records=rows, server_settings=server_settings, seconds=time.perf_counter() - started)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        return report

    for preset in suite["presets"]:
        run_preset(preset, suite, args, work, rows, prompt_tokens, server_settings, write_report)

    report = write_report(complete=True)
    print()
    print(markdown(report))
    print(f"\nresults: {out}")
    if not report["checks"]["ok"]:
        raise SystemExit(f"checks failed: {report['checks']}")


def run_preset(preset: str, suite: dict, args: argparse.Namespace, work: Path, rows: list[dict],
               prompt_tokens: dict, server_settings: dict, write_report) -> None:
    """One preset's package, its servers (one per max_running) and their rounds (rows appended)."""
    built = time.perf_counter()
    package, texts = build_package(work, preset, suite["context_length"], args.seed)
    prompts, sizes = prompt_mix(texts, package / "tokenizer.json", PROMPTS, suite["prompt_tokens"], args.seed)
    prompt_tokens[preset] = sizes
    print(f"package {package} built in {time.perf_counter() - built:.1f} s; {len(prompts)} prompts of "
          f"{min(sizes)}-{max(sizes)} tokens (median {percentile(sizes, 50):.0f})", flush=True)
    max_clients = max(suite["clients"])
    servers = {n: Server(package, suite["device"], n, max(64, 2 * max_clients), suite["threads"],
                         work / f"server-{args.suite}-running{n}-{preset}.log") for n in suite["max_running"]}
    server_settings[preset] = next(iter(servers.values())).settings
    try:
        for server in servers.values():
            server.wait_ready()
        for server in servers.values():  # warm-up: allocations, first-call paths; not measured
            for clients in suite["clients"]:
                asyncio.run(run_load(LoadConfig(url=server.url, clients=clients, requests=clients,
                                                max_tokens=min(16, suite["max_tokens"]), prompts=prompts,
                                                seed=args.seed + 999)))
        for round_index in range(suite["rounds"]):
            order = list(servers) if round_index % 2 == 0 else list(reversed(servers))
            for clients in suite["clients"]:
                requests = suite["requests"] or max(16, 4 * clients)
                for n in order:
                    config = LoadConfig(url=servers[n].url, clients=clients, requests=requests,
                                        max_tokens=suite["max_tokens"], prompts=prompts, seed=args.seed)
                    result = measure(servers[n], config, gpu=suite["device"].startswith("cuda"))
                    summary = result["summary"]
                    rows.append({"preset": preset, "round": round_index + 1, "max_running": n, "clients": clients,
                                 "summary": summary, "server": result["server"], "requests": result["requests"]})
                    busy = result["server"].get("gpu_busy") or {}
                    gpu = "" if busy.get("mean_pct") is None else f"; GPU busy {busy['mean_pct']:.0f}%"
                    print(f"{preset} round {round_index + 1} max_running={n}: {format_summary(summary)}; server "
                          f"counted {result['server']['generation_tokens']} tokens; CPU cores busy: server "
                          f"{result['server']['cpu_cores']:.2f}, client {summary['client_cpu_cores']:.2f}{gpu}",
                          flush=True)
                    write_report(complete=False)
    finally:
        stop_servers(servers.values())


def aggregate(rows: list[dict], suite: dict) -> dict:
    """Per (preset, max_running, clients): all rounds' requests pooled for the percentiles; tokens/s
    as the median of the rounds (and each round's figure)."""
    table = []
    for preset, n, clients in [(p, n, c) for p in suite["presets"] for n in suite["max_running"]
                               for c in suite["clients"]]:
        mine = [r for r in rows if (r["preset"], r["max_running"], r["clients"]) == (preset, n, clients)]
        if mine:  # else: not measured (yet)
            records = [q for r in mine for q in r["requests"] if q["error"] is None]
            rates = [r["summary"]["tokens_per_s"] for r in mine]
            ttft = [q["ttft"] for q in records if q["ttft"] is not None]
            tpot = [q["tpot"] for q in records if q["tpot"] is not None]
            table.append({
                "preset": preset, "max_running": n, "clients": clients, "rounds": len(mine),
                "tokens_per_s": percentile(rates, 50), "tokens_per_s_rounds": rates,
                "generated_tokens_per_round": [r["summary"]["generated_tokens"] for r in mine],
                "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95),
                "tpot_p50_s": percentile(tpot, 50), "tpot_p95_s": percentile(tpot, 95),
                "server_ttft_mean_s": _mean([r["server"]["ttft_s"]["mean"] for r in mine]),
                "server_ttft_p95_s": _mean([r["server"]["ttft_s"]["p95"] for r in mine]),
                "server_tpot_mean_s": _mean([r["server"]["tpot_s"]["mean"] for r in mine]),
                "server_tpot_p95_s": _mean([r["server"]["tpot_s"]["p95"] for r in mine]),
                "server_cpu_cores": _mean([r["server"]["cpu_cores"] for r in mine]),
                "client_cpu_cores": _mean([r["summary"]["client_cpu_cores"] for r in mine]),
                **gpu_busy_columns(mine),
            })
    checks = {
        "no_errors": all(r["summary"]["errors"] == 0 for r in rows),
        "all_ran_to_max_tokens": all(r["summary"]["all_ran_to_max_tokens"] for r in rows),
        "server_counted_same_tokens": all(r["server"]["generation_tokens"] == r["summary"]["generated_tokens"]
                                          for r in rows),
    }
    by_clients = {}
    for r in rows:  # the same requests at each max_running: same tokens, and (same seeds) the same text?
        by_clients.setdefault((r["preset"], r["round"], r["clients"]), []).append(r)
    same_work, same_text, compared = True, 0, 0
    for group in by_clients.values():
        if len(group) < 2:
            continue
        base = {q["index"]: q for q in group[0]["requests"]}
        for other in group[1:]:
            for q in other["requests"]:
                b = base.get(q["index"])
                same_work &= b is not None and b["tokens"] == q["tokens"] and b["prompt_index"] == q["prompt_index"]
                same_text += b is not None and b["text_sha256"] == q["text_sha256"]
                compared += 1
    checks["same_requests_and_tokens_across_configs"] = same_work
    checks["ok"] = all(checks.values())
    checks["identical_text_across_configs"] = f"{same_text}/{compared}"
    report = {"table": table, "checks": checks}
    if len(suite["presets"]) == 1 and len(suite["max_running"]) == 2 and len(suite["clients"]) == 1 and len(table) == 2:
        low, high = (next(t for t in table if t["max_running"] == n) for n in sorted(suite["max_running"]))
        report["ratio"] = high["tokens_per_s"] / low["tokens_per_s"]
        report["ratio_rounds"] = [b / a for a, b in zip(low["tokens_per_s_rounds"], high["tokens_per_s_rounds"])]
    return report


def gpu_busy_columns(mine: list[dict]) -> dict:
    """The rounds' GPU utilization (gpu_busy.py), where it was sampled: mean, and the share of
    samples at or above BUSY_PCT."""
    busy = [r["server"]["gpu_busy"] for r in mine if (r["server"].get("gpu_busy") or {}).get("samples")]
    if not busy:
        return {}
    return {"gpu_busy_mean_pct": _mean([b["mean_pct"] for b in busy]),
            f"gpu_busy_share_at_least_{BUSY_PCT}pct": _mean([b[f"share_at_least_{BUSY_PCT}pct"] for b in busy]),
            "gpu_busy_source": busy[0]["source"]}


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def markdown(report: dict) -> str:
    gpu = any("gpu_busy_mean_pct" in t for t in report["table"])
    lines = ["| preset | engine.max_running | clients | tokens/s (median of rounds) | rounds | TTFT p50 ms | "
             "TTFT p95 ms | TPOT p50 ms | TPOT p95 ms | server TTFT mean / p95 ms | server TPOT mean / p95 ms | "
             "CPU cores busy: server / client |" + (f" GPU busy: mean % / share of samples >= {BUSY_PCT}% |"
                                                    if gpu else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if gpu else "")]
    for t in report["table"]:
        rounds = ", ".join(f"{r:.0f}" for r in t["tokens_per_s_rounds"])
        busy = ""
        if gpu:
            share = t.get(f"gpu_busy_share_at_least_{BUSY_PCT}pct")
            busy = "- |" if "gpu_busy_mean_pct" not in t else f"{t['gpu_busy_mean_pct']:.0f} / {100 * share:.0f}% |"
        lines.append(f"| {t['preset']} | {t['max_running']} | {t['clients']} | {t['tokens_per_s']:.0f} | {rounds} | "
                     f"{ms(t['ttft_p50_s'])} | {ms(t['ttft_p95_s'])} | {ms(t['tpot_p50_s'])} | {ms(t['tpot_p95_s'])} | "
                     f"{ms(t['server_ttft_mean_s'])} / {ms(t['server_ttft_p95_s'])} | "
                     f"{ms(t['server_tpot_mean_s'])} / {ms(t['server_tpot_p95_s'])} | "
                     f"{t['server_cpu_cores']:.2f} / {t['client_cpu_cores']:.2f} |{busy}")
    if "ratio" in report:
        rounds = ", ".join(f"{r:.2f}" for r in report["ratio_rounds"])
        lines.append(f"\nratio (tokens/s): {report['ratio']:.2f}x (rounds: {rounds})")
    lines.append(f"checks: {report['checks']}")
    lines.append(f"load average before / after: {report['loadavg_before']} / {report['loadavg_after']}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
