"""Synthetic inputs for the demo, the tests and the benchmarks, never shipped in a service image:
Common Crawl-like WET files with planted ground truth (`wet`, `lmforge-sample-data`) and a
data-prep output of learnable tokens for the trainer (`token_shards`)."""
