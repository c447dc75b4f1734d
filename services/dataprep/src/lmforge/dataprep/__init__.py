"""lmforge data preparation: Common Crawl WET → clean, deduplicated, tokenized shards."""
