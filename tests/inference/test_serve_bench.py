"""The serving benches (bench/serve/): engine_split_bench.py's old-against-new servers at a tiny size,
the process-tree CPU it charges each server with, and serve_bench.py's GPU suite where no GPU is."""

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "serve"


def bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_serve_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def split():
    return bench_module("engine_split_bench")


# A parent that starts two children burning 0.4 s of CPU each: one exits (and is waited for: its
# time is then in the parent's cutime), one stays alive (its own /proc line counts it).
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    burn = "import time\\nwhile time.process_time() < 0.4: pass\\n"
    live = subprocess.Popen([sys.executable, "-c", burn + "print('burnt', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    subprocess.run([sys.executable, "-c", burn], check=True)
    live.stdout.readline()
    print("ready", flush=True)
    time.sleep(60)
""")


def test_a_servers_cpu_counts_its_children_live_and_exited():
    process_cpu = bench_module("process_cpu")
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    tree = {}
    try:
        assert parent.stdout.readline().strip() == "ready"
        tree = process_cpu.process_tree(parent.pid)
        total = process_cpu.tree_cpu_seconds(parent.pid)
        fields = Path(f"/proc/{parent.pid}/stat").read_text().rsplit(")", 1)[1].split()
        own, reaped = (int(fields[11]) + int(fields[12])) / process_cpu.TICKS, \
            (int(fields[13]) + int(fields[14])) / process_cpu.TICKS
        (live,) = (pid for pid in tree if pid != parent.pid)
        assert len(tree) == 2
        assert tree[live] / process_cpu.TICKS >= 0.39  # the live child, by its own line
        assert reaped >= 0.39  # the exited one, through the parent's cutime
        assert total >= own + 0.78 and total == pytest.approx(sum(tree.values()) / process_cpu.TICKS)
    finally:
        for pid in tree:  # the live child (the parent's own sleep(60) would leave it behind)
            if pid != parent.pid:
                os.kill(pid, signal.SIGKILL)
        parent.kill()
        parent.wait()


def test_old_and_new_servers_report_real_numbers_for_equal_work(split, tmp_path):
    """The suite's core at a tiny size: the old engine from HEAD's tree (extracted, run from those
    sources alone), the new from the working tree, one round at 1 and 2 clients."""
    head = split.resolve_rev("HEAD")
    (tmp_path / "baseline").mkdir()
    sides = {"old": split.Side("old", head, split.extract_baseline(head, tmp_path / "baseline"), 1),
             "new": split.Side("new", None, None, 1)}
    settings = {**split.DEFAULTS, "presets": ["tiny"], "clients": [1, 2], "requests": {1: 2, 2: 2}, "max_tokens": 8,
                "prompt_tokens": (8, 32), "rounds": 1, "docs": 120}
    started = time.monotonic()
    report = split.run_suite(sides, settings, tmp_path / "work", tmp_path / "split.json", log=lambda line: None)
    assert time.monotonic() - started < 60

    checks = report["checks"]
    assert checks["ok"] and checks["all_ran_to_max_tokens"] and checks["same_requests_and_tokens_across_engines"]
    assert report["complete"] and json.loads((tmp_path / "split.json").read_text())["checks"] == checks
    assert [(t["side"], t["clients"]) for t in report["table"]] == [("old", 1), ("old", 2), ("new", 1), ("new", 2)]
    for row in report["table"]:
        for key in ("tokens_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "server_cpu_s_per_token"):
            assert isinstance(row[key], float) and math.isfinite(row[key]) and row[key] > 0, (row["side"], key)
        assert row["ttft_p50_s"] <= row["ttft_p99_s"] and row["tpot_p50_s"] <= row["tpot_p99_s"]
        assert row["generated_tokens_per_round"] == [2 * 8] and row["server_processes"] >= 1
    old_log = (tmp_path / "work" / "server-tiny-old.log").read_text()
    assert f"lmforge.inference from {tmp_path / 'baseline' / 'services'}" in old_log
    assert report["sides"]["new"]["rev"] == "working tree" and report["sides"]["old"]["omp_num_threads"] == 1
    # the goals need 16 and 64 clients: none measured here, none claimed
    assert report["goals"]["speedup"]["tiny"]["new_over_old"] is None
    assert report["goals"]["batching_gain"]["tiny"]["new"]["met"] is None
    table = split.markdown(report)
    assert "| tiny | new | 2 |" in table and "new/old tokens/s at 64 clients, tiny: - (goal >= 2x)" in table


def test_the_split_bench_refuses_a_prompt_that_cannot_fit_the_context(split, capsys):
    with pytest.raises(SystemExit):
        split.parse_args(["--prompt-tokens", "16", "200", "--max-tokens", "64"])
    assert "must fit the context (256)" in capsys.readouterr().err
    args, settings = split.parse_args(["--new-threads", "0", "--requests", "5"])
    assert settings["new_threads"] == 0 and settings["requests"] == {1: 5, 16: 5, 64: 5}
    assert settings["presets"] == ["tiny", "llama-debug"] and args.baseline_rev == "2b6636f"


def test_the_gpu_suite_covers_two_presets_and_stops_at_once_without_cuda():
    serve_bench = bench_module("serve_bench")
    from lmforge.model.config import PRESETS

    _, suite = serve_bench.parse_args(["--suite", "gpu"])
    assert suite["presets"] == ["350m", "llama-1b"] and set(suite["presets"]) <= set(PRESETS)
    assert suite["clients"] == [1, 16, 64] and suite["device"] == "cuda"
    _, suite = serve_bench.parse_args(["--suite", "gpu", "--preset", "350m,llama-1b", "tiny"])
    assert suite["presets"] == ["350m", "llama-1b", "tiny"]

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU for this run, on any machine
    done = subprocess.run([sys.executable, str(BENCH / "serve_bench.py"), "--suite", "gpu", "--out", os.devnull],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1
    assert "device cuda: no CUDA device here" in done.stderr and "package" not in done.stdout

    gpu_busy = bench_module("gpu_busy")
    with gpu_busy.GpuBusy(interval_s=0.05) as busy:
        time.sleep(0.3)
    summary = busy.summary()
    if summary["source"] is None:  # no NVML, no nvidia-smi: said, not failed
        assert summary["samples"] == 0 and summary["mean_pct"] is None and "nvml" in summary["error"]
    else:
        assert summary["samples"] >= 1 and 0 <= summary["mean_pct"] <= 100
