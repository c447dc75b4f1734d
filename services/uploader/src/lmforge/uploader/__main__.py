import sys

from lmforge.uploader.cli import main

sys.exit(main())
