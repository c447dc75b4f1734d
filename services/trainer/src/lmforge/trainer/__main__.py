"""`torchrun --nproc_per_node=N -m lmforge.trainer --config FILE [key=value …]`."""

import sys

from lmforge.common.cli import ServiceCli
from lmforge.trainer.config import load_train_config
from lmforge.trainer.train import train


def _train(args, config) -> int:
    train(config)
    return 0


CLI = ServiceCli("python -m lmforge.trainer", name="lmforge trainer", service="trainer", load_config=load_train_config,
                 set_help=None)
CLI.command(None, _train, config="load")
main = CLI.main


if __name__ == "__main__":
    sys.exit(main())
