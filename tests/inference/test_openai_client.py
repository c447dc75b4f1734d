"""The official `openai` Python client against a real lmforge-serve (with API keys): completions
from a string, a batch, token ids and a batch of them, n choices, streaming with usage, echo and
logprobs equal to the model's own, chat completions through the package's chat template (whole
and streamed), and errors surfacing as the client's exception classes."""

from __future__ import annotations

import openai
import pytest
import torch
from transformers import AutoTokenizer

from lmforge.common.model_package import load_package
from lmforge.inference.text import Codec
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
    assert logprobs.text_offset == [sum(map(len, logprobs.tokens[:i])) for i in range(len(ids))]
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
    with pytest.raises(openai.UnprocessableEntityError):
        api.completions.create(model="tiny-chat", prompt="x", extra_body={"temperatur": 0.5})  # unknown field
    with pytest.raises(openai.NotFoundError):
        api.completions.create(model="gpt-17", prompt="x")
    with openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0) as stranger, \
            pytest.raises(openai.AuthenticationError) as denied:
        stranger.completions.create(model="tiny-chat", prompt="x")
    assert "valid API key" in denied.value.message
    assert api.completions.create(model="tiny-chat", prompt="x", max_tokens=1, user="someone").usage.total_tokens


def test_chat_without_a_template_is_a_clear_400(server):
    url, _ = server  # the tiny package: no tokenizer_config.json, no template
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as api, \
            pytest.raises(openai.BadRequestError) as refused:
        api.chat.completions.create(model="tiny-v1", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.param == "messages" and "no chat template" in refused.value.message
