"""`torchrun --nproc_per_node=N -m lmforge.trainer --config FILE [key=value …]`."""

import sys

from lmforge.common.cli import ServiceCli
from lmforge.trainer.config import load_train_config
from lmforge.trainer.launch import die_with_launcher
from lmforge.trainer.process_exit import frozen_exit
from lmforge.trainer.train import train


def _train(args, config) -> int:
    train(config)
    return 0


CLI = ServiceCli("python -m lmforge.trainer", name="lmforge trainer", service="trainer", load_config=load_train_config,
                 set_help=None)
CLI.command(None, _train, config="load")


def main(argv=None) -> int:
    die_with_launcher()
    return CLI.main(argv)


if __name__ == "__main__":
    sys.exit(frozen_exit(main()))
