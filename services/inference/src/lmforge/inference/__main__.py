import sys

from lmforge.inference.cli import main

sys.exit(main())
