"""The incremental detokenizer against decoding the whole output at once: same text for
multi-byte characters split across tokens, stop strings across token boundaries held back."""

from __future__ import annotations

import random

import pytest
from tokenizers import AddedToken, Tokenizer, normalizers, pre_tokenizers

from lmforge.inference.text import Codec, TextOffsets, TextStream
from tests.serving import SENTENCES, train_tokenizer


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


def _byte_decoder() -> dict[str, int]:
    """The byte-level alphabet back to bytes (GPT-2's bytes_to_unicode, inverted)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def test_text_offsets_are_where_each_tokens_bytes_start_in_the_text(codec):
    """Each token's offset is the character its first byte belongs to (a token that starts inside
    a multi-byte character: that character's), however the tokens are fed; special tokens are text
    when kept (an echoed prompt) and nothing when skipped."""
    byte_of = _byte_decoder()
    eot = codec.tokenizer.token_to_id(EOT)
    rng = random.Random(1)
    texts = [SENTENCES[8], "日本語とemoji 🚀 mixed ✓", *(t for t in random_texts(100, seed=3) if "\ufffd" not in t)]
    for text in texts:
        ids = codec.encode(text)
        pieces = [EOT.encode() if t == eot else bytes(byte_of[c] for c in codec.tokenizer.id_to_token(t)) for t in ids]
        starts = [len(b"".join(pieces[:i])) for i in range(len(ids))]
        whole = b"".join(pieces)
        assert whole.decode() == codec.decode(ids, skip_special_tokens=False) == text
        expected = [len(whole[:start].decode("utf-8", errors="ignore")) for start in starts]
        assert TextOffsets(codec, skip_special_tokens=False).feed(ids) == expected, text
        offsets, fed = TextOffsets(codec, start=7, skip_special_tokens=False), []
        while len(fed) < len(ids):
            fed += offsets.feed(ids[len(fed):len(fed) + rng.randrange(1, 4)])
        assert fed == [7 + e for e in expected]
    ids = codec.encode("ab") + [eot] + codec.encode("c")
    assert len(ids) == 4 and TextOffsets(codec).feed(ids) == [0, 1, 2, 2]  # generated text: no <|endoftext|>
    assert TextOffsets(codec, skip_special_tokens=False).feed(ids) == [0, 1, 2, 2 + len(EOT)]


# -- the characters one token can stand for (the prompt's character bound) -------------------------

EOT = "<|endoftext|>"


def random_texts(count: int, seed: int = 0):
    """Texts mixing what makes tokens long or short: words, whitespace runs, multi-byte and astral
    characters, end-of-text tokens and their fragments, arbitrary code points."""
    rng = random.Random(seed)
    pieces = [*" ".join(SENTENCES).split(), " ", "  ", "\n\n", "\t", "é", "日本", "🚀", EOT, "<|", "endoftext", "|>",
              "=" * 40, "Grüße"]
    for _ in range(count):
        parts = [rng.choice(pieces) if rng.random() < 0.8 else chr(rng.choice([rng.randrange(32, 0xD800),
                                                                                rng.randrange(0xE000, 0x110000)]))
                 for _ in range(rng.randrange(1, 200))]
        yield "".join(parts)


def test_no_text_has_more_characters_than_its_tokens_can_span(codec):
    assert codec.max_chars_per_token == len(EOT)  # the longest entry of the tiny tokenizer
    texts = [*SENTENCES, EOT * 50, " " * 5000, "x" * 3000, *random_texts(300)]
    for text in texts:
        tokens = len(codec.encode(text))
        assert len(text) <= tokens * codec.max_chars_per_token, text
        assert codec.may_fit(text, tokens) and not codec.may_fit(text, len(text) // codec.max_chars_per_token - 1)


def _variant(path, tmp_path, name, change) -> tuple[Codec, Tokenizer]:
    tokenizer = Tokenizer.from_file(str(path))
    change(tokenizer)
    tokenizer.save(str(tmp_path / name))
    return Codec(tmp_path / name), tokenizer


@pytest.mark.parametrize("name, change, text", [
    # A normalizer can delete characters: 4,000 spaces become no token at all.
    ("normalizer", lambda t: setattr(t, "normalizer", normalizers.Replace(" ", "")), " " * 4000),
    # A pre-tokenizer that drops whitespace, not byte-level.
    ("whitespace", lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace()), "a" + " " * 4000 + "b"),
    # An added token that swallows the whitespace before it.
    ("lstrip", lambda t: t.add_tokens([AddedToken("<sep>", lstrip=True)]), " " * 4000 + "<sep>"),
])
def test_no_bound_where_the_tokenizer_can_fold_many_characters_into_few(codec, tmp_path, name, change, text):
    path = tmp_path / "base.json"
    codec.tokenizer.save(str(path))
    variant, tokenizer = _variant(path, tmp_path, f"{name}.json", change)
    longest = max(map(len, tokenizer.get_vocab()))
    assert len(text) > len(tokenizer.encode(text, add_special_tokens=False).ids) * longest  # why no bound holds
    assert variant.max_chars_per_token is None and variant.may_fit(text, 1)


@pytest.mark.parametrize("written", ["<|end_of_text|>", {"content": "<|end_of_text|>", "special": True}])
def test_the_end_of_sequence_token_comes_from_tokenizer_config_beside_the_tokenizer(tmp_path, written):
    """A third party's Hugging Face directory names its own EOS (Llama 3: <|end_of_text|>);
    without a tokenizer_config.json the data-prep tokenizer's <|endoftext|> is the one."""
    import json

    path = train_tokenizer(tmp_path / "tokenizer.json")
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.add_special_tokens([AddedToken("<|end_of_text|>", special=True)])
    tokenizer.save(str(path))
    assert Codec(path).eos_id == tokenizer.token_to_id("<|endoftext|>")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": written}))
    assert Codec(path).eos_id == tokenizer.token_to_id("<|end_of_text|>") != tokenizer.token_to_id("<|endoftext|>")
