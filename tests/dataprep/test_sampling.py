import random
from collections import Counter

from lmforge.dataprep.sampling import reservoir


def test_reservoir_is_bounded_and_uniform():
    counts = Counter()
    for seed in range(2000):
        chosen, seen = reservoir(({"i": i} for i in range(20)), 5, random.Random(seed))
        assert seen == 20 and len(chosen) == 5 and len({row["i"] for row in chosen}) == 5
        counts.update(row["i"] for row in chosen)
    # each of the 20 rows is chosen with probability 1/4: 500 expected of 2000 draws
    assert all(420 < counts[i] < 580 for i in range(20)), counts


def test_reservoir_with_fewer_rows_than_asked():
    chosen, seen = reservoir(iter([{"i": 1}, {"i": 2}]), 5, random.Random(0))
    assert seen == 2 and [r["i"] for r in chosen] == [1, 2]
