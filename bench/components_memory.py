#!/usr/bin/env python3
"""Peak RSS of the largest connected-components task (components.py) on a random duplicate graph.

A random edge list (--edges pairs of --nodes documents spread over --inputs inputs, random kinds) is
written as the dedup partitions' edge files into a scratch output, then every components task of
every round runs in a process of its own, as an Indexed-Job pod runs it, and reports its peak RSS
(VmHWM in /proc/self/status); a process that only imports the modules gives the interpreter's own
share. The removed documents are checked against scipy's connected components of the same edges
in this process (lowest id survives, reason = the document's strongest own edge kind).

    .venv/bin/python bench/components_memory.py [--edges 3000000 --nodes 3000000 --tasks 4]
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lmforge.common.local_store import LocalStore
from lmforge.dataprep import layout
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep.dedup_global import PartitionPlan

CHILD = """
import json, sys
from lmforge.common.local_store import LocalStore
from lmforge.dataprep.config import DataprepConfig
from lmforge.dataprep import components
root, config, n_inputs, what, round_, task = sys.argv[1], DataprepConfig.model_validate_json(sys.argv[2]), \\
    int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
store = LocalStore(root)
result = {}
if what == "components":
    result = components.run_components_task(store, config, n_inputs, round_, task)
elif what == "finish":
    result = components.finish_components(store, config, n_inputs)
hwm = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"peak_rss": hwm, "result": result}))
"""


def child(root: Path, config: DataprepConfig, n_inputs: int, what: str, round_: int = 0, task: int = 0) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), config.model_dump_json(), str(n_inputs), what,
                          str(round_), str(task)], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{what} {round_}/{task} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def expected_removed(edges: np.ndarray) -> dict[int, int]:
    """doc id → reason of every removed document, from scipy's components of the edges."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    nodes, inverse = np.unique(edges[:, :2], return_inverse=True)
    inverse = inverse.reshape(-1, 2)
    n = len(nodes)
    _, labels = connected_components(coo_matrix((np.ones(len(inverse)), (inverse[:, 0], inverse[:, 1])),
                                                shape=(n, n)), directed=False)
    first = np.full(labels.max() + 1, n)
    np.minimum.at(first, labels, np.arange(n))
    kinds = np.full(n, 255, dtype=np.uint8)
    for column in (0, 1):
        np.minimum.at(kinds, inverse[:, column], edges[:, 2].astype(np.uint8))
    removed = first[labels] != np.arange(n)
    return dict(zip(nodes[removed].tolist(), kinds[removed].tolist()))


def write_edges(root: Path, config: DataprepConfig, args) -> np.ndarray:
    rng = np.random.default_rng(args.seed)
    inputs = np.sort(rng.integers(0, args.inputs, args.nodes)).astype(np.uint64)
    ids = (inputs << np.uint64(32)) | np.arange(args.nodes, dtype=np.uint64)
    pairs = ids[rng.integers(0, args.nodes, (args.edges, 2))]
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    edges = np.empty((len(pairs), 3), dtype=np.uint64)
    edges[:, :2] = pairs
    edges[:, 2] = rng.choice(3, len(pairs), p=[0.05, 0.05, 0.9])  # mostly near duplicates, as in a crawl
    count = PartitionPlan.from_config(config.minhash).count
    which = rng.integers(0, count, len(edges))
    store = LocalStore(root)
    for p in range(count):
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(edges[which == p]))
        store.write_bytes(layout.edges(p), buffer.getvalue())
    return edges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=3_000_000)
    parser.add_argument("--nodes", type=int, default=3_000_000)
    parser.add_argument("--inputs", type=int, default=64)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--max-rounds", type=int, default=64)
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    config = DataprepConfig.model_validate({"components": {"tasks": args.tasks, "max_rounds": args.max_rounds},
                                            "minhash": {"partitions_per_band": 2}})
    with tempfile.TemporaryDirectory() as scratch:
        rounds_root = Path(scratch) / "rounds"
        edges = write_edges(rounds_root, config, args)
        baseline = child(rounds_root, config, args.inputs, "nothing")["peak_rss"]
        per_round, started = [], time.perf_counter()
        for round_ in range(args.max_rounds):
            peaks = [child(rounds_root, config, args.inputs, "components", round_, t) for t in range(args.tasks)]
            states = {peak["result"]["state"] for peak in peaks}
            per_round.append({"round": round_, "states": sorted(states),
                              "peak_rss": [peak["peak_rss"] for peak in peaks],
                              "records": [peak["result"].get("records") for peak in peaks]})
            print(f"round {round_:2d} {'/'.join(sorted(states)):18s} peak RSS per task (MiB): "
                  + " ".join(f"{peak['peak_rss'] / 2**20:7.1f}" for peak in peaks), flush=True)
            if states & {"final", "idle"}:
                break
        summary = child(rounds_root, config, args.inputs, "finish")["result"]
        rounds_seconds = time.perf_counter() - started
        found = {}
        for i in range(args.inputs):
            with np.load(rounds_root / layout.removed(i)) as data:
                found.update(zip(data["doc_ids"].tolist(), data["reasons"].tolist()))
        same = found == expected_removed(edges)
    largest = max(max(r["peak_rss"]) for r in per_round)
    figures = {"edges": args.edges, "nodes": args.nodes, "inputs": args.inputs, "tasks": args.tasks,
               "interpreter_peak_rss": baseline, "largest_task_peak_rss": largest, "rounds": per_round,
               "summary": summary, "rounds_seconds": round(rounds_seconds, 1), "removed_as_expected": same}
    mib = 2**20
    print(f"interpreter alone {baseline / mib:.1f} MiB; largest components task {largest / mib:.1f} MiB "
          f"({summary['components_rounds']} rounds, {rounds_seconds:.0f} s); removed documents as scipy's "
          f"components give them: {same}")
    print(json.dumps(summary))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
