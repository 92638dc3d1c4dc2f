"""A batch's images grouped onto canvases by shape (extractor.canvases): the fewest padded pixels
for the number of canvases, against every way of splitting the batch."""

import itertools
import random

import pytest

from extractor.canvases import canvas_groups, round_up


def _pixels(groups, padded):
    return sum(
        len(g) * max(padded[i][0] for i in g) * max(padded[i][1] for i in g) for g in groups
    )


def _every_split(n):
    """Every split of range(n) into two non-empty groups, each once."""
    for mask in range(1, 2 ** (n - 1)):
        inside = [i for i in range(n) if mask >> i & 1]
        yield inside, [i for i in range(n) if not mask >> i & 1]


@pytest.mark.parametrize("seed", range(40))
def test_two_canvases_pad_the_fewest_pixels(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 9)
    multiple = rng.choice([1, 16, 64])
    sizes = [rng.choice([(600, rng.randint(600, 1000)), (rng.randint(600, 1000), 600),
                         (rng.randint(300, 1000), rng.randint(300, 1000))]) for _ in range(n)]
    padded = [(round_up(h, multiple), round_up(w, multiple)) for h, w in sizes]
    one = _pixels([list(range(n))], padded)
    best = min(_pixels(split, padded) for split in _every_split(n))
    groups = canvas_groups(sizes, multiple, most=2, min_saving=0.0)
    assert sorted(itertools.chain(*groups)) == list(range(n))
    assert all(g == sorted(g) for g in groups) and groups == sorted(groups)
    assert _pixels(groups, padded) == min(best, one)
    assert len(groups) == (2 if best < one else 1)
    # A split that saves less than min_saving of the batch's pixels is not made.
    assert len(canvas_groups(sizes, multiple, most=2, min_saving=0.1)) == (
        2 if one - best >= 0.1 * one else 1
    )
    assert canvas_groups(sizes, multiple, most=1) == [list(range(n))]


def test_portraits_and_landscapes_go_to_their_own_canvases():
    sizes = [(600, 800), (800, 600), (600, 900), (600, 600), (1000, 600)]
    assert canvas_groups(sizes, 64, most=2) == [[0, 2, 3], [1, 4]]
    assert canvas_groups(sizes, 64, most=3, min_saving=0.0) == [[0, 2], [1, 4], [3]]
    assert canvas_groups([(600, 900)] * 4, 64, most=2) == [[0, 1, 2, 3]]
