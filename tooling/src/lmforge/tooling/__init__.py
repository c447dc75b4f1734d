"""Generators of what `make docs` writes from the services' declarations (in no image)."""
