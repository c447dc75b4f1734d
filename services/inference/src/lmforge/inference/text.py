"""Text ↔ tokens for the API: the package's tokenizer.json (Hugging Face `tokenizers`), the
incremental detokenizer that turns a stream of tokens into text chunks, holding back bytes of
an unfinished UTF-8 character and text that may be the start of a stop string, and where each
token's text starts in the text (logprobs' `text_offset`)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, pre_tokenizers

from lmforge.inference.chat_template import ChatTemplate

EOT_TOKEN = "<|endoftext|>"  # noqa: S105 - the data-prep tokenizer's end-of-text token


def eos_token(tokenizer_path: Path) -> str:
    """The end-of-sequence token: tokenizer_config.json's `eos_token` beside the tokenizer (a
    Hugging Face directory, ours or a third party's, e.g. Llama 3's <|end_of_text|>), else ours."""
    config_path = tokenizer_path.with_name("tokenizer_config.json")
    if not config_path.is_file():
        return EOT_TOKEN
    try:
        eos = json.loads(config_path.read_text(encoding="utf-8")).get("eos_token")
    except (ValueError, AttributeError):
        return EOT_TOKEN
    if isinstance(eos, dict):  # an AddedToken written out: {"content": ..., ...}
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else EOT_TOKEN


class Codec:
    def __init__(self, path: str | Path):
        self.tokenizer = Tokenizer.from_file(str(path))
        self.eos_id = self.tokenizer.token_to_id(eos_token(Path(path)))
        self.max_chars_per_token = max_chars_per_token(self.tokenizer)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.chat_template = ChatTemplate.beside(Path(path))

    def encode(self, text: str) -> list[int]:
        # encode_batch_fast releases the GIL (encode does not) and computes no character offsets
        # (half the time, and nothing to convert back under the GIL): a long text tokenized on
        # a worker thread leaves the event loop free to serve everyone else.
        return self.tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids

    def may_fit(self, text: str, tokens: int) -> bool:
        """False only when `text` certainly has more than `tokens` tokens (a length check, no
        tokenizing): its characters exceed `tokens` × the most characters one token stands for."""
        return self.max_chars_per_token is None or len(text) <= tokens * self.max_chars_per_token

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """The text of `ids`; generated text leaves special tokens out, an echoed prompt keeps them."""
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The token as text; a token holding part of a UTF-8 character is shown as its raw
        byte-level vocabulary entry instead, so distinct tokens never look alike."""
        text = self.decode([token_id])
        return self.tokenizer.id_to_token(token_id) if "\ufffd" in text or not text else text


_KEEPS_EVERY_CHARACTER = {"ByteLevel", "Digits", "Split"}  # pre-tokenizers that only cut the text


def _byte_level(pre_tokenizer: dict | None) -> bool:
    """A ByteLevel pre-tokenizer, alone or after splitters that drop no character."""
    if pre_tokenizer is None:
        return False
    steps = pre_tokenizer["pretokenizers"] if pre_tokenizer["type"] == "Sequence" else [pre_tokenizer]
    return any(step["type"] == "ByteLevel" for step in steps) and all(
        step["type"] in _KEEPS_EVERY_CHARACTER and step.get("behavior") != "Removed" for step in steps)


def max_chars_per_token(tokenizer: Tokenizer) -> int | None:
    """The most characters of input one token can stand for, where the tokenizer's make-up proves
    a bound; None where it does not.

    The proof, for byte-level BPE (the data-prep tokenizer, GPT-2's, Llama 3's): the pre-tokenizer
    maps each UTF-8 byte to one alphabet character and drops nothing; with the whole byte alphabet
    in the vocabulary, BPE cuts that string into vocabulary entries, so a token spans as many bytes
    as its entry has characters, and a character is at least one byte. An added token spans its own
    content. So a text of n characters has at least n / (the longest entry) tokens. Anything that can
    fold many characters into fewer (a normalizer, an unknown-token fallback, an added token that
    swallows the whitespace beside it) voids the argument."""
    spec = json.loads(tokenizer.to_str())
    model, added = spec["model"], spec.get("added_tokens") or []
    if spec.get("normalizer") is not None or model.get("type") != "BPE" or not _byte_level(spec.get("pre_tokenizer")):
        return None
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    if not set(pre_tokenizers.ByteLevel.alphabet()) <= model["vocab"].keys():
        return None
    if any(token.get("lstrip") or token.get("rstrip") for token in added):
        return None
    return max([len(entry) for entry in model["vocab"]] + [len(token["content"]) for token in added])


class TextStream:
    """Feed tokens one by one; get back the text that is safe to show so far.

    Only the tokens since the last complete character are decoded at each step (byte-level
    BPE decodes token by token into bytes, so text up to a character boundary never changes),
    which keeps a long generation linear rather than decoding everything per token."""

    def __init__(self, codec: Codec, stop: list[str]):
        self.codec = codec
        self.stop = [s for s in stop if s]
        self.ids: list[int] = []
        self.text = ""  # the decoded text of ids[:self.decoded]
        self.decoded = 0
        self.emitted = 0  # characters of the decoded text already returned
        self.stopped = False

    def feed(self, token_id: int) -> str:
        self.ids.append(token_id)
        tail = self.codec.decode(self.ids[self.decoded:])
        if tail.endswith("\ufffd"):  # the token ends inside a UTF-8 character
            return ""
        self.text += tail
        self.decoded = len(self.ids)
        text = self.text
        if self.stop:
            start = max(0, self.emitted - max(map(len, self.stop)) + 1)
            hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                self.stopped = True
                return self._take(text, min(hits))
            return self._take(text, len(text) - self._held_back(text))
        return self._take(text, len(text))

    def flush(self) -> str:
        """The rest, once the sequence has ended (an unfinished character included)."""
        if self.stopped:
            return ""
        return self._take(self.text + self.codec.decode(self.ids[self.decoded:]), None)

    def _take(self, text: str, end: int | None) -> str:
        end = len(text) if end is None else end
        chunk = text[self.emitted:end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return chunk

    def _held_back(self, text: str) -> int:
        """Length of the longest end of `text` that a stop string starts with."""
        longest = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest


class TextOffsets:
    """Where each token's text starts in the text the tokens decode to (`text_offset`), fed
    tokens in order, in as many calls as they arrive. A token that begins inside a character
    (byte-level tokens split a multi-byte character) gets that character's offset."""

    def __init__(self, codec: Codec, start: int = 0, skip_special_tokens: bool = True):
        self.codec, self.skip_special_tokens = codec, skip_special_tokens
        self.length = start  # characters of the text decoded so far (up to the last whole character)
        self.pending: list[int] = []  # tokens since then, ending inside a character
        self.partial = 0  # whole characters the pending tokens decode to before the unfinished one

    def feed(self, ids: list[int]) -> list[int]:
        offsets = []
        for token in ids:
            offsets.append(self.length + self.partial)
            self.pending.append(token)
            text = self.codec.decode(self.pending, self.skip_special_tokens)
            if text.endswith("\ufffd"):
                self.partial = len(text.rstrip("\ufffd"))
            else:
                self.length += len(text)
                self.pending, self.partial = [], 0
        return offsets
