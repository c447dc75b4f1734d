"""The official `openai` Python client against a real lmforge-serve (with API keys): completions
from a string, a batch, token ids and a batch of them, n choices, streaming with usage, echo and
logprobs equal to the model's own, chat completions through the package's chat template (whole
and streamed), and errors surfacing as the client's exception classes. What clients usually
send works: a multi-turn chat sending back the answer's model_dump(), explicit nulls, OpenAI's
neutral fields, models.retrieve, logit_bias, any 64-bit seed, up to 20 chat top_logprobs."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
from transformers import AutoTokenizer

from lmforge.inference.text import Codec
from lmforge.model.package import load_package
from tests.serving import running_server

KEY = "sk-test-key"  # noqa: S105 - a test server's key


@pytest.fixture(scope="module")
def client(chat_package, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "api-keys"
    keys.write_text(f"# test\n{KEY}\n")
    with running_server(chat_package, f"api_keys_file={keys}", "engine.max_running=4") as url, \
            openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=30) as api:
        yield api, url


@pytest.fixture(scope="module")
def codec(chat_package):
    return Codec(chat_package / "tokenizer.json")


def greedy(api, prompt, **kwargs):
    return api.completions.create(model="tiny-chat", prompt=prompt, temperature=0, **kwargs)


def test_completions_from_a_string_a_batch_and_token_ids(client, codec):
    api, _ = client
    single = greedy(api, "The capital of", max_tokens=40)
    assert single.choices[0].text == " France is Paris, and the capital of Italy is Rome."
    assert single.choices[0].finish_reason == "stop" and single.object == "text_completion"
    prompts = ["Bees make", "The capital of", "Water"]
    alone = [greedy(api, p, max_tokens=12).choices[0].text for p in prompts]

    batch = greedy(api, prompts, max_tokens=12)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == alone
    ids = [codec.encode(p) for p in prompts]
    assert greedy(api, ids[0], max_tokens=12).choices[0].text == alone[0]  # one prompt as token ids
    by_ids = greedy(api, ids, max_tokens=12)  # a batch of token-id lists: lm-evaluation-harness's form
    assert [c.text for c in by_ids.choices] == alone
    assert by_ids.usage.prompt_tokens == sum(map(len, ids)) == batch.usage.prompt_tokens
    assert by_ids.usage.completion_tokens == sum(len(codec.encode(t)) for t in alone) + sum(
        c.finish_reason == "stop" for c in by_ids.choices)  # the end-of-text token counts, unseen
    assert by_ids.usage.total_tokens == by_ids.usage.prompt_tokens + by_ids.usage.completion_tokens


def test_n_choices_per_prompt_in_order(client):
    api, _ = client
    body = dict(model="tiny-chat", prompt=["Our", "Two"], max_tokens=8, temperature=1.5, seed=7, n=3)
    first = api.completions.create(**body)
    assert [c.index for c in first.choices] == list(range(6))
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in api.completions.create(**body).choices]  # seeded: reproducible
    assert len(set(texts[:3])) > 1  # the n choices of one prompt differ
    greedy_n = greedy(api, ["Bees make", "Water"], max_tokens=6, n=2).choices
    assert greedy_n[0].text == greedy_n[1].text != greedy_n[2].text == greedy_n[3].text


def test_streaming_with_usage(client):
    api, _ = client
    whole = greedy(api, ["Bees make", "Water"], max_tokens=20, n=2)
    chunks = list(greedy(api, ["Bees make", "Water"], max_tokens=20, n=2, stream=True,
                         stream_options={"include_usage": True}))
    *deltas, last = chunks
    assert last.choices == [] and last.usage == whole.usage
    assert all(c.usage is None and len(c.choices) == 1 for c in deltas)
    for choice in whole.choices:
        mine = [c.choices[0] for c in deltas if c.choices[0].index == choice.index]
        assert "".join(c.text for c in mine) == choice.text
        assert [c.finish_reason for c in mine][-1] == choice.finish_reason
    assert list(greedy(api, "Water", max_tokens=3, stream=True))[-1].usage is None  # not asked for


def assert_offsets_point_into_the_text(codec, text: str, ids: list[int], logprobs) -> None:
    """Each token's text_offset is where its text starts in the choice's text (a token holding
    part of a character: that character's), in order, never past the text's end."""
    offsets = logprobs.text_offset
    assert len(offsets) == len(ids) == len(logprobs.tokens)
    assert offsets == sorted(offsets) and offsets[-1] <= len(text)
    for token_id, token, offset in zip(ids, logprobs.tokens, offsets, strict=True):
        if codec.decode([token_id]) == token:  # whole characters, not a generated end-of-text
            assert text.startswith(token, offset), (token, offset, text)


@torch.no_grad()
def direct_logprobs(model, ids: list[int]) -> list[float]:
    """Each token's logprob after the first from one forward pass of the model itself."""
    logits, _ = model(torch.tensor([ids]))
    logprobs = torch.log_softmax(logits[0, :-1].float(), dim=-1)
    return logprobs.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist()


@torch.no_grad()
def greedy_ids(model, ids: list[int], count: int) -> list[int]:
    ids = list(ids)
    for _ in range(count):
        logits, _ = model(torch.tensor([ids]))
        ids.append(int(logits[0, -1].argmax()))
    return ids


def test_echo_and_logprobs_are_the_models_own(client, codec, chat_package):
    api, _ = client
    prompt = "Grüße aus München"
    ids = codec.encode(prompt)
    model, _ = load_package(chat_package)
    expected = direct_logprobs(model, ids)
    scored = greedy(api, prompt, max_tokens=0, echo=True, logprobs=1)  # scoring only
    choice = scored.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert scored.usage.completion_tokens == 0 and scored.usage.prompt_tokens == len(ids)
    logprobs = choice.logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    assert logprobs.tokens == [codec.token_text(t) for t in ids]  # "ß" spans two tokens: shown as raw entries
    assert_offsets_point_into_the_text(codec, choice.text, ids, logprobs)
    for chosen, top in zip(logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True):
        assert len(top) == 1 and max(top.values()) >= chosen - 1e-6

    generated = greedy(api, ids, max_tokens=10, echo=True, logprobs=2)  # token ids in, text out
    choice = generated.choices[0]
    plain = greedy(api, prompt, max_tokens=10).choices[0].text
    assert choice.text == prompt + plain
    assert len(choice.logprobs.token_logprobs) == len(ids) + generated.usage.completion_tokens
    assert choice.logprobs.token_logprobs[1:len(ids)] == pytest.approx(expected, abs=1e-4)
    everything = greedy_ids(model, ids, generated.usage.completion_tokens)
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(direct_logprobs(model, everything), abs=1e-4)
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs[1:])
    assert_offsets_point_into_the_text(codec, choice.text, everything, choice.logprobs)

    streamed = [c.choices[0] for c in greedy(api, [ids, ids[:2]], max_tokens=0, echo=True, stream=True)]
    assert [(c.index, c.text, c.finish_reason) for c in streamed[:2]] == [  # the echoes first, then the ends
        (0, prompt, None), (1, codec.decode(ids[:2]), None)]
    assert sorted((c.index, c.text, c.finish_reason) for c in streamed[2:]) == [(0, "", "length"), (1, "", "length")]


def test_chat_uses_the_packages_template_whole_and_streamed(client, chat_package):
    api, _ = client
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Bees make"}]
    rendered = AutoTokenizer.from_pretrained(chat_package).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)  # transformers' own rendering
    assert rendered == "system: Be brief.\nuser: Bees make\nassistant:"
    expected = greedy(api, rendered, max_tokens=12)

    chat = api.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=12, temperature=0,
                                       logprobs=True, top_logprobs=2)
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-")
    choice = chat.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == expected.choices[0].text
    assert choice.finish_reason == expected.choices[0].finish_reason
    assert chat.usage == expected.usage
    assert len(choice.logprobs.content) == chat.usage.completion_tokens
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in choice.logprobs.content)

    chunks = list(api.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=12, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    *deltas, last = chunks
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert deltas[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in deltas) == choice.message.content
    assert deltas[-1].choices[0].finish_reason == choice.finish_reason
    assert last.choices == [] and last.usage == chat.usage

    parts = [{"role": "user", "content": [{"type": "text", "text": "Bees "}, {"type": "text", "text": "make"}]}]
    by_parts = api.chat.completions.create(model="tiny-chat", messages=parts, max_tokens=12, temperature=0)
    assert by_parts.usage.prompt_tokens == chat.usage.prompt_tokens - len(Codec(
        chat_package / "tokenizer.json").encode("system: Be brief.\n"))


def test_chat_json_on_the_wire_has_openais_fields_in_openais_order(client):
    """The raw bodies, not the client's lenient parse: every field present (null when unset) and
    in order, a delta with only the fields it sets, and the logprob entries with their bytes."""
    _, url = client
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "tiny-chat", "messages": [{"role": "user", "content": "Bees make"}], "max_tokens": 3,
            "temperature": 0}
    top = ["token", "logprob", "bytes"]

    plain = httpx.post(f"{url}/v1/chat/completions", headers=headers, json=body, timeout=30).json()
    assert list(plain) == ["id", "object", "created", "model", "choices", "usage"]
    (choice,) = plain["choices"]
    assert list(choice) == ["index", "message", "logprobs", "finish_reason"] and choice["logprobs"] is None
    assert list(choice["message"]) == ["role", "content"] and choice["message"]["role"] == "assistant"
    assert list(plain["usage"]) == ["prompt_tokens", "completion_tokens", "total_tokens"]
    scored = httpx.post(f"{url}/v1/chat/completions", headers=headers, json={**body, "logprobs": True,
                                                                             "top_logprobs": 2}, timeout=30).json()
    entries = scored["choices"][0]["logprobs"]["content"]
    assert len(entries) == 3 and all(list(e) == [*top, "top_logprobs"] for e in entries)
    assert all(e["bytes"] == list(e["token"].encode()) and [list(t) for t in e["top_logprobs"]] == [top, top]
               for e in entries)

    stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", headers=headers, json=stream, timeout=30) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    *chunks, usage = [json.loads(e) for e in events[:-1]]
    assert all(list(c) == ["id", "object", "created", "model", "choices", "usage"] for c in [*chunks, usage])
    assert all(c["usage"] is None and list(c["choices"][0]) == ["index", "delta", "logprobs", "finish_reason"]
               for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all(list(d) == ["content"] and d["content"] for d in deltas[1:-1])
    assert set(deltas[-1]) <= {"content"}  # the last: its finish reason, with the text that came with it if any
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert "".join(d.get("content", "") for d in deltas) == choice["message"]["content"]
    assert usage["choices"] == [] and usage["usage"] == plain["usage"]


def test_errors_surface_as_the_clients_exceptions(client, chat_package):
    api, url = client
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(model="tiny-chat", prompt="The sun", suffix="and the moon")
    assert refused.value.status_code == 400 and refused.value.param == "suffix"
    assert "suffix: not supported" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        api.completions.create(model="tiny-chat", prompt=[[1, 2], [3, 10**6]])
    assert refused.value.param == "prompt" and "token id 1000000 is outside the vocabulary" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}])
    assert refused.value.param == "messages" and "only text content parts" in refused.value.message
    for bad in ({"extra_body": {"temperatur": 0.5}}, {"temperature": 5}, {"prompt": ""}, {"max_tokens": 2**64}):
        with pytest.raises(openai.BadRequestError) as refused:  # as OpenAI and vLLM answer: not a 422
            api.completions.create(**{"model": "tiny-chat", "prompt": "x", **bad})
        assert refused.value.status_code == 400 and refused.value.code is None
        assert refused.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as missing:
        api.completions.create(model="gpt-17", prompt="x")
    assert missing.value.code == "model_not_found" and missing.value.param == "model"
    with openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0) as stranger, \
            pytest.raises(openai.AuthenticationError) as denied:
        stranger.completions.create(model="tiny-chat", prompt="x")
    assert "valid API key" in denied.value.message and denied.value.code == "invalid_api_key"
    surrogate = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}",
                                                                  "content-type": "application/json"},
                           content='{"messages": [{"role": "user", "content": "Bees \\ud800"}]}', timeout=30)
    assert surrogate.status_code == 400 and "lone surrogate" in surrogate.json()["error"]["message"]
    assert api.completions.create(model="tiny-chat", prompt="x", max_tokens=1, user="someone").usage.total_tokens


def test_chat_without_a_template_is_a_clear_400(server):
    url, _ = server  # the tiny package: no tokenizer_config.json, no template
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as api, \
            pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model="tiny-v1", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.param == "messages" and "no chat template" in refused.value.message


def test_a_multi_turn_chat_sends_back_the_answer_as_the_client_dumps_it(client, codec):
    api, _ = client
    messages = [{"role": "user", "content": "Bees make"}]
    first = api.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=6, temperature=0)
    answer = first.choices[0].message.model_dump()  # the client's usual pattern
    assert answer["refusal"] is None and answer["tool_calls"] is None and answer["audio"] is None
    messages += [answer, {"role": "user", "content": "Water"}]
    second = api.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=6, temperature=0)
    rendered = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
    assert second.usage.prompt_tokens == len(codec.encode(rendered))
    assert second.choices[0].message.content == greedy(api, rendered, max_tokens=6).choices[0].text

    called = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call-1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]}
    with pytest.raises(openai.BadRequestError) as refused:  # it would change the prompt: refused by name
        api.chat.completions.create(model="tiny-chat", messages=[messages[0], called], max_tokens=2)
    assert refused.value.param == "messages.1.tool_calls" and "messages.1.tool_calls" in refused.value.message


def test_null_is_the_default_and_neutral_fields_are_accepted(client):
    api, _ = client
    chat = dict(model="tiny-chat", messages=[{"role": "user", "content": "Bees make"}], max_tokens=8, seed=3)
    expected = api.chat.completions.create(**chat).choices[0].message.content  # sampled (temperature 1), seeded
    nulls = api.chat.completions.create(**chat, temperature=None, top_p=None, n=None, stream=None, stop=None,
                                        logprobs=None, top_logprobs=None, max_completion_tokens=None,
                                        presence_penalty=None, frequency_penalty=None, logit_bias=None, user=None)
    assert [c.message.content for c in nulls.choices] == [expected] and nulls.choices[0].logprobs is None
    neutral = api.chat.completions.create(**chat, store=False, metadata={"team": "search"}, service_tier="auto",
                                          parallel_tool_calls=False, tool_choice="none", tools=[],
                                          response_format={"type": "text"})
    assert neutral.choices[0].message.content == expected
    completion = dict(model="tiny-chat", prompt="Bees make", max_tokens=8, seed=3)
    assert api.completions.create(**completion, temperature=None, top_p=None, n=None, stream=None, logprobs=None,
                                  echo=None, stop=None, best_of=None, suffix=None).choices[0].text == \
        api.completions.create(**completion).choices[0].text

    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}
    for fields, param in (({"tools": [tool]}, "tools"), ({"response_format": schema}, "response_format"),
                          ({"tool_choice": "required"}, "tool_choice")):
        with pytest.raises(openai.BadRequestError) as refused:  # they would change the output
            api.chat.completions.create(**chat, **fields)
        assert refused.value.param == param and f"'{param}: " in refused.value.message


def test_models_retrieve_and_the_served_model_by_empty_name(client, chat_package):
    api, url = client
    (listed,) = api.models.list().data
    assert listed.id == listed.root == "tiny-chat" and listed.owned_by == "lmforge"
    raw = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).text
    assert str(chat_package) not in raw and "/tmp" not in raw  # no package path to key holders
    assert api.models.retrieve("tiny-chat") == listed
    with pytest.raises(openai.NotFoundError) as missing:
        api.models.retrieve("gpt-17")
    assert missing.value.code == "model_not_found" and "gpt-17" in missing.value.message
    assert api.completions.create(model="", prompt="Water", max_tokens=2).model == "tiny-chat"  # "": the one served


def test_logit_bias_moves_the_output(client, codec):
    api, _ = client
    token = codec.encode(" capital")
    assert len(token) == 1
    forced = greedy(api, "The capital of", max_tokens=4, logit_bias={str(token[0]): 100})
    assert forced.choices[0].text == " capital" * 4
    chat = api.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "Bees make"}],
                                       max_tokens=3, temperature=0.8, seed=1, logit_bias={str(token[0]): 100})
    assert chat.choices[0].message.content == " capital" * 3
    plain = greedy(api, "The capital of", max_tokens=1, logprobs=0).choices[0].logprobs.tokens
    first = codec.encode(plain[0])
    banned = greedy(api, "The capital of", max_tokens=1, logprobs=0, logit_bias={str(first[0]): -100})
    assert banned.choices[0].logprobs.tokens != plain


def test_any_64_bit_seed_reproduces(client):
    api, _ = client
    body = dict(model="tiny-chat", prompt="Our", max_tokens=12, temperature=1.5)
    texts = [api.completions.create(**body, seed=seed).choices[0].text for seed in (-1, -12345, -1, 0)]
    assert texts[0] == texts[2] and len({texts[0], texts[1], texts[3]}) == 3
    pair = api.completions.create(**body, seed=-1, n=2).choices  # choice i: seed + i, modulo 2**64
    assert [c.text for c in pair] == [texts[0], texts[3]]


def test_logprobs_zero_and_up_to_twenty_chat_top_logprobs(client):
    api, _ = client
    zero = greedy(api, "The capital of", max_tokens=4, logprobs=0).choices[0].logprobs
    assert zero.top_logprobs == [{t: lp} for t, lp in zip(zero.tokens, zero.token_logprobs, strict=True)]
    echoed = greedy(api, "The capital of", max_tokens=0, echo=True, logprobs=0).choices[0].logprobs
    assert echoed.top_logprobs == [None] + [{t: lp} for t, lp in zip(echoed.tokens[1:], echoed.token_logprobs[1:],
                                                                       strict=True)]
    messages = [{"role": "user", "content": "Bees make"}]
    chat = api.chat.completions.create(model="tiny-chat", messages=messages, max_tokens=3, temperature=0,
                                       logprobs=True, top_logprobs=20)
    assert [len(entry.top_logprobs) for entry in chat.choices[0].logprobs.content] == [20] * 3
    with pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model="tiny-chat", messages=messages, logprobs=True, top_logprobs=21)
    assert refused.value.param == "top_logprobs"


def test_echo_of_token_ids_with_special_tokens_is_their_text(client, codec):
    """The echoed text is what the tokens and their offsets describe, special tokens included,
    and the generated tokens' offsets go on from its end, whole and streamed."""
    api, _ = client
    eot = codec.eos_id
    ids = [eot, *codec.encode("The capital of"), eot, *codec.encode(" Water")]
    prompt_text = "<|endoftext|>The capital of<|endoftext|> Water"
    whole = greedy(api, ids, max_tokens=8, echo=True, logprobs=1)
    choice = whole.choices[0]
    tokens, offsets = choice.logprobs.tokens, choice.logprobs.text_offset
    assert choice.text.startswith(prompt_text) and len(choice.text) > len(prompt_text)
    assert "".join(tokens[:len(ids)]) == prompt_text
    assert offsets[:len(ids)] == [len("".join(tokens[:i])) for i in range(len(ids))]
    assert offsets[len(ids)] == len(prompt_text)  # the completion's first token: no restart at 0
    assert offsets == sorted(offsets) and offsets[-1] <= len(choice.text)
    assert all(choice.text.startswith(token, offset) for token, offset in zip(tokens, offsets, strict=True)
               if token != "<|endoftext|>" or offset < len(prompt_text))  # a generated end-of-text is not text

    chunks = [c.choices[0] for c in greedy(api, ids, max_tokens=8, echo=True, logprobs=1, stream=True)]
    assert "".join(c.text for c in chunks) == choice.text
    assert [t for c in chunks for t in c.logprobs.tokens] == tokens
    assert [o for c in chunks for o in c.logprobs.text_offset] == offsets
