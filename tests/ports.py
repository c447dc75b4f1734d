"""A free TCP port on loopback, for servers the tests start."""

from lmforge.demo.processes import free_port  # noqa: F401 - re-exported for the tests
