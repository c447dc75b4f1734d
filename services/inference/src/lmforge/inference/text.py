"""Text ↔ tokens for the API: the package's tokenizer.json (Hugging Face `tokenizers`), and the
incremental detokenizer that turns a stream of tokens into text chunks, holding back bytes of
an unfinished UTF-8 character and text that may be the start of a stop string."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

EOT_TOKEN = "<|endoftext|>"  # noqa: S105 - the data-prep tokenizer's end-of-text token


class Codec:
    def __init__(self, path: str | Path):
        self.tokenizer = Tokenizer.from_file(str(path))
        self.eos_id = self.tokenizer.token_to_id(EOT_TOKEN)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """The token as text; a token holding part of a UTF-8 character is shown as its raw
        byte-level vocabulary entry instead, so distinct tokens never look alike."""
        text = self.decode([token_id])
        return self.tokenizer.id_to_token(token_id) if "\ufffd" in text or not text else text


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
