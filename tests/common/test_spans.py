from lmforge.common.spans import covered_tokens


def test_covered_tokens_is_the_union_of_the_long_spans():
    assert covered_tokens([(0, 40), (30, 75), (80, 90)], 32) == 75
    assert covered_tokens([(10, 50), (15, 49)], 32) == 40
    assert covered_tokens([(50, 90), (0, 40), (39, 41)], 2) == 81  # unsorted; a bridge of 2 joins them
    assert covered_tokens([(0, 10), (5, 20), (30, 33), (40, 72)]) == 20 + 3 + 32
    assert covered_tokens([(0, 10)], 32) == 0 and covered_tokens([], 1) == 0
