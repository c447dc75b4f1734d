import sys

from lmforge.dataprep.cli import main

sys.exit(main())
