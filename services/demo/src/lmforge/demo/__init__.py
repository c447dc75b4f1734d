"""lmforge on one machine: the platform's services as local processes, stage by stage (`make demo`)."""
