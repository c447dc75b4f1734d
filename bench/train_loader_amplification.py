#!/usr/bin/env python3
"""The trainer's loader with a corpus 100 times the node's block cache, S3 20 ms away: bytes
fetched per byte trained and the data-wait share of the step, for `data.shuffle: global` (uniform
over the corpus) and `blocks` (block-window shuffle, trainer/sampling.py), side by side in one run.

A local S3 server (moto, its own process) holds a data-prep output of random tokens, in blocks of
--block-kb; bench/latency_proxy.py adds --delay-ms to every request in front of it. Each run
starts from an empty cache of --cache-mb (the corpus is --corpus-factor times that) and iterates
--steps batches of one rank with the trainer's loader (Prefetcher over data_stream.read_batch at
--prefetch, as train.py does), the training step stood in for by --compute-ms of sleep. Bytes
fetched are the block GETs' bodies; bytes trained are steps × batch × seq_len × 2. Blocks, sequences
and cache are production's scaled down (4 MiB, 4096 tokens, 64 GiB), the windows in use a fraction
of the cache as there.

    .venv/bin/python bench/train_loader_amplification.py [--steps 320] [--compute-ms 100]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from s3_behind_proxy import PREFIX, s3_behind_proxy  # noqa: E402 - a sibling script

REPO = HERE.parent


def make_data(root: Path, shards: int, shard_tokens: int, block_bytes: int) -> Path:
    from lmforge.sample_data.token_shards import write_output

    rng = np.random.default_rng(0)
    arrays = [rng.integers(1, 50_000, shard_tokens, dtype=np.uint16) for _ in range(shards)]
    return write_output(root, {"train": arrays}, vocab_size=50_304, block_bytes=block_bytes)


def run(shuffle: str, args, work: Path, fetched: list) -> dict:
    from lmforge.trainer.block_cache import BlockCache
    from lmforge.trainer.data_stream import StreamingSource, read_batch
    from lmforge.trainer.prefetch import Prefetcher
    from lmforge.trainer.sampling import BlockSampler, GlobalSampler

    cache_dir = work / f"cache-{shuffle}"  # empty: each run starts cold
    cache = BlockCache(cache_dir, args.cache_bytes)
    source = StreamingSource(PREFIX, "train", args.seq_len, cache)
    if shuffle == "global":
        sampler = GlobalSampler([source], [1.0], seed=1)
    else:
        sampler = BlockSampler([source], [1.0], seed=1, streams=args.streams, window_blocks=args.window_blocks,
                               unit_blocks=args.unit_blocks)
    fetched.clear()
    prefetcher = Prefetcher(lambda i: read_batch(sampler, i, 0, 1, args.batch), range(args.steps),
                            depth=args.prefetch, pin_memory=False)
    waits = []
    started = time.perf_counter()
    for _, _, _, waited in prefetcher:
        waits.append(waited)
        time.sleep(args.compute_ms / 1000)
    wall = time.perf_counter() - started
    prefetcher.close()
    trained = args.steps * args.batch * args.seq_len * source.token_bytes
    steady = waits[5:]
    cached = sum(p.stat().st_size for p in (cache_dir / "blocks").glob("*/*"))
    assert cached <= args.cache_bytes
    return {"shuffle": shuffle, "bytes_fetched": sum(n for *_, n in fetched), "bytes_trained": trained,
            "fetched_per_trained": sum(n for *_, n in fetched) / trained, "blocks_fetched": len(fetched),
            "data_wait_fraction": sum(waits) / wall,
            "steady_data_wait_fraction": sum(steady) / (sum(steady) + len(steady) * args.compute_ms / 1000),
            "mean_wait_ms": 1000 * sum(waits) / len(waits), "wall_s": wall, "cache_mb_at_end": cached / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=320)
    parser.add_argument("--batch", type=int, default=32, help="sequences per step (one rank)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--block-kb", type=int, default=16, help="storage block (production: 4 MiB)")
    parser.add_argument("--cache-mb", type=float, default=1.5, help="the block cache's bound")
    parser.add_argument("--corpus-factor", type=int, default=100, help="corpus size / cache size")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--streams", type=int, default=2, help="data.shuffle_streams")
    parser.add_argument("--window-blocks", type=int, default=16, help="data.shuffle_window_blocks")
    parser.add_argument("--unit-blocks", type=int, default=8, help="data.shuffle_unit_blocks")
    parser.add_argument("--compute-ms", type=float, default=100.0, help="the stand-in training step")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="added to every S3 request")
    parser.add_argument("--prefetch", type=int, default=8, help="data.prefetch")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"))
    args = parser.parse_args()
    args.cache_bytes = int(args.cache_mb * 2**20)



    block_bytes = args.block_kb << 10
    corpus_bytes = args.corpus_factor * args.cache_bytes
    shard_tokens = corpus_bytes // 2 // args.shards
    window_units = max(1, args.window_blocks // args.unit_blocks)
    working_set = 2 * args.streams * window_units * (args.unit_blocks + 1) * block_bytes
    if working_set > args.cache_bytes:
        print(f"warning: two windows per stream ({working_set >> 10} KiB) do not fit the cache", flush=True)
    work = Path(tempfile.mkdtemp(prefix="lmforge-amplification-bench-"))
    rows = []
    try:
        data = make_data(work / "prepared", args.shards, shard_tokens, block_bytes)
        with s3_behind_proxy(data, args.delay_ms) as fetched:
            print(f"corpus {corpus_bytes / 2**20:.0f} MiB ({args.shards} shards, blocks of {args.block_kb} KiB), "
                  f"cache {args.cache_mb:g} MiB; {args.steps} steps of {args.batch} x {args.seq_len + 1} tokens, "
                  f"{args.compute_ms:g} ms compute, prefetch {args.prefetch}; S3 through a {args.delay_ms:g} ms "
                  f"proxy; blocks: {args.streams} streams, windows of {args.window_blocks} blocks, units of "
                  f"{args.unit_blocks}", flush=True)
            for shuffle in ("global", "blocks"):
                rows.append(run(shuffle, args, work, fetched))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print("\n| data.shuffle | bytes fetched / trained | blocks fetched | data wait / wall | from step 5 | mean wait "
          "/ step |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shuffle']} | {r['fetched_per_trained']:.2f} | {r['blocks_fetched']} | "
              f"{100 * r['data_wait_fraction']:.1f}% | {100 * r['steady_data_wait_fraction']:.2f}% | "
              f"{r['mean_wait_ms']:.1f} ms |")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "train-loader-amplification.json").write_text(
        json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
