"""`lmforge-sample-data`: synthetic, realistic WET files for demos, tests and benchmarks.

lmforge-sample-data --output sample.warc.wet.gz --docs 3000 --seed 7
lmforge-sample-data --output s3://lmforge/datasets/sample/wet --files 2   # the data pipeline's crawl "sample"
"""

from __future__ import annotations

import argparse
import sys

from lmforge.common.cli import ServiceCli
from lmforge.common.errors import InputError
from lmforge.common.logging import get_logger
from lmforge.sample_data.inputs import write_sample_inputs
from lmforge.sample_data.wet import write_sample_wet


def generate(args: argparse.Namespace, _config: None) -> int:
    if args.docs < 0 or (args.files is not None and args.files < 1):
        raise InputError("--docs must be at least 0 and --files at least 1")
    if args.files is None:
        written = [(args.output, write_sample_wet(args.output, args.docs, args.seed))]
    else:
        written = write_sample_inputs(args.output, args.files, args.docs, args.seed)
    log = get_logger("sample_data")
    for uri, summary in written:
        log.info(
            "sample_data_written",
            output=uri,
            docs=summary.docs,
            seed=summary.seed,
            bytes=summary.size_bytes,
            kinds=summary.counts,
        )
    return 0


def build_cli() -> ServiceCli:
    cli = ServiceCli("lmforge-sample-data", service="sample_data", description=__doc__)
    parser = cli.command(None, generate)
    parser.add_argument(
        "--output",
        required=True,
        help="the file to write (.warc.wet or .warc.wet.gz); with --files, a directory or s3:// prefix",
    )
    parser.add_argument("--docs", type=int, default=2000, help="documents per file")
    parser.add_argument(
        "--seed", type=int, default=0, help="the (first) file's seed; the output depends on docs and seed only"
    )
    parser.add_argument(
        "--files", type=int, metavar="N", help="write N files, sample-00000.warc.wet.gz …, seeds SEED, SEED+1, …"
    )
    return cli


CLI = build_cli()
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
