"""The incremental detokenizer against decoding the whole output at once: same text for
multi-byte characters split across tokens, stop strings across token boundaries held back."""

from __future__ import annotations

import pytest

from lmforge.inference.text import Codec, TextStream
from tests.serving import train_tokenizer


@pytest.fixture(scope="module")
def codec(tmp_path_factory):
    return Codec(train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json"))


@pytest.mark.parametrize("text", ["Grüße aus München: das Café öffnet um acht Uhr.", "日本語とemoji 🚀 mixed ✓"])
def test_streamed_chunks_add_up_to_the_whole_decode(codec, text):
    ids = codec.encode(text)
    stream = TextStream(codec, [])
    chunks = [stream.feed(token) for token in ids] + [stream.flush()]
    assert "".join(chunks) == codec.decode(ids) == text
    assert not any("\ufffd" in chunk for chunk in chunks)


def test_a_stop_string_spanning_tokens_is_cut_and_never_shown(codec):
    ids = codec.encode("The capital of France is Paris, and the capital of Italy is Rome.")
    stream = TextStream(codec, [", and"])
    shown = ""
    for token in ids:
        shown += stream.feed(token)
        assert ", an" not in shown  # a possible start of the stop string is held back
        if stream.stopped:
            break
    assert stream.stopped and shown == "The capital of France is Paris" and stream.flush() == ""
