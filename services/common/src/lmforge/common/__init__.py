"""Code shared by every lmforge service: config, logging, errors, storage, shard format, metrics."""
