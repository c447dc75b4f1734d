"""The large-star and small-star steps (Kiveris et al., "Connected Components in MapReduce and
Beyond", SoCC 2014) on one task's share of an undirected graph, and the labels a settled graph gives.

A share is its nodes' adjacency: directed records (src, dst, layer) whose src is one of the task's
nodes; an undirected edge {u, v} is held as (u, v) by u's task and as (v, u) by v's. Layers are
independent graphs carried in the same records (components.py: every duplicate edge, and the
near-duplicate edges alone). A step turns each node's neighbourhood into new undirected edges and
returns them as records in both directions, for the tasks of both ends.

Guarantees: a step never adds a node, never drops one that has an edge, and keeps each component's
nodes connected; alternated, the steps turn every component into a star whose center is its lowest
id (the paper proves O(log² n) rounds and observes O(log n)). A graph is settled, a fixed point of
both steps, when each node's edges either all go to higher ids or are one edge to a lower id: then
each component is one star and the lowest id in a node's closed neighbourhood is its component's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Records = tuple[np.ndarray, np.ndarray, np.ndarray]  # src (uint64), dst (uint64), layer (uint8)


@dataclass(frozen=True)
class Adjacency:
    """Records sorted by (layer, src, dst), without duplicates or self-loops. `head` marks the first
    record of each (layer, src) group, which holds that node's lowest neighbour."""

    src: np.ndarray
    dst: np.ndarray
    layer: np.ndarray
    head: np.ndarray

    @classmethod
    def build(cls, records: list[np.ndarray]) -> Adjacency:
        """From [src, dst, layer] in any order, which it empties: each input array is freed as soon
        as its sorted copy exists (a task's memory is a few times its records)."""
        src, dst, layer = records
        records.clear()
        proper = src != dst
        if not proper.all():
            src, dst, layer = src[proper], dst[proper], layer[proper]
        del proper
        order = np.lexsort((dst, src, layer))
        src = src[order]
        dst = dst[order]
        layer = layer[order]
        del order
        head = np.ones(len(src), dtype=bool)
        head[1:] = (src[1:] != src[:-1]) | (layer[1:] != layer[:-1])
        distinct = head.copy()
        distinct[1:] |= dst[1:] != dst[:-1]
        if not distinct.all():
            src, dst, layer, head = src[distinct], dst[distinct], layer[distinct], head[distinct]
        return cls(src, dst, layer, head)

    def __len__(self) -> int:
        return len(self.src)

    def lowest_neighbour(self) -> np.ndarray:
        """Per record, the lowest neighbour of its src (in its layer)."""
        return self.dst[self.head][np.cumsum(self.head) - 1]

    def settled(self) -> bool:
        """Whether every node's edges all go to higher ids or are a single edge to a lower one."""
        sizes = np.diff(np.append(np.flatnonzero(self.head), len(self.src)))
        has_lower = self.dst[self.head] < self.src[self.head]
        return not np.any(has_lower & (sizes > 1))

    def centers(self, layer: int, nodes: np.ndarray) -> np.ndarray:
        """For each of `nodes` (sorted), the lowest id among it and its neighbours in `layer`: on a
        settled graph, the lowest id of its component (itself for a node with no edge there)."""
        mine = self.head & (self.layer == layer)
        heads, lowest = self.src[mine], self.dst[mine]  # sorted by src
        if len(heads) == 0:
            return nodes.copy()
        at = np.minimum(np.searchsorted(heads, nodes), len(heads) - 1)
        found = heads[at] == nodes
        return np.where(found, np.minimum(nodes, lowest[at]), nodes)


def large_star(adjacency: Adjacency) -> Records:
    """Each node u links each higher neighbour to m(u), the lowest of u and its neighbours."""
    up = adjacency.dst > adjacency.src
    lowest = np.minimum(adjacency.src[up], adjacency.lowest_neighbour()[up])
    return both_ways(adjacency.dst[up], lowest, adjacency.layer[up])


def small_star(adjacency: Adjacency) -> Records:
    """Each node u with lower neighbours links itself and each of them to the lowest of them; the
    edges to higher neighbours are theirs to handle."""
    lowest = adjacency.lowest_neighbour()
    down = adjacency.dst < adjacency.src
    others = down & (adjacency.dst != lowest)  # each other lower neighbour v → {v, lowest}
    itself = down & adjacency.head  # once per node with a lower neighbour (its head holds the lowest) → {u, lowest}
    return both_ways(np.concatenate((adjacency.dst[others], adjacency.src[itself])),
                      np.concatenate((lowest[others], lowest[itself])),
                      np.concatenate((adjacency.layer[others], adjacency.layer[itself])))


def both_ways(a: np.ndarray, b: np.ndarray, layer: np.ndarray) -> Records:
    """The undirected edges {a, b} as records for the tasks of both ends."""
    return np.concatenate((a, b)), np.concatenate((b, a)), np.concatenate((layer, layer))
