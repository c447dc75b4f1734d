"""Step 5, tracing: the served model's outputs traced back to the training documents they came from.

A passage of a training document (a window from the middle of the first long enough document of the
first train shard) goes to /v1/trace: the answer must name that document's URL, as its lineage records it.
Then a completion prompted with the passage's first half asks for `trace: true`: the spans of the output
found verbatim in the training data come back with the choice."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from lmforge.demo.processes import StepFailed

PASSAGE_TOKENS = 64
INDEX_LOAD_SECONDS = 120


@dataclass
class TracedPassage:
    text: str
    url: str  # the URL its document's lineage records
    found: bool  # the trace named that URL
    spans: int
    longest: int  # tokens of the longest span
    count: int  # occurrences of the longest span in the training data
    documents: list[str]  # the URLs the longest span's documents carry
    completion: str
    completion_spans: list[dict]  # {length, count, url} of each span traced in the completion


def training_passage(data_dir: Path) -> tuple[str, str]:
    """(text, URL) of a PASSAGE_TOKENS-token window of a training document."""
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    from lmforge.common.shard_index import MANIFEST, parse_manifest, read_split_index
    from lmforge.common.shards import open_shard, read_doc_ends
    from lmforge.dataprep import layout

    manifest = parse_manifest((data_dir / MANIFEST).read_bytes(), str(data_dir / MANIFEST))
    tokenizer = Tokenizer.from_file(str(data_dir / "tokenizer.json"))
    for shard in read_split_index(manifest, "train", lambda rel: (data_dir / rel).read_bytes(), str(data_dir)):
        _, tokens = open_shard(data_dir / shard.path)
        lineage = pq.read_table(data_dir / layout.lineage_of(shard.path), columns=["url"])
        start = 0
        for index, end in enumerate(read_doc_ends(data_dir / shard.path)):
            end = int(end)
            if end - start > 2 * PASSAGE_TOKENS:  # the document's EOT is its last token
                middle = start + (end - start - PASSAGE_TOKENS) // 2
                text = tokenizer.decode([int(t) for t in tokens[middle:middle + PASSAGE_TOKENS]])
                return text, lineage.column("url")[index].as_py()
            start = end
    raise StepFailed(f"no training document of {data_dir} is longer than {2 * PASSAGE_TOKENS} tokens")


def _post(url: str, api_key: str, route: str, body: dict) -> dict:
    """The answer's JSON; a 503 (the trace index still loading: /readyz covers the model only) is asked again
    for up to INDEX_LOAD_SECONDS."""
    deadline = time.monotonic() + INDEX_LOAD_SECONDS
    while True:
        response = httpx.post(f"{url}{route}", json=body, headers={"Authorization": f"Bearer {api_key}"},
                              timeout=120)
        if response.status_code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if response.status_code != 200:
        raise StepFailed(f"{route} answered {response.status_code}: {response.text[:500]}")
    return response.json()


def trace_passage(url: str, api_key: str, model: str, data_dir: Path, max_tokens: int) -> dict:
    text, source = training_passage(data_dir)
    traced = _post(url, api_key, "/v1/trace", {"text": text, "max_documents": 50})
    spans = traced["spans"]
    longest = max(spans, key=lambda s: s["length"], default=None)
    urls = [d["url"] for d in longest["documents"]] if longest else []
    found = any(d["url"] == source for s in spans for d in s["documents"])
    if not found:
        raise StepFailed(f"/v1/trace of a passage of {source} did not name it: {traced}"[:800])
    prompt = text[: len(text) // 2]
    completion = _post(url, api_key, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                         "temperature": 0, "trace": True})
    choice = completion["choices"][0]
    completion_spans = [{"length": s["length"], "count": s["count"],
                         "url": s["documents"][0]["url"] if s["documents"] else None}
                        for s in choice["trace"]["spans"]]
    return asdict(TracedPassage(text, source, found, len(spans), longest["length"], longest["count"], urls[:3],
                                choice["text"], completion_spans))


def trace_lines(trace: dict | None) -> list[str]:
    if not trace:
        return []
    first = trace["documents"][0] if trace["documents"] else "?"
    longest = max(trace["completion_spans"], key=lambda s: s["length"], default=None)
    completion = (f"longest {longest['length']} tokens, in {longest['count']} document(s), e.g. {longest['url']}"
                  if longest else "no span of the minimum length")
    return [f"Trace       a {PASSAGE_TOKENS}-token training passage → a {trace['longest']}-token span in "
            f"{trace['count']} training document(s), e.g. {first}; its own document ({trace['url']}) "
            f"{'named' if trace['found'] else 'NOT named'}",
            f"            a completion of its first half with trace: true → {len(trace['completion_spans'])} "
            f"span(s) found verbatim ({completion})"]
