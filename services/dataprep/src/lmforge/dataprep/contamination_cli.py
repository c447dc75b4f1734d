"""`lmforge-dataprep contamination-report`: how much of an evaluation set the training data holds verbatim.

Each eval set (JSONL, read by the contamination step's reader: steps/contamination.py) is traced against
the run's trace index (`trace-index/` in the output unless --index names another, local or s3://, fetched
through lmforge.trace.cache) by lmforge.trace.contamination, and written next to the run's report as
`reports/contamination-<eval set>.json` and `.html` (the data-prep report links every such page). The
index's own tokenizer.json tokenizes the items, so they are counted in the tokens the model trained on.
A missing index or eval set exits 3 (InputError) with one line, a storage error 4."""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from pathlib import Path

from lmforge.common.errors import InputError
from lmforge.common.logging import get_logger
from lmforge.common.storage import open_store
from lmforge.dataprep.layout import TRACE_INDEX

log = get_logger("dataprep")
# reports/contamination-<eval set>.{json,html}; report.py links the pages (the engine, the tokenizer and the
# templates are imported when the command runs, not by every lmforge-dataprep command)


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def add_contamination_report(cli) -> None:
    """Declare the command on the `lmforge-dataprep` ServiceCli."""
    parser = cli.command("contamination-report", cmd_contamination_report,
                         help="per eval-set item, the longest span found verbatim in the training data, and where "
                              "(needs the trace index)")
    parser.add_argument("--output", required=True, help="the data-prep output (directory or s3:// prefix): the "
                        "reports are written to its reports/")
    parser.add_argument("--eval-set", required=True, action="append", metavar="PATH",
                        help="a JSONL eval set (.jsonl or .jsonl.gz, local or s3://), one item per line with a "
                             "'text' field; repeatable, one report each")
    parser.add_argument("--index", metavar="URI", help=f"the trace index (default: OUTPUT/{TRACE_INDEX})")
    parser.add_argument("--cache-dir", metavar="DIR",
                        help="where an s3:// index is downloaded and kept (default: a temporary directory)")
    parser.add_argument("--min-span-tokens", type=_positive, default=8, metavar="N",
                        help="shortest span reported, in tokens (default: 8)")
    parser.add_argument("--max-documents", type=_positive, default=3, metavar="N",
                        help="source documents listed per item (default: 3)")
    parser.add_argument("--text-field", default="text", metavar="NAME",
                        help="the JSONL field holding an item's text (default: text)")
    parser.add_argument("--id-field", default="id", metavar="NAME",
                        help="the JSONL field holding an item's id (default: id; without it, the item's line number)")


def _items(path: str, text_field: str, id_field: str) -> list[dict]:
    from lmforge.dataprep.steps.contamination import read_eval_set

    return [{"id": str(record.get(id_field, f"line {line}")), "text": record[text_field]}
            for line, record in read_eval_set(path, text_field)]


def _open_index(uri: str, cache_dir: Path):
    """(the TraceIndex, its tokenizers.Tokenizer)."""
    import tokenizers

    from lmforge.trace.cache import fetch_index
    from lmforge.trace.engine import TraceIndex
    from lmforge.trace.format import TOKENIZER

    root = fetch_index(uri, cache_dir)
    index = TraceIndex.open(root)
    tokenizer_path = root / TOKENIZER
    if not tokenizer_path.is_file():
        raise InputError(f"trace index {uri} has no {TOKENIZER}: rerun the data-prep report stage")
    return index, tokenizers.Tokenizer.from_file(str(tokenizer_path))


def render_contamination_html(report: dict) -> str:
    """The report as one self-contained page (the shared layout of lmforge.pages; every string escaped)."""
    from lmforge.pages.html_pages import render

    return render("lmforge.dataprep", "dataprep/contamination.html",
                  title=f"Contamination of {report['eval_set']['name']}", report=report)


def cmd_contamination_report(args, _config: None) -> int:
    from lmforge.dataprep.report import CONTAMINATION_REPORTS
    from lmforge.dataprep.steps.contamination import eval_set_name
    from lmforge.trace.contamination import contamination_report

    index_uri = args.index or f"{args.output.rstrip('/')}/{TRACE_INDEX}"
    with contextlib.ExitStack() as stack:
        cache_dir = Path(args.cache_dir) if args.cache_dir else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="lmforge-trace-")))
        index, tokenizer = _open_index(index_uri, cache_dir)
        sets = [(path, eval_set_name(path), _items(path, args.text_field, args.id_field)) for path in args.eval_set]
        store = stack.enter_context(contextlib.closing(open_store(args.output)))
        for path, name, items in sets:
            report = contamination_report(index, tokenizer, items, min_span_tokens=args.min_span_tokens,
                                          max_documents=args.max_documents)
            report = {"eval_set": {"name": name, "path": path}, "index_uri": index_uri, **report}
            base = f"{CONTAMINATION_REPORTS}{name}"
            store.write_text(f"{base}.json", json.dumps(report, indent=1, ensure_ascii=False) + "\n")
            store.write_text(f"{base}.html", render_contamination_html(report))
            log.info("contamination_report_written", eval_set=path, report=store.join(f"{base}.html"),
                     **report["summary"])
    return 0
