import sys

from lmforge.sample_data.cli import main

sys.exit(main())
