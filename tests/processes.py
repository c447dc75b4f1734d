"""Child processes of the tests: wait until one answers over HTTP, stop one for good."""

from lmforge.demo.processes import stop, wait_http_ok  # noqa: F401 - re-exported for the tests
