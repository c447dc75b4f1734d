"""`lmforge-dataprep`: run the pipeline locally, as Indexed-Job workers, or stage by stage."""

from __future__ import annotations

import argparse
import os
import sys
import time

from lmforge.common.cli import ServiceCli
from lmforge.common.errors import ConfigError
from lmforge.common.logging import get_logger
from lmforge.dataprep import stage_runs
from lmforge.dataprep.classifier_cli import add_train_classifier_options, settings_from_args, sources_from_args
from lmforge.dataprep.config import DataprepConfig, load_dataprep_config
from lmforge.dataprep.contamination_cli import add_contamination_report
from lmforge.dataprep.stages import GLOBAL_STAGES, ROUNDS, stage

log = get_logger("dataprep")
OUTPUT_HELP = "output directory or s3:// prefix"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise ConfigError(f"environment variable {name} must be an integer, got {value!r}") from exc


def _add_sharding(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--workers", type=int, default=None,
                        help="local processes (default: CPU count, at most 8)")
    parser.add_argument("--worker-index", type=int, default=None,
                        help=f"this worker's index among --num-workers, for {what} (default: $JOB_COMPLETION_INDEX)")
    parser.add_argument("--num-workers", type=int, default=None,
                        help="number of workers sharing the work (default: $LMFORGE_NUM_WORKERS or 1)")
    parser.add_argument("--pushgateway", default=os.environ.get("LMFORGE_PUSHGATEWAY"),
                        help="push this process's counters to a Prometheus Pushgateway when done")


def _sharding(args) -> tuple[int | None, int]:
    index = args.worker_index if args.worker_index is not None else _env_int("JOB_COMPLETION_INDEX")
    count = args.num_workers or _env_int("LMFORGE_NUM_WORKERS") or 1
    return index, count


def _processes(args) -> int:
    return args.workers if getattr(args, "workers", None) else stage_runs.default_processes()


def _open(args, config: DataprepConfig | None) -> stage_runs.Run:
    """Workers load the config (file, env, --set); global stages (config None) reuse the one
    the workers recorded unless a config is given explicitly."""
    return stage_runs.open_run(args.output, config, getattr(args, "input", None), _processes(args))


def _push(args, run: stage_runs.Run, worker: str, indices: list[int]) -> None:
    """Push the counters of the inputs this process was responsible for."""
    if not getattr(args, "pushgateway", None):
        return
    from lmforge.dataprep.metrics import DataprepMetrics

    metrics = DataprepMetrics()
    metrics.record_inputs(run.store, indices)
    metrics.push(args.pushgateway, worker)


def cmd_run(args, config: DataprepConfig) -> int:
    with _open(args, config) as run:
        index, count = _sharding(args)
        if index is None:
            started = time.perf_counter()
            report = stage_runs.run_all(run)
            seconds = round(time.perf_counter() - started, 2)
            log.info("run_complete", output=run.store.uri, report=report, seconds=seconds)
            sys.stderr.write(f"report: {report}\n")
            _push(args, run, "local", list(range(run.n_inputs)))
            return 0
        indices = stage_runs.worker_slice(run.n_inputs, index, count)
        stage_runs.run_inputs(run, indices)
        log.info("worker_complete", worker_index=index, num_workers=count)
        _push(args, run, str(index), indices)
    return 0


def cmd_stage(args, config: DataprepConfig | None) -> int:
    """A global stage (stages.py): all its tasks, or a worker's slice of them (of one round)."""
    index, count = _sharding(args) if stage(args.command).split else (None, 1)
    if index is not None and stage(args.command).kind == ROUNDS and args.round is None:
        raise ConfigError(f"a {args.command} worker runs one round's slice: give --round (one Indexed Job per round)")
    with _open(args, config) as run:
        result = stage_runs.run_stage(run, args.command, index, count, round=getattr(args, "round", None))
        if args.command == "report":
            sys.stderr.write(f"report: {result}\n")
    return 0


def cmd_finalize(args, config: DataprepConfig | None) -> int:
    with _open(args, config) as run:
        sys.stderr.write(f"report: {stage_runs.run_global_stages(run)}\n")
    return 0


def cmd_sample(args, _config: None) -> int:
    from lmforge.dataprep.sampling import SIDES, print_sample

    sides = SIDES if args.side == "both" else (args.side,)
    print_sample(args.output, args.n, args.seed, args.chars, sys.stdout, step=args.step, sides=sides,
                 as_json=args.json, err=sys.stderr)
    return 0


def cmd_fetch(args, _config: None) -> int:
    from pathlib import Path

    from lmforge.dataprep.fetch import fetch_crawl

    paths = fetch_crawl(args.crawl, args.shards, Path(args.output), base_url=args.base_url, log=log, kind=args.kind)
    log.info("fetch_complete", files=[str(p) for p in paths])
    return 0


def cmd_train_ngram(args, _config: None) -> int:
    from lmforge.dataprep.train_ngram import train_ngram

    model = train_ngram(args.input, args.output, order=args.order, text_field=args.text_field,
                        normalize=not args.no_normalize)
    log.info("train_ngram_complete", output=args.output, order=model.order,
             ngrams=[len(grams) for grams in model.adjusted])
    return 0


def cmd_train_classifier(args, _config: None) -> int:
    from lmforge.dataprep.classifier_training import train_classifier

    train_classifier(sources_from_args(args), args.output, settings_from_args(args), sys.stdout)
    return 0


def build_cli() -> ServiceCli:
    cli = ServiceCli("lmforge-dataprep", service="dataprep", description=__doc__, load_config=load_dataprep_config,
                     set_help="override a config field, e.g. --set steps.langid.threshold=0.5",
                     interrupted="interrupted; rerun the same command to resume")
    run = cli.command("run", cmd_run, config="load",
                      help="the whole pipeline locally, or one Indexed-Job worker's per-input stage")
    run.add_argument("--input", nargs="+", required=True, metavar="PATH",
                     help="WET or WARC files: local paths/globs, https:// URLs, s3:// URIs (globs allowed)")
    run.add_argument("--output", required=True, help=OUTPUT_HELP)
    _add_sharding(run, "the per-input stage")

    # The global stages, as stages.py declares them: with no --config or --set, the config the
    # workers recorded.
    for declared in GLOBAL_STAGES:
        command = cli.command(declared.name, cmd_stage, help=declared.help, config="explicit")
        command.add_argument("--output", required=True, help=OUTPUT_HELP)
        if declared.split:
            _add_sharding(command, declared.name)
        if declared.kind == ROUNDS:
            command.add_argument("--round", type=int, default=None,
                                 help="the round a worker's slice belongs to (one Indexed Job per round); "
                                      "without: every round, then the summary")
    finalize = cli.command("finalize", cmd_finalize, config="explicit",
                           help="every global stage after the workers, in order: "
                                + " → ".join(s.name for s in GLOBAL_STAGES))
    finalize.add_argument("--output", required=True, help=OUTPUT_HELP)
    finalize.add_argument("--workers", type=int, default=None, help="local processes")

    sample = cli.command("sample", cmd_sample,
                         help="print random kept and dropped documents (of the run or of one step) with drop reasons")
    sample.add_argument("--output", required=True, help="a data-prep output directory")
    sample.add_argument("--n", type=int, default=100)
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--chars", type=int, default=300, help="characters of text shown per document")
    sample.add_argument("--step", default=None, metavar="ID",
                        help="documents one step removed, and documents that passed it (default: the run's output "
                             "and every rejected document)")
    sample.add_argument("--side", choices=("kept", "removed", "both"), default="both",
                        help="draw kept documents, removed ones, or half of each")
    sample.add_argument("--json", action="store_true",
                        help="one JSON object per line (url, step, side, reason, text, doc_id); the count to stderr")

    fetch = cli.command("fetch", cmd_fetch,
                        help="download a crawl's wet.paths.gz (or warc.paths.gz) and its first N files, resumably")
    fetch.add_argument("--crawl", required=True, help="crawl id, e.g. CC-MAIN-2024-22")
    fetch.add_argument("--shards", type=int, required=True)
    fetch.add_argument("--kind", choices=["wet", "warc"], default="wet",
                       help="WET (extracted text) or WARC (HTML responses; `run` extracts their main text)")
    fetch.add_argument("--output", required=True)
    fetch.add_argument("--base-url", default="https://data.commoncrawl.org",
                       help="https:// mirror or s3://commoncrawl")

    ngram = cli.command("train-ngram", cmd_train_ngram,
                        help="estimate a modified Kneser-Ney n-gram model (ARPA, for KenLM) for the perplexity step")
    ngram.add_argument("--input", nargs="+", required=True, metavar="PATH",
                       help=".txt, .jsonl(.gz) or .parquet files, directories or globs (e.g. a data-prep output's "
                            "work/docs/*.parquet)")
    ngram.add_argument("--output", required=True, help="the .arpa file to write")
    ngram.add_argument("--order", type=int, default=3,
                       help="n-gram order (CCNet used 5 with lmplz; this estimator holds the counts in memory)")
    ngram.add_argument("--text-field", default="text", help="the JSONL field / Parquet column of the text")
    ngram.add_argument("--no-normalize", action="store_true",
                       help="keep the text as it is (default: normalize as CCNet, as the kenlm backend does)")
    add_train_classifier_options(cli.command(
        "train-classifier", cmd_train_classifier,
        help="train a fastText classifier (DCLM's recipe) from labelled JSONL files or data-prep outputs"))
    add_contamination_report(cli)
    return cli


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
