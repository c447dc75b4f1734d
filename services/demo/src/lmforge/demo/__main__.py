import sys

from lmforge.demo.cli import main

sys.exit(main())
