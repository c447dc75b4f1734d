"""lmforge trainer: a GPT trained with torchrun and FSDP on data-prep shards."""
