#!/usr/bin/env python3
"""A load generator for `lmforge-serve`: C concurrent streaming clients send a fixed, seeded
mix of completion requests (varied prompt lengths) and time every token as it arrives.

Each client takes the next request of a fixed list (request i always has the same prompt and
the same sampling seed, whatever the concurrency), sends `POST /v1/completions` with
`"stream": true, "logprobs": 0` and reads the SSE stream. Generated tokens are counted from
each chunk's `choices[0].logprobs.tokens` (a chunk may carry several tokens, for instance
the bytes of one UTF-8 character, or none), never by re-tokenizing the text.

Per request (client side, time.perf_counter):
  TTFT  = send -> first chunk carrying a token
  TPOT  = (last token's chunk - first token's chunk) / (tokens - 1)
Per run: p50/p95 of both, and generated tokens/s = all generated tokens / wall time from
the first send to the last response's end.

    python bench/serve/loadgen.py --url http://127.0.0.1:8000 --clients 16 --requests 64 --max-tokens 64

Without --prompts the mix comes from a built-in text (word windows of 8 to 96 words);
`--prompts FILE` takes a JSON list of prompt strings instead.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import httpx

BUILTIN_TEXT = """
The harbour town woke slowly under a grey sky. Fishing boats came back one by one with the
tide, and the gulls followed them in long, noisy lines. In the market square the baker had
already sold most of his bread, and the woman who kept the flower stall was arranging tulips
in tall metal buckets. A schoolteacher crossed the square with a stack of exam papers under
her arm, stopping to talk with an old man who repaired bicycles in a narrow workshop beside
the church. They spoke about the weather, about the new road to the city, and about the
festival that would fill the streets at the end of the month. Further along the quay, two
engineers were measuring the old sea wall. The storms of the last winter had loosened several
stones, and the council wanted a report before the summer. One of them wrote numbers in a
notebook while the other read them aloud from a laser gauge, and now and then they argued
about whether the cracks were new. Children ran past on their way to school, shouting about a
football match, and a dog barked at them from the deck of a small sailing boat. By noon the
clouds had broken up, the light turned silver on the water, and the cafes put their chairs
out on the pavement. Travellers from the morning train walked down from the station with
maps and cameras, looking for the museum, the lighthouse and the famous fish soup that every
guidebook recommended. In the evening the wind dropped, the lamps came on along the harbour,
and the town settled into the quiet rhythm it had kept for three hundred years.
"""


def builtin_prompts(count: int = 32, seed: int = 0, min_words: int = 8, max_words: int = 96) -> list[str]:
    """Windows of the built-in text of seeded random lengths."""
    words = BUILTIN_TEXT.split()
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        length = rng.randint(min_words, max_words)
        start = rng.randrange(0, len(words) - length)
        prompts.append(" ".join(words[start:start + length]))
    return prompts


@dataclass
class RequestResult:
    index: int
    prompt_index: int
    seed: int
    sent: float
    first_token: float | None = None
    last_token: float | None = None
    ended: float | None = None
    tokens: int = 0
    chunks: int = 0
    finish_reason: str | None = None
    status: int | None = None
    error: str | None = None
    text_sha256: str = ""

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def tpot(self) -> float | None:
        if self.tokens < 2 or self.first_token is None:
            return None
        return (self.last_token - self.first_token) / (self.tokens - 1)

    @property
    def latency(self) -> float | None:
        return None if self.ended is None else self.ended - self.sent

    def record(self) -> dict:
        return {**asdict(self), "ttft": self.ttft, "tpot": self.tpot, "latency": self.latency}


@dataclass
class LoadConfig:
    url: str
    clients: int = 16
    requests: int | None = 64  # total; None: until `duration` has passed
    duration: float | None = None  # seconds; requests are started until then
    max_tokens: int = 64
    temperature: float = 1.0
    seed: int = 0
    prompts: list[str] = field(default_factory=builtin_prompts)
    timeout: float = 600.0

    def request_plan(self, index: int) -> tuple[int, dict]:
        """(prompt index, body) of request `index`: the same for every run and concurrency."""
        order = list(range(len(self.prompts)))
        random.Random(self.seed).shuffle(order)
        prompt_index = order[index % len(order)]
        return prompt_index, {"prompt": self.prompts[prompt_index], "max_tokens": self.max_tokens,
                              "temperature": self.temperature, "stream": True, "seed": self.seed * 1_000_003 + index,
                              "logprobs": 0}


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


async def one_request(client: httpx.AsyncClient, config: LoadConfig, index: int) -> RequestResult:
    prompt_index, body = config.request_plan(index)
    result = RequestResult(index=index, prompt_index=prompt_index, seed=body["seed"], sent=time.perf_counter())
    text = hashlib.sha256()
    try:
        async with client.stream("POST", f"{config.url}/v1/completions", json=body) as response:
            result.status = response.status_code
            if response.status_code != 200:
                result.error = (await response.aread()).decode(errors="replace")[:300]
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    result.error = json.dumps(chunk["error"])[:300]
                    break
                now = time.perf_counter()
                choice = chunk["choices"][0]
                tokens = len((choice.get("logprobs") or {}).get("tokens") or [])
                result.chunks += 1
                if tokens:
                    if result.first_token is None:
                        result.first_token = now
                    result.last_token = now
                    result.tokens += tokens
                text.update(choice.get("text", "").encode())
                if choice.get("finish_reason"):
                    result.finish_reason = choice["finish_reason"]
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        result.ended = time.perf_counter()
        result.text_sha256 = text.hexdigest()[:16]
    return result


async def run_load(config: LoadConfig) -> dict:
    """Drive the server; returns {"summary": ..., "requests": [...]}."""
    if config.requests is None and config.duration is None:
        raise ValueError("give requests or duration")
    results: list[RequestResult] = []
    next_index = 0
    started = time.perf_counter()
    deadline = None if config.duration is None else started + config.duration

    async def client_loop(client: httpx.AsyncClient) -> None:
        nonlocal next_index
        while True:
            if config.requests is not None and next_index >= config.requests:
                return
            if deadline is not None and time.perf_counter() >= deadline:
                return
            index, next_index = next_index, next_index + 1
            results.append(await one_request(client, config, index))

    limits = httpx.Limits(max_connections=config.clients + 4, max_keepalive_connections=config.clients + 4)
    async with httpx.AsyncClient(timeout=config.timeout, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(config.clients)))
    results.sort(key=lambda r: r.index)
    return {"summary": summarize(results, config), "requests": [r.record() for r in results]}


def summarize(results: list[RequestResult], config: LoadConfig) -> dict:
    ok = [r for r in results if r.error is None and r.status == 200]
    first_sent = min((r.sent for r in results), default=0.0)
    last_end = max((r.ended for r in results if r.ended is not None), default=first_sent)
    wall = last_end - first_sent
    tokens = sum(r.tokens for r in ok)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    tpots = [r.tpot for r in ok if r.tpot is not None]
    latencies = [r.latency for r in ok if r.latency is not None]

    def stats(values: list[float]) -> dict:
        return {"p50": percentile(values, 50), "p95": percentile(values, 95),
                "mean": sum(values) / len(values) if values else None, "max": max(values, default=None)}

    return {
        "clients": config.clients, "requests": len(results), "ok": len(ok), "errors": len(results) - len(ok),
        "error_samples": [r.error for r in results if r.error][:3],
        "max_tokens": config.max_tokens, "temperature": config.temperature,
        "generated_tokens": tokens, "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "requests_per_s": len(ok) / wall if wall > 0 else None,
        "ttft_s": stats(ttfts), "tpot_s": stats(tpots), "latency_s": stats(latencies),
        "finish_reasons": dict(Counter(r.finish_reason for r in ok)),
        "all_ran_to_max_tokens": bool(ok) and all(r.tokens == config.max_tokens and r.finish_reason == "length"
                                                  for r in ok),
    }


def format_summary(summary: dict) -> str:
    ms = lambda v: "-" if v is None else f"{v * 1000:.1f}"  # noqa: E731
    return (f"{summary['clients']} clients, {summary['ok']}/{summary['requests']} ok, "
            f"{summary['generated_tokens']} tokens in {summary['wall_s']:.2f} s: "
            f"{summary['tokens_per_s'] or 0:.1f} tokens/s; "
            f"TTFT p50 {ms(summary['ttft_s']['p50'])} ms p95 {ms(summary['ttft_s']['p95'])} ms; "
            f"TPOT p50 {ms(summary['tpot_s']['p50'])} ms p95 {ms(summary['tpot_s']['p95'])} ms; "
            f"finish {summary['finish_reasons']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--clients", type=int, default=16, help="concurrent streaming clients")
    parser.add_argument("--requests", type=int, default=None, help="requests in all (default 64 without --duration)")
    parser.add_argument("--duration", type=float, default=None, help="start requests for this many seconds instead")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0, help="request order and per-request sampling seeds")
    parser.add_argument("--prompts", help="JSON file: a list of prompt strings (default: the built-in mix)")
    parser.add_argument("--json", help="write the summary and per-request records here")
    args = parser.parse_args(argv)
    requests = args.requests if args.requests is not None or args.duration is not None else 64
    prompts = builtin_prompts(seed=args.seed)
    if args.prompts:
        with open(args.prompts) as fh:
            prompts = json.load(fh)
    config = LoadConfig(url=args.url.rstrip("/"), clients=args.clients, requests=requests, duration=args.duration,
                        max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed, prompts=prompts)
    result = asyncio.run(run_load(config))
    print(format_summary(result["summary"]))
    for error in result["summary"]["error_samples"]:
        print(f"error: {error}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=1)
    return 0 if result["summary"]["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
