#!/usr/bin/env python3
"""`make bench-serve-split`: lmforge-serve from a baseline revision (old) against lmforge-serve from
the working tree (new), through HTTP only, side by side in one run: issue 33's figures for the
engine moved out of the API process into an engine-core process of its own.

Both servers serve the same model package with the same settings (serve_bench.py's package: BPE
tokenizer, random weights, end-of-text suppressed so every request runs to max_tokens; its Server
and loadgen.py's streaming clients):
  old  `git archive --baseline-rev services/` (default 2b6636f, main before the split) extracted into
       a temp dir and run from those sources alone (baseline_tree.py)
  new  the working tree's sources (`python -m lmforge.inference`, what `lmforge-serve` runs), or
       --new-rev's, extracted the same way (a revision against another: a check of the machinery)
Settings: device cpu, engine.max_running 64, engine.max_waiting 128 (no 429 at 64 clients),
engine.kv_cache_bytes holding --kv-contexts full contexts (default 64: 64 sequences fit, so the
64-client figure measures the engine, not KV admission; the CPU default is 8 contexts).
Presets `tiny` and `llama-debug`, context 256 (serve_bench's CPU suite); prompts of 16..128 tokens,
64 generated tokens per request, at 1, 16 and 64 concurrent streaming clients (requests: 12, 64 and
128: a closed loop of clients, each sending its next request when one ends). Both servers of a
preset are up together; rounds alternate which is measured first (ABBA); a warm-up per server
and client count is not measured.

Threads: the old server keeps serve_bench's CPU setting, OMP_NUM_THREADS=1 (one Python thread
bounds it; the load generator needs the other vCPU). The new server's is --new-threads (default 1;
0 leaves it unset: torch's default, a thread per core); it is inherited by every process of the
server, the engine core included, and recorded in the JSON.

Per (preset, engine, clients), client side (loadgen.py): generated tokens/s (median of rounds, each
round's too), TTFT p50/p99 and TPOT p50/p99 over all rounds' requests; server side: CPU seconds per
generated token, the CPU (user + system) of the server's whole process tree (the API process, the
engine-core process, any more API processes; children that exited included: process_cpu.py)
between the start and the end of the measurement, over the tokens the clients received; the
processes in the tree; the idle server's CPU meanwhile (it should be ~0: a busy-polling idle
server would take CPU from the measured one).

Goals (issue 33), printed: new/old tokens/s at 64 clients >= 2x; batching gain of the new engine,
tiny: tokens/s at 16 clients / at 1 client >= 4x; the new engine's TPOT p99 at 64 clients within
2x of its TPOT p50 at 1 client. Equal work, checked: every request ended with finish_reason
"length" after max_tokens tokens, and old and new generated the same tokens for the same requests
(same prompts and sampling seeds); identical text is counted, not required.

    python bench/serve/engine_split_bench.py [--baseline-rev REV] [--new-rev REV] [--new-threads N]
        [--presets tiny llama-debug] [--clients 1 16 64] [--rounds 4]

Results: bench/out/serve-split.json (rewritten after every measurement; `complete` once done) and
a Markdown table. The whole default run took 10 minutes (605 s) on the 2-vCPU VM, the baseline
against itself (`--new-rev 2b6636f`) with the machine's other load at 8 (less on a quiet machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline_tree import REPO, extract_baseline, resolve_rev  # noqa: E402
from loadgen import LoadConfig, format_summary, percentile, run_load  # noqa: E402
from serve_bench import PROMPTS, Server, build_package, machine, ms, prompt_mix, server_side, stop_servers  # noqa: E402

BASELINE_REV = "2b6636f"  # main before the engine-core process split (issue 33)
OUT = REPO / "bench" / "out" / "serve-split.json"
SIDES = ("old", "new")
DEFAULTS = {"presets": ["tiny", "llama-debug"], "context_length": 256, "clients": [1, 16, 64],
            "requests": {1: 12, 16: 64, 64: 128}, "max_tokens": 64, "prompt_tokens": (16, 128), "rounds": 4,
            "max_running": 64, "max_waiting": 128, "kv_contexts": 64, "old_threads": 1, "new_threads": 1,
            "docs": 3000, "seed": 0}
GOALS = {"speedup_clients": 64, "speedup_at_least": 2.0, "batching_preset": "tiny", "batching_clients": (1, 16),
         "batching_at_least": 4.0, "tpot_tail_clients": (1, 64), "tpot_tail_at_most": 2.0}


def requests_for(settings: dict, clients: int) -> int:
    return settings["requests"].get(clients) or max(16, 2 * clients)


def kv_cache_bytes(package: Path, contexts: int, context_length: int) -> int:
    """Bytes of `contexts` full contexts of the package's model in fp32 (the CPU's dtype): a key and
    a value per layer and key/value head per token."""
    from lmforge.model.config import GPTConfig

    config = GPTConfig.model_validate(json.loads((package / "config.json").read_text())["model"])
    return contexts * context_length * 2 * config.n_layer * config.kv_heads * config.head_dim * 4


class Side:
    """One engine: its sources (None: the working tree through the venv), its revision, its threads."""

    def __init__(self, name: str, rev: str | None, sources: list[str] | None, threads: int | None):
        self.name, self.rev, self.sources, self.threads = name, rev, sources, threads

    def describe(self) -> dict:
        return {"rev": self.rev or "working tree", "sources": self.sources or "venv (working tree)",
                "omp_num_threads": self.threads or "unset (torch default)"}


def start_servers(sides: dict[str, Side], package: Path, settings: dict, work: Path, preset: str) -> dict[str, Server]:
    servers = {}
    extra = [f"engine.kv_cache_bytes={kv_cache_bytes(package, settings['kv_contexts'], settings['context_length'])}"]
    try:
        for name, side in sides.items():
            servers[name] = Server(package, "cpu", settings["max_running"], settings["max_waiting"], side.threads,
                                   work / f"server-{preset}-{name}.log", sources=side.sources, extra_settings=extra)
        for server in servers.values():
            server.wait_ready()
    except BaseException:
        stop_servers(servers.values())
        raise
    return servers


def metrics_or_none(server: Server) -> dict | None:
    """The server's /metrics, or None where it has none to give (the tokens check is then skipped)."""
    try:
        return server.metrics()
    except Exception:  # noqa: BLE001 - an engine under change may serve metrics differently
        return None


def measure(server: Server, idle: list[Server], config: LoadConfig) -> dict:
    """One load run; the server tree's CPU, the idle servers' CPU and the client's over it."""
    before = metrics_or_none(server)
    cpu, idle_cpu, client_cpu = server.cpu_seconds(), [s.cpu_seconds() for s in idle], time.process_time()
    result = asyncio.run(run_load(config))
    cpu, client_cpu = server.cpu_seconds() - cpu, time.process_time() - client_cpu
    idle_cpu = sum(s.cpu_seconds() - c for s, c in zip(idle, idle_cpu, strict=True))
    processes = server.processes()
    after = metrics_or_none(server)
    summary = result["summary"]
    wall, tokens = summary["wall_s"], summary["generated_tokens"]
    summary["client_cpu_cores"] = client_cpu / wall if wall else None
    counted = server_side(before, after)["generation_tokens"] if before and after else None
    result["server"] = {"cpu_s": cpu, "cpu_cores": cpu / wall if wall else None,
                        "cpu_s_per_token": cpu / tokens if tokens else None, "processes": processes,
                        "idle_servers_cpu_s": idle_cpu, "generation_tokens": counted}
    return result


def run_suite(sides: dict[str, Side], settings: dict, work: Path, out: Path | None = None, log=print) -> dict:
    """Every preset's measurements; the report (also written to `out` after each measurement)."""
    started = time.perf_counter()
    rows: list[dict] = []
    report: dict = {}
    work.mkdir(parents=True, exist_ok=True)

    def write(complete: bool) -> dict:
        report.update(aggregate(rows, settings, list(sides)))
        report.update(settings={k: (dict(v) if isinstance(v, dict) else v) for k, v in settings.items()},
                      sides={n: s.describe() for n, s in sides.items()}, machine=machine(),
                      date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), complete=complete,
                      seconds=time.perf_counter() - started, rows=rows)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1, default=str))
        return report

    for preset in settings["presets"]:
        built = time.perf_counter()
        package, texts = build_package(work, preset, settings["context_length"], settings["seed"], settings["docs"])
        prompts, sizes = prompt_mix(texts, package / "tokenizer.json", PROMPTS, tuple(settings["prompt_tokens"]),
                                    settings["seed"])
        report.setdefault("prompt_tokens", {})[preset] = sizes
        log(f"{preset}: package {package} in {time.perf_counter() - built:.1f} s; {len(prompts)} prompts of "
            f"{min(sizes)}-{max(sizes)} tokens")
        servers = start_servers(sides, package, settings, work, preset)
        try:
            report.setdefault("server_settings", {})[preset] = next(iter(servers.values())).settings
            for name, server in servers.items():  # warm-up: allocations, first-call paths; not measured
                for clients in settings["clients"]:
                    asyncio.run(run_load(LoadConfig(url=server.url, clients=clients, requests=clients,
                                                    max_tokens=min(16, settings["max_tokens"]), prompts=prompts,
                                                    seed=settings["seed"] + 999)))
                log(f"{preset}: {name} server ready and warm, {server.processes()} processes")
            for round_index in range(settings["rounds"]):
                order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
                for clients in settings["clients"]:
                    for name in order:
                        config = LoadConfig(url=servers[name].url, clients=clients,
                                            requests=requests_for(settings, clients),
                                            max_tokens=settings["max_tokens"], prompts=prompts, seed=settings["seed"])
                        idle = [s for n, s in servers.items() if n != name]
                        result = measure(servers[name], idle, config)
                        rows.append({"preset": preset, "side": name, "round": round_index + 1, "clients": clients,
                                     "summary": result["summary"], "server": result["server"],
                                     "requests": result["requests"]})
                        s = result["server"]
                        log(f"{preset} round {round_index + 1} {name}: {format_summary(result['summary'])}; server "
                            f"CPU {1e3 * (s['cpu_s_per_token'] or 0):.2f} ms/token over {s['processes']} processes "
                            f"(idle server {s['idle_servers_cpu_s']:.2f} s)")
                        write(complete=False)
        finally:
            stop_servers(servers.values())
    return write(complete=True)


def aggregate(rows: list[dict], settings: dict, sides: list[str]) -> dict:
    table = []
    for preset in settings["presets"]:
        for side in sides:
            for clients in settings["clients"]:
                mine = [r for r in rows if (r["preset"], r["side"], r["clients"]) == (preset, side, clients)]
                if mine:
                    table.append(table_row(preset, side, clients, mine))
    return {"table": table, "goals": goals(table, sides), "checks": checks(rows)}


def table_row(preset: str, side: str, clients: int, mine: list[dict]) -> dict:
    """Tokens/s: the median of the rounds; latency percentiles over all rounds' requests; CPU per
    token: all rounds' CPU over all their tokens."""
    records = [q for r in mine for q in r["requests"] if q["error"] is None]
    ttft = [q["ttft"] for q in records if q["ttft"] is not None]
    tpot = [q["tpot"] for q in records if q["tpot"] is not None]
    rates = [r["summary"]["tokens_per_s"] for r in mine]
    tokens = sum(r["summary"]["generated_tokens"] for r in mine)
    cpu = sum(r["server"]["cpu_s"] for r in mine)
    wall = sum(r["summary"]["wall_s"] for r in mine)
    return {"preset": preset, "side": side, "clients": clients, "rounds": len(mine),
            "requests_per_round": mine[0]["summary"]["requests"],
            "tokens_per_s": percentile(rates, 50), "tokens_per_s_rounds": rates,
            "generated_tokens_per_round": [r["summary"]["generated_tokens"] for r in mine],
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
            "server_cpu_s_per_token": cpu / tokens if tokens else None,
            "server_cpu_cores": cpu / wall if wall else None,
            "client_cpu_cores": sum(r["summary"]["client_cpu_cores"] or 0 for r in mine) / len(mine),
            "server_processes": max(r["server"]["processes"] for r in mine),
            "idle_servers_cpu_s": sum(r["server"]["idle_servers_cpu_s"] for r in mine)}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def goals(table: list[dict], sides: list[str]) -> dict:
    """Issue 33's three goals, per preset where its rows are there (None where they are not)."""
    cell = {(t["preset"], t["side"], t["clients"]): t for t in table}
    presets = sorted({t["preset"] for t in table}, key=[t["preset"] for t in table].index)
    get = lambda p, s, c, k: (cell.get((p, s, c)) or {}).get(k)  # noqa: E731
    g = GOALS
    result = {"speedup": {}, "batching_gain": {}, "tpot_tail": {}}
    for p in presets:
        if "old" in sides and "new" in sides:
            value = ratio(get(p, "new", g["speedup_clients"], "tokens_per_s"),
                          get(p, "old", g["speedup_clients"], "tokens_per_s"))
            result["speedup"][p] = {"clients": g["speedup_clients"], "new_over_old": value,
                                    "goal_at_least": g["speedup_at_least"],
                                    "met": None if value is None else value >= g["speedup_at_least"]}
        low, high = g["batching_clients"]
        for side in sides:
            value = ratio(get(p, side, high, "tokens_per_s"), get(p, side, low, "tokens_per_s"))
            goal = g["batching_at_least"] if side == "new" and p == g["batching_preset"] else None
            result["batching_gain"].setdefault(p, {})[side] = {
                "clients": [low, high], "gain": value, "goal_at_least": goal,
                "met": None if value is None or goal is None else value >= goal}
            one, many = g["tpot_tail_clients"]
            value = ratio(get(p, side, many, "tpot_p99_s"), get(p, side, one, "tpot_p50_s"))
            goal = g["tpot_tail_at_most"] if side == "new" else None
            result["tpot_tail"].setdefault(p, {})[side] = {
                "p99_at": many, "p50_at": one, "ratio": value, "goal_at_most": goal,
                "met": None if value is None or goal is None else value <= goal}
    return result


def checks(rows: list[dict]) -> dict:
    """Equal work: every request ran to max_tokens ("length"); old and new generated the same tokens
    for the same requests. Identical text and the server's own token count are reported only."""
    result = {"no_errors": all(r["summary"]["errors"] == 0 for r in rows),
              "all_ran_to_max_tokens": all(r["summary"]["all_ran_to_max_tokens"] for r in rows)}
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["preset"], r["round"], r["clients"]), []).append(r)
    same_work, same_text, compared = True, 0, 0
    for group in groups.values():
        base = {q["index"]: q for q in group[0]["requests"]}
        for other in group[1:]:
            same_work &= len(other["requests"]) == len(base)
            for q in other["requests"]:
                b = base.get(q["index"])
                same_work &= b is not None and (b["tokens"], b["prompt_index"], b["seed"]) == (
                    q["tokens"], q["prompt_index"], q["seed"])
                same_text += b is not None and b["text_sha256"] == q["text_sha256"]
                compared += 1
    result["same_requests_and_tokens_across_engines"] = same_work
    result["ok"] = all(result.values())
    result["identical_text_across_engines"] = f"{same_text}/{compared}"
    counted = [r for r in rows if r["server"]["generation_tokens"] is not None]
    agree = sum(r["server"]["generation_tokens"] == r["summary"]["generated_tokens"] for r in counted)
    result["server_counted_client_tokens"] = f"{agree}/{len(counted)} measurements with /metrics"
    return result


def _fmt(value: float | None, digits: int = 2, suffix: str = "x") -> str:
    return "-" if value is None else f"{value:.{digits}f}{suffix}"


def markdown(report: dict) -> str:
    lines = ["| preset | engine | clients | tokens/s (median; rounds) | TTFT p50 / p99 ms | TPOT p50 / p99 ms | "
             "server CPU ms / token | server processes | CPU cores busy: server / client |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in report["table"]:
        rounds = ", ".join(f"{r:.0f}" for r in t["tokens_per_s_rounds"])
        cpu = "-" if t["server_cpu_s_per_token"] is None else f"{1e3 * t['server_cpu_s_per_token']:.2f}"
        lines.append(f"| {t['preset']} | {t['side']} | {t['clients']} | {t['tokens_per_s']:.0f} ({rounds}) | "
                     f"{ms(t['ttft_p50_s'])} / {ms(t['ttft_p99_s'])} | {ms(t['tpot_p50_s'])} / {ms(t['tpot_p99_s'])} | "
                     f"{cpu} | {t['server_processes']} | {_fmt(t['server_cpu_cores'], 2, '')} / "
                     f"{_fmt(t['client_cpu_cores'], 2, '')} |")
    g = report["goals"]
    met = lambda m: "" if m is None else (" (met)" if m else " (NOT met)")  # noqa: E731
    lines.append("")
    for preset, s in g["speedup"].items():
        lines.append(f"new/old tokens/s at {s['clients']} clients, {preset}: {_fmt(s['new_over_old'])} "
                     f"(goal >= {s['goal_at_least']:.0f}x){met(s['met'])}")
    for preset, by_side in g["batching_gain"].items():
        parts = [f"{side} {_fmt(v['gain'])}" + (f" (goal >= {v['goal_at_least']:.0f}x){met(v['met'])}"
                                                 if v["goal_at_least"] else "") for side, v in by_side.items()]
        clients = next(iter(by_side.values()))["clients"]
        lines.append(f"batching gain, tokens/s at {clients[1]} / at {clients[0]} client, {preset}: {'; '.join(parts)}")
    for preset, by_side in g["tpot_tail"].items():
        parts = [f"{side} {_fmt(v['ratio'])}" + (f" (goal <= {v['goal_at_most']:.0f}x){met(v['met'])}"
                                                 if v["goal_at_most"] else "") for side, v in by_side.items()]
        first = next(iter(by_side.values()))
        lines.append(f"TPOT p99 at {first['p99_at']} clients / TPOT p50 at {first['p50_at']}, {preset}: "
                     f"{'; '.join(parts)}")
    sides = "; ".join(f"{n}: {d['rev']}, OMP_NUM_THREADS {d['omp_num_threads']}" for n, d in report["sides"].items())
    lines.append(f"engines: {sides}")
    lines.append(f"checks: {report['checks']}")
    return "\n".join(lines)


def git_head() -> dict:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "services/"], capture_output=True,
                           text=True)
    return {"head": head.stdout.strip(), "services_dirty": bool(dirty.stdout.strip())}


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline-rev", default=BASELINE_REV, help="the old engine's git revision (default "
                                                                      "%(default)s)")
    parser.add_argument("--new-rev", help="the new engine's git revision (default: the working tree)")
    parser.add_argument("--new-threads", type=int, default=DEFAULTS["new_threads"],
                        help="OMP_NUM_THREADS of the new server's processes; 0: unset (default %(default)s)")
    parser.add_argument("--old-threads", type=int, default=DEFAULTS["old_threads"],
                        help="OMP_NUM_THREADS of the old server; 0: unset (default %(default)s, serve_bench's)")
    parser.add_argument("--presets", nargs="+", default=DEFAULTS["presets"])
    parser.add_argument("--clients", type=int, nargs="+", default=DEFAULTS["clients"])
    parser.add_argument("--requests", type=int, help="requests per measurement at every client count (default "
                                                     "12, 64, 128 at 1, 16, 64 clients; else max(16, 2C))")
    parser.add_argument("--max-tokens", type=int, default=DEFAULTS["max_tokens"])
    parser.add_argument("--prompt-tokens", type=int, nargs=2, default=DEFAULTS["prompt_tokens"],
                        metavar=("LOW", "HIGH"))
    parser.add_argument("--rounds", type=int, default=DEFAULTS["rounds"])
    parser.add_argument("--kv-contexts", type=int, default=DEFAULTS["kv_contexts"],
                        help="engine.kv_cache_bytes in full contexts (default %(default)s)")
    parser.add_argument("--docs", type=int, default=DEFAULTS["docs"], help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    parser.add_argument("--work", type=Path, default=REPO / "bench" / "out" / "serve-split",
                        help="packages and server logs (default %(default)s)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.rounds < 1 or min(args.clients) < 1 or args.max_tokens < 2:
        parser.error("--rounds and --clients at least 1, --max-tokens at least 2 (TPOT needs two tokens)")
    if max(args.prompt_tokens) + args.max_tokens > DEFAULTS["context_length"]:
        parser.error(f"the longest prompt + --max-tokens must fit the context ({DEFAULTS['context_length']})")
    requests = {c: args.requests for c in args.clients} if args.requests else dict(DEFAULTS["requests"])
    settings = {**DEFAULTS, "presets": args.presets, "clients": args.clients, "requests": requests,
                "max_tokens": args.max_tokens, "prompt_tokens": tuple(args.prompt_tokens), "rounds": args.rounds,
                "kv_contexts": args.kv_contexts, "old_threads": args.old_threads, "new_threads": args.new_threads,
                "docs": args.docs, "seed": args.seed}
    return args, settings


def main(argv: list[str] | None = None) -> None:
    args, settings = parse_args(argv)
    from lmforge.model.config import PRESETS

    unknown = [p for p in settings["presets"] if p not in PRESETS]
    if unknown:
        raise SystemExit(f"--presets: unknown {unknown}; choose from {sorted(PRESETS)}")
    baseline = resolve_rev(args.baseline_rev)
    new_rev = resolve_rev(args.new_rev, "--new-rev") if args.new_rev else None
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        def extracted(rev: str) -> list[str]:
            return extract_baseline(rev, Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="serve-split-"))))

        sides = {"old": Side("old", baseline, extracted(baseline), settings["old_threads"] or None),
                 "new": Side("new", new_rev, extracted(new_rev) if new_rev else None, settings["new_threads"] or None)}
        report = run_suite(sides, settings, args.work, args.out, log=lambda line: print(line, flush=True))
    report["git"] = git_head()
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print()
    print(markdown(report))
    print(f"\nresults: {args.out} ({time.perf_counter() - started:.0f} s)")
    if not report["checks"]["ok"]:
        raise SystemExit(f"checks failed: {report['checks']}")


if __name__ == "__main__":
    main()
