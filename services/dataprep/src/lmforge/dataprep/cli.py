"""`lmforge-dataprep`: run the pipeline locally, as Indexed-Job workers, or stage by stage."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from lmforge.common.errors import CLI_ERRORS, ConfigError, report_failure
from lmforge.common.logging import get_logger
from lmforge.dataprep import runner
from lmforge.dataprep.config import load_dataprep_config

log = get_logger("dataprep")


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"environment variable {name} must be an integer, got {value!r}") from exc


def _add_common(parser: argparse.ArgumentParser, *, inputs: bool = False) -> None:
    if inputs:
        parser.add_argument("--input", nargs="+", required=True, metavar="PATH",
                            help="WET files: local paths/globs, https:// URLs, s3:// URIs (globs allowed)")
    parser.add_argument("--output", required=True, help="output directory or s3:// prefix")
    parser.add_argument("--config", help="YAML config file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set langid.threshold=0.5")


def _add_sharding(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--workers", type=int, default=None,
                        help="local processes (default: CPU count, at most 8)")
    parser.add_argument("--worker-index", type=int, default=None,
                        help=f"this worker's index among --num-workers, for {what} (default: $JOB_COMPLETION_INDEX)")
    parser.add_argument("--num-workers", type=int, default=None,
                        help="number of workers sharing the work (default: $LMFORGE_NUM_WORKERS or 1)")
    parser.add_argument("--pushgateway", default=os.environ.get("LMFORGE_PUSHGATEWAY"),
                        help="push this process's counters to a Prometheus Pushgateway when done")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lmforge-dataprep", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="the whole pipeline locally, or one Indexed-Job worker's per-input stage")
    _add_common(run, inputs=True)
    _add_sharding(run, "the per-input stage")

    for name, text in (("dedup", "group one slice of the dedup partitions (LSH bands, URL, content)"),
                       ("tokenize", "tokenize one slice of the inputs")):
        stage = sub.add_parser(name, help=text)
        _add_common(stage)
        _add_sharding(stage, name)
    for name, text in (("cluster", "connected components over all dedup edges"),
                       ("tokenizer", "train the BPE tokenizer on a sample (or load tokenizer.path)"),
                       ("shards", "shuffle, split and write shards, lineage and manifest.json"),
                       ("report", "write report.json and report.html")):
        stage = sub.add_parser(name, help=text)
        _add_common(stage)
    finalize = sub.add_parser("finalize", help="every global stage after the workers: dedup → report")
    _add_common(finalize)
    finalize.add_argument("--workers", type=int, default=None, help="local processes")

    sample = sub.add_parser("sample", help="print random kept and dropped documents with drop reasons")
    sample.add_argument("--output", required=True, help="a data-prep output directory")
    sample.add_argument("--n", type=int, default=100)
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--chars", type=int, default=300, help="characters of text shown per document")

    data = sub.add_parser("sample-data", help="write a synthetic, realistic WET file for demos and tests")
    data.add_argument("--output", required=True, help="file to write (.warc.wet or .warc.wet.gz)")
    data.add_argument("--docs", type=int, default=2000)
    data.add_argument("--seed", type=int, default=0)

    fetch = sub.add_parser("fetch", help="download a crawl's wet.paths.gz and its first N WET files, resumably")
    fetch.add_argument("--crawl", required=True, help="crawl id, e.g. CC-MAIN-2024-22")
    fetch.add_argument("--shards", type=int, required=True)
    fetch.add_argument("--output", required=True)
    fetch.add_argument("--base-url", default="https://data.commoncrawl.org",
                       help="https:// mirror or s3://commoncrawl")
    return parser


def _sharding(args) -> tuple[int | None, int]:
    index = args.worker_index if args.worker_index is not None else _env_int("JOB_COMPLETION_INDEX")
    count = args.num_workers or _env_int("LMFORGE_NUM_WORKERS") or 1
    return index, count


def _processes(args) -> int:
    return args.workers if getattr(args, "workers", None) else runner.default_processes()


def _open(args, with_inputs: bool) -> runner.Run:
    """Workers load the config (file, env, --set); global stages reuse the one the
    workers recorded unless a config is given explicitly."""
    explicit = with_inputs or args.config or args.overrides
    config = load_dataprep_config(args.config, args.overrides) if explicit else None
    return runner.open_run(args.output, config, args.input if with_inputs else None, _processes(args))


def _push(args, run: runner.Run, worker: str, indices: list[int]) -> None:
    """Push the counters of the inputs this process was responsible for."""
    if not getattr(args, "pushgateway", None):
        return
    from lmforge.dataprep.metrics import DataprepMetrics

    metrics = DataprepMetrics()
    metrics.record_inputs(run.store, indices)
    metrics.push(args.pushgateway, worker)


def cmd_run(args) -> int:
    run = _open(args, with_inputs=True)
    index, count = _sharding(args)
    if index is None:
        started = time.perf_counter()
        report = runner.run_all(run)
        log.info("run_complete", output=run.store.uri, report=report, seconds=round(time.perf_counter() - started, 2))
        sys.stderr.write(f"report: {report}\n")
        _push(args, run, "local", list(range(run.n_inputs)))
        return 0
    indices = runner.worker_slice(run.n_inputs, index, count)
    runner.run_inputs(run, indices)
    log.info("worker_complete", worker_index=index, num_workers=count)
    _push(args, run, str(index), indices)
    return 0


def cmd_dedup(args) -> int:
    run = _open(args, with_inputs=False)
    index, count = _sharding(args)
    plan_count = runner.PartitionPlan.from_config(run.config.minhash).count
    runner.run_dedup(run, None if index is None else runner.worker_slice(plan_count, index, count))
    return 0


def cmd_tokenize(args) -> int:
    run = _open(args, with_inputs=False)
    index, count = _sharding(args)
    runner.run_tokenize(run, None if index is None else runner.worker_slice(run.n_inputs, index, count))
    return 0


def cmd_simple(args) -> int:
    run = _open(args, with_inputs=False)
    {"cluster": runner.run_cluster, "tokenizer": runner.run_tokenizer, "shards": runner.run_shards,
     "report": runner.run_report}[args.command](run)
    return 0


def cmd_finalize(args) -> int:
    run = _open(args, with_inputs=False)
    runner.run_dedup(run)
    runner.run_cluster(run)
    runner.run_tokenizer(run)
    runner.run_tokenize(run)
    runner.run_shards(run)
    sys.stderr.write(f"report: {runner.run_report(run)}\n")
    return 0


def cmd_sample(args) -> int:
    from lmforge.dataprep.sampling import print_sample

    print_sample(args.output, args.n, args.seed, args.chars, sys.stdout)
    return 0


def cmd_sample_data(args) -> int:
    from lmforge.dataprep.sample_data import write_sample_wet

    summary = write_sample_wet(args.output, args.docs, args.seed)
    log.info("sample_data_written", output=args.output, docs=args.docs, seed=args.seed,
             bytes=os.path.getsize(args.output), kinds=getattr(summary, "kind_counts", None))
    return 0


def cmd_fetch(args) -> int:
    from pathlib import Path

    from lmforge.dataprep.fetch import fetch_crawl

    paths = fetch_crawl(args.crawl, args.shards, Path(args.output), base_url=args.base_url, log=log)
    log.info("fetch_complete", files=[str(p) for p in paths])
    return 0


COMMANDS = {"run": cmd_run, "dedup": cmd_dedup, "tokenize": cmd_tokenize, "cluster": cmd_simple,
            "tokenizer": cmd_simple, "shards": cmd_simple, "report": cmd_simple, "finalize": cmd_finalize,
            "sample": cmd_sample, "sample-data": cmd_sample_data, "fetch": cmd_fetch}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except CLI_ERRORS as exc:
        return report_failure(log, f"lmforge-dataprep {args.command}", exc, command=args.command)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; rerun the same command to resume\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
