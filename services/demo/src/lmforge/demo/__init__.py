"""lmforge on one machine: the platform's services as local processes, step by step (`make demo`)."""
