"""MinHash signatures and LSH band keys (datasketch), shared by the per-input stage that
computes them and the global stage that groups and verifies them.

One `MinHashConfig` drives both; it is persisted in the run directory and later stages
refuse to work with signatures produced under another config.
"""

from __future__ import annotations

import hashlib
import math
import re
import zlib

import numpy as np
from datasketch import MinHash, MinHashLSH

from lmforge.dataprep.config import MinHashConfig

_WORD = re.compile(r"\w+")
_SHINGLE_MULTIPLIER = np.uint32(0x9E3779B1)  # odd: a bijective mix per position
SIGNATURE_DTYPE = np.uint32  # datasketch's default "affine32" scheme
# Candidate pairs are verified against full signatures, so false positives only cost a
# comparison; weigh false negatives heavily when datasketch picks bands x rows
# (threshold 0.8, 128 permutations → 18 bands x 7 rows: P(candidate | J=0.85) = 0.999).
LSH_WEIGHTS = (0.01, 0.99)
WORD_CACHE_LIMIT = 500_000  # distinct words whose hashes are remembered (≈ 50 MB)


def lsh_params(config: MinHashConfig) -> tuple[int, int]:
    """(bands, rows): explicit in config, else datasketch's optimum for the threshold."""
    if config.bands is not None:
        return config.bands, config.rows
    lsh = MinHashLSH(threshold=config.threshold, num_perm=config.num_perm, weights=LSH_WEIGHTS)
    return lsh.b, lsh.r


def verify_threshold(config: MinHashConfig) -> float:
    """Estimated-Jaccard floor for a verified pair: the threshold lowered by `verify_sigmas`
    standard deviations of the 128-permutation estimator at the threshold. At the defaults
    (0.8, 3σ) that is 0.694: a pair at true J = 0.5 passes with probability ~1e-5."""
    t = config.threshold
    return t - config.verify_sigmas * math.sqrt(t * (1 - t) / config.num_perm)


def _identity(value):
    return value


class MinHasher:
    def __init__(self, config: MinHashConfig):
        self.config = config
        self.bands, self.rows = lsh_params(config)
        # Build permutations once; each per-document MinHash shares them.
        self._template = MinHash(num_perm=config.num_perm, seed=config.seed, hashfunc=_identity)
        self._word_hashes: dict[str, int] = {}

    def _hash_words(self, words: list[str]) -> np.ndarray:
        # Words repeat across documents (Zipf), so most lookups hit the cache.
        cache = self._word_hashes
        try:
            hashes = list(map(cache.__getitem__, words))
        except KeyError:
            if len(cache) > WORD_CACHE_LIMIT:
                cache.clear()
            for word in set(words).difference(cache):
                cache[word] = zlib.crc32(word.encode("utf-8"))
            hashes = list(map(cache.__getitem__, words))
        return np.array(hashes, dtype=np.uint32)

    def shingle_hashes(self, text: str) -> np.ndarray:
        """32-bit hashes of the lowercase word n-grams (n = shingle_words)."""
        words = _WORD.findall(text.lower())
        if not words:
            return np.zeros(0, dtype=np.uint32)
        word_hashes = self._hash_words(words)
        n = min(self.config.shingle_words, len(words))
        count = len(words) - n + 1
        shingles = word_hashes[:count].copy()
        with np.errstate(over="ignore"):
            for offset in range(1, n):
                shingles = shingles * _SHINGLE_MULTIPLIER + word_hashes[offset : offset + count]
        return shingles

    def signature(self, text: str) -> np.ndarray:
        minhash = MinHash(
            num_perm=self.config.num_perm,
            seed=self.config.seed,
            hashfunc=_identity,
            permutations=self._template.permutations,
            scheme=self._template.scheme,
        )
        shingles = self.shingle_hashes(text)
        if len(shingles):
            minhash.update_batch(shingles.tolist())
        return minhash.hashvalues.astype(SIGNATURE_DTYPE, copy=False)

    def band_keys(self, signature: np.ndarray) -> np.ndarray:
        """One stable 64-bit key per band."""
        rows = self.rows
        keys = np.empty(self.bands, dtype=np.uint64)
        for band in range(self.bands):
            chunk = signature[band * rows : (band + 1) * rows].tobytes()
            keys[band] = int.from_bytes(hashlib.blake2b(chunk, digest_size=8, person=band.to_bytes(2, "little"))
                                        .digest(), "little")
        return keys


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Share of equal signature positions (datasketch's MinHash.jaccard), row-wise."""
    return np.mean(a == b, axis=-1)
