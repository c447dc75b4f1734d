#!/usr/bin/env python3
"""The trainer's data wait: the same batches from local disk and streamed from S3 through the
node block cache, with the object store 20 ms away (docs/benchmarks.md, "Trainer data streaming").

A local S3 server (moto, its own process) holds a data-prep output of random tokens (manifest
blocks of 4 MiB); bench/latency_proxy.py (its own process) adds --delay-ms to every request in
front of it. Each run iterates --steps batches of one rank with the trainer's own loader
(Prefetcher over data_stream.read_batch, as train.py does, with `data.shuffle: global`: most
sequences miss the cache, the worst case for latency) and stands in for the training step
with --compute-ms of sleep (a GPU step: the Python thread waits, the GIL is free). A streamed
run starts from an empty cache, bounded below the data set (--cache-mb), so blocks are evicted
and fetched again throughout. Printed per run: data-wait fraction of wall time, mean and worst
wait per step (all steps, and from step 5 on), blocks fetched, and the sha256 of every batch
read, which must be the same for every run.

    .venv/bin/python bench/train_streaming.py [--steps 60] [--compute-ms 100] [--delay-ms 20]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from s3_behind_proxy import PREFIX, s3_behind_proxy  # noqa: E402 - a sibling script


def make_data(root: Path, shards: int, shard_tokens: int) -> Path:
    from lmforge.sample_data.token_shards import write_output

    rng = np.random.default_rng(0)
    arrays = [rng.integers(1, 50_000, shard_tokens, dtype=np.uint16) for _ in range(shards)]
    return write_output(root, {"train": arrays}, vocab_size=50_304)


def run(label: str, sampler, depth: int, args, fetches: list) -> dict:
    from lmforge.trainer.data_stream import read_batch
    from lmforge.trainer.prefetch import Prefetcher

    fetches.clear()
    prefetcher = Prefetcher(lambda i: read_batch(sampler, i, 0, 1, args.batch), range(args.steps), depth=depth,
                            pin_memory=False)
    waits, digest = [], hashlib.sha256()
    started = time.perf_counter()
    for _, batch, _, waited in prefetcher:
        waits.append(waited)
        digest.update(batch.numpy().tobytes())
        time.sleep(args.compute_ms / 1000)
    wall = time.perf_counter() - started
    prefetcher.close()
    steady = waits[5:]
    return {"run": label, "prefetch": depth, "data_wait_fraction": sum(waits) / wall,
            "steady_data_wait_fraction": sum(steady) / (sum(steady) + len(steady) * args.compute_ms / 1000),
            "mean_wait_ms": 1000 * sum(waits) / len(waits), "worst_wait_ms_after_step_5": 1000 * max(steady),
            "wall_s": wall, "blocks_fetched": len(fetches), "batches_sha256": digest.hexdigest()[:16]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--compute-ms", type=float, default=100.0, help="the stand-in training step")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="added to every S3 request")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--shard-mb", type=int, default=32, help="size of each shard (uint16 tokens)")
    parser.add_argument("--cache-mb", type=int, default=32, help="the block cache's bound")
    parser.add_argument("--depths", default="0,2,8", help="prefetch depths to compare")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()


    from lmforge.trainer.block_cache import BlockCache
    from lmforge.trainer.data import ShardSource
    from lmforge.trainer.data_stream import StreamingSource
    from lmforge.trainer.sampling import GlobalSampler

    work = Path(tempfile.mkdtemp(prefix="lmforge-stream-bench-"))
    rows = []
    depths = [int(d) for d in args.depths.split(",")]
    try:
        data = make_data(work / "prepared", args.shards, args.shard_mb << 19)
        with s3_behind_proxy(data, args.delay_ms) as fetches:
            print(f"data set: {args.shards} shards x {args.shard_mb} MiB, blocks of 4 MiB; cache {args.cache_mb} "
                  f"MiB; {args.steps} steps of {args.batch} x {args.seq_len + 1} tokens, {args.compute_ms:g} ms "
                  f"compute; S3 through a {args.delay_ms:g} ms proxy", flush=True)
            local = GlobalSampler([ShardSource(data, "train", args.seq_len)], [1.0], seed=1)
            for round_ in range(args.rounds):  # the order alternates: the machine's load drifts
                for depth in depths if round_ % 2 == 0 else depths[::-1]:
                    rows.append(run("local disk", local, depth, args, fetches))
                    print(json.dumps(rows[-1]), flush=True)
                    cache_dir = work / f"cache-{round_}-{depth}"  # empty: each streamed run starts cold
                    cache = BlockCache(cache_dir, args.cache_mb << 20)
                    streamed = GlobalSampler([StreamingSource(PREFIX, "train", args.seq_len, cache)], [1.0], seed=1)
                    rows.append(run(f"S3 +{args.delay_ms:g} ms", streamed, depth, args, fetches))
                    cached = sum(p.stat().st_size for p in (cache_dir / "blocks").glob("*/*"))
                    rows[-1]["cache_mb_at_end"] = cached / 2**20
                    assert cached <= args.cache_mb << 20
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    same = len({r["batches_sha256"] for r in rows}) == 1
    print(f"\nsame batches in every run: {'yes' if same else 'NO'}")
    print(f"| source | prefetch | data wait / wall (median of {args.rounds}) | from step 5 | mean wait/step "
          "| worst wait (step 5+) | blocks fetched |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label in dict.fromkeys(r["run"] for r in rows):
        for depth in depths:
            runs = [r for r in rows if r["run"] == label and r["prefetch"] == depth]

            def median(key, runs=runs):
                return statistics.median(r[key] for r in runs)

            each = ", ".join(f"{100 * r['data_wait_fraction']:.1f}" for r in runs)
            print(f"| {label} | {depth} | {100 * median('data_wait_fraction'):.1f}% ({each}) | "
                  f"{100 * median('steady_data_wait_fraction'):.2f}% | {median('mean_wait_ms'):.1f} ms | "
                  f"{median('worst_wait_ms_after_step_5'):.1f} ms | {median('blocks_fetched'):.0f} |")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "train-streaming.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    if not same:
        raise SystemExit("the runs read different batches")


if __name__ == "__main__":
    main()
