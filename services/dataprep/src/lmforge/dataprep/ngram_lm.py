"""A word n-gram language model estimated with interpolated modified Kneser-Ney smoothing
(Chen & Goodman 1998, "An Empirical Study of Smoothing Techniques", section 3; the estimate
KenLM's lmplz makes, Heafield et al. 2013), written as an ARPA file that KenLM loads.

The `kenlm` package on PyPI only queries models (lmplz is not in it, nor in Debian): this is
`lmforge-dataprep train-ngram`'s estimator, in pure Python, for the corpora a perplexity filter
is trained on (a Wikipedia-like reference, in memory: tens of millions of words, not billions).

Each line is a sentence `<s> w1 … wn </s>`. The highest order keeps raw counts; a lower-order
n-gram's count is its number of distinct left extensions (its continuation count), except an
n-gram starting with <s>, which has none and keeps its raw count. Per order, three discounts
D1, D2, D3+ come from the counts of counts (Chen & Goodman's eq. 26). Then

    p(w | h) = (a(hw) - D(a(hw))) / Σ_v a(hv)  +  γ(h) · p(w | h without its first word)
    γ(h)     = (D1·N1(h•) + D2·N2(h•) + D3+·N3+(h•)) / Σ_v a(hv)

and the unigrams interpolate with the uniform distribution over the vocabulary (with <unk>).
In ARPA terms p(w|h) is the n-gram's probability and γ(h) the backoff weight of h: an unseen
hw backs off to γ(h)·p(w|h'), which is exactly the interpolated estimate.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
# Discounts when an order's counts of counts cannot give them (a tiny corpus: no n-gram seen
# twice, ...): lmplz refuses such a corpus; these are the typical values it estimates.
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)

Ngram = tuple[str, ...]


def discounts(adjusted: Iterable[int]) -> tuple[float, float, float]:
    """D1, D2, D3+ from the counts of counts n1..n4 (Chen & Goodman 1998, eq. 26)."""
    n = Counter(min(count, 4) for count in adjusted)
    n1, n2, n3, n4 = n[1], n[2], n[3], n[4]
    if not (n1 and n2 and n3 and n4):
        return FALLBACK_DISCOUNTS
    y = n1 / (n1 + 2 * n2)
    found = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    if not all(0 < d <= i + 1 for i, d in enumerate(found)):
        return FALLBACK_DISCOUNTS
    return found


@dataclass
class NgramModel:
    """The counts and discounts of an interpolated modified Kneser-Ney model; `logprob` is
    the estimate computed directly from them, `write_arpa` the same model as an ARPA file."""

    order: int
    adjusted: list[dict[Ngram, int]]  # adjusted[k-1]: the k-grams' (continuation) counts
    discount: list[tuple[float, float, float]]
    # per order k, per context h (a (k-1)-gram): (Σ_v a(hv), γ(h))
    context: list[dict[Ngram, tuple[int, float]]] = field(default_factory=list)
    vocab_size: int = 0  # unigram types but <s>, with <unk>

    def d(self, k: int, count: int) -> float:
        return self.discount[k - 1][min(count, 3) - 1]

    def logprob(self, word: str, history: Ngram) -> float:
        """log10 p(word | history), history cut to the last order-1 words."""
        history = tuple(history[len(history) - self.order + 1:]) if self.order > 1 else ()
        return math.log10(self._prob(word, history))

    def _prob(self, word: str, history: Ngram) -> float:
        k = len(history) + 1
        seen = self.context[k - 1].get(history)
        if k == 1:
            total, gamma = seen
            count = self.adjusted[0].get((word,), 0) if word != BOS else 0
            own = (count - self.d(1, count)) / total if count else 0.0
            return own + gamma / self.vocab_size
        lower = self._prob(word, history[1:])
        if seen is None:
            return lower
        total, gamma = seen
        count = self.adjusted[k - 1].get((*history, word), 0)
        own = (count - self.d(k, count)) / total if count else 0.0
        return own + gamma * lower

    def write_arpa(self, path: str | Path) -> Path:
        """Every seen n-gram with its log10 probability and, when it is a context, backoff."""
        path = Path(path)
        lines = ["", "\\data\\"]
        lines += [f"ngram {k}={len(grams) + (k == 1 and (UNK,) not in grams)}"
                  for k, grams in enumerate(self.adjusted, 1)]
        for k, grams in enumerate(self.adjusted, 1):
            lines += ["", f"\\{k}-grams:"]
            contexts = self.context[k] if k < self.order else {}
            entries = sorted(grams) + ([(UNK,)] if k == 1 and (UNK,) not in grams else [])
            for gram in entries:
                logp = -99.0 if gram == (BOS,) else self.logprob(gram[-1], gram[:-1])
                line = f"{logp:.7f}\t{' '.join(gram)}"
                if gram in contexts:
                    line += f"\t{math.log10(contexts[gram][1]):.7f}"
                lines.append(line)
        lines += ["", "\\end\\", ""]
        path.write_text("\n".join(lines), encoding="utf-8")
        return path


def count_ngrams(sentences: Iterable[list[str]], order: int) -> list[dict[Ngram, int]]:
    """Adjusted counts per order: raw counts at the highest order and for n-grams starting
    with <s>, continuation counts (distinct left extensions) for the others."""
    top: Counter[Ngram] = Counter()
    starts: list[Counter[Ngram]] = [Counter() for _ in range(order)]
    for words in sentences:
        padded = (BOS, *words, EOS)
        for i in range(len(padded) - order + 1):
            top[padded[i:i + order]] += 1
        for k in range(1, min(order, len(padded) + 1)):
            starts[k - 1][padded[:k]] += 1
    adjusted: list[dict[Ngram, int]] = [{} for _ in range(order)]
    adjusted[order - 1] = dict(top)
    for k in range(order - 1, 0, -1):
        continuation: Counter[Ngram] = Counter(gram[1:] for gram in adjusted[k])
        continuation.update(starts[k - 1])  # <s>-initial: never a suffix, so no overlap
        adjusted[k - 1] = dict(continuation)
    return adjusted


def estimate(sentences: Iterable[list[str]], order: int = 3) -> NgramModel:
    """An interpolated modified Kneser-Ney model of the sentences (lists of words)."""
    if order < 1:
        raise ValueError(f"order must be ≥ 1, got {order}")
    adjusted = count_ngrams(sentences, order)
    unigrams = {gram: count for gram, count in adjusted[0].items() if gram != (BOS,)}
    if not unigrams:
        raise ValueError("no text to estimate a language model from")
    model = NgramModel(order, adjusted, [])
    for k, grams in enumerate(adjusted, 1):
        model.discount.append(discounts(grams.values() if k > 1 else unigrams.values()))
    for k, grams in enumerate(adjusted, 1):
        by_context: dict[Ngram, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        for gram, count in grams.items():
            if gram == (BOS,):
                continue
            sums = by_context[gram[:-1]]
            sums[0] += count
            sums[min(count, 3)] += 1
        d1, d2, d3 = model.discount[k - 1]
        model.context.append({h: (s[0], (d1 * s[1] + d2 * s[2] + d3 * s[3]) / s[0]) for h, s in by_context.items()})
    model.vocab_size = len(unigrams) + ((UNK,) not in unigrams)
    return model
