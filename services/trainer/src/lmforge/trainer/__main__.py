"""`torchrun --nproc_per_node=N -m lmforge.trainer --config FILE [key=value …]`."""

import argparse
import sys

from lmforge.common.errors import CLI_ERRORS, report_failure
from lmforge.common.logging import get_logger
from lmforge.trainer.config import load_train_config
from lmforge.trainer.train import train


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmforge.trainer")
    parser.add_argument("--config", help="YAML config file")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        train(load_train_config(args.config, args.overrides))
    except CLI_ERRORS as exc:
        return report_failure(get_logger("trainer"), "lmforge trainer", exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
