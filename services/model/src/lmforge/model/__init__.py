"""The model of lmforge (architecture, configs, KV cache, package formats, Hugging Face conversion)."""
