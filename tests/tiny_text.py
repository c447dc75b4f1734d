"""The sentences the tests' tiny model memorizes, and the byte-level BPE tokenizer trained on them (no torch):
tests/serving.py trains its model on them, tests/trace_index.py indexes them, and a server accepts such an index
only when both tokenizers hash the same, so they are declared here once."""

from __future__ import annotations

from pathlib import Path

EOT = "<|endoftext|>"
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "A week has seven days and a year has twelve months.",
    "The sun rises in the east and sets in the west.",
    "Bees make honey from the nectar of flowers.",
    "The train to the north leaves at nine in the morning.",
    "Two plus two is four, and three plus three is six.",
    "Grüße aus München: das Café öffnet um acht Uhr.",
    "Our garden has roses, tulips and a small apple tree.",
]


def train_tokenizer(path: Path, vocab_size: int = 320, sentences: list[str] = SENTENCES) -> Path:
    """A byte-level BPE tokenizer.json (EOT is id 0) trained on `sentences`; returns `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(sentences * 4, trainer)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path
