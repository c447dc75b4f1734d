import sys

from lmforge.canary.cli import main

sys.exit(main())
