"""Heads scored as grounding classifiers (pipeline/analyze/grounding.py) on hand-built attention
maps: a head that always attends to the right region scores 100%, one that attends to the most
confident detection equals the baseline, IoU exactly 0.5 counts, padded regions are never chosen
nor counted in a head's image share, ties go to the first region, and a phrase's row is pooled
from its wordpieces as stated."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.analyze.grounding import BatchCases, HeadTally, box_ious, head_choices, score_batch
from pipeline.analyze.report import group_report

# Regions of one image: r0 the target, r1 elsewhere, r2 the target's top half (IoU exactly 0.5).
TARGET = [0.0, 0.0, 10.0, 10.0]
REGIONS = np.array([[0, 0, 10, 10], [20, 20, 30, 30], [0, 0, 10, 5]], dtype=np.float32)


def test_iou_of_exactly_one_half_counts_and_just_below_does_not():
    ious = box_ious(np.array([[0, 0, 10, 5], [0, 0, 10, 4.99], [0, 0, 10, 10], [10, 10, 20, 20]]),
                    np.array(TARGET))
    assert ious[0] == 0.5
    assert 0.49 < ious[1] < 0.5
    assert ious[2] == 1.0 and ious[3] == 0.0  # touching corners: no area in common
    assert (ious >= 0.5).tolist() == [True, False, True, False]


def one_hot_maps(choices: list[list[int]], T: int, N: int) -> torch.Tensor:
    """(B=len(choices), L=1, heads, T, N): head h of sentence b puts 0.7 of every text
    position's attention on region choices[b][h] (-1: spread evenly) and 0.3 on the text."""
    B, H = len(choices), len(choices[0])
    maps = torch.zeros(B, 1, H, T, N)
    for b, row in enumerate(choices):
        for h, region in enumerate(row):
            if region < 0:
                maps[b, 0, h, :, :] = 0.7 / N
            else:
                maps[b, 0, h, :, region] = 0.7
    return maps


def cases(hits: list[list[bool]], confident: list[int], real: list[int], T: int = 3
          ) -> BatchCases:
    """One entity case per sentence, pooled from position 1."""
    B, N = len(hits), len(hits[0])
    weights = torch.zeros(B, 1, T, dtype=torch.float64)
    weights[:, 0, 1] = 1.0
    mask = torch.zeros(B, N, dtype=torch.bool)
    for b, n in enumerate(real):
        mask[b, :n] = True
    return BatchCases(weights, torch.tensor(hits)[:, None, :], (("entity",),) * B, mask,
                      torch.tensor(confident))


def test_the_right_head_scores_100_and_the_confident_head_equals_the_baseline():
    # Three sentences; the hits of their regions, their most confident region, 3 real regions.
    hits = [[True, False, True], [False, True, False], [False, False, True]]
    confident = [1, 1, 0]  # baseline: wrong, right, wrong -> 1 of 3
    right = [0, 1, 2]
    # heads: always right, always the most confident, spread evenly (ties: region 0).
    choices = [[r, c, -1] for r, c in zip(right, confident)]
    tally = HeadTally(("1",), 3)
    chosen = score_batch(tally, one_hot_maps(choices, 3, 3), cases(hits, confident, [3, 3, 3]))
    group = tally.groups["entity"]
    assert group.count == 3 and group.baseline == 1 and group.any_region == 3
    assert group.correct.tolist() == [[3, 1, 1]]  # ties -> region 0: right in sentence 0 only
    assert chosen[:, 0, 0, 2].tolist() == [0, 0, 0]
    report = group_report(("1",), group)
    assert report["accuracy"] == [[100.0, pytest.approx(100 / 3, abs=0.01),
                                   pytest.approx(100 / 3, abs=0.01)]]
    assert report["baseline"] == pytest.approx(100 / 3, abs=0.01)
    assert report["best"] == {"layer": "1", "head": 1, "accuracy": 100.0, "active": True}
    # 0.7 of each row goes to the regions, over the 20% that makes a head active
    assert report["image_share"] == [[0.7, 0.7, 0.7]]


def test_padded_regions_are_never_chosen_and_their_attention_is_no_image_share():
    # Two real regions (r1 the target) and two padded slots that the maps give attention to, as a
    # model masking with a finite bias would; the share counts the real regions' attention only.
    T, N = 3, 4
    maps = torch.zeros(1, 1, 3, T, N)
    maps[0, 0, 0, :, 3] = 0.6  # head 0: most on a padded slot, 0.1 on r1 -> r1, share 0.1
    maps[0, 0, 0, :, 1] = 0.1
    maps[0, 0, 1, :, 2] = 0.5  # head 1: 0.5 on a padded slot, 0.25 on r0 -> r0, share 0.25
    maps[0, 0, 1, :, 0] = 0.25
    maps[0, 0, 2, :, 2:] = 0.45  # head 2: only the padding -> r0 (a tie of zeros), share 0
    batch = cases([[False, True, False, False]], [0], real=[2])
    choice, share = head_choices(maps, batch)
    assert choice[0, 0, 0].tolist() == [1, 0, 0]
    assert share[0, 0, 0].tolist() == pytest.approx([0.1, 0.25, 0.0])
    tally = HeadTally(("1",), 3)
    score_batch(tally, maps, batch)
    report = group_report(("1",), tally.groups["entity"])
    assert report["accuracy"] == [[100.0, 0.0, 0.0]]
    assert report["image_share"] == [[0.1, 0.25, 0.0]]  # with the padding: 0.7, 0.75, 0.9
    assert report["active"] == [[False, True, False]]
    assert report["best"]["head"] == 1 and not report["best"]["active"]
    assert report["best_active"] == {"layer": "1", "head": 2, "accuracy": 0.0, "active": True}


def test_a_phrase_row_is_the_mean_over_words_of_the_mean_over_pieces():
    from pipeline.analyze.cases import weights

    # words: w0 -> pieces 1, 2; w1 -> piece 3; position 0 is [CLS], 4 [SEP]
    pieces = [[1, 2], [3]]
    assert weights([0, 1], pieces, 5).tolist() == [0, 0.25, 0.25, 0.5, 0]
    assert weights([1], pieces, 5).tolist() == [0, 0, 0, 1, 0]
    assert weights([0, 1], [[1, 2], []], 5) is None  # a word cut off: no case

    # Pieces 1 and 2 look at r1 (0.6 each), piece 3 at r0 (0.9): the mean of means is
    # r0 0.45, r1 0.3: r0 wins (a plain mean over the three pieces would pick r1: 0.4 > 0.3).
    maps = torch.zeros(1, 1, 1, 5, 2)
    maps[0, 0, 0, 1, 1] = maps[0, 0, 0, 2, 1] = 0.6
    maps[0, 0, 0, 3, 0] = 0.9
    batch = BatchCases(torch.from_numpy(weights([0, 1], pieces, 5))[None, None],
                       torch.tensor([[[True, False]]]), (("entity",),),
                       torch.ones(1, 2, dtype=torch.bool), torch.tensor([1]))
    choice, share = head_choices(maps, batch)
    assert choice.item() == 0
    assert share.item() == pytest.approx(0.75)


def test_a_region_at_iou_exactly_one_half_is_a_hit_of_the_case():
    from collections import Counter

    from pipeline.analyze.cases import Case, Skipped, batch_cases
    from shards.schema import Sample

    sample = Sample("flickr30k-1", {}, {"boxes": REGIONS[1:],  # r1 elsewhere, r2 the top half
                                        "object_conf": np.array([0.9, 0.2], np.float32)})
    case = Case("entity", (0,), tuple(TARGET), "a ball")
    skipped = Skipped(Counter())
    found, kept = batch_cases([[case, Case("det", (1,), tuple(TARGET), "x")]], [[[1], []]],
                              [sample], 3, 36, 4, skipped)
    assert found.hits[0, 0].tolist() == [False, True, False, False]
    assert found.region_mask[0].tolist() == [True, True, False, False]
    assert found.most_confident.tolist() == [0]
    assert kept == [[case]] and skipped.counts == {"words cut off by the text length": 1}


def sentence(words: str, phrases: list[tuple[int, int, int]]):
    """An EntitySentence of `words` with phrases (chain, first word, end)."""
    from pipeline.analyze.entities import EntitySentence, Phrase

    w = tuple(words.split())
    return EntitySentence("1", 0, w, tuple(Phrase(c, ("people",), s, w[s:e])
                                           for c, s, e in phrases))


def test_an_arc_points_from_the_word_outside_to_the_boxed_phrase_the_head_when_both_are():
    from pipeline.analyze.cases import sentence_cases
    from pipeline.analyze.entities import ImageEntities
    from pipeline.analyze.parses import Parse

    s = sentence("A man wearing a white shirt near a tree .", [(1, 0, 2), (2, 3, 6), (3, 7, 9)])
    man, shirt = (0.0, 0.0, 10.0, 10.0), (20.0, 20.0, 30.0, 30.0)
    entities = ImageEntities("1", 100, 100, {1: (man,), 2: (shirt,)}, frozenset({3}),
                             frozenset())
    #            A    man  wearing a  white shirt near a  tree .
    heads = (1, -1, 1, 5, 5, 2, 8, 8, 2, 1)
    deprels = ("det", "root", "acl", "det", "amod", "obj", "case", "det", "obl", "punct")
    cases = sentence_cases(s, entities, Parse(s.words, heads, deprels))
    found = [(c.group, c.words, c.box) for c in cases]
    assert found == [
        ("entity", (0, 1), man), ("entity", (3, 4, 5), shirt),  # the scene chain 3 has no box
        ("det", (0,), man),          # man -det-> A: the head is in the phrase
        ("acl", (2,), man),          # man -acl-> wearing: "wearing" looks for the man
        ("det", (3,), shirt), ("amod", (4,), shirt),  # inside the phrase: towards its noun
        ("obj", (2,), shirt),        # wearing -obj-> shirt: the dependent is the entity
        ("punct", (9,), man),
    ]  # near / a / tree: both ends outside a boxed phrase (the tree is the scene): no case
    assert sentence_cases(s, entities, None) == cases[:2]
