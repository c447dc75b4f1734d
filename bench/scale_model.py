#!/usr/bin/env python3
"""docs/scaling.md's tables: data prep of whole Common Crawl snapshots (10 TB and 100 TB of WET, on
1,000 and 4,000 pods) stage by stage, from what the benchmarks measured on this machine.

Reads, from bench/out/ (each optional: where one is missing, the figures of the run recorded in
FALLBACK below, marked with its date in the generated text):
- dataprep-crawl-structure.json (`make bench-dataprep-crawl`): S3 requests per task of every stage
  with the 100 TB run's task structure, the pods' own requests, and the bytes of the key objects;
- dataprep-scaling.json (`make bench-dataprep-scaling`): CPU seconds per WET MB of each per-input
  stage at one worker on one core, and each stage's per-task peak RSS at 1x, 4x and 16x;
- components-memory.json (`bench/components_memory.py --json`): a components task's peak RSS per
  record it holds, and its CPU per record and round.

The stages and what their tasks read and write are the code's (stages.py, layout.py); the task counts
are what the code chooses for the crawl (dedup_plan: partitions per band and per combined object from
the inputs' listed sizes; minhash.group_objects input groups) or what the model must pick
(components.tasks: the fewest that keep a task under 1.5 GB). A task's requests are the measured
per-task figures applied to the crawl's fan-ins (two per input of a combine task's group, two per
group object of a dedup task, 4 x components.tasks per components round, ...); a request costs 20 ms
of latency (assumed) and its client CPU (measured); a stage's wall time is its tasks' time over the
pods, plus what each pod does before its first task. Results between the markers of
docs/scaling.md (--write), with the figures they came from, so tests/dataprep/test_scaling_bench.py
can check they are what this computes.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- scale-model:begin -->", "<!-- scale-model:end -->"
INPUTS_TAG = "<!-- scale-model-inputs "
MIB = 2**20
PART = 8 * MIB  # lmforge.common.s3 DEFAULT_PART_SIZE: one PUT up to it, multipart above (+ create, complete)
MAX_TASK_RSS = 1.5e9  # the per-task budget (issue 19)
S3_PREFIX_PUTS, S3_PREFIX_GETS = 3_500, 5_500  # requests/s per prefix before S3 answers SlowDown
SUSTAINED = 600  # seconds: a prefix over S3's rate for less than this is retried through (its load is spread)
HASH_DIRS = 256  # layout._hash_dir: objects read and written at high rates spread over 256 directories
GOAL_REQUESTS = 1e9  # issue 31: dedup and components requests at 100 TB (≈ $400 of GETs)
GET_DOLLARS = 0.4e-6  # S3 standard, per GET
REQUEST_LATENCY = 0.020  # ASSUMED: time to first byte of one S3 request (the trainer streaming bench's proxy)
THREADS = 16  # dedup_global.READ_THREADS, components.IO_THREADS: reads a combine/dedup/components task keeps in flight
STAGES = ("inputs", "combine", "dedup", "components", "tokenizer", "tokenize", "shards", "report")
CRAWL_DOCS_PER_TB = 3e8  # Common Crawl: 3.0 G documents in ~10 TB of gzip WET
CRAWL_FILE_BYTES = 10e12 / 90_000  # one WET file, as a listing gives it

# Figures of earlier runs, used where bench/out/ holds no newer ones (each with its date).
FALLBACK = {
    # `make bench-dataprep-scaling`, 2026-11-26 (docs/benchmarks.md): 205.5 MB of generated WET, 50,000
    # records, one worker on one core; CPU seconds per stage (dedup: the partitions' sort and verify).
    "cpu": {"date": "2026-11-26", "wet_bytes": 205461655, "gz_bytes": 91474798, "records": 50000,
            "seconds": {"inputs": 60.098, "dedup": 4.37, "tokenizer": 8.405, "tokenize": 19.921, "shards": 0.33}},
    "corpus": {"dedup_share": 37488 / 50000, "kept_share": 31000 / 50000, "tokens_per_wet_byte": 22677370 / 205461655,
               "bytes_per_wet_byte": {"docs": 45754990 / 205461655, "tokens": 45354740 / 205461655,
                                      "token_index": 4873272 / 205461655, "filter_rejects": 1571427 / 205461655,
                                      "dedup_rejects": 836754 / 205461655, "lineage": 2118205 / 205461655}},
    # its flatness runs' largest per-task peak RSS, per stage (the old stages: dedup, cluster)
    "rss": {"date": "2026-11-26", "inputs": 237731840, "combine": 168464384, "dedup": 168464384,
            "components": 165715968, "tokenizer": 216911872, "tokenize": 264978432, "shards": 189743104,
            "report": 167612416},
    "report": {"rss_per_input": 0.0, "cpu_per_input": 0.0},
    # botocore's client CPU per request, from the 2026-11-26 flatness runs' dedup tasks over S3
    "request_cpu": 1.5e-3,
}


# ------------------------------------------------------------------ what was measured


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def load(out: Path) -> dict:
    """The measured figures the model uses, from bench/out/ where present, else FALLBACK's."""
    measured = json.loads(json.dumps(FALLBACK))
    measured["sources"] = {}
    scaling = _read(out / "dataprep-scaling.json") or {}
    if scaling.get("scaling"):
        bench = scaling["scaling"]
        measured["cpu"] = {"date": scaling["date"], "wet_bytes": bench["input"]["wet_bytes"],
                           "gz_bytes": bench["input"]["gz_bytes"], "records": bench["input"]["records"],
                           "seconds": {name: p["workers_1"].get("cpu_seconds", 0.0)
                                       for name, p in bench["phases"].items()}}
    flat = scaling.get("flatness")
    if flat:
        phases = flat["phases"]
        measured["rss"] = {"date": scaling["date"], **{name: max(row["peak_rss_bytes"]["values"])
                                                       for name, row in phases.items()}}
        span = (flat["factors"][-1] - flat["factors"][0]) * flat["files_at_1x"]
        report = phases.get("report")
        if report and span:
            # a rise within the flatness floor is allocator noise, not a slope to carry to 900,000 inputs
            rss, cpu = report["peak_rss_bytes"]["values"], report["cpu_seconds"]
            rise = rss[-1] - rss[0] if rss[-1] - rss[0] >= flat["floor_bytes"]["peak_rss_bytes"] else 0.0
            measured["report"] = {"rss_per_input": rise / span, "cpu_per_input": max(0.0, (cpu[-1] - cpu[0]) / span)}
        measured["sources"]["flatness"] = scaling["date"]
    crawl = _read(out / "dataprep-crawl-structure.json")
    if crawl:
        measured["requests"] = crawl_requests(crawl)
        measured["sources"]["crawl_structure"] = crawl["date"]
    components = _read(out / "components-memory.json")
    if components:
        measured["components"] = components_figures(components)
        written = time.gmtime((out / "components-memory.json").stat().st_mtime)
        measured["sources"]["components_memory"] = components.get("date") or time.strftime("%Y-%m-%d", written)
    return measured


def crawl_requests(crawl: dict) -> dict:
    """Per-task request figures of the crawl-structure run with the most inputs, as the model applies
    them: what a task makes per unit of its fan-in, and what it makes besides."""
    factors = sorted(crawl["results"], key=int)
    big, small = crawl["results"][factors[-1]], crawl["results"][factors[0]]
    stages, config = big["stages"], big["config"]
    n, n_small = big["inputs"], small["inputs"]
    groups = min(n, config["group_objects"])
    combine = stages["combine"]
    group_inputs = sum(combine["inputs_per_group"]) / 2
    key_reads = combine["families"].get("work/minhash/keys/*/", 0) / combine["tasks"]
    dedup = stages["dedup"]
    object_reads = dedup["families"].get("work/dedup/combined/*/", 0) / dedup["tasks"]
    comps = stages["components"]
    rounds = {int(r): v for r, v in comps["per_round"].items()}
    tasks = config["components_tasks"]
    partitions = dedup["tasks"]
    keys = big["objects"].get("work/minhash/keys/*/", [0, 0])
    graph = big["graph"]

    # A pod's own requests (outside its tasks): opening the run (a constant), a HEAD of each of its
    # tasks' markers (two for an input), and for combine and shards a HEAD of every input's marker of
    # the stage before (runner._require_inputs_done, run_shards): the constant from the dedup pods,
    # the per-input part from combine's and shards' (the bench's pods each ran tasks / pods tasks).
    def own(stage: str) -> float:
        return stages[stage]["pod_own_max"] - math.ceil(stages[stage]["tasks"] / stages[stage]["pods"])

    sets = dict(item.split("=", 1) for item in big.get("sets", []))
    per_partition = int(sets.get("shards.inputs_per_partition", 1))
    return {
        "date": crawl["date"], "inputs": n, "factors": [int(f) for f in factors],
        "inputs_task": stages["inputs"]["per_task_mean"],
        "combine_per_group_input": key_reads / group_inputs, "combine_task": combine["per_task_mean"] - key_reads,
        "dedup_per_object": object_reads / groups, "dedup_task": dedup["per_task_mean"] - object_reads,
        "dedup_groups": groups,
        # components: round 0 per edge file; a star round 4 x tasks (objects in and out, the markers of the
        # round before: a HEAD and a GET each); an idle round 2 x tasks; the constant parts measured
        "components_round0_per_edge_file": rounds[0]["mean"] / max(partitions / tasks, 1),
        "components_star_extra": max(0.0, comps["star_rounds_per_task_mean"] - 4 * tasks),
        "components_rounds": comps["rounds"], "components_tasks": tasks,
        "tokenize_task": stages["tokenize"]["per_task_mean"],
        "shards_per_input": stages["shards"]["per_task_mean"] / per_partition, "inputs_per_partition": per_partition,
        "tokenizer": stages["tokenizer"]["requests"],
        "report_per_input": (stages["report"]["requests"] - small["stages"]["report"]["requests"]) / (n - n_small),
        "pod_base": own("dedup"),
        "combine_pod_per_input": max(0.0, (own("combine") - own("dedup")) / n),
        "shards_pod_per_input": max(0.0, (own("shards") - own("dedup")) / n),
        "busiest_share": {s: stages[s]["busiest_share"] for s in stages},
        "busiest_prefix": {s: stages[s]["busiest_prefix"] for s in stages},
        "key_bytes_per_doc": keys[1] / max(graph["docs_into_dedup"], 1),
        "edges_per_doc": graph["edges"] / max(graph["docs_into_dedup"], 1),
        "records_per_doc": graph["round1_records"] / max(graph["docs_into_dedup"], 1),
        "identical": all(r["identical"] for r in crawl["results"].values()),
    }


def components_figures(figures: dict) -> dict:
    """A components task's peak RSS per record it holds (the largest task less the interpreter, over
    its records) and CPU per record per round, from bench/components_memory.py."""
    held = max((max(r for r in round_["records"] if r is not None) for round_ in figures["rounds"]
                if any(r is not None for r in round_["records"])), default=0)
    records = sum(sum(r or 0 for r in round_["records"]) for round_ in figures["rounds"])
    return {"bytes_per_record": (figures["largest_task_peak_rss"] - figures["interpreter_peak_rss"]) / max(held, 1),
            "interpreter": figures["interpreter_peak_rss"], "edges": figures["edges"], "nodes": figures["nodes"],
            "tasks": figures["tasks"], "largest": figures["largest_task_peak_rss"], "held": held,
            "rounds": figures["summary"]["components_rounds"],
            "cpu_per_record_round": figures["rounds_seconds"] / max(records, 1)}


# ------------------------------------------------------------------ the model


def human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {suffix}{unit}".strip()
    return f"{n:.0f} {unit}".strip()


def puts(size: float) -> float:
    """Requests to write one object of `size` bytes."""
    return 1 if size <= PART else math.ceil(size / PART) + 2


def key_row_bytes(bands: int, num_perm: int) -> int:
    """A document's bytes in its input's key file (and again in the combined objects): a (doc id, key,
    row) triple in each of the bands + 2 key columns' sections, and its signature in each band's."""
    return (bands + 2) * 24 + bands * 4 * num_perm


def code_counts(n_inputs: int, input_bytes: float) -> dict:
    """The counts the code chooses for `n_inputs` inputs of `input_bytes` each (dedup_plan.choose_counts
    without the list), with the defaults of MinHashConfig."""
    from lmforge.dataprep.config import MinHashConfig
    from lmforge.dataprep.dedup_plan import choose_combine_partitions, choose_partitions_per_band, input_groups
    from lmforge.dataprep.minhash import lsh_params

    config = MinHashConfig()
    bands, rows = lsh_params(config)
    groups = input_groups(n_inputs, config.group_objects)
    largest_group = max(len(g) for g in groups) * input_bytes
    ppb = choose_partitions_per_band(config, bands, n_inputs * input_bytes)
    partitions = (bands + 2) * ppb
    combine = choose_combine_partitions(config, bands, ppb, partitions, largest_group)
    return {"bands": bands, "rows": rows, "num_perm": config.num_perm, "ppb": ppb, "partitions": partitions,
            "combine_partitions": combine, "ranges": math.ceil(partitions / combine), "groups": len(groups),
            "group_inputs": max(len(g) for g in groups), "max_rounds": 16}


def model(m: dict, wet_tb: float, pods: int, input_files: int, components_tasks: int | None = None) -> dict:
    """Every stage at one crawl size: tasks, CPU, requests, the busiest prefix, memory, wall time."""
    req, rss, cpu_m = m["requests"], m["rss"], m["cpu"]
    n = input_files
    wet = wet_tb * 1e12
    docs = wet_tb * CRAWL_DOCS_PER_TB
    counts = code_counts(n, wet / n)
    dedup_docs = docs * m["corpus"]["dedup_share"]
    per_mb = {k: v / (cpu_m["wet_bytes"] / 1e6) for k, v in cpu_m["seconds"].items()}
    wet_mb = wet / 1e6 * cpu_m["wet_bytes"] / cpu_m["gz_bytes"]  # the crawl's WET uncompressed, as the bench's CPU is
    request_cpu = m["request_cpu"]
    bands, num_perm = counts["bands"], counts["num_perm"]
    key_bytes = dedup_docs * key_row_bytes(bands, num_perm)
    G, D = counts["groups"], counts["partitions"]
    comp = m.get("components") or {}
    records = dedup_docs * req["records_per_doc"]

    def components_rss(tasks: int) -> float:
        return rss["components"] + comp.get("bytes_per_record", 70.0) * records / tasks

    T = components_tasks or next((t for t in _grid(1_000_000) if components_rss(t) <= MAX_TASK_RSS), 1_000_000)
    rounds = max(req["components_rounds"], comp.get("rounds", 0))  # the deeper graph's, where measured
    stages: dict[str, dict] = {}

    def stage(name: str, tasks: int, cpu: float, requests: float, per_task: float, pod_own: float,
              prefixes: list[tuple], memory: float, grows: str, latency: float | None = None,
              rounds_run: int = 1) -> None:
        """One stage: its tasks' CPU (plus their requests' client CPU), requests (per task and the pods'
        own, each paid before the pod's first task of a round), the prefixes it loads most ((GET-class
        requests, PUTs, name[, the seconds they take: the whole stage's by default])) and its largest
        task's memory. A task's latency is
        per_task x 20 ms unless given; its tasks run in waves over min(pods, tasks) pods."""
        cpu += request_cpu * requests
        task_seconds = cpu / tasks + (per_task * REQUEST_LATENCY if latency is None else latency)
        wall = rounds_run * pod_own * REQUEST_LATENCY + task_seconds * math.ceil(tasks / min(pods, tasks))
        loads = []
        for g, p, prefix, *seconds in prefixes:
            span = max(seconds[0] if seconds else wall, 1e-9)
            # a burst shorter than SUSTAINED: S3 answers SlowDown and the retries spread it over that long
            loads.append((max(g / S3_PREFIX_GETS, p / S3_PREFIX_PUTS) / max(span, SUSTAINED), (g + p) / span, prefix))
        load, rate, prefix = max(loads)
        stages[name] = {"tasks": tasks, "cpu_hours": cpu / 3600, "requests": requests, "per_task": per_task,
                        "pod_own": pod_own, "wall_hours": wall / 3600,
                        "pod_hours": rounds_run * pod_own * REQUEST_LATENCY / 3600, "memory": memory, "grows": grows,
                        "prefix": prefix, "prefix_rate": rate, "prefix_load": load}

    # inputs: one per WET file; writes its docs, key file (its signature in every band section), rejects
    per_input = wet / n
    docs_object = per_input * m["corpus"]["bytes_per_wet_byte"]["docs"] * cpu_m["wet_bytes"] / cpu_m["gz_bytes"]
    key_object = key_bytes / n
    inputs_task = req["inputs_task"] + (puts(docs_object) - 1) + (puts(key_object) - 1)
    pod_inputs = req["pod_base"] + 2 * math.ceil(n / pods)
    stage("inputs", n, per_mb["inputs"] * wet_mb, n * inputs_task + min(pods, n) * pod_inputs, inputs_task,
          pod_inputs, [(n, n * puts(docs_object), "work/docs/"), (n, n, "work/done/"),
                       (0, n * puts(key_object) / HASH_DIRS, "work/minhash/keys/XX/")],
          rss["inputs"], "flat (one input)")

    # combine: G groups x ranges; two ranged reads per input of its group, one object per task; every
    # pod first HEADs every input's marker (runner._require_inputs_done)
    combine_tasks = G * counts["ranges"]
    combined_object = key_bytes / combine_tasks
    reads = req["combine_per_group_input"] * counts["group_inputs"]
    combine_task = reads + req["combine_task"] + puts(combined_object) - 1
    combine_pods = min(pods, combine_tasks)
    pod_combine = req["pod_base"] + math.ceil(combine_tasks / combine_pods) + req["combine_pod_per_input"] * n
    stage("combine", combine_tasks, key_bytes * 2 / 1e9, combine_tasks * combine_task + combine_pods * pod_combine,
          combine_task, pod_combine,
          [(combine_pods * req["combine_pod_per_input"] * n, 0, "work/done/", pod_combine * REQUEST_LATENCY),
           (combine_tasks * reads / HASH_DIRS, combine_tasks * puts(combined_object) / HASH_DIRS,
            "work/minhash/keys/XX/")],
          rss["combine"] + combined_object, f"its object, {human(combined_object, 'B')}",
          latency=combine_task * REQUEST_LATENCY / THREADS)

    # dedup: two reads per group object, and in a band partition signature reads per object: its
    # candidates' rows are dense enough at this size that they coalesce into one read per MiB
    docs_per_partition = dedup_docs / counts["ppb"]
    sig_section = docs_per_partition / G * 4 * num_perm
    sig_reads = math.ceil(sig_section / MIB)
    dedup_task = 2 * G + sig_reads * G * bands / (bands + 2) + req["dedup_task"]
    dedup_memory = rss["dedup"] + docs_per_partition * 80 + 0.25 * docs_per_partition * 4 * num_perm
    pod_dedup = req["pod_base"] + math.ceil(D / min(pods, D))
    stage("dedup", D, per_mb["dedup"] * wet_mb, D * dedup_task + min(pods, D) * pod_dedup, dedup_task, pod_dedup,
          [(D * dedup_task / HASH_DIRS, D / HASH_DIRS, "work/dedup/combined/XX/")], dedup_memory,
          f"{human(docs_per_partition)} docs per partition x 80 B + a quarter's signatures",
          latency=dedup_task * REQUEST_LATENCY / THREADS)

    # components: round 0 reads its share of the edge files; a star round reads and writes an object per
    # task (THREADS at a time) and reads the round before's T markers one by one (a HEAD and a GET each);
    # the chart runs components.max_rounds rounds, those after the labels settled idle (the markers only)
    star, idle = rounds - 1, counts["max_rounds"] - rounds
    edge_files = D / T
    round0 = req["components_round0_per_edge_file"] * edge_files + T
    removed = n / T
    comp_task = round0 + star * (4 * T + req["components_star_extra"]) + idle * (2 * T + 3) + removed
    comp_latency = (round0 / THREADS + star * (2 * T / THREADS + 2 * T) + idle * 2 * T + removed) * REQUEST_LATENCY
    comp_cpu = comp.get("cpu_per_record_round", 1e-6) * records * rounds
    markers = T * 2 * T * (counts["max_rounds"] - 1)  # on one prefix per round (round-NNN/), not hashed
    stage("components", T, comp_cpu, T * comp_task, comp_task, req["pod_base"] + math.ceil(T / min(pods, T)),
          [(markers, 0, "work/dedup/components/round-NNN/", (counts["max_rounds"] - 1) * 2 * T * REQUEST_LATENCY),
           (0, n, "work/dedup/removed/"),
           (T * T * star / HASH_DIRS, T * T * rounds / HASH_DIRS, "work/dedup/components/XX/")],
          components_rss(T), f"{human(records)} records / {T:,} tasks x {comp.get('bytes_per_record', 70.0):.0f} B",
          latency=comp_latency, rounds_run=counts["max_rounds"])

    share = req["busiest_share"]
    stage("tokenizer", 1, cpu_m["seconds"]["tokenizer"], req["tokenizer"] + T, req["tokenizer"] + T, 0,
          [(req["tokenizer"] * share["tokenizer"], 0, req["busiest_prefix"]["tokenizer"])], rss["tokenizer"],
          "flat (its sample)")
    tokenize_task = req["tokenize_task"] + 2 * (puts(docs_object) - 1)
    pod_tokenize = req["pod_base"] + math.ceil(n / min(pods, n))
    stage("tokenize", n, per_mb["tokenize"] * wet_mb, n * tokenize_task + min(pods, n) * pod_tokenize,
          tokenize_task, pod_tokenize, [(n, n, "work/done/"), (0, n * puts(docs_object), "work/tokens/")],
          rss["tokenize"], "flat (one input)")
    # shards: shards.inputs_per_partition inputs per task, as the bench ran it; every pod first HEADs every
    # input's tokenize marker (runner.run_shards)
    shard_tasks = math.ceil(n / req["inputs_per_partition"])
    shard_pods = min(pods, shard_tasks)
    shards_task = req["shards_per_input"] * req["inputs_per_partition"]
    pod_shards = req["pod_base"] + math.ceil(shard_tasks / shard_pods) + req["shards_pod_per_input"] * n
    stage("shards", shard_tasks, per_mb["shards"] * wet_mb, shard_tasks * shards_task + shard_pods * pod_shards,
          shards_task, pod_shards,
          [(shard_pods * req["shards_pod_per_input"] * n, 0, "work/done/", pod_shards * REQUEST_LATENCY)],
          rss["shards"], f"flat ({req['inputs_per_partition']} inputs per task)")
    report_requests = req["report_per_input"] * n
    report_rss = rss["report"] + m["report"]["rss_per_input"] * n
    stage("report", 1, m["report"]["cpu_per_input"] * n, report_requests, report_requests, 0,
          [(report_requests * share["report"], 0, req["busiest_prefix"]["report"])], report_rss,
          "flat" if not m["report"]["rss_per_input"] else f"{m['report']['rss_per_input']:.0f} B per input")

    cpu = sum(s["cpu_hours"] for s in stages.values())
    wall = sum(s["wall_hours"] for s in stages.values())
    return {"wet_tb": wet_tb, "pods": pods, "inputs": n, "docs": docs, "dedup_docs": dedup_docs, "counts": counts,
            "key_bytes": key_bytes, "records": records, "stages": stages, "cpu_hours": cpu, "wall_hours": wall,
            "components_tasks": T,
            "dedup_components_requests": stages["dedup"]["requests"] + stages["components"]["requests"],
            "combine_requests": stages["combine"]["requests"]}


def _grid(top: int) -> list[int]:
    """1, 2, … top, geometrically (~5% apart): the settings the model tries."""
    out, x = [], 1.0
    while x <= top:
        if not out or int(x) != out[-1]:
            out.append(int(x))
        x *= 1.05
    return out


def goals(r: dict) -> list[tuple[str, bool, str]]:
    """Issue 31's goal at one size: (what, holds, the figure)."""
    largest = max(r["stages"].items(), key=lambda item: item[1]["memory"])
    busiest = max(r["stages"].items(), key=lambda item: item[1]["prefix_load"])
    bound = 2 * r["cpu_hours"] / r["pods"]
    return [
        ("no task above 1.5 GB", largest[1]["memory"] <= MAX_TASK_RSS,
         f"largest: {largest[0]}, {human(largest[1]['memory'], 'B')}"),
        ("no prefix above S3's rates (3,500 PUT/s, 5,500 GET/s)", busiest[1]["prefix_load"] <= 1,
         f"busiest: {busiest[0]}'s `{busiest[1]['prefix']}` at {busiest[1]['prefix_load']:.0%} of its rate"),
        ("dedup + components requests ≤ 1e9", r["dedup_components_requests"] <= GOAL_REQUESTS,
         f"{human(r['dedup_components_requests'])} (with combine's {human(r['combine_requests'])}: "
         f"{human(r['dedup_components_requests'] + r['combine_requests'])}, "
         f"${(r['dedup_components_requests'] + r['combine_requests']) * GET_DOLLARS:,.0f} at GET prices)"),
        ("wall time within 2x of CPU-hours / pods", r["wall_hours"] <= bound,
         f"{r['wall_hours']:,.1f} h against {bound:,.1f} h; of it, the pods' own requests before their first task "
         f"{sum(s['pod_hours'] for s in r['stages'].values()):,.1f} h and the one-task stages "
         f"{sum(s['wall_hours'] for s in r['stages'].values() if s['tasks'] == 1):,.1f} h"),
    ]


def limits(m: dict, pods: int) -> list[dict]:
    """What gives way first as the crawl grows (files in proportion): the size at which each stage's
    largest task passes 1.5 GB or its busiest prefix S3's rate, and the request and wall goals."""
    def at(tb: float) -> dict:
        return model(m, tb, pods, max(1, round(tb * 1e12 / CRAWL_FILE_BYTES)))

    metrics = []
    for name in STAGES:
        metrics.append((f"{name} memory", f"the largest {name} task passes 1.5 GB",
                        lambda r, s=name: r["stages"][s]["memory"] / MAX_TASK_RSS - 1))
        metrics.append((f"{name} prefix rate", f"the {name} stage's busiest prefix passes S3's per-prefix rate",
                        lambda r, s=name: r["stages"][s]["prefix_load"] - 1))
    metrics += [("dedup + components requests", "dedup and components make more than 1e9 requests",
                 lambda r: r["dedup_components_requests"] / GOAL_REQUESTS - 1),
                ("combine + dedup + components requests", "the shuffle, dedup and components together make more "
                 "than 1e9 requests", lambda r: (r["dedup_components_requests"] + r["combine_requests"]) / GOAL_REQUESTS
                 - 1)]
    rows = []
    for name, what, metric in metrics:
        lo, hi = math.log(1e-2), math.log(1e4)
        if metric(at(math.exp(lo))) > 0:
            size = None
        elif metric(at(math.exp(hi))) <= 0:
            size = math.inf
        else:
            for _ in range(30):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if metric(at(math.exp(mid))) > 0 else (mid, hi)
            size = math.exp(hi)
        rows.append({"name": name, "what": what, "wet_tb": size})
    return sorted(rows, key=lambda r: -1 if r["wet_tb"] is None else r["wet_tb"])


# ------------------------------------------------------------------ the text


def _size(tb: float | None) -> str:
    if tb is None:
        return "under 10 GB"
    return "not by 10 PB" if math.isinf(tb) else human(tb * 1e12, "B")


def render(m: dict, scale: dict) -> str:
    sources = m.get("sources", {})
    out = [f"Generated by `.venv/bin/python bench/scale_model.py --write docs/scaling.md`: request figures from "
           f"`make bench-dataprep-crawl` of {m['requests']['date']}, per-task memory from "
           + (f"`make bench-dataprep-scaling`'s flatness runs of {sources['flatness']}" if "flatness" in sources
              else f"the flatness runs of {m['rss']['date']} (the stages before combine and components)")
           + f", CPU per WET MB from the run of {m['cpu']['date']}"
           + (f", components memory from `bench/components_memory.py` of {sources['components_memory']}"
              if "components_memory" in sources else "") + ". Every S3 request 20 ms (assumed) and "
           f"{m['request_cpu'] * 1e3:.1f} ms of client CPU (measured); a combine, dedup or components task keeps "
           f"{THREADS} reads in flight, every other task one.", ""]
    for wet_tb, input_files in scale["sizes"]:
        runs = [model(m, wet_tb, pods, input_files) for pods in scale["pods"]]
        r, c = runs[0], runs[0]["counts"]
        out += [f"### {wet_tb:g} TB of WET: {input_files:,} WET files, {human(r['docs'])} documents", "",
                f"Counts: `minhash.partitions_per_band` = {c['ppb']:,} ({c['partitions']:,} dedup partitions; "
                f"the code's auto choice), `combine_partitions` = {c['combine_partitions']} ({c['ranges']:,} ranges), "
                f"{c['groups']} input groups of up to {c['group_inputs']:,} inputs ({c['groups'] * c['ranges']:,} "
                f"combine tasks), `components.tasks` = {r['components_tasks']:,} (the fewest under 1.5 GB a task); "
                f"key files and combined objects {human(r['key_bytes'], 'B')} each way "
                f"({human(r['key_bytes'] / r['dedup_docs'], 'B')} per document: its signature in every band's "
                f"section).", "",
                "| stage | tasks | CPU-hours | requests | per task | pod's own | busiest prefix: req/s, share of S3's "
                "rate | largest task | wall h, " + " / ".join(f"{p:,} pods" for p in scale["pods"]) + " |",
                "|---|---|---|---|---|---|---|---|---|"]
        for name, s in r["stages"].items():
            walls = " / ".join(f"{run['stages'][name]['wall_hours']:.2f}" for run in runs)
            out.append(f"| {name} | {s['tasks']:,} | {s['cpu_hours']:,.1f} | {human(s['requests'])} | "
                       f"{human(s['per_task'])} | {human(s['pod_own'])} | `{s['prefix']}` {human(s['prefix_rate'])}/s, "
                       f"{s['prefix_load']:.0%} | {human(s['memory'], 'B')} ({s['grows']}) | {walls} |")
        total = human(sum(s["requests"] for s in r["stages"].values()))
        out += [f"| **total** | | **{r['cpu_hours']:,.0f}** | **{total}** | | | | | **"
                + " / ".join(f"{run['wall_hours']:.1f}" for run in runs) + "** |", ""]
        for run in runs:
            out.append(f"Goal check at {run['pods']:,} pods:")
            out += [f"- {'holds' if ok else '**does not hold**'}: {what} ({figure})" for what, ok, figure in goals(run)]
            out.append("")
    out += [f"What gives way first as the crawl grows (WET files in proportion, {scale['pods'][0]:,} pods; the size at "
            "which each passes its limit):", ""]
    rows = limits(m, scale["pods"][0])
    for k, row in enumerate([row for row in rows if row["wet_tb"] is None or not math.isinf(row["wet_tb"])], 1):
        out.append(f"{k}. **{row['name']}** at {_size(row['wet_tb'])} of WET: {row['what']}.")
    never = [row["name"] for row in rows if row["wet_tb"] is not None and math.isinf(row["wet_tb"])]
    if never:
        out += ["", f"Not reached by 10 PB of WET: {', '.join(never)}."]
    req = m["requests"]
    out += ["", f"Measured per task (`make bench-dataprep-crawl`, {req['inputs']:,} inputs at its largest): "
            f"{req['combine_per_group_input']:.2f} requests per input of a combine task's group; "
            f"{req['dedup_per_object']:.2f} per group object of a dedup task; a round-0 components task "
            f"{req['components_round0_per_edge_file']:.2f} per edge file of its share; a pod of combine "
            f"{req['combine_pod_per_input']:.2f} and of shards {req['shards_pod_per_input']:.2f} per input of the "
            f"run before its first task; the report {req['report_per_input']:.1f} per input; "
            f"{req['records_per_doc']:.2f} components records per document into dedup; output byte-identical to a "
            f"one-worker local run: {req['identical']}."]
    return "\n".join(out)


def section(measured: dict, scale: dict) -> str:
    """The generated part of docs/scaling.md: the tables, then what they came from (one comment line),
    so check() can recompute them."""
    inputs = json.dumps({"measured": measured, "scale": scale}, sort_keys=True)
    return f"{render(measured, scale)}\n{INPUTS_TAG}{inputs} -->"


def generated_part(doc: str) -> str:
    return doc.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def check(doc: str) -> bool:
    """Whether a document's generated part is what its recorded inputs give (no hand edits)."""
    part = generated_part(doc)
    recorded = json.loads(part.rsplit(INPUTS_TAG, 1)[1].removesuffix(" -->"))
    return part == section(recorded["measured"], recorded["scale"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(REPO / "bench" / "out"), help="where the benchmarks wrote their JSON")
    p.add_argument("--wet-tb", type=float, nargs="+", default=[10.0, 100.0], help="crawl sizes, TB of WET")
    p.add_argument("--input-files", type=int, nargs="+", default=[90_000, 900_000],
                   help="WET files of each crawl size (one inputs task each)")
    p.add_argument("--pods", type=int, nargs="+", default=[1000, 4000], help="pods (the first: the goal check's)")
    p.add_argument("--write", metavar="MARKDOWN", help="replace the text between the scale-model markers of this file")
    args = p.parse_args()
    if len(args.wet_tb) != len(args.input_files):
        p.error("give one --input-files per --wet-tb")
    measured = load(Path(args.out))
    if "requests" not in measured:
        p.error(f"no {Path(args.out) / 'dataprep-crawl-structure.json'}: run `make bench-dataprep-crawl` first")
    scale = {"sizes": [list(x) for x in zip(args.wet_tb, args.input_files)], "pods": args.pods}
    text = section(measured, scale)
    if not args.write:
        print(text)
        return
    path = Path(args.write)
    head, rest = path.read_text().split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
