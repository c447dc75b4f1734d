#!/usr/bin/env python3
"""`make bench-dataprep-crawl`: data prep with a crawl's task structure on a small corpus, every S3
request counted per task and per prefix (issue 31, "Proof on this machine").

The corpus is a thousand tiny WET inputs at 16× (a few KB each, cut from one generated corpus so
duplicates cross inputs), on a moto S3 server with the output. The settings give every stage the
task structure of the 100 TB run (crawl_settings: the counts the code itself chooses for 900,000
WET files of 111 MB, by dedup_plan.choose_counts, per input): dedup partitions per input as at
100 TB, combined objects of the same number of partitions, and fixed fan-ins (input groups,
components tasks) that do not move with the corpus. It runs at 1×, 4× and 16× the inputs (same
input size); each stage as a few pods, each pod opening the run as `lmforge-dataprep <stage>
--worker-index k --num-workers n` does, all in this one process with the tasks inline, so every
request is attributed to the task (or the pod code around the tasks) that made it.

Counting: a botocore `before-send` hook on every S3 client lmforge.common.s3 builds (each HTTP
request, retries included: method, bucket, key); the prefix is the key's directories up to and
including its two-hex-digit hash directory (layout._hash_dir), else its whole directory. One
boto3 session is shared by those clients in this process (a fresh one per client, as the code
makes, costs ~120 ms of CPU, paid per input opened); the requests are the same.

Printed per scale: requests per task of each split stage (max and mean; combine's also per input
of its group; the components' per round, per edge file in round 0), the busiest prefix's share of
each stage's requests and of the run's, the pod code's own requests (outside its tasks), and
whether the S3 output's shards/, index/, lineage/ and manifest.json are byte-identical to a
one-worker local run of the same inputs. Asserted (flat_failures): per unit of its fan-in a
task's requests do not grow from 1× to 16× (within --tolerance; a dedup task's stay under
3 × group objects + a constant), and the outputs are identical. Results:
bench/out/dataprep-crawl-structure.json, which bench/scale_model.py reads.

The 16× run makes ~78,000 requests; moto's server and botocore cost ~4 ms of CPU each in this
process, so the default sizes take ~15 CPU-minutes (--base-inputs 16 for a quick look).

    .venv/bin/python bench/dataprep_crawl_structure.py [--base-inputs 64 --factors 1,4,16 --group-objects 8]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

IDENTICAL = ("shards/", "index/", "lineage/", "manifest.json")
HASH_DIR = re.compile(r"^[0-9a-f]{2}$")

# The 100 TB run the structure is taken from (issue 31): ten Common Crawl snapshots.
CRAWL_INPUTS = 900_000
CRAWL_INPUT_BYTES = 100e12 / CRAWL_INPUTS  # ~111 MB of gzip WET per file, as a listing gives it


# ------------------------------------------------------------------ the 100 TB structure


def crawl_settings(base_inputs: int, factor: int, group_objects: int, components_tasks: int) -> dict:
    """Settings that give a run of base_inputs × factor inputs the 100 TB run's tasks per input:
    the dedup partitions the code chooses for 900,000 inputs of 111 MB (dedup_plan.choose_counts),
    per input, times the base run's inputs (rounded to whole partitions per band), times `factor`
    (so partitions per input are the same at every factor); the partitions per combined object it
    chooses there; and the given fan-ins (input groups, components tasks), config values that do
    not move with the corpus."""
    from lmforge.dataprep.config import MinHashConfig
    from lmforge.dataprep.dedup_plan import choose_counts
    from lmforge.dataprep.minhash import lsh_params

    config = MinHashConfig()
    bands, _ = lsh_params(config)
    crawl = choose_counts(config, bands, [int(CRAWL_INPUT_BYTES)] * CRAWL_INPUTS)
    crawl_partitions = (bands + 2) * crawl["partitions_per_band"]
    per_input = crawl_partitions / CRAWL_INPUTS
    ppb = max(1, round(per_input * base_inputs / (bands + 2))) * factor
    return {
        "crawl": {"inputs": CRAWL_INPUTS, "input_bytes": CRAWL_INPUT_BYTES, **crawl, "partitions": crawl_partitions,
                  "partitions_per_input": per_input, "bands": bands},
        "sets": {"minhash.partitions_per_band": ppb, "minhash.combine_partitions": crawl["combine_partitions"],
                 "minhash.group_objects": group_objects, "components.tasks": components_tasks},
    }


# ------------------------------------------------------------------ counting requests


def prefix_of(key: str) -> str:
    """The key's directories up to and including its hash directory (two hex digits), else all of them."""
    parts = key.split("/")[:-1]
    for k, part in enumerate(parts):
        if HASH_DIR.match(part):
            return "/".join(parts[: k + 1]) + "/"
    return "/".join(parts) + "/" if parts else ""


def family_of(prefix: str) -> str:
    """A prefix with its hash directory and round number generalised: the objects of one kind."""
    prefix = re.sub(r"/[0-9a-f]{2}/$", "/*/", prefix)
    return re.sub(r"round-\d{3}/", "round-*/", prefix)


def describe(method: str, url: str) -> tuple[str, str, str]:
    """(method, bucket, key) of a path-style S3 request; a listing is LIST with its prefix as key,
    a multipart create or complete is POST."""
    parts = urlsplit(url)
    bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
    query = parse_qs(parts.query, keep_blank_values=True)
    if method == "GET" and "list-type" in query:
        return "LIST", bucket, query.get("prefix", [""])[0] + "*"
    return method, bucket, key


class RequestCounter:
    """Every S3 request of lmforge's clients in this process, by scope (what was running) and by
    (method, bucket, prefix)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.scope: tuple = ("outside",)
        self.counts: dict[tuple, Counter] = defaultdict(Counter)
        self._undo: list = []

    def on_send(self, request, **_) -> None:
        method, bucket, key = describe(request.method, request.url)
        with self._lock:
            self.counts[self.scope][(method, bucket, prefix_of(key))] += 1

    @contextlib.contextmanager
    def scoped(self, *scope):
        previous, self.scope = self.scope, scope
        try:
            yield
        finally:
            self.scope = previous

    def install(self) -> RequestCounter:
        """Hook every S3 client lmforge.common.s3 makes from now on, and scope each task the data-prep
        executor runs inline as ("task", stage, its fields)."""
        import boto3

        from lmforge.common import s3
        from lmforge.dataprep import executor

        shared, make_session, make_client, run_task = boto3.session.Session(), boto3.session.Session, s3.s3_client, \
            executor.run_task
        creating = threading.Lock()

        def session(*args, **kwargs):
            return shared if not args and not kwargs else make_session(*args, **kwargs)

        def counted_client(*args, **kwargs):
            with creating:  # one session: clients made one at a time
                boto3.session.Session = session
                try:
                    client = make_client(*args, **kwargs)
                finally:
                    boto3.session.Session = make_session
            client.meta.events.register("before-send.s3", self.on_send)
            return client

        def counted_task(task, store, config):
            with self.scoped("task", self.scope[1], *task_label(task)):
                return run_task(task, store, config)

        s3.s3_client, executor.run_task = counted_client, counted_task
        self._undo = [(s3, "s3_client", make_client), (executor, "run_task", run_task)]
        return self

    def uninstall(self) -> None:
        for module, name, value in self._undo:
            setattr(module, name, value)
        self._undo = []

    def scopes(self, kind: str, stage: str | None = None) -> dict[tuple, Counter]:
        return {scope: counts for scope, counts in self.counts.items()
                if scope[0] == kind and (stage is None or scope[1] == stage)}


def task_label(task) -> tuple:
    """A task's integer fields, in order: its identity within its stage."""
    return tuple(getattr(task, f.name) for f in dataclasses.fields(task)
                 if isinstance(getattr(task, f.name), int) and f.name != "n_inputs")


# ------------------------------------------------------------------ running the stages as pods


def run_as_pods(counter: RequestCounter, output: str, inputs: list[str], sets: list[str], pods: int) -> dict:
    """Every stage of stages.STAGES, in order, as `pods` pods each (fewer where a stage has fewer
    tasks; one for a single stage), each pod opening the run as the CLI does. The components
    rounds run until one whose tasks only mark themselves done (idle), as the chart's Jobs would.
    Returns {stage: {"pods": pods per round, "rounds": rounds run (a rounds stage)}}."""
    from lmforge.dataprep import components, stage_runs
    from lmforge.dataprep.config import load_dataprep_config
    from lmforge.dataprep.stages import ROUNDS, STAGES

    config = load_dataprep_config(None, sets)
    ran: dict = {}

    def pod_run(stage: str, k: int, n: int, round_: int | None = None) -> None:
        with counter.scoped("pod", stage, round_, k):
            run = stage_runs.open_run(output, config if stage == "inputs" else None,
                                  inputs if stage == "inputs" else None, processes=1)
            with run:
                stage_runs.run_stage(run, stage, k if n else None, max(n, 1), round_)

    def task_count(stage: str, round_: int | None = None) -> int:
        with counter.scoped("driver", stage):
            run = stage_runs.open_run(output, None, None) if stage != "inputs" else None
            return len(inputs) if run is None else stage_runs.stage_task_count(run, stage, round_)

    for stage in STAGES:
        if stage.kind == ROUNDS:
            rounds, n = 0, 0
            for r in range(components.scheduled_rounds(config)):
                n = min(pods, task_count(stage.name, r))
                for k in range(n):
                    pod_run(stage.name, k, n, r)
                rounds += 1
                with counter.scoped("driver", stage.name):
                    run = stage_runs.open_run(output, None, None)
                    states = {round_state(run, r, t) for t in range(run.config.components.tasks)}
                if states == {components.IDLE}:
                    break
            ran[stage.name] = {"pods": n, "rounds": rounds}
        elif stage.split:
            n = min(pods, task_count(stage.name))
            for k in range(n):
                pod_run(stage.name, k, n)
            ran[stage.name] = {"pods": n}
        else:
            pod_run(stage.name, 0, 0)
            ran[stage.name] = {"pods": 1}
    return ran


def round_state(run, round_: int, task: int) -> str:
    from lmforge.dataprep import layout

    return json.loads(run.store.read_text(layout.components_done(round_, task)))["state"]


# ------------------------------------------------------------------ summaries


def requests_of(counts: Counter) -> int:
    return sum(counts.values())


def stage_summary(counter: RequestCounter, stage: str, bucket: str, root: str, n_inputs: int, config) -> dict:
    """Requests per task of one stage (max, mean, tasks), the pods' own, and prefixes by load."""
    tasks = counter.scopes("task", stage)
    pods = counter.scopes("pod", stage)
    per_task = [requests_of(c) for c in tasks.values()] or [requests_of(c) for c in pods.values()]
    by_prefix: Counter = Counter()
    by_method: Counter = Counter()
    for counts in [*tasks.values(), *pods.values()]:
        for (method, b, prefix), n in counts.items():
            where = prefix.removeprefix(root + "/") if b == bucket else f"{b}/{prefix}"
            by_prefix[where] += n
            by_method[method] += n
    total = sum(by_prefix.values())
    busiest, busiest_n = by_prefix.most_common(1)[0] if by_prefix else ("", 0)
    families: Counter = Counter()
    for prefix, n in by_prefix.items():
        families[family_of(prefix)] += n
    out = {"tasks": len(tasks) or len(pods), "requests": total, "by_method": dict(by_method),
           "per_task_max": max(per_task, default=0), "per_task_min": min(per_task, default=0),
           "per_task_mean": round(sum(per_task) / max(len(per_task), 1), 2),
           "pods": len(pods), "pod_own_max": max((requests_of(c) for c in pods.values()), default=0),
           "busiest_prefix": busiest, "busiest_share": round(busiest_n / max(total, 1), 4),
           "prefixes": len(by_prefix), "top_prefixes": by_prefix.most_common(5), "families": dict(families)}
    if stage == "combine":
        from lmforge.dataprep.dedup_global import shuffle_plan

        groups = shuffle_plan(config.minhash, n_inputs).groups
        ratios = [requests_of(c) / len(groups[scope[2]]) for scope, c in tasks.items()]
        out["per_group_input_max"] = round(max(ratios, default=0), 3)
        out["per_group_input_mean"] = round(sum(ratios) / max(len(ratios), 1), 3)
        out["inputs_per_group"] = [min(len(g) for g in groups), max(len(g) for g in groups)]
    if stage == "components":
        out.update(components_summary(tasks, config))
    return out


def components_summary(tasks: dict[tuple, Counter], config) -> dict:
    """Per round: requests per task. Round 0 reads its share of the dedup partitions' edge files
    (counted per edge file); the round that finds the labels also writes one removed file per input
    its task owns (counted apart): what is left is the fan-in and fan-out of components.tasks objects."""
    from lmforge.dataprep.components import edge_share

    rounds: dict[int, list[tuple[int, int]]] = defaultdict(list)
    per_edge_file, per_index = [], Counter()
    for scope, counts in tasks.items():
        round_, task = scope[2], scope[3]
        removed = sum(n for (_, _, prefix), n in counts.items() if prefix.endswith("work/dedup/removed/"))
        rounds[round_].append((requests_of(counts), removed))
        per_index[task] += requests_of(counts)
        if round_ == 0:
            per_edge_file.append(requests_of(counts) / max(len(edge_share(config, task)), 1))
    star = [n - removed for r, values in rounds.items() if r > 0 for n, removed in values]
    return {"per_round": {r: {"max": max(n for n, _ in v), "mean": round(sum(n for n, _ in v) / len(v), 2),
                              "removed_files_max": max(m for _, m in v)} for r, v in sorted(rounds.items())},
            "round0_per_edge_file_max": round(max(per_edge_file, default=0), 3),
            "star_rounds_per_task_max": max(star, default=0),
            "star_rounds_per_task_mean": round(sum(star) / max(len(star), 1), 2),
            "per_task_all_rounds_max": max(per_index.values(), default=0)}


def run_summary(counter: RequestCounter, bucket: str, root: str) -> dict:
    """The busiest prefix of the whole run (tasks and pods of every stage)."""
    by_prefix: Counter = Counter()
    for scope, counts in counter.counts.items():
        if scope[0] in ("task", "pod"):
            for (_, b, prefix), n in counts.items():
                by_prefix[prefix.removeprefix(root + "/") if b == bucket else f"{b}/{prefix}"] += n
    total = sum(by_prefix.values())
    busiest, n = by_prefix.most_common(1)[0]
    return {"requests": total, "busiest_prefix": busiest, "busiest_share": round(n / total, 4),
            "prefixes": len(by_prefix)}


# ------------------------------------------------------------------ outputs


def duplicate_graph(output: str, config, n_inputs: int) -> dict:
    """The run's documents into dedup, its duplicate edges and the records round 1 of the components held."""
    from lmforge.common.storage import open_store
    from lmforge.dataprep import layout

    store = open_store(output)
    summary = json.loads(store.read_text(layout.DEDUP_STATS))
    kept = sum(json.loads(store.read_text(layout.input_stats(i)))["docs_kept"] for i in range(n_inputs))
    records = [json.loads(store.read_text(layout.components_done(1, t))).get("records", 0)
               for t in range(config.components.tasks)]
    return {"docs_into_dedup": kept, "edges": summary["edges"], "removed": summary["removed_total"],
            "clusters": summary["clusters"], "rounds": summary["components_rounds"],
            "round1_records": sum(records), "round1_records_max": max(records)}


def object_bytes(client, bucket: str, root: str) -> dict[str, list[int]]:
    """Files and bytes of the run's objects, by family (family_of)."""
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{root}/"):
        for item in page.get("Contents", []):
            entry = found[family_of(prefix_of(item["Key"].removeprefix(root + "/")))]
            entry[0] += 1
            entry[1] += item["Size"]
    return dict(sorted(found.items()))


def s3_digests(client, bucket: str, root: str) -> dict[str, str]:
    digests = {}
    for name in IDENTICAL:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{root}/{name}"):
            for item in page.get("Contents", []):
                body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                digests[item["Key"].removeprefix(root + "/")] = hashlib.sha256(body).hexdigest()
    return digests


def local_digests(output: Path) -> dict[str, str]:
    digests = {}
    for name in IDENTICAL:
        root = output / name.rstrip("/")
        for path in sorted([root] if root.is_file() else root.rglob("*")):
            if path.is_file():
                digests[str(path.relative_to(output))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def local_run(inputs: list[str], sets: list[str], output: Path) -> dict[str, str]:
    """The same inputs, one worker, output on local disk: what the S3 run must equal."""
    from lmforge.dataprep import stage_runs
    from lmforge.dataprep.config import load_dataprep_config

    shutil.rmtree(output, ignore_errors=True)
    with stage_runs.open_run(str(output), load_dataprep_config(None, sets), inputs, processes=1) as run:
        stage_runs.run_all(run)
    return local_digests(output)


# ------------------------------------------------------------------ moto


class MotoS3:
    """moto's S3 server on loopback, with the environment pointing lmforge's clients at it."""

    ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "LMFORGE_S3_ANONYMOUS": "0"}

    def __enter__(self) -> MotoS3:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self._saved = {k: os.environ.get(k) for k in [*self.ENV, "AWS_ENDPOINT_URL"]}
        os.environ.update({**self.ENV, "AWS_ENDPOINT_URL": self.endpoint})
        import boto3

        self.client = boto3.client("s3", endpoint_url=self.endpoint)
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()
        for k, v in self._saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


# ------------------------------------------------------------------ one scale


def measure(client, counter: RequestCounter, name: str, inputs: list[str], sets: list[str], pods: int,
            scratch: Path) -> dict:
    """One corpus through every stage on S3 as pods, then the same locally at one worker; the
    requests per stage and whether the outputs are byte-identical."""
    from lmforge.dataprep import stage_runs
    from lmforge.dataprep.stages import STAGES

    bucket, root = f"crawl-{name}", "out"
    client.create_bucket(Bucket=bucket)
    output = f"s3://{bucket}/{root}"
    started = time.perf_counter()
    counter.counts.clear()
    ran = run_as_pods(counter, output, inputs, sets, pods)
    seconds = time.perf_counter() - started
    with counter.scoped("driver", "summary"):
        config = stage_runs.open_run(output, None, None).config
    stages = {stage.name: {**stage_summary(counter, stage.name, bucket, root, len(inputs), config),
                           **ran.get(stage.name, {})} for stage in STAGES}
    whole = run_summary(counter, bucket, root)
    with counter.scoped("driver", "summary"):
        graph = duplicate_graph(output, config, len(inputs))
    objects = object_bytes(client, bucket, root)
    with counter.scoped("local", "local"):
        local = local_run(inputs, sets, scratch / f"local-{name}")
    remote = s3_digests(client, bucket, root)
    shutil.rmtree(scratch / f"local-{name}", ignore_errors=True)
    return {"inputs": len(inputs), "seconds": round(seconds, 1), "stages": stages, "run": whole,
            "config": {k: getattr(config.minhash, k) for k in ("partitions_per_band", "combine_partitions",
                                                                 "group_objects")}
            | {"components_tasks": config.components.tasks},
            "graph": graph, "objects": objects,
            "identical": bool(local) and local == remote, "identical_files": len(local),
            "differing": sorted(k for k in set(local) | set(remote) if local.get(k) != remote.get(k))[:10]}


# ------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-inputs", type=int, default=64, help="inputs of the 1x run")
    p.add_argument("--factors", default="1,4,16", help="multiples of --base-inputs to run")
    p.add_argument("--docs-per-input", type=int, default=4, help="WET records per input (~1.9 kB of gzip each)")
    p.add_argument("--group-objects", type=int, default=8,
                   help="minhash.group_objects: input groups, fixed at every scale (the 100 TB run: 256)")
    p.add_argument("--components-tasks", type=int, default=8, help="components.tasks, fixed at every scale")
    p.add_argument("--pods", type=int, default=4, help="pods per split stage (each opens the run, as the CLI does)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="further config overrides (after the structure's)")
    p.add_argument("--tolerance", type=float, default=0.10,
                   help="allowed growth of requests per task from the smallest to the largest run")
    p.add_argument("--seed", type=int, default=31)
    p.add_argument("--out", default=str(REPO / "bench" / "out"))
    return p.parse_args(argv)


# A tokenizer sample and shards sized for a small corpus; 16 inputs per shard partition (docs/scaling.md
# advises 10-100 at crawl scale: fewer, larger shards and manifest entries).
SMALL_RUN = ["tokenizer.vocab_size=1000", "tokenizer.sample_bytes=1048576", "shards.shard_tokens=65536",
             "shards.val_fraction=0.05", "shards.inputs_per_partition=16"]


def flat_failures(results: dict[int, dict], tolerance: float) -> list[str]:
    """Requests per task must not grow with the inputs: a combine task's per input of its group, a
    round-0 components task's per edge file it reads and a components star round's (less its removed
    files), each within `tolerance` (+1 request of rounding) of the smallest run's. A dedup task's
    are held to a bound that does not depend on the inputs: two reads per group object, at most one
    signature read per object (its candidates' rows lie within COALESCE_GAP_BYTES at these sizes),
    and the constant part of the smallest run's least busy task. (Its mean rises toward the bound
    as more of a task's group objects hold one of its candidates.)"""
    failures = []
    factors = sorted(results)
    checks = (("combine", "per_group_input_max"), ("combine", "per_group_input_mean"),
              ("components", "round0_per_edge_file_max"), ("components", "star_rounds_per_task_max"),
              ("components", "star_rounds_per_task_mean"))
    for stage, key in checks:
        values = [results[f]["stages"][stage][key] for f in factors]
        if max(values) > values[0] * (1 + tolerance) + 1:
            failures.append(f"{stage} {key} grows with the inputs: {values} at {factors}x")
    bound = dedup_bound(results[factors[0]])
    for f in factors:
        largest = results[f]["stages"]["dedup"]["per_task_max"]
        if largest > bound:
            failures.append(f"{f}x: a dedup task made {largest} requests, above its bound {bound}")
        if not results[f]["identical"]:
            failures.append(f"{f}x: S3 output differs from the local one-worker run: {results[f]['differing']}")
    return failures


def dedup_bound(result: dict) -> int:
    """3 x the group objects + the constant part of the run's least busy dedup task."""
    groups = min(result["inputs"], result["config"]["group_objects"])
    return 3 * groups + result["stages"]["dedup"]["per_task_min"] - 2 * groups


def print_table(results: dict[int, dict]) -> None:
    factors = sorted(results)
    head = " / ".join(f"{f}x" for f in factors)
    print(f"\n{'stage':11s} {'tasks (' + head + ')':>26s} {'req/task max':>20s} {'req/task mean':>24s} "
          f"{'pod own max':>16s} {'busiest prefix share':>22s}")
    for stage in results[factors[0]]["stages"]:
        rows = [results[f]["stages"][stage] for f in factors]

        def join(key, fmt="{}", rows=rows):
            return "/".join(fmt.format(r[key]) for r in rows)

        print(f"{stage:11s} {join('tasks'):>26s} {join('per_task_max'):>20s} {join('per_task_mean', '{:.1f}'):>24s} "
              f"{join('pod_own_max'):>16s} {join('busiest_share', '{:.1%}'):>22s}  {rows[-1]['busiest_prefix']}")
    print(f"dedup requests per task, bound (3 x group objects + constant): {dedup_bound(results[factors[0]])}")
    combine = [results[f]["stages"]["combine"] for f in factors]
    print("combine requests per input of its group (max/mean): "
          + ", ".join(f"{f}x {c['per_group_input_max']}/{c['per_group_input_mean']} ({c['inputs_per_group'][1]} inputs)"
                      for f, c in zip(factors, combine)))
    comps = [results[f]["stages"]["components"] for f in factors]
    print("components: rounds " + "/".join(str(c["rounds"]) for c in comps)
          + "; round 0 per edge file read (max) " + "/".join(str(c["round0_per_edge_file_max"]) for c in comps)
          + "; star rounds per task less its removed files (max/mean) "
          + ", ".join(f"{c['star_rounds_per_task_max']}/{c['star_rounds_per_task_mean']}" for c in comps)
          + "; per task over all rounds (max) " + "/".join(str(c["per_task_all_rounds_max"]) for c in comps))
    for f in factors:
        r = results[f]
        print(f"{f}x: {r['inputs']} inputs, {r['run']['requests']} requests, busiest prefix "
              f"{r['run']['busiest_prefix']} {r['run']['busiest_share']:.1%} of {r['run']['prefixes']} prefixes, "
              f"{r['seconds']}s; byte-identical "
              f"to the local run: {r['identical']} ({r['identical_files']} files); settings {r['config']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from dataprep_scaling import split_corpus

    from lmforge.common.logging import configure_logging

    configure_logging("WARNING")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    factors = sorted(int(f) for f in args.factors.split(","))
    n_max = args.base_inputs * factors[-1]
    docs_mb = n_max * args.docs_per_input / (50_000 / 205.5)
    files = split_corpus(docs_mb, n_max, args.seed, out)
    print(f"corpus: {len(files)} WET files, {sum(p.stat().st_size for p in files) / len(files) / 1e3:.1f} kB each",
          flush=True)
    results: dict[int, dict] = {}
    counter = RequestCounter()
    with MotoS3() as s3, tempfile.TemporaryDirectory() as scratch:
        counter.install()
        s3.client.create_bucket(Bucket="crawl-inputs")
        for path in files:
            s3.client.upload_file(str(path), "crawl-inputs", f"wet/{path.name}")
        for f in factors:
            n = args.base_inputs * f
            structure = crawl_settings(args.base_inputs, f, args.group_objects, args.components_tasks)
            sets = [*SMALL_RUN, *(f"{k}={v}" for k, v in structure["sets"].items()), *args.set]
            inputs = [f"s3://crawl-inputs/wet/{p.name}" for p in files[:n]]
            results[f] = {**measure(s3.client, counter, f"x{f}", inputs, sets, args.pods, Path(scratch)), "sets": sets,
                          "structure": structure}
            print(f"  {f}x: {n} inputs, {results[f]['run']['requests']} requests, {results[f]['seconds']}s",
                  flush=True)
        counter.uninstall()
    print_table(results)
    failures = flat_failures(results, args.tolerance)
    crawl = results[factors[0]]["structure"]["crawl"]
    payload = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "args": vars(args), "crawl": crawl,
               "docs_per_input": args.docs_per_input,
               "input_gz_bytes": sum(p.stat().st_size for p in files) / len(files),
               "results": {str(f): r for f, r in results.items()}, "failures": failures}
    path = out / "dataprep-crawl-structure.json"
    path.write_text(json.dumps(payload, indent=1, default=str))
    print(f"\nresults: {path}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
