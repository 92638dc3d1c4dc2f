"""Flickr30K retrieval metrics (pipeline/evaluate/flickr30k.py) on hand-built score matrices:
ranks both ways (an image ranks by the best of its captions), ties counted against the true
item, R@k, median and mean rank, a warning where the gallery is too small for R@k; parity with
SCAN's loops where there are no ties; 5,000 x 1,000 in well under a second; the files' errors;
`pipeline evaluate flickr30k` end to end."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.cli import main
from pipeline.evaluate.flickr30k import (
    caption_ranks,
    evaluate_flickr30k,
    image_ranks,
    read_karpathy,
    read_retrieval_predictions,
    retrieval_scores,
    write_retrieval_predictions,
)
from pipeline.evaluate.inputs import EvaluationError

# 3 images, 2 captions each: caption c belongs to image c // 2.
CAPTION_IMAGE = np.array([0, 0, 1, 1, 2, 2])
SCORES = np.array([
    #  img0  img1  img2
    [0.9, 0.1, 0.2],   # c0 (img0): img0 first                       -> rank 1
    [0.3, 0.8, 0.1],   # c1 (img0): img1 above it                    -> rank 2
    [0.2, 0.7, 0.1],   # c2 (img1): first                            -> rank 1
    [0.5, 0.1, 0.4],   # c3 (img1): its image last of 3              -> rank 3
    [0.1, 0.6, 0.5],   # c4 (img2): img1 above                       -> rank 2
    [0.0, 0.2, 0.3],   # c5 (img2): first                            -> rank 1
])
# Image -> caption, by column: img0's best caption c0 (.9) is first -> 1; img1's best c2 (.7) is
# beaten by img0's c1 (.8) -> 2; img2's best c4 (.5) is first -> 1.


def test_caption_to_image_ranks_by_hand():
    ranks = caption_ranks(SCORES, CAPTION_IMAGE)
    np.testing.assert_array_equal(ranks, [1, 2, 1, 3, 2, 1])  # c3's image is last: rank I = 3


def test_image_to_caption_takes_the_best_of_its_captions():
    np.testing.assert_array_equal(image_ranks(SCORES, CAPTION_IMAGE), [1, 2, 1])
    # img1's captions c2 (.7) and c3 (.1): the best, c2, is beaten only by c1 (.8) -> 2, though
    # c3 alone would rank 6th of 6.
    scores = SCORES.copy()
    # Now img1's best caption is c3 (.1): c1 (.8), c4 (.6), c5 (.2) beat it and c0 ties it (.1,
    # counted against it) -> rank 5.
    scores[2, 1] = 0.05
    np.testing.assert_array_equal(image_ranks(scores, CAPTION_IMAGE), [1, 5, 1])


def test_recalls_median_and_mean_rank_by_hand():
    scores = retrieval_scores(SCORES, CAPTION_IMAGE)
    t2i, i2t = scores.caption_to_image, scores.image_to_caption
    # caption ranks 1, 2, 1, 3, 2, 1: R@1 3/6, R@5 = R@10 = 6/6; median of 1,1,1,2,2,3 = 1.5
    # -> floor 1; mean 10 / 6 = 1.666.. -> 1.67
    assert t2i.as_dict() == {"r1": 50.0, "r5": 100.0, "r10": 100.0, "medr": 1.0, "meanr": 1.67}
    # image ranks 1, 2, 1: R@1 2/3 = 66.67, median 1, mean 4/3 = 1.33
    assert i2t.as_dict() == {"r1": 66.67, "r5": 100.0, "r10": 100.0, "medr": 1.0, "meanr": 1.33}
    assert (scores.captions, scores.images) == (6, 3)

    # R@5 and R@10 below 100: 12 images, one caption each, caption c's image at rank c + 1.
    n = 12
    scores = np.tile(np.arange(n, 0, -1, dtype=np.float32), (n, 1))  # image 0 scores highest
    ranks = retrieval_scores(scores, np.arange(n))  # caption c belongs to image c
    t2i = ranks.caption_to_image
    # ranks 1..12: R@1 1/12 = 8.33, R@5 5/12 = 41.67, R@10 10/12 = 83.33; median 6.5 -> 6
    assert t2i.as_dict() == {"r1": 8.33, "r5": 41.67, "r10": 83.33, "medr": 6.0, "meanr": 6.5}
    # an image's column is constant (every caption scores it the same): all tie, all worst
    np.testing.assert_array_equal(image_ranks(scores, np.arange(n)), [n] * n)


def test_a_gallery_too_small_for_r_at_k_is_warned_of_naming_its_sizes():
    # 3 images of 2 captions: a caption's image ranks <= 3, an image's best caption <= 6 - 2 + 1.
    assert retrieval_scores(SCORES, CAPTION_IMAGE).warnings == (
        "gallery too small for caption->image R@5, R@10: only 3 images, so every caption's image "
        "ranks <= 3; they are 100% whatever the scores",
        "gallery too small for image->caption R@5, R@10: 6 captions of 3 images, so every "
        "image's best caption ranks <= 5 (only other images' captions count against it); they "
        "are 100% whatever the scores",
    )
    # 14 captions, more than 10, yet image 1 (5 captions) has only image 0's 9 against its best:
    # the worst scores for it rank it 10th, and R@10 is still 100%.
    caption_image = np.array([0] * 9 + [1] * 5)
    # Image 0's captions score 1 with both images, image 1's 0: first in every column.
    worst = np.repeat(np.where(caption_image == 0, 1.0, 0.0)[:, None], 2, axis=1)  # (14, 2)
    scores = retrieval_scores(worst, caption_image)
    assert image_ranks(worst, caption_image).tolist() == [1, 10]
    assert scores.image_to_caption.r10 == 100.0 and scores.image_to_caption.r5 == 50.0
    assert scores.warnings[1] == (
        "gallery too small for image->caption R@10: 14 captions of 2 images, so every image's "
        "best caption ranks <= 10 (only other images' captions count against it); it is 100% "
        "whatever the scores"
    )
    # 11 images of one caption each: a rank of 11 is possible both ways, nothing to warn of.
    assert retrieval_scores(np.eye(11), np.arange(11)).warnings == ()


def test_ties_rank_against_the_true_item():
    constant = np.zeros((6, 3))
    # Each caption: 3 images tie -> its own counts last: rank 3 (the worst), never 1.
    np.testing.assert_array_equal(caption_ranks(constant, CAPTION_IMAGE), [3] * 6)
    # Each image: the 4 other images' captions tie with its best -> rank 5 (the worst possible
    # for an image with 2 of the 6 captions); its own second caption does not count.
    np.testing.assert_array_equal(image_ranks(constant, CAPTION_IMAGE), [5] * 3)
    scores = retrieval_scores(constant, CAPTION_IMAGE)
    assert scores.caption_to_image.r1 == 0.0 and scores.caption_to_image.medr == 3.0
    assert scores.image_to_caption.r1 == 0.0 and scores.image_to_caption.meanr == 5.0

    # One tie: c0 scores img0 and img1 both 0.9 -> rank 2, not 1.
    tied = SCORES.copy()
    tied[0, 1] = 0.9
    assert caption_ranks(tied, CAPTION_IMAGE)[0] == 2
    # Two captions of img0 tie for its best: neither counts against the other -> still 1.
    tied = SCORES.copy()
    tied[1, 0] = 0.9
    assert image_ranks(tied, CAPTION_IMAGE)[0] == 1


def _scan_ranks(scores: np.ndarray, caption_image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SCAN's evaluation.py `t2i` / `i2t` loops (argsort, 0-based position, +1), generalised to
    any caption count per image."""
    t2i = np.array([np.where(np.argsort(row)[::-1] == caption_image[c])[0][0] + 1
                    for c, row in enumerate(scores)])
    i2t = []
    for image in range(scores.shape[1]):
        order = np.argsort(scores[:, image])[::-1]
        i2t.append(min(np.where(order == c)[0][0] for c in np.flatnonzero(caption_image == image))
                   + 1)
    return t2i, np.array(i2t)


def test_parity_with_scan_loops_without_ties():
    rng = np.random.default_rng(0)
    caption_image = np.repeat(np.arange(40), 5)
    scores = rng.standard_normal((200, 40))
    scores[np.arange(200), caption_image] += 1.0  # a model better than chance
    t2i, i2t = _scan_ranks(scores, caption_image)
    np.testing.assert_array_equal(caption_ranks(scores, caption_image), t2i)
    np.testing.assert_array_equal(image_ranks(scores, caption_image), i2t)
    result = retrieval_scores(scores, caption_image)
    assert result.caption_to_image.medr == np.floor(np.median(t2i - 1)) + 1  # SCAN's formula
    assert result.caption_to_image.meanr == round(float(np.mean(t2i - 1) + 1), 2)
    assert result.image_to_caption.r5 == round(100.0 * np.sum(i2t - 1 < 5) / len(i2t), 2)


def test_full_test_split_size_scores_in_well_under_a_second():
    rng = np.random.default_rng(1)
    scores = rng.standard_normal((5000, 1000)).astype(np.float32)
    caption_image = np.repeat(np.arange(1000), 5)
    retrieval_scores(scores[:50, :10], caption_image[:50])  # warm up
    start = time.perf_counter()
    result = retrieval_scores(scores, caption_image)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, elapsed
    # random scores: the true image's rank is uniform on 1..1000, mean about 500
    assert 450 < result.caption_to_image.meanr < 550


def test_retrieval_scores_refuse_bad_input():
    with pytest.raises(EvaluationError, match="NaN or inf"):
        retrieval_scores(np.array([[np.nan, 1.0]]), np.array([0]))
    with pytest.raises(EvaluationError, match="1 images have no caption, e.g. index 1"):
        retrieval_scores(np.zeros((2, 2)), np.array([0, 0]))
    with pytest.raises(EvaluationError, match="integers in 0..1"):
        retrieval_scores(np.zeros((2, 2)), np.array([0, 2]))


# --- files and the verb ------------------------------------------------------------------------

def _karpathy(path: Path) -> Path:
    """Images 0..4: 0 and 1 train, 2..4 test (2 captions each), sentid = 10 * imgid + k."""
    images = []
    for imgid, split in enumerate(["train", "train", "test", "test", "test"]):
        sentences = [{"tokens": ["a", "dog"], "raw": f"A dog {imgid}-{k}.", "imgid": imgid,
                      "sentid": 10 * imgid + k} for k in range(2)]
        images.append({"filename": f"{1000 + imgid}.jpg", "imgid": imgid, "split": split,
                       "sentids": [s["sentid"] for s in sentences], "sentences": sentences})
    path.write_text(json.dumps({"images": images, "dataset": "flickr30k"}), encoding="utf-8")
    return path


def _test_predictions(path: Path) -> Path:
    """The test split's matrix with rows and columns in another order than the file's."""
    sentids = np.array([41, 20, 31, 21, 40, 30])
    imgids = np.array([4, 2, 3])
    image_of = {s: s // 10 for s in sentids}
    scores = np.array([[1.0 if image_of[s] == i else 0.0 for i in imgids] for s in sentids])
    scores[3] = [0.0, 0.5, 0.9]  # sentid 21 (image 2): image 4 above its own -> rank 2
    write_retrieval_predictions(scores, sentids, imgids, path)
    return path


def test_read_karpathy(tmp_path):
    path = _karpathy(tmp_path / "dataset_flickr30k.json")
    test = read_karpathy(path, "test")
    assert [image.imgid for image in test] == [2, 3, 4]
    assert test[0].filename == "1002.jpg" and test[0].split == "test"
    assert test[0].sentences == ((20, "A dog 2-0."), (21, "A dog 2-1."))
    assert len(read_karpathy(path)) == 5
    with pytest.raises(EvaluationError, match=r"no image of split 'val'; its splits are "
                                              r"\['test', 'train'\]") as info:
        read_karpathy(path, "val")
    assert str(info.value).startswith(str(path))
    data = json.loads(path.read_text())
    data["images"][3]["sentences"][1]["sentid"] = 20
    path.write_text(json.dumps(data))
    with pytest.raises(EvaluationError, match=r"image 3 \(imgid 3\): sentid 20 appears twice"):
        read_karpathy(path)


def test_evaluate_flickr30k_reorders_by_ids(tmp_path):
    karpathy = _karpathy(tmp_path / "dataset_flickr30k.json")
    predictions = _test_predictions(tmp_path / "scores.npz")
    read = read_retrieval_predictions(predictions)
    assert read.scores.dtype == np.float32 and read.scores.shape == (6, 3)
    scores = evaluate_flickr30k(predictions, karpathy)
    # captions: one of 6 at rank 2 -> R@1 5/6 = 83.33, mean 7/6 = 1.17. Images: all 1 (image 2's
    # other caption, sentid 20, is first in its column).
    assert scores.caption_to_image.as_dict() == {"r1": 83.33, "r5": 100.0, "r10": 100.0,
                                                 "medr": 1.0, "meanr": 1.17}
    assert scores.image_to_caption.r1 == 100.0
    assert (scores.captions, scores.images) == (6, 3)


def test_retrieval_prediction_errors_name_the_file(tmp_path):
    karpathy = _karpathy(tmp_path / "dataset_flickr30k.json")
    path = tmp_path / "scores.npz"

    def error(scores, sentids, imgids, message: str) -> None:
        with open(path, "wb") as f:
            np.savez(f, scores=scores, sentids=sentids, imgids=imgids)
        with pytest.raises(EvaluationError, match=message) as info:
            evaluate_flickr30k(path, karpathy)
        assert str(info.value).startswith(str(path))

    sentids, imgids = np.array([20, 21, 30, 31, 40, 41]), np.array([2, 3, 4])
    ok = np.zeros((6, 3), dtype=np.float32)
    error(ok[:5], sentids[:5], imgids, r"no prediction for 1 of the 6 test captions.*41")
    error(np.zeros((6, 4)), sentids, np.array([2, 3, 4, 0]), r"1 predictions for test images "
          r"that are not in")
    error(ok, np.array([20, 20, 30, 31, 40, 41]), imgids, "sentids holds 20 twice")
    error(ok, sentids, imgids.astype(np.float32), "imgids must be a 1-D integer array")
    error(ok[:, :2], sentids, imgids, r"scores must be float \(len\(sentids\), len\(imgids\)\)")
    nan = ok.copy()
    nan[4, 1] = np.nan
    error(nan, sentids, imgids, "1 scores are NaN or inf, e.g. sentid 40 with imgid 3")
    with open(path, "wb") as f:
        np.savez(f, scores=ok, sentids=sentids)
    with pytest.raises(EvaluationError, match=r"lacks \['imgids'\]"):
        read_retrieval_predictions(path)
    with open(path, "wb") as f:  # an object array needs pickle: refused, not unpickled
        np.savez(f, scores=np.array([{"a": 1}], dtype=object), sentids=sentids, imgids=imgids)
    with pytest.raises(EvaluationError, match="not an .npz of plain arrays"):
        read_retrieval_predictions(path)
    path.write_text('{"scores": []}')  # e.g. a JSON file: numpy would advise allow_pickle
    with pytest.raises(EvaluationError, match=r"not an .npz \(a zip of .npy arrays") as err:
        read_retrieval_predictions(path)
    assert "pickle" not in str(err.value)


def test_evaluate_flickr30k_cli(tmp_path, capsys):
    karpathy = _karpathy(tmp_path / "dataset_flickr30k.json")
    predictions = _test_predictions(tmp_path / "scores.npz")
    out = tmp_path / "flickr.json"
    argv = ["evaluate", "flickr30k", "--predictions", str(predictions), "--annotations",
            str(karpathy)]
    assert main([*argv, "--json", str(out)]) == 0
    metrics = json.loads(out.read_text())
    assert metrics["caption_to_image"]["r1"] == 83.33
    assert metrics["image_to_caption"] == {"r1": 100.0, "r5": 100.0, "r10": 100.0, "medr": 1.0,
                                           "meanr": 1.0}
    printed = capsys.readouterr()
    assert "6 captions, 3 images" in printed.out and "caption->image R@1 (%)" in printed.out
    # 3 test images of 2 captions: R@5 and R@10 mean nothing either way (the gallery test above)
    warnings = [line.removeprefix("pipeline evaluate: warning: ")
                for line in printed.err.splitlines() if "warning" in line]
    assert warnings == metrics["warnings"] == list(
        evaluate_flickr30k(predictions, karpathy).warnings)
    assert [w.split(":")[0] for w in warnings] == [
        "gallery too small for caption->image R@5, R@10",
        "gallery too small for image->caption R@5, R@10"]

    assert main([*argv, "--split", "train"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeline: evaluation error: ") and str(predictions) in err
    assert "no prediction for 4 of the 4 train captions" in err
    assert main([*argv, "--holdout", "corpus"]) == 2
    assert "--holdout is for vqa and gqa" in capsys.readouterr().err
