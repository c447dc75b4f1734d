"""Which sequences a batch holds: a pure function of (seed, step, position in the step's global
batch), so a restarted run, or one on another number of ranks with the same global batch, reads
exactly the batches it would have read.

A step's global batch is G = world × grad_accum × per_rank sequences; batch index i is micro-batch
m = i mod grad_accum of step i // grad_accum, and there rank r holds positions
(r·grad_accum + m)·per_rank + [0, per_rank): a rank's positions over a step are contiguous, and
2 ranks × 4 sequences or 1 rank × 2 micro-batches of 4 hold the same 8 positions. Two shuffles
(config `data.shuffle`):

`blocks` (BlockSampler, the default) reads a storage block once per epoch however large the
corpus is next to the node's cache (MosaicML Streaming's block shuffle and canonical nodes):

- *Units*: a source's sequences, shard by shard, in runs of `unit_blocks` × (block_bytes //
  (seq_len × token bytes)) consecutive sequences: `unit_blocks` storage blocks (the last unit of
  a shard is shorter). Reading a unit fetches its blocks and the next one (its last sequence's
  tail), so fetched / trained bytes are about (unit_blocks + 1) / unit_blocks while the cache
  holds the windows being read (plus a shard's first block, for its header, once a process).
- *Streams*: the positions are cut into S groups of G/S, S the largest divisor of G that is at
  most `streams` and the smallest source's sequences; stream s owns positions [s·G/S, (s+1)·G/S)
  and makes its own draws, in order: draw c = step·G/S + (position − s·G/S). A rank's positions
  lie in about S/world + 1 streams, so with S a multiple of the number of nodes no two nodes
  read one stream's blocks.
- *Epochs*: each epoch, a source's units are put in a keyed order (seed, source, epoch) and
  stream s takes the s-th S-th of that order's sequences; it reads them window by window, a
  window being W = window_blocks // unit_blocks consecutive units of the order whose sequences
  it draws in a keyed order (seed, source, epoch, stream, window). Every sequence of a source is
  drawn once per epoch (by one stream), none twice; two sequences a stream draws from one window
  come from at most W units; a unit's sequences are all drawn within its window.
- *Mixtures*: a stream's draws go in chunks of K = `mixture_chunk`; chunk k gives source i
  C_i(k+1) − C_i(k) draws, C_i(k) being the largest-remainder share of k·K draws at the weights
  (so at every chunk's end a source is within one sequence of its weight × draws, and a chunk
  holds exactly its quota), at positions of the chunk set by a keyed permutation, a source's
  draws in a chunk in order (so any prefix of a stream's draws takes a prefix of each source's):
  a chunk's layout costs O(K) once, a draw's source and index then O(1). Each
  source goes through its own epochs (a small one faster), its streams at one pace (their
  shares differ by one sequence at most).

The order depends on the seed, G, these settings and the sources' shapes only: changing G or a
setting starts another order from that batch on (a valid shuffle, but the epoch in progress is
not completed as it would have been).

*Schedules* (lmforge.trainer.schedule: stages of global batch, sequence length and mixture by
consumed tokens) are what changes G without that: with a plan,

- the stream count S is one for the whole run, a divisor of every stage's G, so a batch ramp only
  widens each stream's share of a step, and each stream keeps drawing where it was: every
  sequence once per epoch whatever the ramp;
- each stage has its mixture's chunks (keyed by the stage too), and each stream continues each
  source's draws from where the stage before left them (a chunk takes a prefix of each source's
  draws, so a stage change mid-chunk leaves no gap and no repeat);
- the sources hold the longest stage's sequences, and a shorter stage reads consecutive pieces of
  them: a stream's position in a source is counted in the shortest stage's sequences ("atoms"),
  a stage of a atoms per sequence starts at the next multiple of a. So the token stream is the
  same at every length, a change to a longer sequence skips fewer than a atoms per stream and
  source (nothing is read twice), and a stream still reads its windows' blocks whole: the read
  amplification bound holds across the stages.

`global` (GlobalSampler) is the uniform shuffle: sample q = (i·world + r)·per_rank + j (batch
index i, rank r; the same 8 q's per step for any split of G) picks its source by a hash of
(seed, q) against the weights, then perm(q mod n) of that source, perm a
keyed bijection of [0, n) per epoch (q // n). Any two sequences of the corpus can be neighbours,
so once the corpus is much larger than the cache nearly every sequence costs a block fetch;
it suits corpora the cache holds, and it is the benchmark's baseline.
"""

from __future__ import annotations

import functools
import hashlib
import math
import threading
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Protocol

import numpy as np

from lmforge.common.errors import ConfigError
from lmforge.trainer.data import SampleRef

if TYPE_CHECKING:
    from lmforge.trainer.schedule import TrainingPlan

EPOCHS_KEPT = 4  # unit orders kept per source (a source's streams are at most an epoch apart)


class Source(Protocol):
    """What a sampler needs of a data source (data.ShardSource and data_stream.StreamingSource)."""

    name: str
    seq_len: int
    tokenizer_sha256: str

    @property
    def num_sequences(self) -> int: ...

    @property
    def sequence_ends(self) -> np.ndarray: ...

    @property
    def block_bytes(self) -> int: ...

    @property
    def token_bytes(self) -> int: ...

    def sequence(self, index: int, offset: int = 0, length: int = 0) -> np.ndarray: ...


def _hash64(*parts: int | str) -> int:
    data = ":".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class KeyedPermutation:
    """A bijection of [0, n) from a 4-round Feistel network over the next power of four,
    with cycle walking: O(1) memory whatever n, different for every key."""

    ROUNDS = 4

    def __init__(self, n: int, key: int):
        if n < 1:
            raise ValueError("a permutation needs n ≥ 1")
        self.n = n
        self.half_bits = max(1, ((n - 1).bit_length() + 1) // 2)
        self.mask = (1 << self.half_bits) - 1
        self.keys = [_hash64(key, r) for r in range(self.ROUNDS)]

    def _round(self, value: int, round_key: int) -> int:
        return _hash64(round_key, value) & self.mask

    def _encrypt(self, x: int) -> int:
        left, right = x >> self.half_bits, x & self.mask
        for round_key in self.keys:
            left, right = right, left ^ self._round(right, round_key)
        return (left << self.half_bits) | right

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        x = self._encrypt(i)
        while x >= self.n:  # cycle walking stays within [0, n)
            x = self._encrypt(x)
        return x


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def keyed_order(n: int, key: int) -> np.ndarray:
    """range(n) in a keyed random order, as an array: indices sorted by splitmix64 of (key + i·golden).
    Both steps are bijections of 64-bit integers, so no two indices tie and the order is the same on
    every machine and numpy version."""
    x = np.uint64(key & (2**64 - 1)) + np.arange(n, dtype=np.uint64) * _GOLDEN  # wraps modulo 2**64
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return np.argsort(x, kind="stable")


class Sampler:
    """Sources, weights and seed, checked; subclasses define batch_refs."""

    def __init__(self, sources: Sequence[Source], weights: Sequence[float], seed: int):
        if len(sources) != len(weights) or not sources:
            raise ConfigError("data: give one weight per source")
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ConfigError("data: mixture weights must be non-negative and not all zero")
        if len({s.tokenizer_sha256 for s in sources}) > 1:
            raise ConfigError("data: mixture sources were tokenized with different tokenizers")
        self.sources = list(sources)
        self.seed = seed
        total = float(sum(weights))
        self.weights = [w / total for w in weights]

    def batch_refs(self, index: int, rank: int, world_size: int, per_rank: int) -> list[SampleRef]:
        """The sequences of `rank`'s batch number `index`."""
        raise NotImplementedError

    def batch(self, index: int, rank: int, world_size: int, per_rank: int) -> tuple[np.ndarray, list[SampleRef]]:
        """(per_rank, seq_len + 1) int64 tokens of `rank`'s batch number `index`, and what they are."""
        refs = self.batch_refs(index, rank, world_size, per_rank)
        tokens = np.stack([r.read(self.sources) for r in refs])
        return tokens, refs


class GlobalSampler(Sampler):
    """The uniform shuffle over the whole corpus (`data.shuffle: global`; module docstring)."""

    def __init__(self, sources: Sequence[Source], weights: Sequence[float], seed: int,
                 plan: TrainingPlan | None = None):
        super().__init__(sources, weights, seed)
        if plan is not None and plan.seq_lens[0] != plan.seq_lens[1]:
            raise ConfigError("schedule: a sequence-length curriculum needs data.shuffle: blocks")
        self.plan = plan
        stage_weights = [stage.mixture for stage in plan.stages] if plan else [tuple(weights)]
        self._cumulative = [np.cumsum(np.asarray(w) / sum(w)) for w in stage_weights]
        self._perms: dict[tuple[int, int], KeyedPermutation] = {}

    def _permutation(self, source: int, epoch: int) -> KeyedPermutation:
        key = (source, epoch)
        permutation = self._perms.get(key)
        if permutation is None:  # (the prefetcher's loader threads call this at once: no lookup after a clear)
            if len(self._perms) > 64:
                self._perms.clear()
            permutation = KeyedPermutation(self.sources[source].num_sequences, _hash64(self.seed, source, epoch))
            self._perms[key] = permutation
        return permutation

    def sample(self, q: int, stage: int = 0) -> SampleRef:
        if len(self.sources) == 1:
            source = 0
        else:
            u = _hash64(self.seed, "mix", q) / 2**64
            source = min(int(np.searchsorted(self._cumulative[stage], u, side="right")), len(self.sources) - 1)
        n = self.sources[source].num_sequences
        epoch, offset = divmod(q, n)
        return SampleRef(source, self._permutation(source, epoch)(offset), epoch)

    def batch_refs(self, index: int, rank: int, world_size: int, per_rank: int) -> list[SampleRef]:
        if self.plan is None:
            first, stage = (index * world_size + rank) * per_rank, 0
        else:  # sample q of the run: the sequences of the steps before, then micro-batch by micro-batch
            step, micro = self.plan.locate(index)
            first = self.plan.sequences_before(step) + (micro * world_size + rank) * per_rank
            stage = self.plan.stage(step).index
        return [self.sample(q, stage) for q in range(first, first + per_rank)]


class BlockSampler(Sampler):
    """The block-window shuffle with streams and mixture chunks (`data.shuffle: blocks`; module docstring).
    `grad_accum`: micro-batches per step (batch index i is micro-batch i mod grad_accum of step i // grad_accum);
    or a `plan` (lmforge.trainer.schedule.TrainingPlan) whose stages set each step's batch, mixture and sequence
    length (the sources then hold the longest stage's sequences; see "Schedules" in the module docstring)."""

    def __init__(self, sources: Sequence[Source], weights: Sequence[float], seed: int, *, streams: int = 8,
                 window_blocks: int = 128, unit_blocks: int = 8, mixture_chunk: int = 1024, grad_accum: int = 1,
                 plan: TrainingPlan | None = None):
        super().__init__(sources, weights, seed)
        for name, value in (("data.shuffle_streams", streams), ("data.shuffle_window_blocks", window_blocks),
                            ("data.shuffle_unit_blocks", unit_blocks), ("data.shuffle_mixture_chunk", mixture_chunk),
                            ("grad_accum", grad_accum)):
            if value < 1:
                raise ConfigError(f"{name}: must be 1 or more, not {value}")
        self.streams, self.grad_accum, self.plan = streams, grad_accum, plan
        self.window_units = max(1, window_blocks // unit_blocks)
        self.orders = [_SourceOrder(source, index, seed, unit_blocks, self.window_units)
                       for index, source in enumerate(self.sources)]
        stage_weights = [stage.mixture for stage in plan.stages] if plan else [tuple(weights)]
        names = [s.name for s in self.sources]
        self._mixtures = [_Mixture(w, mixture_chunk, seed, names, stage=k) if len(self.sources) > 1 else None
                          for k, w in enumerate(stage_weights)]
        used = [i for i in range(len(self.sources)) if any(w[i] > 0 for w in stage_weights)]
        self._fewest = min(self.sources[i].num_sequences for i in used)
        if plan is not None:
            shortest, longest = plan.seq_lens
            if any(source.seq_len != longest for source in self.sources):
                raise ValueError(f"a scheduled sampler reads sequences of the longest stage's {longest} tokens")
            self._atom, self._atoms_per_sequence = shortest, longest // shortest
            self._plan_streams = self.stream_count(plan.stream_divisor())
            self._starts = self._stage_starts()

    def stream_count(self, global_batch: int) -> int:
        """S for a global batch of `global_batch` positions: the largest divisor of it that is at most
        `streams` and the smallest source's sequences (equal streams go through epochs at one pace)."""
        most = min(self.streams, global_batch, self._fewest)
        return next(s for s in range(most, 0, -1) if global_batch % s == 0)

    def batch_refs(self, index: int, rank: int, world_size: int, per_rank: int) -> list[SampleRef]:
        if self.plan is None:
            step, micro = divmod(index, self.grad_accum)
            size = world_size * self.grad_accum * per_rank
            streams = self.stream_count(size)
            return self._refs(0, step * (size // streams), size // streams, streams,
                              (rank * self.grad_accum + micro) * per_rank, per_rank)
        step, micro = self.plan.locate(index)
        stage, micro_batches = self.plan.stage(step), self.plan.micro_batches(step)
        if world_size * micro_batches * per_rank != stage.sequences:
            raise ValueError(f"step {step}: {world_size} ranks x {micro_batches} micro-batches x {per_rank} "
                             f"sequences is not the stage's global batch of {stage.sequences}")
        streams = self._plan_streams
        drawn = (self.plan.sequences_before(step) - stage.sequences_before) // streams
        return self._refs(stage.index, drawn, stage.sequences // streams, streams,
                          (rank * micro_batches + micro) * per_rank, per_rank)

    def _refs(self, stage: int, drawn: int, width: int, streams: int, first: int, count: int) -> list[SampleRef]:
        """The sequences at positions [first, first + count) of a step whose streams have each drawn `drawn`
        sequences in this stage before it."""
        mixture = self._mixtures[stage]
        refs = []
        for position in range(first, first + count):
            stream, column = divmod(position, width)
            source, nth = mixture.locate(stream, drawn + column) if mixture else (0, drawn + column)
            if self.plan is None:
                refs.append(self.orders[source].ref(stream, streams, nth))
                continue
            seq_len = self.plan.stages[stage].seq_len
            atoms = seq_len // self._atom
            at = _round_up(self._starts[stage][stream][source], atoms) + nth * atoms
            sequence, piece = divmod(at, self._atoms_per_sequence)
            ref = self.orders[source].ref(stream, streams, sequence)
            if self._atoms_per_sequence > 1:
                ref = SampleRef(ref.source, ref.sequence, ref.epoch, piece * self._atom, seq_len)
            refs.append(ref)
        return refs

    def _stage_starts(self) -> list[list[list[int]]]:
        """[stage][stream][source]: the stream's position in the source's draws, in the shortest stage's
        sequences ("atoms"), when the stage starts. A stage of a atoms per sequence starts at the next
        multiple of a, so a longer stage skips the rest of a sequence it cannot use whole (fewer than a
        atoms per stream and source, at each change to a longer sequence)."""
        stages, streams = self.plan.stages, self._plan_streams
        starts = [[[0] * len(self.sources) for _ in range(streams)]]
        for previous, stage in zip(stages, stages[1:], strict=False):
            draws = (stage.sequences_before - previous.sequences_before) // streams
            atoms = previous.seq_len // self._atom
            mixture = self._mixtures[previous.index]
            row = []
            for stream in range(streams):
                counts = mixture.counts(stream, draws) if mixture else [draws]
                row.append([_round_up(at, atoms) + n * atoms
                            for at, n in zip(starts[-1][stream], counts, strict=True)])
            starts.append(row)
        return starts


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class _SourceOrder:
    """One source's units and, per epoch, their keyed order, cut into stream shares and windows."""

    def __init__(self, source: Source, index: int, seed: int, unit_blocks: int, window_units: int):
        self.index, self.seed, self.window_units = index, seed, window_units
        per_block = max(1, source.block_bytes // (source.seq_len * source.token_bytes))
        self.unit_sequences = per_block * unit_blocks
        ends = np.asarray(source.sequence_ends, dtype=np.int64)
        starts = np.concatenate(([0], ends[:-1]))
        self.unit_starts = np.concatenate([np.arange(lo, hi, self.unit_sequences, dtype=np.int64)
                                           for lo, hi in zip(starts, ends, strict=True) if hi > lo])
        shard_ends = np.repeat(ends[ends > starts], [-(-(hi - lo) // self.unit_sequences)
                                                     for lo, hi in zip(starts, ends, strict=True) if hi > lo])
        self.unit_sizes = np.minimum(self.unit_sequences, shard_ends - self.unit_starts)
        self.num_sequences = int(ends[-1])
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._lock = threading.Lock()

    def epoch_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(units in the epoch's order, cumulative sequences before each of them and after the last)."""
        with self._lock:
            layout = self._epochs.get(epoch)
            if layout is None:
                order = keyed_order(len(self.unit_starts), _hash64(self.seed, "units", self.index, epoch))
                layout = order, np.concatenate(([0], np.cumsum(self.unit_sizes[order])))
                if len(self._epochs) >= EPOCHS_KEPT:
                    del self._epochs[min(self._epochs)]
                self._epochs[epoch] = layout
            return layout

    def ref(self, stream: int, streams: int, draw: int) -> SampleRef:
        """The stream's `draw`-th sequence of this source (counting across epochs)."""
        n = self.num_sequences
        share_lo, share_hi = stream * n // streams, (stream + 1) * n // streams
        epoch, offset = divmod(draw, share_hi - share_lo)
        order, cumulative = self.epoch_order(epoch)
        at = share_lo + offset  # position in the epoch's order of sequences
        first_unit = int(np.searchsorted(cumulative, share_lo, side="right")) - 1
        window = (int(np.searchsorted(cumulative, at, side="right")) - 1 - first_unit) // self.window_units
        lo_unit = first_unit + window * self.window_units
        hi_unit = min(lo_unit + self.window_units, len(order))
        lo, hi = max(share_lo, int(cumulative[lo_unit])), min(share_hi, int(cumulative[hi_unit]))
        shuffle = KeyedPermutation(hi - lo, _hash64(self.seed, "window", self.index, epoch, streams, stream, window))
        at = lo + shuffle(at - lo)
        unit = int(np.searchsorted(cumulative, at, side="right")) - 1
        return SampleRef(self.index, int(self.unit_starts[order[unit]]) + at - int(cumulative[unit]), epoch)


class _Mixture:
    """Which source each draw of a stream takes, and its index among that source's draws there."""

    def __init__(self, weights: Sequence[float], chunk: int, seed: int, names: Sequence[str], stage: int = 0):
        self.stage = stage  # a schedule's stage (lmforge.trainer.schedule): each its own chunk permutations
        exact = [Fraction(repr(float(w))) for w in weights]  # the decimal the config wrote, exactly
        total = sum(exact)
        self.shares = tuple(w / total for w in exact)
        self.chunk, self.seed = chunk, seed
        for name, share in zip(names, self.shares, strict=True):
            if 0 < share * chunk < 1:  # below one draw a chunk, a chunk's quota could be negative
                raise ConfigError(f"data.sources: {name}'s weight is {float(share):.3g} of the mixture, less than one "
                                  f"of every data.shuffle_mixture_chunk={chunk} draws; raise it to at least "
                                  f"{math.ceil(1 / share)}")

    def locate(self, stream: int, draw: int) -> tuple[int, int]:
        chunk, slot = divmod(draw, self.chunk)
        sources, ranks = self._chunk(stream, chunk)
        source = int(sources[slot])
        return source, _apportion(self.shares, chunk * self.chunk)[source] + int(ranks[slot])

    def counts(self, stream: int, draws: int) -> list[int]:
        """How many of the stream's first `draws` draws each source takes."""
        chunk, rest = divmod(draws, self.chunk)
        counts = list(_apportion(self.shares, chunk * self.chunk))
        if rest:
            sources, _ = self._chunk(stream, chunk)
            for source, n in zip(*np.unique(sources[:rest], return_counts=True), strict=True):
                counts[int(source)] += int(n)
        return counts

    @functools.lru_cache(maxsize=64)  # noqa: B019 (a few chunks per stream in use at once; the sampler lives long)
    def _chunk(self, stream: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:
        """The chunk's source by slot (its quota of each, at keyed places) and each slot's rank among its
        source's slots: a source's draws in a chunk come in order, so any prefix of the stream's draws takes
        a prefix of each source's (a stage change continues from there)."""
        before, after = _apportion(self.shares, chunk * self.chunk), _apportion(self.shares, (chunk + 1) * self.chunk)
        offsets = np.cumsum([0, *(hi - lo for lo, hi in zip(before, after, strict=True))])
        key = _hash64(self.seed, "mix", stream, chunk) if self.stage == 0 else \
            _hash64(self.seed, "mix", self.stage, stream, chunk)
        permutation = KeyedPermutation(self.chunk, key)
        places = np.array([permutation(slot) for slot in range(self.chunk)])
        sources = np.searchsorted(offsets, places, side="right") - 1
        ranks = np.zeros(self.chunk, dtype=np.int64)
        for source in range(len(self.shares)):
            mine = sources == source
            ranks[mine] = np.arange(int(mine.sum()))
        return sources, ranks


@functools.lru_cache(maxsize=1024)
def _apportion(shares: tuple[Fraction, ...], draws: int) -> tuple[int, ...]:
    """`draws` split among the shares by largest remainder (ties to the first source)."""
    exact = [share * draws for share in shares]
    counts = [math.floor(e) for e in exact]
    by_remainder = sorted(range(len(shares)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: draws - sum(counts)]:
        counts[i] += 1
    return tuple(counts)
