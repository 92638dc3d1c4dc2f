"""The objectives and streams of VCR (pipeline/finetune/vcr.py), RefCOCO+ (refcoco.py) and
Flickr30K retrieval (retrieval.py, distractors.py) on hand-built rows: texts and segments, the
leaderboard file's round trip, IoU targets and the loss on them, distractors that are what they
claim and drawn again identically, the score matrix's order (each image collated once, the same
scores as pair by pair), and the zero-shot score."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from region_fakes import fake_sample

from pipeline.common.text import load_tokenizer
from pipeline.evaluate.refcoco import box_iou
from pipeline.evaluate.vcr import evaluate_vcr, write_vcr_submission
from pipeline.finetune.distractors import RetrievalStream, hard_negative_pool
from pipeline.finetune.refcoco import RegionTask, RefExample, refcoco_given_boxes
from pipeline.finetune.retrieval import (
    CaptionExample,
    RetrievalTask,
    pretrained_scorer,
    score_matrix,
)
from pipeline.finetune.vcr import (
    QA_R,
    ChoiceTask,
    prediction_items,
    read_vcr_examples,
    render,
    vcr_predictions,
)

ROWS = dict(max_text_length=24, max_boxes=6)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def _vcr_line(annot_id: str, answer: int, rationale: int) -> dict:
    return {
        "annot_id": annot_id, "img_fn": "lsmdc_m/clip@0.jpg", "metadata_fn": "lsmdc_m/clip@0.json",
        "objects": ["ball", "box", "star"], "question": ["What", "color", "is", [0], "?"],
        "answer_choices": [[[0], "is", c] for c in ("red", "blue", "green", "white")],
        "rationale_choices": [[[1, 2], "are", c] for c in ("near", "far", "big", "small")],
        "answer_label": answer, "rationale_label": rationale,
    }


def test_tags_are_written_as_the_objects_names():
    objects = ["ball", "box", "star"]
    assert render(["What", "color", "is", (0,), "?"], objects) == "What color is ball ?"
    assert render([(0, 1), "touch"], objects) == "ball and box touch"
    assert render([(2, 0, 1)], objects) == "star, ball and box"


def test_vcr_items_and_the_leaderboard_file_round_trip(tmp_path):
    path = tmp_path / "val.jsonl"
    lines = [_vcr_line("val-0", 2, 1), _vcr_line("val-1", 0, 3)]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    items = read_vcr_examples(path)
    assert [(i.id, i.kind, i.label) for i in items] == [
        ("val-0", "q_a", 2), ("val-0:r2", "qa_r", 1), ("val-1", "q_a", 0), ("val-1:r0", "qa_r", 3)]
    assert items[0].context == "What color is ball ?"
    assert items[0].choices[2] == "ball is green"
    assert items[1].context == "What color is ball ? ball is green"
    assert items[1].choices[0] == "box and star are near"

    # Five items a question for the leaderboard: the answer, then rationales given each answer.
    predicted = prediction_items(path)
    assert [i.id for i in predicted[:5]] == ["val-0", "val-0:r0", "val-0:r1", "val-0:r2",
                                            "val-0:r3"]
    # A model right on val-0 (answer and rationale) and wrong on val-1's rationale.
    right = {"val-0": 2, "val-0:r2": 1, "val-1": 0, "val-1:r0": 2}
    probs = [(i.id, [0.7 if j == right.get(i.id, 0) else 0.1 for j in range(4)])
             for i in predicted]
    out = tmp_path / "val.csv"
    write_vcr_submission(vcr_predictions(probs), out)
    assert evaluate_vcr(out, path).as_dict() == {"q_a": 100.0, "qa_r": 50.0, "q_ar": 50.0}


def test_a_choice_batch_pairs_each_choice_with_its_context(tokenizer):
    rng = np.random.default_rng(0)
    task = ChoiceTask(tokenizer, **ROWS)
    items = [
        _item("q", ("red", "blue", "green big", "white"), 1, "q_a"),
        _item("q:r1", ("near", "far", "big", "small"), 3, QA_R),
    ]
    samples = [(fake_sample(rng, 0, 4),), (fake_sample(rng, 1, 6),)]
    batch = task.make_batch(items, samples)
    ids, types = batch.inputs["input_ids"], batch.inputs["token_type_ids"]
    assert ids.shape[:2] == (2, 4) and batch.inputs["features"].shape[:2] == (2, 6)
    # Choice 2 of row 0: [CLS] what color ? [SEP] green big [SEP]: segment 1 on its last three.
    words = tokenizer.convert_ids_to_tokens(ids[0, 2][batch.inputs["attention_mask"][0, 2] == 1])
    assert words == ["[CLS]", "what", "color", "?", "[SEP]", "green", "big", "[SEP]"]
    assert types[0, 2][: len(words)].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]

    scores = torch.tensor([[0.0, 2.0, 0.0, 0.0], [3.0, 0.0, 0.0, 1.0]])  # row 0 right, 1 wrong
    losses, metrics = task.compute(lambda **_: scores, batch)
    assert losses["loss_choice"] == pytest.approx(float(F.cross_entropy(scores,
                                                                        torch.tensor([1, 3]))))
    assert [float(v) for v in metrics["q_a"]] == [1.0, 1.0]
    assert [float(v) for v in metrics["qa_r"]] == [0.0, 1.0]


def _item(item_id, choices, label, kind):
    from pipeline.finetune.vcr import ChoiceExample

    return ChoiceExample("vcr", item_id, ("vcr-x",), "what color ?", choices, label, kind)


def test_region_targets_loss_and_prediction_follow_the_iou(tokenizer):
    rng = np.random.default_rng(1)
    sample = fake_sample(rng, 0, 3)
    sample.arrays["boxes"][:] = [[0, 0, 99, 99], [0, 0, 49, 99], [200, 200, 260, 260]]
    target = (0.0, 0.0, 99.0, 99.0)
    example = RefExample("refcoco+", "7", (sample.key,), "the red one", target)
    other = fake_sample(rng, 1, 2)
    task = RegionTask(tokenizer, **ROWS)
    batch = task.make_batch([example, example], [(sample,), (other,)])
    iou = batch.targets["iou"]
    assert iou[0].tolist() == pytest.approx([1.0, 0.5, 0.0])  # inclusive pixels: 50x100 / 100x100
    assert iou[0, 1] == box_iou([0, 0, 49, 99], target)
    assert iou[1, 2:].eq(0).all()  # padding

    scores = torch.tensor([[0.5, 2.0, -1.0], [1.0, -2.0, float("-inf")]])
    losses, metrics = task.compute(lambda **_: scores, batch)
    target_row0 = torch.tensor([1.0, 0.5, 0.0])  # 0.5 counts (>= 0.5), below it would be 0
    expected = (F.binary_cross_entropy_with_logits(scores[0], target_row0, reduction="sum")
                + F.binary_cross_entropy_with_logits(scores[1, :2], iou[1, :2].where(
                    iou[1, :2] >= 0.5, torch.zeros(2)), reduction="sum")) / 2
    assert losses["loss_region"] == pytest.approx(float(expected))
    # Row 0 picks region 1 (IoU exactly 0.5: right); row 1 picks its region 0.
    hits = float(iou[1, 0] >= 0.5)
    assert [float(v) for v in metrics["accuracy"]] == [1.0 + hits, 2.0]
    assert task.predict(lambda **_: scores, batch, [(sample,), (other,)]) == [
        [0.0, 0.0, 49.0, 99.0], other.arrays["boxes"][0].tolist()]


def test_refcoco_given_boxes_are_the_annotations_xyxy(tmp_path):
    path = tmp_path / "instances.json"
    path.write_text(json.dumps({"annotations": [
        {"image_id": 5, "bbox": [10, 20, 30, 40]}, {"image_id": 5, "bbox": [0, 0, 1, 2]},
        {"image_id": 6, "bbox": [1, 1, 1, 1]}]}))
    assert refcoco_given_boxes(path) == {"5": [[10, 20, 40, 60], [0, 0, 1, 2]],
                                         "6": [[1, 1, 2, 2]]}


def _caption_world(images: int = 6, captions: int = 3):
    rng = np.random.default_rng(2)
    samples = {f"flickr30k-{i}": fake_sample(rng, i, 4) for i in range(images)}
    for i, key in enumerate(samples):  # keys as the stream sees them
        samples[key] = type(samples[key])(key=key, meta=samples[key].meta,
                                          arrays=samples[key].arrays)
    examples = [CaptionExample("flickr30k", str(i * captions + c), (f"flickr30k-{i}",),
                               f"caption {c} of image {i}", i)
                for i in range(images) for c in range(captions)]
    return samples, examples


def test_hard_negatives_are_the_nearest_images_by_mean_feature():
    rng = np.random.default_rng(3)
    samples = {}
    directions = {"a": [1, 0, 0], "b": [0.9, 0.1, 0], "c": [0, 1, 0], "d": [0.6, 0.8, 0]}
    for name, direction in directions.items():
        s = fake_sample(rng, 0, 2)
        s.arrays["features"] = np.array([direction, direction], dtype=np.float16)
        samples[name] = s
    pool = hard_negative_pool(list(samples), samples, size=2)
    assert pool == {"a": ("b", "d"), "b": ("a", "d"), "c": ("d", "b"), "d": ("c", "b")}


def test_retrieval_distractors_are_what_they_claim_and_drawn_again_identically():
    samples, examples = _caption_world()
    pool = hard_negative_pool(sorted(samples), samples, size=2)

    def stream(in_order=False):
        return RetrievalStream(examples, samples, batch_size=4, rank=0, world_size=1, seed=5,
                               pool=pool, in_order=in_order)

    first = [[item.images + (item.other_sentence,) for item, _ in rows]
             for rows in stream().batches(1)]
    assert first == [[item.images + (item.other_sentence,) for item, _ in rows]
                     for rows in stream().batches(1)]
    resumed = [[item.images + (item.other_sentence,) for item, _ in rows]
               for rows in stream().batches(1, start_step=2)]
    assert resumed == first[2:]
    by_sentence = {e.sentence: e for e in examples}
    for rows in stream().batches(1):
        for item, images in rows:
            true, random_image, hard = item.images
            assert random_image != true and hard in pool[true]
            assert by_sentence[item.other_sentence].images[0] != true
            assert [s.key for s in images] == list(item.images)
    ordered = [item.id for rows in stream(in_order=True).batches() for item, _ in rows]
    assert ordered == [e.id for e in examples]


def test_retrieval_rows_are_four_pairs_trained_towards_the_true_one(tokenizer):
    samples, examples = _caption_world()
    pool = hard_negative_pool(sorted(samples), samples, size=2)
    stream = RetrievalStream(examples, samples, batch_size=2, rank=0, world_size=1, seed=0,
                             pool=pool)
    rows = next(iter(stream.batches(0)))
    task = RetrievalTask(tokenizer, **ROWS)
    batch = task.make_batch([i for i, _ in rows], [s for _, s in rows])
    assert batch.inputs["input_ids"].shape[0] == 8 and batch.size == 2
    first = rows[0][0]
    texts = tokenizer.batch_decode(batch.inputs["input_ids"][:4], skip_special_tokens=True)
    assert texts == [t.lower() for t in (first.sentence, first.other_sentence, first.sentence,
                                         first.sentence)]
    feats = batch.inputs["features"]
    own, rand = samples[first.images[0]], samples[first.images[1]]
    assert torch.equal(feats[0, :4], torch.from_numpy(own.arrays["features"]).float())
    assert torch.equal(feats[1], feats[0])
    assert torch.equal(feats[2, :4], torch.from_numpy(rand.arrays["features"]).float())

    scores = torch.tensor([2.0, 0.0, 1.0, 0.5, 0.0, 1.0, 0.0, 0.0])
    losses, metrics = task.compute(lambda **_: scores, batch)
    expected = F.cross_entropy(scores.view(2, 4), torch.zeros(2, dtype=torch.long))
    assert losses["loss_retrieval"] == pytest.approx(float(expected))
    assert [float(v) for v in metrics["accuracy"]] == [1.0, 2.0]


def test_the_score_matrix_puts_each_pair_where_it_belongs(tokenizer):
    samples, examples = _caption_world(images=3, captions=2)
    task = RetrievalTask(tokenizer, **ROWS)
    keys = list(samples)

    def scorer(**inputs):  # a score that knows the caption (its length) and the image
        return inputs["attention_mask"].sum(1) * 100.0 + inputs["features"][:, 0, 0] * 0

    def image_marked(**inputs):
        return inputs["features"][:, 0, 0].float()

    matrix = score_matrix(scorer, task, examples, keys, samples, batch_size=4)
    lengths = [len(tokenizer(e.sentence)["input_ids"]) * 100.0 for e in examples]
    assert matrix.tolist() == [[n] * 3 for n in lengths]
    marks = score_matrix(image_marked, task, examples, keys, samples, batch_size=5)
    first = [float(samples[k].arrays["features"][0, 0]) for k in keys]
    assert marks == pytest.approx(np.array([first] * len(examples)), abs=1e-3)


@pytest.mark.parametrize("static_shapes", [False, True])
def test_the_score_matrix_collates_each_image_once_and_scores_as_pair_by_pair(
        tokenizer, static_shapes, monkeypatch):
    from collections import Counter

    import pipeline.finetune.objective as objective
    from model.lxmert import LxmertConfig, LxmertForPreTraining

    torch.manual_seed(0)
    config = dataclasses.replace(LxmertConfig.tiny(), vocab_size=tokenizer.vocab_size)
    scorer = pretrained_scorer(LxmertForPreTraining(config).eval())
    rng = np.random.default_rng(6)
    # Region counts that make batches of different widths: more than max_boxes (cut), some, none.
    samples = {}
    for i, boxes in enumerate([9, 7, 0, 2, 4]):
        sample = fake_sample(rng, i, boxes)
        sample.arrays["features"] = rng.random((boxes, config.visual_feat_dim)).astype(np.float16)
        samples[f"flickr30k-{i}"] = dataclasses.replace(sample, key=f"flickr30k-{i}")
    keys = list(samples)
    captions = [CaptionExample("flickr30k", str(c), (keys[c % 5],), text, c % 5)
                for c, text in enumerate(["a red ball", "two boxes on a long table", "a dog",
                                          "people walk along the beach", "sky"])]
    task = RetrievalTask(tokenizer, max_text_length=12, max_boxes=6, static_shapes=static_shapes)
    batch_size = 2  # 25 pairs: 13 batches, each padded to its own most regions

    # The reference: each batch's pairs collated as pairs, as scoring did before the gallery.
    seen = []
    reference = np.zeros((5, 5), dtype=np.float32)
    for start in range(0, 25, batch_size):
        pairs = range(start, min(start + batch_size, 25))
        inputs = task.pair_inputs([captions[p // 5].sentence for p in pairs],
                                  [samples[keys[p % 5]] for p in pairs])
        seen.append(inputs)
        with torch.no_grad():
            reference.flat[start:start + len(pairs)] = scorer(**inputs).numpy()

    collated = Counter()
    collate = objective.collate_regions

    def counting_collate(images, **options):
        collated.update(image.key for image in images)
        return collate(images, **options)

    fed = []

    def recording_scorer(**inputs):
        fed.append(inputs)
        return scorer(**inputs)

    monkeypatch.setattr(objective, "collate_regions", counting_collate)
    matrix = score_matrix(recording_scorer, task, captions, keys, samples, batch_size=batch_size)
    assert collated == Counter(keys)  # each image once, not once per caption (5 times)
    assert np.array_equal(matrix, reference)
    assert len(fed) == len(seen) == 13
    for new, old in zip(fed, seen):  # the very same tensors, padding width included
        assert new.keys() == old.keys()
        for name in old:
            assert (new[name] is None and old[name] is None) or torch.equal(new[name], old[name])
    # Batches of images (0, 1), (2, 3), (4, 0), (1, 2), (3, 4), ... and lastly (4,).
    widths = [inputs["features"].shape[1] for inputs in seen]
    assert widths == ([6] * 13 if static_shapes else [6, 2, 6, 6, 4] * 2 + [6, 2, 4])
    unmasked = [inputs["region_mask"] is None for inputs in seen]  # (0, 1): every region real
    assert unmasked == [static_shapes and b % 5 == 0 for b in range(13)]


def test_the_zero_shot_score_is_the_matching_heads_log_odds(tokenizer):
    from model.lxmert import LxmertConfig, LxmertForPreTraining

    torch.manual_seed(0)
    config = dataclasses.replace(LxmertConfig.tiny(), vocab_size=tokenizer.vocab_size)
    model = LxmertForPreTraining(config).eval()
    rng = np.random.default_rng(4)
    task = RetrievalTask(tokenizer, max_text_length=12, max_boxes=4)
    samples = [fake_sample(rng, i, 4) for i in range(2)]
    for s in samples:
        s.arrays["features"] = rng.random((4, config.visual_feat_dim)).astype(np.float16)
    inputs = task.pair_inputs(["a red ball", "two boxes"], samples)
    with torch.no_grad():
        logits = model(**inputs).cross_relationship_score
        score = pretrained_scorer(model)(**inputs)
    assert torch.allclose(score, logits[:, 1] - logits[:, 0])
