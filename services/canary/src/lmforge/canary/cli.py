"""`lmforge-canary [run]`: evaluate the deployed model on a fixed canary set (held-out perplexity
through POST /v1/completions with echo and logprobs, prompt → expected-continuation checks through
greedy completions),
compare with the stored baseline, push lmforge_canary_* gauges to a Pushgateway, print a table.
`lmforge-canary make-baseline`: record the baseline from a known-good deployment."""

from __future__ import annotations

import sys

from lmforge.canary.baseline import Baseline, ensure_comparable, read_baseline, write_baseline
from lmforge.canary.client import API_KEY_ENV, InferenceClient, resolve_api_key
from lmforge.canary.compare import compare
from lmforge.canary.config import CanaryConfig, load_canary_config
from lmforge.canary.evalset import EvalSet, load_eval_set
from lmforge.canary.evaluate import EvalResult, evaluate
from lmforge.canary.metrics import PushError, build_registry, push
from lmforge.canary.report import render
from lmforge.common.cli import ServiceCli
from lmforge.common.logging import get_logger

EXIT_PASS = 0
EXIT_REGRESSION = 1
EXIT_INTERNAL = 70  # a bug: never confused with a regression
EXIT_CODES = """exit codes:
  0   passed (also when there is no baseline to compare with: the table says so)
  1   regression beyond the tolerance (the metrics are pushed: lmforge_canary_passed 0)
  2   bad configuration or flags; the endpoint refused the API key (401/403)
  3   bad input: the eval set or the baseline file is invalid, or the baseline was recorded
      with another eval set, or the endpoint rejected an eval item (400/422)
  4   the endpoint (or the baseline's store) cannot be reached or keeps failing; a local
      file cannot be written or read (disk full, a file where a directory belongs); a failed
      push when push.required is true and the run passed (otherwise a failed push is
      logged and shown, and the exit code is the verdict's)
  70  internal error (a bug; the trace is in the log)"""


def _evaluate(args, config: CanaryConfig) -> tuple[EvalSet, EvalResult, Baseline | None]:
    api_key = resolve_api_key(args.api_key_file)
    evalset = load_eval_set(args.eval_set)
    baseline = None
    if getattr(args, "baseline", None):
        baseline = read_baseline(args.baseline)
        if baseline is None:
            get_logger("canary").warning("baseline_missing", baseline=args.baseline)
        else:
            ensure_comparable(baseline, evalset, args.baseline, args.eval_set)
    with InferenceClient(args.endpoint, config.http, api_key, config.model,
                         trace_endpoint=config.memorization.endpoint) as client:
        result = evaluate(client, evalset, config.default_max_tokens, config.memorization)
    return evalset, result, baseline


def run(args, config: CanaryConfig) -> int:
    log = get_logger("canary")
    evalset, result, baseline = _evaluate(args, config)
    verdict = compare(result, baseline, config.tolerance)
    push_error = None
    if args.pushgateway:
        try:
            key = push(args.pushgateway, build_registry(result, verdict, baseline), result.model, config.push)
            labels = ", ".join(f"{k}={v}" for k, v in {"job": config.push.job, **key}.items())
            push_status = f"pushed to {args.pushgateway} ({labels})"
            log.info("metrics_pushed", pushgateway=args.pushgateway, job=config.push.job, grouping_key=key)
        except PushError as exc:
            push_error, push_status = exc, f"NOT pushed: {exc}"
            log.error("push_failed", pushgateway=args.pushgateway, error=str(exc), required=config.push.required)
    else:
        push_status = "not pushed (no --pushgateway)"
    code = EXIT_PASS if verdict.passed else EXIT_REGRESSION
    if code == EXIT_PASS and push_error is not None and config.push.required:
        code = push_error.exit_code
    log_result = log.info if verdict.passed else log.error
    log_result("canary_result", verdict="pass" if verdict.passed else "regression", passed=verdict.passed,
               model=result.model, perplexity=result.perplexity, score=result.score,
               baseline=args.baseline if baseline is not None else None,
               baseline_perplexity=baseline.perplexity if baseline is not None else None,
               baseline_score=baseline.score if baseline is not None else None, reasons=verdict.reasons,
               notes=verdict.notes, newly_failing=verdict.newly_failing, pushed=bool(args.pushgateway)
               and push_error is None, exit_code=code)
    sys.stdout.flush()
    sys.stderr.write(render(result, evalset, verdict, baseline, args.baseline, config.tolerance, push_status))
    return code


def make_baseline(args, config: CanaryConfig) -> int:
    log = get_logger("canary")
    evalset, result, _ = _evaluate(args, config)
    write_baseline(args.output, result)
    failing = [c.id for c in result.checks if not c.passed]
    if failing:
        log.warning("baseline_has_failing_checks", failing=failing,
                    hint="a baseline should come from a known-good deployment")
    log.info("baseline_written", output=args.output, model=result.model, perplexity=result.perplexity,
             score=result.score, tokens=result.tokens)
    sys.stdout.flush()
    sys.stderr.write(render(result, evalset, None, None, None, config.tolerance, None)
                     + f"baseline written: {args.output}\n")
    return EXIT_PASS


def build_cli() -> ServiceCli:
    # 1 means "regression" only: an untyped LmforgeError and a bug exit 70 (EXIT_INTERNAL).
    cli = ServiceCli("lmforge-canary", service="canary", description=__doc__, epilog=EXIT_CODES,
                     load_config=load_canary_config, default_command="run", internal_exit_code=EXIT_INTERNAL)
    run_cmd = cli.command("run", run, help="evaluate, compare with the baseline, push, print (the default command)",
                          config="load")
    make = cli.command("make-baseline", make_baseline, help="record the baseline from a known-good deployment",
                       config="load")
    for command in (run_cmd, make):
        command.add_argument("--endpoint", required=True, help="the inference server's base URL, "
                             "e.g. http://lmforge-inference:8000")
        command.add_argument("--eval-set", required=True, metavar="FILE", help="the eval-set file (YAML or JSON)")
        command.add_argument("--api-key-file", metavar="FILE",
                             help=f"a file holding the API key (a mounted Secret); else env {API_KEY_ENV}")
    run_cmd.add_argument("--baseline", metavar="FILE", help="the baseline (a path or s3://BUCKET/KEY); missing: the "
                         "run passes and says there was nothing to compare with")
    run_cmd.add_argument("--pushgateway", metavar="URL", help="push the lmforge_canary_* metrics here")
    make.add_argument("--output", required=True, metavar="FILE", help="where to write the baseline "
                      "(a path or s3://BUCKET/KEY; replaced atomically)")
    return cli


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
