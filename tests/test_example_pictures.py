"""pipeline/demo/pictures.py on a tiny VQA run of the generated world: the two pictures, and
attention shares checked against the encoder's raw attention maps averaged here by hand."""

from __future__ import annotations

import io
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from test_finetune import TINY, finetune, vqa_sets

from model.tasks import AnswerModel
from model.visualbert import VisualBertConfig, VisualBertModel
from pipeline.common.config import to_dict
from pipeline.demo.pictures import FOCUS_COLOR, read_example, write_example_pictures
from pipeline.finetune.data import task_examples
from pipeline.finetune.run_model import load_run_model
from pipeline.extract.show import load_sample, sample_image
from pipeline.common.text import encode_texts
from shards.batch import collate_regions


@pytest.fixture(scope="module")
def vqa_run(pretrain_world, tmp_path_factory) -> Path:
    """Two cross-modality layers, so "the last" is not also the first."""
    run = tmp_path_factory.mktemp("pictures") / "vqa"
    sets = vqa_sets(pretrain_world) + TINY + ["model.cross_layers=2"]
    assert finetune("vqa", run, sets, "run.max_steps=2") == 0
    return run


def held_out(run_dir: Path):
    """(example, sample, image bytes) of the run's first validation (minival) question."""
    config = load_run_model(run_dir).config
    example = task_examples("vqa", config.data)[1][0]
    shards = Path(config.data.shards[0])
    sample = load_sample(shards, example.images[0])
    return example, sample, sample_image(sample, shards, None)[0]


def test_attention_shares_are_the_raw_maps_averaged_over_heads_and_words(vqa_run):
    run = load_run_model(vqa_run)
    example, sample, _ = held_out(vqa_run)
    reading = read_example(run, example, sample)

    data = run.config.data
    tokenizer = run.objective.tokenizer
    text = encode_texts(tokenizer, [example.sentence], data.max_text_length)
    regions = collate_regions([sample], max_boxes=data.max_boxes)
    inputs = {**text, **regions.model_inputs()}
    with torch.no_grad():
        maps = run.model.encoder(**inputs, output_attentions=True).attentions
        logits = run.model(**inputs)[0]
    assert len(maps.cross_text_to_visual) == 2
    last = maps.cross_text_to_visual[1][0].numpy().astype(np.float64)  # (heads, T, N)
    tokens = tokenizer.convert_ids_to_tokens(text["input_ids"][0].tolist())
    words = [t for t, token in enumerate(tokens) if token not in ("[CLS]", "[SEP]", "[PAD]")]
    assert 0 < len(words) < len(tokens)
    expected = np.zeros(last.shape[-1])
    for head in range(last.shape[0]):
        for t in words:
            expected += last[head, t]
    expected /= last.shape[0] * len(words)

    assert len(reading.shares) == min(sample.num_boxes, data.max_boxes) == last.shape[-1]
    np.testing.assert_allclose(reading.shares, expected, rtol=1e-6, atol=1e-9)
    assert reading.shares.sum() == pytest.approx(1.0, abs=1e-6)
    assert reading.focus == int(np.argmax(expected))
    # Not uniform, else the argmax would prove nothing.
    assert reading.shares.max() > reading.shares.min() + 1e-4

    best = int(logits.argmax())
    assert reading.answer == run.vocab.answers[best]
    assert reading.probability == pytest.approx(float(torch.sigmoid(logits[best])), rel=1e-5)
    assert reading.truth == Counter(example.answers).most_common(1)[0][0]
    assert reading.question == example.sentence


def test_pictures_are_the_image_over_a_caption_strip_with_the_focus_outlined(vqa_run, tmp_path):
    example, sample, image_bytes = held_out(vqa_run)
    paths = write_example_pictures(vqa_run, example, sample, image_bytes, tmp_path / "pictures")
    assert [p.name for p in paths] == ["boxes.png", "attention.png"]
    width, height = sample.meta["width"], sample.meta["height"]
    original = np.asarray(Image.open(io.BytesIO(image_bytes)).convert("RGB"))
    pictures = [np.asarray(Image.open(p).convert("RGB")) for p in paths]
    for picture in pictures:
        assert picture.shape[1] == width and picture.shape[0] > height
        assert (picture[height:] == 255).mean() > 0.5  # a white strip, with some text on it
        assert (picture[height:] != 255).any()
    assert (pictures[0][:height] != original).any()  # boxes drawn

    reading = read_example(load_run_model(vqa_run), example, sample)
    x1, y1, x2, y2 = np.rint(sample.arrays["boxes"][reading.focus]).astype(int)
    left_edge = pictures[1][y1:y2, x1]  # the label covers at most the top of it
    assert (left_edge == FOCUS_COLOR).all(axis=-1).mean() > 0.5
    # Outside every box the image is dimmed to 20% (but for the focus label, which may sit above).
    seen = sample.arrays["boxes"][: len(reading.shares)]
    outside = np.ones((height, width), dtype=bool)
    for bx1, by1, bx2, by2 in np.rint(seen).astype(int):
        outside[max(by1 - 4, 0):by2 + 4, max(bx1 - 4, 0):bx2 + 4] = False
    if outside.any():
        dimmed = np.rint(original[outside] * 0.2)
        close = np.abs(pictures[1][:height][outside] - dimmed) <= 1
        assert close.all(axis=-1).mean() > 0.9


def test_a_run_of_another_encoder_is_refused_with_the_reason(vqa_run, tmp_path):
    """A VisualBERT run directory made by hand (config, answers, a checkpoint's state.pt)."""
    lxmert = load_run_model(vqa_run)
    encoder = VisualBertConfig.tiny(visual_feat_dim=lxmert.config.model.visual_feat_dim)
    run = tmp_path / "visualbert"
    (run / "step").mkdir(parents=True)
    config = replace(lxmert.config, arch="visualbert", model=encoder)
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    shutil.copy(vqa_run / "answers.json", run / "answers.json")
    model = AnswerModel(VisualBertModel(encoder), len(lxmert.vocab))
    torch.save({"model": model.state_dict()}, run / "step" / "state.pt")

    example, sample, image_bytes = held_out(vqa_run)
    with pytest.raises(ValueError, match="need an LXMERT run.*VisualBertModel"):
        write_example_pictures(run, example, sample, image_bytes, tmp_path / "out",
                               checkpoint=run / "step")
    assert not (tmp_path / "out").exists()
