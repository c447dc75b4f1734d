"""The crawl-structure proof in small (bench/dataprep_crawl_structure.py): tiny inputs on the moto S3
server, every stage run as pods in this process with each S3 request counted per task; at 4× the
inputs a dedup task, a combine task (per input of its group) and a components task make no more
requests, and the S3 output is byte-identical to a one-worker local run."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BASE_INPUTS, FACTOR, DOCS_PER_INPUT = 6, 4, 20
GROUPS, COMPONENTS_TASKS = 4, 3
# fewer LSH bands (6 key columns, not 20) and shards of 4 inputs: fewer tasks, the same structure
SETS = ["shards.inputs_per_partition=4", "minhash.bands=4", "minhash.rows=8"]


def _bench(name: str):
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_prefix_is_cut_after_the_hash_directory():
    bench = _bench("dataprep_crawl_structure")
    assert bench.prefix_of("out/work/dedup/combined/3f/g000001-r0000.bin") == "out/work/dedup/combined/3f/"
    assert bench.prefix_of("out/work/dedup/components/0a/round-001/00001-00002.npz") == "out/work/dedup/components/0a/"
    assert bench.prefix_of("out/work/done/input-000001") == "out/work/done/"
    assert bench.family_of("out/work/dedup/edges/c4/") == "out/work/dedup/edges/*/"
    assert bench.describe("GET", "http://127.0.0.1:5/b/out/work/x%20y?list-type=2&prefix=out%2Fwork%2F") == \
        ("LIST", "b", "out/work/*")


def test_requests_per_task_do_not_grow_with_the_inputs_and_the_output_equals_a_local_run(s3, tmp_path):
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no log record per request
    _, make_bucket = s3
    bench = _bench("dataprep_crawl_structure")
    scaling = _bench("dataprep_scaling")
    files = scaling.split_corpus(BASE_INPUTS * FACTOR * DOCS_PER_INPUT / scaling.DOCS_PER_MB, BASE_INPUTS * FACTOR,
                                 seed=5, out=tmp_path / "corpus")
    client = make_bucket("crawl-test-inputs")
    for path in files:
        client.upload_file(str(path), "crawl-test-inputs", path.name)
    counter = bench.RequestCounter().install()
    results = {}
    try:
        for factor in (1, FACTOR):
            structure = bench.crawl_settings(BASE_INPUTS, factor, GROUPS, COMPONENTS_TASKS)
            sets = [*bench.SMALL_RUN, *(f"{k}={v}" for k, v in structure["sets"].items()), *SETS]
            inputs = [f"s3://crawl-test-inputs/{p.name}" for p in files[: BASE_INPUTS * factor]]
            results[factor] = bench.measure(client, counter, f"t{factor}x", inputs, sets, 1, tmp_path)
    finally:
        counter.uninstall()
    small, large = results[1]["stages"], results[FACTOR]["stages"]
    assert large["dedup"]["tasks"] == FACTOR * small["dedup"]["tasks"]  # partitions per input kept
    assert large["combine"]["inputs_per_group"][1] > small["combine"]["inputs_per_group"][1]
    assert small["components"]["rounds"] >= 3 and results[1]["graph"]["edges"] > 0  # duplicates at both sizes
    assert bench.flat_failures(results, tolerance=0.10) == []
    # the fan-ins bound a task's requests, whatever the inputs: a dedup task reads two ranges and at
    # most one signature range per group object, a combine task two ranges per input of its group
    assert 2 * GROUPS < large["dedup"]["per_task_max"] <= 3 * GROUPS + 4
    assert large["combine"]["per_group_input_max"] <= 2 + 4 / large["combine"]["inputs_per_group"][0]
    assert all(r["identical"] and r["identical_files"] > 10 for r in results.values())
