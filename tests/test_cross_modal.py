"""`pipeline analyze cross-modal` on the world's Flickr30K Entities: the word classes, a
hand-built model whose answers are known (right only with what each condition removes), the
report against a case-by-case recomputation with the real LXMERT, the four architectures, and
what cannot be analysed refused with the file named."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.archs import ARCHS
from model.checkpoints.formats import save_ours
from pipeline.analyze.cross_modal import cross_modal_influence
from pipeline.analyze.cross_modal_report import cross_modal_report
from pipeline.analyze.entities import read_entities
from pipeline.analyze.model import AnalysedModel
from pipeline.analyze.word_classes import phrase_word_classes
from pipeline.common.visual_words import COLOURS, MATERIALS, SHAPES
from pipeline.cli import main
from pipeline.common.text import load_tokenizer
from pipeline.finetune.data import Features
from pipeline.train.checkpoint import save_checkpoint
from shards.batch import collate_regions

SPLIT = "train"
FEATURE_DIM = 64  # the bundled world detector's region features
TEXT_LENGTH = 32  # long enough for every caption of the world: nothing is cut
BOXES = 36


def test_word_classes_of_phrases():
    assert phrase_word_classes(["a", "small", "red", "metal", "ball"], scene=False) == [
        "other", "other", "colour", "material", "shape"]
    assert phrase_word_classes(["two", "Red", "boxes"], scene=False) == ["other", "colour", "shape"]
    assert phrase_word_classes(["a", "man"], scene=False) == ["other", "noun"]
    assert phrase_word_classes(["the", "wooden", "planks"], scene=True) == [
        "other", "ground", "ground"]
    from pipeline.world.scene import COLORS, MATERIALS as WORLD_MATERIALS, SHAPES as WORLD_SHAPES

    assert set(COLORS) <= COLOURS and set(WORLD_SHAPES) <= SHAPES
    assert set(WORLD_MATERIALS) <= MATERIALS


def tiny_config(arch: str):
    config = dataclasses.replace(ARCHS[arch].config.tiny(), visual_feat_dim=FEATURE_DIM,
                                 vocab_size=30522)
    return dataclasses.replace(config, num_objects=1600) if arch == "lxmert" else config


def pretraining_run(arch: str, run: Path, seed: int = 0) -> nn.Module:
    """A run directory whose one checkpoint holds a fresh pretraining model (as `pipeline
    pretrain` writes it); returns the model."""
    torch.manual_seed(seed)
    config = tiny_config(arch)
    module = ARCHS[arch].pretraining(config).eval()
    encoder = module if arch == "lxmert" else getattr(module, ARCHS[arch].encoder_attr)
    save_checkpoint(run, position={"step": 1, "epoch": 0, "micro": 0},
                    state={"model": module.state_dict(), "optimizer": {}}, arch=arch,
                    export_config=config, export_state=encoder.state_dict(), keep=1)
    return module


def _data(world: Path, images: int | None = None):
    data = read_entities(world / "flickr30k_entities", SPLIT, [])
    return data[:images] if images else data


def _iou(regions: np.ndarray, box) -> np.ndarray:
    x1 = np.maximum(regions[:, 0], box[0])
    y1 = np.maximum(regions[:, 1], box[1])
    x2 = np.minimum(regions[:, 2], box[2])
    y2 = np.minimum(regions[:, 3], box[3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = lambda b: (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])  # noqa: E731
    return inter / (area(regions) + area(np.asarray(box)) - inter)


def reference(module: nn.Module, world: Path, shards: Path, images: int) -> dict:
    """(test, class, condition) -> (right, losses), one case and one condition per forward:
    the word's pieces masked, the aligned regions (IoU >= 0.5 here) dropped from region_mask;
    for the regions, the aligned ones zeroed and the phrase's pieces (or every word) dropped
    from the attention mask."""
    from pipeline.analyze.cross_modal import _region_logits

    tokenizer = load_tokenizer()
    features = Features.open([str(shards)])
    found: dict = {}

    def add(key, right, loss):
        found.setdefault(key, ([], []))
        found[key][0].append(bool(right))
        found[key][1].append(float(loss))

    for entities, sentences in _data(world, images):
        sample = features[f"flickr30k-{entities.image_id}"]
        regions = collate_regions([sample], max_boxes=BOXES)
        boxes = sample.arrays["boxes"][:BOXES].astype(np.float64)
        present = regions.region_mask
        for sentence in sentences:
            enc = tokenizer(list(sentence.words), is_split_into_words=True, truncation=True,
                            max_length=TEXT_LENGTH, return_tensors="pt")
            ids, word_ids = enc["input_ids"], enc.word_ids(0)
            ones = torch.ones_like(ids)

            def run(input_ids, attention_mask, region_mask, features=regions.features):
                return module(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=torch.zeros_like(ids), features=features,
                              boxes=regions.boxes_xyxy_norm, region_mask=region_mask)

            for phrase in sentence.phrases:
                box = entities.box(phrase.chain) if phrase.chain else None
                if box is None and phrase.chain not in entities.scene:
                    continue
                aligned = torch.zeros_like(present, dtype=torch.bool)
                if box is not None:
                    aligned[0, :len(boxes)] = torch.from_numpy(_iou(boxes, box) >= 0.5)
                classes = phrase_word_classes(phrase.words, scene=box is None)
                spans = [[t for t, w in enumerate(word_ids) if w == i]
                         for i in range(phrase.first_word, phrase.end)]
                for pieces, word_class in zip(spans, classes):
                    masked = ids.clone()
                    masked[0, pieces] = tokenizer.mask_token_id
                    for condition, keep in (("all", present), ("aligned_removed",
                                                                present & ~aligned),
                                            ("none", torch.zeros_like(present))):
                        logits = run(masked, ones, keep).lang_prediction_logits[0, pieces]
                        add(("masked_lm", word_class, condition),
                            (logits.argmax(-1) == ids[0, pieces]).all(),
                            F.cross_entropy(logits, ids[0, pieces]))
                if box is None or not aligned.any():
                    continue
                phrase_pieces = [t for p in spans for t in p]
                without = ones.clone()
                without[0, phrase_pieces] = 0
                ends = torch.zeros_like(ones)
                ends[0, [0, ids.shape[1] - 1]] = 1
                zeroed = regions.features.masked_fill(aligned[..., None], 0)
                for condition, attend in (("all", ones), ("aligned_removed", without),
                                          ("none", ends)):
                    logits = _region_logits("lxmert", run(ids, attend, present, zeroed))[0]
                    for n in torch.nonzero(aligned[0]).flatten().tolist():
                        target = regions.object_ids[0, n]
                        add(("masked_regions", classes[-1], condition),
                            logits[n].argmax() == target,
                            F.cross_entropy(logits[n][None], target[None]))
    return found


def test_the_report_equals_a_case_by_case_recomputation(pretrain_world, flickr_shards, tmp_path):
    module = pretraining_run("lxmert", tmp_path / "run", seed=3)
    model = AnalysedModel(module, "lxmert", TEXT_LENGTH, BOXES, "", "run", False)
    images = 6
    with torch.no_grad():
        influence = cross_modal_influence(model, _data(pretrain_world.world, images),
                                          Features.open([str(flickr_shards)]), batch_size=4)
        expected = reference(module, pretrain_world.world, flickr_shards, images)
    counts = influence.tally.counts
    assert set(counts) == set(expected)
    assert {key[0] for key in counts} == {"masked_lm", "masked_regions"}
    assert {key[1] for key in counts} >= {"colour", "shape", "ground", "other"}
    for key, (right, losses) in expected.items():
        assert counts[key].count == len(right), key
        assert counts[key].correct == sum(right), key
        assert counts[key].loss == pytest.approx(sum(losses), rel=1e-4), key
    # The aligned regions' removal changes the masked LM's losses: the alignment is exercised.
    lm = [k for k in counts if k[0] == "masked_lm" and k[1] == "shape"]
    assert len({counts[k].loss for k in lm}) == 3


class KnownAnswers(nn.Module):
    """A hand-built "LXMERT" whose answers are known: it names a masked word right exactly when
    every real region of the image is there (else [PAD]), and a masked region's object label
    right exactly when the whole caption is attended (else label 0, no world object's)."""

    def __init__(self, labels: dict[tuple, int], vocab: int, mask_id: int):
        super().__init__()
        self.config = SimpleNamespace(num_objects=1600, word_aligned_regions=False)
        self.labels, self.vocab, self.mask_id = labels, vocab, mask_id
        self.truth: dict[tuple, torch.Tensor] = {}

    def remember(self, ids: list[int]) -> None:
        """An unmasked caption, looked up by its text with any masked positions ignored."""
        self.truth[tuple(ids)] = torch.tensor(ids)

    def _original(self, row: torch.Tensor) -> torch.Tensor:
        for ids, original in self.truth.items():
            if len(ids) == len(row) and all(a == b or b == self.mask_id
                                            for a, b in zip(ids, row.tolist())):
                return original
        raise AssertionError("an unknown caption")

    def forward(self, *, input_ids, attention_mask, token_type_ids, features, boxes, region_mask,
                mlm_index):
        B, T = input_ids.shape
        logits = torch.zeros(len(mlm_index), self.vocab)
        for k, at in enumerate(mlm_index.tolist()):
            b, t = divmod(at, T)
            real = int((boxes[b].abs().sum(-1) > 0).sum())  # padding boxes are 0
            whole = int(region_mask[b].sum()) == real
            logits[k, int(self._original(input_ids[b])[t]) if whole else 0] = 1.0
        obj = torch.zeros(B, features.shape[1], 1600)
        for b in range(B):
            whole_text = int(attention_mask[b].sum()) == int((input_ids[b] != 0).sum())
            for n in range(int(region_mask[b].sum())):
                key = tuple(np.round(boxes[b, n].tolist(), 5))
                obj[b, n, self.labels[key] if whole_text else 0] = 1.0
        return SimpleNamespace(lang_prediction_logits=logits, obj_logits=obj)


def test_a_model_with_known_answers_gets_exactly_them(pretrain_world, flickr_shards):
    """Masked LM: right with every region (100%), wrong with none (0%), and with the phrase's
    regions removed right exactly for the words whose phrase has no aligned region (counted
    here from the boxes). Regions: right with the whole caption only."""
    features = Features.open([str(flickr_shards)])
    data = _data(pretrain_world.world, 5)
    labels = {}
    aligned_words = words = 0
    tokenizer = load_tokenizer()
    for entities, sentences in data:
        sample = features[f"flickr30k-{entities.image_id}"]
        regions = collate_regions([sample], max_boxes=BOXES)
        for box, label in zip(regions.boxes_xyxy_norm[0].tolist(), regions.object_ids[0].tolist()):
            labels[tuple(np.round(box, 5))] = label
        boxes = sample.arrays["boxes"][:BOXES].astype(np.float64)
        for sentence in sentences:
            for phrase in sentence.phrases:
                box = entities.box(phrase.chain) if phrase.chain else None
                if box is None and phrase.chain not in entities.scene:
                    continue
                words += len(phrase.words)
                if box is not None and (_iou(boxes, box) >= 0.5).any():
                    aligned_words += len(phrase.words)
    model = KnownAnswers(labels, tokenizer.vocab_size, tokenizer.mask_token_id)
    for _, sentences in data:
        enc = tokenizer([list(s.words) for s in sentences], is_split_into_words=True,
                        truncation=True, max_length=TEXT_LENGTH)
        for ids in enc["input_ids"]:
            model.remember(ids)
    analysed = AnalysedModel(model, "lxmert", TEXT_LENGTH, BOXES, "", "known", False)
    influence = cross_modal_influence(analysed, data, features, batch_size=1)
    report = cross_modal_report(influence, {"arch": "lxmert", "random_init": False})
    lm = report["masked_lm"]["all"]
    assert lm["count"] == words and 0 < aligned_words < words
    assert lm["accuracy"]["all"] == 100.0 and lm["accuracy"]["none"] == 0.0
    assert lm["accuracy"]["aligned_removed"] == round(100.0 * (words - aligned_words) / words, 2)
    assert report["masked_lm"]["ground"]["accuracy"]["aligned_removed"] == 100.0
    regions = report["masked_regions"]["all"]
    assert regions["count"] > 0
    assert regions["accuracy"] == {"all": 100.0, "aligned_removed": 0.0, "none": 0.0}
    assert regions["delta_accuracy"] == {"aligned_removed": 100.0, "none": 100.0}


@pytest.mark.parametrize("arch", ["lxmert", "visualbert", "vlbert", "vilbert"])
def test_every_architecture_is_analysed(arch, pretrain_world, flickr_shards, tmp_path):
    pretraining_run(arch, tmp_path / "run")
    out = tmp_path / "out"
    assert main(["analyze", "cross-modal", "--run", str(tmp_path / "run"), "--shards",
                 str(flickr_shards), "--entities", str(pretrain_world.world / "flickr30k_entities"),
                 "--split", SPLIT, "--out", str(out), "--max-text-length", str(TEXT_LENGTH),
                 "--max-boxes", str(BOXES)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert (out / "cross_modal.png").stat().st_size > 10_000
    lm = report["masked_lm"]
    assert lm["all"]["count"] == sum(e["count"] for k, e in lm.items() if k != "all") > 100
    for entry in lm.values():
        assert entry["delta_accuracy"]["none"] == pytest.approx(
            entry["accuracy"]["all"] - entry["accuracy"]["none"], abs=0.011)
    if arch == "visualbert":
        assert report["masked_regions"] is None
    else:
        assert report["masked_regions"]["all"]["count"] > 0


def test_what_cannot_be_analysed_is_refused_naming_the_file(pretrain_world, flickr_shards,
                                                            tmp_path, capsys):
    base = ["analyze", "cross-modal", "--shards", str(flickr_shards), "--entities",
            str(pretrain_world.world / "flickr30k_entities"), "--split", SPLIT,
            "--out", str(tmp_path / "out")]
    # An exported VisualBERT encoder keeps no masked-LM head.
    config = tiny_config("visualbert")
    save_ours(tmp_path / "encoder", "visualbert", config,
              ARCHS["visualbert"].encoder(config).state_dict())
    assert main([*base, "--run", str(tmp_path / "encoder")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "encoder") in err and "pretraining heads" in err
    assert "tensors missing, e.g. " in err and "Error(s) in loading" not in err
    # A run whose checkpoint is not a pretraining model (a fine-tuning run's, say).
    run = tmp_path / "finetune"
    save_checkpoint(run, position={"step": 1, "epoch": 0, "micro": 0},
                    state={"model": {"head.weight": torch.zeros(2, 2)}, "optimizer": {}},
                    arch="visualbert", export_config=config,
                    export_state=ARCHS["visualbert"].encoder(config).state_dict(), keep=1)
    assert main([*base, "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert str(run) in err and "pipeline pretrain" in err
    # Shards that are not there.
    pretraining_run("lxmert", tmp_path / "pretrain")
    missing = [*base[:2], "--shards", str(tmp_path / "nope"), *base[4:]]
    assert main([*missing, "--run", str(tmp_path / "pretrain")]) == 2
    err = capsys.readouterr().err
    assert err == f"pipeline: shard error: {tmp_path / 'nope'}: no such shard directory\n"
    assert not (tmp_path / "out" / "report.json").exists()
