"""Pipeline steps: each one small, with its own counters (see lmforge.dataprep.step_base)."""
